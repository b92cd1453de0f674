//! The PostgreSQL backend through real gRPC calls: in-process servers on
//! 127.0.0.1:0 over a fresh schema of the database named by
//! `LEASEHOLD_TEST_POSTGRES` (e.g. `postgres://postgres@127.0.0.1:5432/test`),
//! dropped after each test. Without the variable every test prints that the
//! suite was skipped, and passes.
//!
//! Expiry runs on the database's clock, which cannot be injected: those
//! tests use TTLs of a few hundred milliseconds and bounded waits.
//!
//! The lease contract both backends share (grants, refusals, replays, FIFO,
//! expiry, recovery, paging) is in `contract.rs`, run against PostgreSQL
//! too; this suite keeps what only PostgreSQL has (several servers on one
//! schema, the sweeper, outages, migrations, the shared line).

mod common;
#[macro_use]
mod pg_harness;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::requests::*;
use leasehold_core::error::{Error, StaleReason};
use leasehold_server::postgres::{PgBackend, PgConfig};
use leasehold_wire::pb;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;
use pg_harness::{PgServer, Schema, counter, database};
use tokio::task::JoinHandle;
use tonic::Code;
use tonic::transport::Channel;

/// A retry (same owner and request id) sent while the original still waits
/// in line gets the same grant, replayed, when the original is served.
#[tokio::test]
async fn a_retry_waiting_behind_its_original_gets_the_replay() {
    let schema = schema_or_skip!();
    let server = PgServer::start(&schema).await;
    let mut c = server.client().await;
    let lease = lease_of(c.acquire(acquire("k", "a", 10_000)).await.unwrap());
    let request = pb::AcquireRequest {
        request_id: "r".into(),
        ..waiting("k", "b", 5_000, 5_000)
    };
    let mut first = server.client().await;
    let original = {
        let request = request.clone();
        tokio::spawn(async move { first.acquire(request).await })
    };
    schema.in_line("k", 1).await;
    let mut second = server.client().await;
    let retry = tokio::spawn(async move { second.acquire(request).await });
    schema.in_line("k", 2).await;
    c.release(release(&lease, false)).await.unwrap();
    let original = original.await.unwrap().unwrap().into_inner();
    let retry = retry.await.unwrap().unwrap().into_inner();
    assert!(!original.replayed && retry.replayed);
    assert_eq!(original.lease, retry.lease);
}

/// A waiter whose request is cancelled leaves the line at once: the key
/// goes to the next waiter, not to nobody.
#[tokio::test]
async fn a_cancelled_waiter_leaves_the_line() {
    let schema = schema_or_skip!();
    let server = PgServer::start(&schema).await;
    let mut c = server.client().await;
    let lease = lease_of(c.acquire(acquire("k", "a", 10_000)).await.unwrap());

    let mut b = server.client().await;
    let mut request = tonic::Request::new(waiting("k", "b", 10_000, 10_000));
    request.set_timeout(Duration::from_millis(300));
    let cancelled = b.acquire(request).await.unwrap_err();
    assert!(
        matches!(cancelled.code(), Code::Cancelled | Code::DeadlineExceeded),
        "{cancelled:?}"
    );
    let mut d = server.client().await;
    let d_wait = tokio::spawn(async move { d.acquire(waiting("k", "d", 10_000, 10_000)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.release(release(&lease, false)).await.unwrap();
    let d_lease = lease_of(d_wait.await.unwrap().unwrap());
    assert_eq!(d_lease.owner, "d", "b's place was given up");
}

/// A fence whose term expired while someone waited is superseded by the
/// waiter's grant (as on SQLite, where a key is handed on before anything
/// else looks at it), and Get shows the waiter as the holder.
#[tokio::test]
async fn an_expired_fence_with_a_waiter_is_superseded() {
    let schema = schema_or_skip!();
    let server = PgServer::start(&schema).await;
    let mut c = server.client().await;
    let held = lease_of(c.acquire(acquire("k", "a", 300)).await.unwrap());
    let mut b = server.client().await;
    let b_wait = tokio::spawn(async move { b.acquire(waiting("k", "b", 5_000, 5_000)).await });
    schema.in_line("k", 1).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let refused = c.check(check("k", held.fence)).await.unwrap_err();
    let StaleReason::Superseded { by } = stale_reason(&refused) else {
        panic!("{refused:?}");
    };
    let state = c.get(get("k")).await.unwrap().into_inner();
    assert_eq!(state.lease.as_ref().unwrap().owner, "b");
    assert_eq!(state.lease.unwrap().fence, by.0);
    assert_eq!(lease_of(b_wait.await.unwrap().unwrap()).fence, by.0);
}

/// A waiter row whose server stopped its heartbeat (the server died) drops
/// out of line once its lease lapses: it neither gets the key nor holds up
/// the waiters behind it or newcomers.
#[tokio::test]
async fn a_dead_servers_waiters_lapse() {
    let schema = schema_or_skip!();
    let server = PgServer::start(&schema).await;
    let mut c = server.client().await;
    let lease = lease_of(c.acquire(acquire("k", "a", 10_000)).await.unwrap());
    let (db, connection) = tokio_postgres::connect(&schema.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    // A waiter of a server that is gone: in line, heartbeat due in 200 ms.
    db.batch_execute(&format!(
        "INSERT INTO {0}.waiters (key, owner, ttl_ms, wait_until_ms, alive_until_ms)
         SELECT 'k', 'ghost', 10000, {0}.now_ms() + 60000, {0}.now_ms() + 200",
        schema.name
    ))
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut b = server.client().await;
    let b_wait = tokio::spawn(async move { b.acquire(waiting("k", "b", 5_000, 5_000)).await });
    schema.in_line("k", 1).await;
    c.release(release(&lease, false)).await.unwrap();
    let b_lease = lease_of(b_wait.await.unwrap().unwrap());
    assert_eq!(b_lease.owner, "b", "the ghost was skipped");
    c.release(release(&b_lease, false)).await.unwrap();
    let newcomer = lease_of(c.acquire(acquire("k", "c", 5_000)).await.unwrap());
    assert_eq!(
        newcomer.owner, "c",
        "a lapsed row does not make a free key busy"
    );
}

/// A key released cleanly is forgotten after its retention: NOT_FOUND, its
/// old fence unknown, and a fresh grant's fence above every earlier one.
#[tokio::test]
async fn released_keys_are_forgotten_and_fences_never_repeat() {
    let schema = schema_or_skip!();
    let server = PgServer::start_with(PgConfig {
        retention_ms: 200,
        ..schema.config()
    })
    .await;
    let mut c = server.client().await;
    let lease = lease_of(c.acquire(acquire("k", "a", 5_000)).await.unwrap());
    let other = lease_of(c.acquire(acquire("other", "a", 5_000)).await.unwrap());
    c.release(release(&lease, false)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.backend.sweep().await.unwrap();

    assert_eq!(c.get(get("k")).await.unwrap_err().code(), Code::NotFound);
    let refused = c.check(check("k", lease.fence)).await.unwrap_err();
    assert_eq!(stale_reason(&refused), StaleReason::Unknown);
    let again = c
        .acquire(acquire("k", "b", 5_000))
        .await
        .unwrap()
        .into_inner();
    assert!(again.previous.is_none());
    assert!(again.lease.unwrap().fence > other.fence.max(lease.fence));
}

/// A schema name at PostgreSQL's 63-byte limit works, wake-ups included
/// (its NOTIFY channel is shortened).
#[tokio::test]
async fn a_schema_name_of_63_bytes_works() {
    let mut schema = schema_or_skip!();
    schema.name = format!("{:_<63}", schema.name);
    let server = PgServer::start(&schema).await;
    let mut c = server.client().await;
    let lease = lease_of(c.acquire(acquire("k", "a", 10_000)).await.unwrap());
    let mut b = server.client().await;
    let waiting = tokio::spawn(async move { b.acquire(waiting("k", "b", 5_000, 5_000)).await });
    schema.in_line("k", 1).await;
    c.release(release(&lease, false)).await.unwrap();
    assert_eq!(lease_of(waiting.await.unwrap().unwrap()).owner, "b");
}

/// ServerInfo names the PostgreSQL backend.
#[tokio::test]
async fn server_info_names_the_postgres_backend() {
    let schema = schema_or_skip!();
    let server = PgServer::start(&schema).await;
    let reply = server
        .client()
        .await
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.backend, "postgres");
    assert_eq!(reply.protocol, leasehold_wire::PROTOCOL);
}

/// Connection options in the URL are kept beside the schema's search_path:
/// here one that makes every transaction read-only, so the start fails.
#[tokio::test]
async fn url_options_are_kept() {
    let schema = schema_or_skip!();
    let separator = if schema.url.contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{separator}options=-c%20default_transaction_read_only%3Don",
        schema.url
    );
    let err = PgBackend::connect(PgConfig {
        url,
        ..schema.config()
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("read-only"), "{err}");
}

/// Two servers applying their migrations at the same moment on one fresh
/// schema both start (the advisory lock serialises them), and a third
/// start finds nothing left to do.
#[tokio::test]
async fn servers_starting_together_migrate_once() {
    let schema = schema_or_skip!();
    let (a, b) = tokio::join!(
        PgBackend::connect(schema.config()),
        PgBackend::connect(schema.config())
    );
    a.expect("first server");
    b.expect("second server");
    PgBackend::connect(schema.config())
        .await
        .expect("third server");
}

/// An unreachable database fails the start, naming the database and not the password.
#[tokio::test]
async fn an_unreachable_database_fails_the_start() {
    let Some(_) = database() else { return };
    let config = PgConfig {
        connect_timeout: Duration::from_millis(500),
        ..PgConfig::new("postgres://postgres:secret@127.0.0.1:1/test")
    };
    let err = PgBackend::connect(config).await.unwrap_err().to_string();
    assert!(err.contains("127.0.0.1"), "{err}");
    assert!(!err.contains("secret"), "{err}");
}

/// Two servers on one schema, clients on both contending for the same keys:
/// never two live terms at once, and fences rise with every grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_keep_mutual_exclusion_and_rising_fences() {
    let schema = schema_or_skip!();
    let servers = [
        PgServer::start(&schema).await,
        PgServer::start(&schema).await,
    ];
    let keys = ["shared/0", "shared/1"];
    let holding: Arc<Vec<AtomicBool>> =
        Arc::new(keys.iter().map(|_| AtomicBool::new(false)).collect());
    let last_fence: Arc<Vec<AtomicU64>> =
        Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
    let grants = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for worker in 0..8 {
        let mut client = servers[worker % 2].client().await;
        let (holding, last_fence, grants) = (holding.clone(), last_fence.clone(), grants.clone());
        workers.push(tokio::spawn(async move {
            let owner = format!("w{worker}");
            let deadline = Instant::now() + Duration::from_secs(4);
            let mut round = 0;
            while Instant::now() < deadline {
                round += 1;
                let k = (worker + round) % keys.len();
                let request = pb::AcquireRequest {
                    request_id: format!("{owner}-{round}"),
                    ..waiting(keys[k], &owner, 5_000, 2_000)
                };
                let lease = match client.acquire(request).await {
                    Ok(reply) => lease_of(reply),
                    Err(status) if status.code() == Code::Aborted => continue,
                    Err(status) => panic!("acquire: {status:?}"),
                };
                assert!(
                    !holding[k].swap(true, Ordering::SeqCst),
                    "two live terms on {}",
                    keys[k]
                );
                let previous = last_fence[k].swap(lease.fence, Ordering::SeqCst);
                assert!(
                    lease.fence > previous,
                    "fence {} after {previous}",
                    lease.fence
                );
                grants.fetch_add(1, Ordering::Relaxed);
                client
                    .check(check(keys[k], lease.fence))
                    .await
                    .expect("holder's check");
                tokio::time::sleep(Duration::from_millis(2)).await;
                holding[k].store(false, Ordering::SeqCst);
                client
                    .release(release(&lease, false))
                    .await
                    .expect("release");
            }
        }));
    }
    for worker in workers {
        worker.await.expect("worker");
    }
    assert!(
        grants.load(Ordering::Relaxed) > 20,
        "too few grants to mean anything"
    );
}

/// FIFO holds across servers: waiters queued through different servers are
/// served in the order they queued.
#[tokio::test]
async fn the_line_is_shared_across_servers() {
    let schema = schema_or_skip!();
    let one = PgServer::start(&schema).await;
    let two = PgServer::start(&schema).await;
    let mut c = one.client().await;
    let lease = lease_of(c.acquire(acquire("k", "a", 10_000)).await.unwrap());
    let mut order = Vec::new();
    let mut waits = Vec::new();
    for (i, server) in [&two, &one, &two].into_iter().enumerate() {
        let mut client = server.client().await;
        let owner = format!("w{i}");
        order.push(owner.clone());
        waits.push(tokio::spawn(async move {
            client.acquire(waiting("k", &owner, 10_000, 10_000)).await
        }));
        // In line before the next one comes.
        schema.in_line("k", i + 1).await;
    }
    let mut current = lease;
    let mut served = Vec::new();
    let mut fences = HashSet::new();
    for wait in waits {
        c.release(release(&current, false)).await.unwrap();
        current = lease_of(wait.await.unwrap().unwrap());
        assert!(fences.insert(current.fence));
        served.push(current.owner.clone());
    }
    assert_eq!(served, order);
}

/// `--max-waiters-per-key` counts the line as the database has it: with two
/// places, waiters queued through two servers fill it, a third is refused
/// through either server, and the place a served waiter leaves is free for
/// a newcomer through either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_limit_holds_across_servers() {
    let schema = schema_or_skip!();
    let config = PgConfig {
        max_waiters_per_key: 2,
        ..schema.config()
    };
    let one = PgServer::start_with(config.clone()).await;
    let two = PgServer::start_with(config).await;
    let mut c = one.client().await;
    let lease = lease_of(c.acquire(acquire("k", "a", 10_000)).await.unwrap());
    let mut waits = Vec::new();
    for (i, server) in [&one, &two].into_iter().enumerate() {
        let mut client = server.client().await;
        let owner = format!("w{i}");
        waits.push(tokio::spawn(async move {
            client.acquire(waiting("k", &owner, 10_000, 10_000)).await
        }));
        schema.in_line("k", i + 1).await;
    }
    for server in [&one, &two] {
        let refused = server
            .client()
            .await
            .acquire(waiting("k", "late", 10_000, 10_000))
            .await
            .unwrap_err();
        assert_eq!(
            leasehold_wire::status::from_status(&refused),
            Error::ResourceExhausted {
                limit: "waiters_per_key".into(),
                detail: "2 Acquires already wait for key \"k\"".into(),
            }
        );
    }
    c.release(release(&lease, false)).await.unwrap();
    let served = lease_of(waits.remove(0).await.unwrap().unwrap());
    assert_eq!(served.owner, "w0");
    let mut newcomer = two.client().await;
    let newcomer =
        tokio::spawn(async move { newcomer.acquire(waiting("k", "new", 10_000, 10_000)).await });
    // w1 and the newcomer.
    schema.in_line("k", 2).await;
    assert!(!newcomer.is_finished(), "the newcomer was not kept in line");
    newcomer.abort();
    for wait in waits {
        wait.abort();
    }
    stop_waiting(&mut [one, two]).await;
}

/// Stops `servers`, so the Acquires still waiting through them give up
/// before the test's schema is dropped: a server left serving its line
/// may be inside a transaction when the drop blocks the test's thread, and
/// the `DROP SCHEMA` would then wait for that transaction forever.
async fn stop_waiting(servers: &mut [PgServer]) {
    for server in servers {
        server.stop().await;
    }
}

/// Waiting Acquires of one key sent all at once through two servers take
/// exactly the line's places and no more: counting the line and joining it
/// cannot interleave (the count is taken under the line's lock). Without
/// the lock, one round in about five overfilled the line here; the test
/// runs four, on keys of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_racing_through_two_servers_never_overfill_the_line() {
    const PLACES: usize = 3;
    const WAITERS: usize = 24;
    let schema = schema_or_skip!();
    let config = PgConfig {
        max_waiters_per_key: PLACES,
        pool_size: 16,
        ..schema.config()
    };
    let mut servers = [
        PgServer::start_with(config.clone()).await,
        PgServer::start_with(config).await,
    ];
    let mut c = servers[0].client().await;
    let mut clients = Vec::new();
    for i in 0..WAITERS {
        clients.push(servers[i % 2].client().await);
    }
    let db = schema.db().await;
    let mut waits = Vec::new();
    for round in 0..4 {
        let key = format!("k{round}");
        lease_of(c.acquire(acquire(&key, "a", 60_000)).await.unwrap());
        let start = Arc::new(tokio::sync::Barrier::new(WAITERS));
        let (refusals, mut refused) = tokio::sync::mpsc::unbounded_channel();
        for (i, client) in clients.iter().enumerate() {
            let (mut client, key) = (client.clone(), key.clone());
            let (start, refusals) = (start.clone(), refusals.clone());
            waits.push(tokio::spawn(async move {
                start.wait().await;
                let status = client
                    .acquire(waiting(&key, &format!("w{i}"), 10_000, 60_000))
                    .await
                    .unwrap_err();
                refusals.send(status).unwrap();
            }));
        }
        // Until every Acquire is either refused or in line.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut refusals = Vec::new();
        loop {
            while let Ok(status) = refused.try_recv() {
                refusals.push(status);
            }
            let queued = pg_harness::line_len(&db, &key).await;
            if refusals.len() + queued >= WAITERS {
                assert_eq!(queued, PLACES, "{key}: {} refused", refusals.len());
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{key}: {queued} in line and {} refused of {WAITERS}",
                refusals.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(refusals.len(), WAITERS - PLACES, "{key}");
        for status in &refusals {
            assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        }
    }
    for wait in waits {
        wait.abort();
    }
    stop_waiting(&mut servers).await;
}

/// Servers are stateless: a term granted through one server is renewed,
/// checked and released through another after the first has stopped.
#[tokio::test]
async fn a_stopped_server_loses_nothing() {
    let schema = schema_or_skip!();
    let mut one = PgServer::start(&schema).await;
    let two = PgServer::start(&schema).await;
    let lease = lease_of(
        one.client()
            .await
            .acquire(acquire("k", "a", 5_000))
            .await
            .unwrap(),
    );
    one.stop().await;

    let mut c = two.client().await;
    let renewed = c
        .renew(renew(&lease, 0))
        .await
        .unwrap()
        .into_inner()
        .lease
        .unwrap();
    assert_eq!(renewed.fence, lease.fence);
    c.check(check("k", lease.fence)).await.unwrap();
    c.release(release(&lease, false)).await.unwrap();
    let next = lease_of(c.acquire(acquire("k", "b", 5_000)).await.unwrap());
    assert!(next.fence > lease.fence);
}

/// SIGTERM, and a clean exit.
fn terminate(mut child: std::process::Child) {
    let pid = child.id().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill -TERM");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
}

/// `serve --store postgres://…` serves leases from the database, in the
/// schema `--pg-schema` names.
#[tokio::test]
async fn serve_with_a_postgres_store() {
    let schema = schema_or_skip!();
    let (child, addr) = common::spawn_serve(&["--store", &schema.url, "--pg-schema", &schema.name]);
    let mut c = LeaseholdClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let lease = lease_of(c.acquire(acquire("k", "a", 5_000)).await.unwrap());
    // The same state through an in-process server on the same schema.
    let other = PgServer::start(&schema).await;
    let refused = other
        .client()
        .await
        .check(check("k", lease.fence + 1))
        .await;
    assert_eq!(refused.unwrap_err().code(), Code::FailedPrecondition);
    other
        .client()
        .await
        .check(check("k", lease.fence))
        .await
        .unwrap();
    terminate(child);
}

/// `serve --store sqlite:PATH` is the SQLite engine on PATH (no database needed).
#[tokio::test]
async fn serve_with_a_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let store = format!("sqlite:{}", db.display());
    let (child, addr) = common::spawn_serve(&["--store", &store]);
    let mut c = LeaseholdClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    c.acquire(acquire("k", "a", 5_000)).await.unwrap();
    terminate(child);
    assert!(db.exists());
}

/// A store that is neither, or `--store` together with `--db`, is refused.
#[test]
fn bad_store_arguments_are_refused() {
    for args in [
        &["--store", "mysql://x"][..],
        &["--store", "sqlite:"],
        &["--store", "sqlite:a.db", "--db", "b.db"],
    ] {
        let output = std::process::Command::new(common::binary())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("LEASEHOLD_DB")
            .env_remove("LEASEHOLD_STORE")
            .output()
            .expect("run leasehold serve");
        assert!(!output.status.success(), "{args:?} was accepted");
        assert!(!output.stderr.is_empty());
    }
}

/// On one Session stream, operations on a key take effect in the order they
/// were sent, even when sent without waiting: a Check, a Release, another
/// owner's Acquire, then a Check and a Renew of the released fence.
#[tokio::test]
async fn a_session_stream_applies_in_arrival_order() {
    use leasehold_wire::pb::session_request::Op;
    let schema = schema_or_skip!();
    let server = PgServer::start(&schema).await;
    let mut c = server.client().await;
    let (tx, outbound) = tokio::sync::mpsc::unbounded_channel();
    let mut rx = c
        .session(tokio_stream::wrappers::UnboundedReceiverStream::new(
            outbound,
        ))
        .await
        .expect("open Session")
        .into_inner();
    for round in 0..10 {
        let key = format!("k{round}");
        let lease = lease_of(c.acquire(acquire(&key, "a", 5_000)).await.unwrap());
        let ops = [
            Op::Check(check(&key, lease.fence)),
            Op::Release(release(&lease, false)),
            Op::Acquire(acquire(&key, "b", 5_000)),
            Op::Check(check(&key, lease.fence)),
            Op::Renew(renew(&lease, 0)),
        ];
        for (id, op) in ops.into_iter().enumerate() {
            tx.send(pb::SessionRequest {
                op: Some(op),
                id: id as u64,
            })
            .unwrap();
        }
        let mut answers = std::collections::HashMap::new();
        for _ in 0..5 {
            let answer = tokio::time::timeout(Duration::from_secs(10), rx.message())
                .await
                .expect("an answer within 10 s")
                .expect("no stream error")
                .expect("stream open");
            answers.insert(answer.id, answer);
        }
        let ok =
            |id: u64, what: &str| assert_eq!(answers[&id].code, 0, "{what}: {:?}", answers[&id]);
        ok(0, "check before the release");
        ok(1, "release");
        ok(2, "acquire after the release");
        let taken = answers[&2].lease.as_ref().unwrap();
        assert_eq!(taken.owner, "b");
        for id in [3, 4] {
            let refusal = &answers[&id];
            assert_eq!(refusal.code, Code::FailedPrecondition as i32, "{refusal:?}");
            let err = leasehold_wire::status::from_refusal(
                refusal.code,
                &refusal.message,
                &refusal.details,
            );
            assert!(
                matches!(err, Error::StaleFence { reason: StaleReason::Superseded { by }, .. } if by.0 == taken.fence),
                "{err:?}"
            );
        }
    }
}

/// A TCP relay to the database that can be cut (every connection dropped,
/// new ones refused) and restored, to take the database away from a server.
struct Relay {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    /// Bumped on every cut, so relayed connections of an earlier epoch stop.
    epoch: Arc<tokio::sync::watch::Sender<u64>>,
    _task: JoinHandle<()>,
}

impl Relay {
    async fn to(database: SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let epoch = Arc::new(tokio::sync::watch::Sender::new(0u64));
        let task = tokio::spawn({
            let (up, epoch) = (up.clone(), epoch.clone());
            async move {
                loop {
                    let Ok((mut inbound, _)) = listener.accept().await else {
                        return;
                    };
                    if !up.load(Ordering::SeqCst) {
                        continue; // dropped: the database is "down"
                    }
                    let mut cut = epoch.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut outbound) = tokio::net::TcpStream::connect(database).await
                        else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = cut.changed() => {}
                        }
                    });
                }
            }
        });
        Relay {
            addr,
            up,
            epoch,
            _task: task,
        }
    }

    /// A relay to the test database and the database URL through it.
    async fn for_schema(schema: &Schema) -> (Relay, String) {
        let parsed: tokio_postgres::Config = schema.url.parse().unwrap();
        let host = match &parsed.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(host) => host.clone(),
            other => panic!("the test needs a TCP database, not {other:?}"),
        };
        let port = parsed.get_ports().first().copied().unwrap_or(5432);
        let database = tokio::net::lookup_host((host.as_str(), port))
            .await
            .unwrap()
            .next()
            .unwrap();
        let relay = Relay::to(database).await;
        let password = parsed
            .get_password()
            .map(|p| format!(":{}", String::from_utf8_lossy(p)))
            .unwrap_or_default();
        let url = format!(
            "postgres://{}{password}@{}/{}",
            parsed.get_user().unwrap_or("postgres"),
            relay.addr,
            parsed.get_dbname().unwrap_or("postgres")
        );
        (relay, url)
    }

    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.epoch.send_modify(|e| *e += 1);
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

/// While the database cannot be reached every request is refused with
/// UNAVAILABLE, never answered from a guess; once it is back, service
/// resumes by itself and nothing acknowledged was lost.
#[tokio::test]
async fn a_database_outage_is_unavailable_then_resumes() {
    let schema = schema_or_skip!();
    let (relay, url) = Relay::for_schema(&schema).await;
    let server = PgServer::start_with(PgConfig {
        connect_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_secs(2),
        ..PgConfig {
            url,
            ..schema.config()
        }
    })
    .await;
    let mut c = server.client().await;
    let lease = lease_of(c.acquire(acquire("k", "a", 60_000)).await.unwrap());

    relay.cut();
    let started = Instant::now();
    let refused = c.renew(renew(&lease, 0)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let refused = c.acquire(acquire("k", "b", 5_000)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let refused = c.check(check("k", lease.fence)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );

    relay.restore();
    let deadline = Instant::now() + Duration::from_secs(10);
    let renewed = loop {
        match c.renew(renew(&lease, 0)).await {
            Ok(reply) => break reply.into_inner().lease.unwrap(),
            Err(status) if status.code() == Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("after the outage: {status:?}"),
        }
    };
    assert_eq!(renewed.fence, lease.fence, "the grant outlived the outage");
    let refused = c.acquire(acquire("k", "b", 5_000)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Aborted, "still held by a");
}

/// A schema migrated by a newer leasehold is refused, not touched.
#[tokio::test]
async fn a_schema_from_a_newer_leasehold_is_refused() {
    let schema = schema_or_skip!();
    PgBackend::connect(schema.config())
        .await
        .expect("first start");
    let (client, connection) = tokio_postgres::connect(&schema.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "INSERT INTO {}.leasehold_migrations (version) VALUES (999)",
            schema.name
        ))
        .await
        .unwrap();
    let err = PgBackend::connect(schema.config()).await.unwrap_err();
    assert!(
        matches!(
            err,
            leasehold_core::store::StoreError::TooNew { found: 999, .. }
        ),
        "{err}"
    );
}

/// The Rust client's guard works unchanged over the PostgreSQL backend:
/// acquire over the shared Session stream, background renewal past the
/// TTL, the fence check, and release.
#[tokio::test]
async fn the_rust_client_guard_holds_and_releases() {
    let schema = schema_or_skip!();
    let server = PgServer::start(&schema).await;
    let client = leasehold_client::Client::connect(format!("http://{}", server.addr))
        .await
        .unwrap();
    let guard = client
        .acquire("guarded")
        .owner("agent")
        .ttl(Duration::from_millis(600))
        .send()
        .await
        .expect("acquire");
    let fence = guard.fence();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(guard.is_valid(), "renewed in the background");
    guard.verify().await.expect("still the live term");
    let mut c = server.client().await;
    c.check(check("guarded", fence.0))
        .await
        .expect("live on the server");
    let ended = guard.release().await.expect("release");
    assert_eq!(ended.fence, fence);
    let refused = c.check(check("guarded", fence.0)).await.unwrap_err();
    assert!(matches!(
        stale_reason(&refused),
        StaleReason::Released { .. }
    ));
}

/// A `leasehold serve --store postgres://…` process on the test schema,
/// killed (SIGKILL) when dropped.
struct ServeProcess {
    child: std::process::Child,
    addr: SocketAddr,
}

impl ServeProcess {
    fn start(schema: &Schema) -> ServeProcess {
        let (child, addr) =
            common::spawn_serve(&["--store", &schema.url, "--pg-schema", &schema.name]);
        ServeProcess { child, addr }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `kill -9`: no drain, no goodbye to its clients.
    fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A guard on a client with two endpoints keeps its lease when the server it
/// talks to is killed with SIGKILL: it renews through the other server, with
/// the same fence and lease id, and never stops being valid.
#[tokio::test]
async fn a_guard_renews_through_another_server_when_its_server_is_killed() {
    let schema = schema_or_skip!();
    let one = ServeProcess::start(&schema);
    let two = ServeProcess::start(&schema);
    let (one_url, two_url) = (one.url(), two.url());
    let client = leasehold_client::Client::connect_any([one_url.clone(), two_url.clone()])
        .await
        .unwrap();
    assert_eq!(client.current_endpoint(), one_url);
    let ttl = Duration::from_millis(1_500);
    let guard = client
        .acquire("failover")
        .owner("agent")
        .ttl(ttl)
        .send()
        .await
        .expect("acquire");
    let fence = guard.fence();
    guard
        .verify()
        .await
        .expect("checked through the first server");

    one.kill9();
    // Over more than two TTLs the guard stays valid: its deadline can only
    // have moved by renewals the surviving server acknowledged.
    let until = Instant::now() + ttl * 2 + Duration::from_millis(500);
    while Instant::now() < until {
        assert!(guard.is_valid(), "lost after the kill: {:?}", guard.loss());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(client.current_endpoint(), two_url, "failed over");
    assert_eq!(guard.gate().await.expect("gate"), fence);

    // The term is live on the survivor, and nobody else can take it.
    let mut raw = LeaseholdClient::connect(two_url.clone()).await.unwrap();
    let live = raw.check(check("failover", fence.0)).await.unwrap();
    assert_eq!(live.into_inner().lease.unwrap().owner, "agent");
    let busy = raw.acquire(acquire("failover", "other", 1_000)).await;
    assert_eq!(busy.unwrap_err().code(), Code::Aborted);

    let ended = guard.release().await.expect("release through the survivor");
    assert_eq!(ended.fence, fence);
    let next = client.acquire("failover").ttl(ttl).send().await.unwrap();
    assert!(next.fence() > fence, "{} after {fence}", next.fence());
    next.release().await.unwrap();
}

/// What the load tests below share: who holds each key now, the highest
/// fence acknowledged so far, and counts.
struct Ledger {
    /// Per key: whether a worker believes it holds it.
    holding: Vec<AtomicBool>,
    /// Per key: the last fence granted.
    last_fence: Vec<AtomicU64>,
    /// The highest fence any grant acknowledged, over all keys.
    highest: AtomicU64,
    grants: AtomicU64,
}

impl Ledger {
    fn new(keys: usize) -> Ledger {
        Ledger {
            holding: (0..keys).map(|_| AtomicBool::new(false)).collect(),
            last_fence: (0..keys).map(|_| AtomicU64::new(0)).collect(),
            highest: AtomicU64::new(0),
            grants: AtomicU64::new(0),
        }
    }

    /// Records a grant of key `k` with `fence`, for an Acquire sent when
    /// the highest acknowledged fence was `floor`: nobody else holds the
    /// key, and the fence is above every fence acknowledged before the
    /// Acquire was sent (one sequence for all keys) and above the key's last.
    fn granted(&self, k: usize, fence: u64, floor: u64) {
        assert!(
            !self.holding[k].swap(true, Ordering::SeqCst),
            "two live holders of key {k}"
        );
        assert!(
            fence > floor,
            "fence {fence} granted after {floor} was acknowledged"
        );
        let previous = self.last_fence[k].swap(fence, Ordering::SeqCst);
        assert!(fence > previous, "key {k}: fence {fence} after {previous}");
        self.highest.fetch_max(fence, Ordering::SeqCst);
        self.grants.fetch_add(1, Ordering::Relaxed);
    }

    fn released(&self, k: usize) {
        self.holding[k].store(false, Ordering::SeqCst);
    }
}

/// `kill -9` of one of two servers while clients with both endpoints
/// acquire and release hot keys through guards: never two live holders,
/// fences keep rising past every one acknowledged, the survivor keeps
/// granting, and the clients of the dead server carry on against it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_server_under_load_keeps_exclusion_and_rising_fences() {
    let schema = schema_or_skip!();
    let one = ServeProcess::start(&schema);
    let two = ServeProcess::start(&schema);
    let (one_url, two_url) = (one.url(), two.url());
    const KEYS: [&str; 3] = ["hot/0", "hot/1", "hot/2"];
    let ledger = Arc::new(Ledger::new(KEYS.len()));
    let killed = Arc::new(AtomicBool::new(false));
    let after_kill = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let run_for = Duration::from_secs(7);
    let mut workers = Vec::new();
    for worker in 0..6 {
        // Half start on the server that will die.
        let endpoints = if worker % 2 == 0 {
            [one_url.clone(), two_url.clone()]
        } else {
            [two_url.clone(), one_url.clone()]
        };
        let client = leasehold_client::Client::connect_any(endpoints)
            .await
            .unwrap();
        let (ledger, killed, after_kill) = (ledger.clone(), killed.clone(), after_kill.clone());
        workers.push(tokio::spawn(async move {
            let owner = format!("w{worker}");
            let mut round = 0;
            while started.elapsed() < run_for {
                round += 1;
                let k = (worker + round) % KEYS.len();
                let floor = ledger.highest.load(Ordering::SeqCst);
                let guard = match client
                    .acquire(KEYS[k])
                    .owner(owner.as_str())
                    .ttl(Duration::from_secs(3))
                    .wait(Duration::from_millis(1_000))
                    .send()
                    .await
                {
                    Ok(guard) => guard,
                    Err(err) if err.busy_holder().is_some() || err.is_transient() => continue,
                    Err(err) => panic!("{owner}: acquire: {err}"),
                };
                ledger.granted(k, guard.fence().0, floor);
                if killed.load(Ordering::SeqCst) {
                    after_kill.fetch_add(1, Ordering::Relaxed);
                }
                match guard.gate().await {
                    Ok(fence) => assert_eq!(fence, guard.fence()),
                    Err(err) => assert!(err.is_transient(), "{owner}: gate: {err}"),
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                ledger.released(k);
                match guard.release().await {
                    Ok(_) => {}
                    // Unreachable in the moment of the kill: the term
                    // expires at its TTL instead.
                    Err(err) if err.is_transient() => {}
                    // Released through the killed server, which died before
                    // replying; the resend to the survivor finds the term
                    // ended and the key granted on. Only possible after the kill.
                    Err(leasehold_client::ClientError::Lost {
                        reason: leasehold_client::LossReason::Refused(Error::StaleFence { .. }),
                        ..
                    }) if killed.load(Ordering::SeqCst) => {}
                    Err(err) => panic!("{owner}: release: {err}"),
                }
            }
            client.current_endpoint().to_owned()
        }));
    }
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let before_kill = ledger.grants.load(Ordering::Relaxed);
    assert!(
        before_kill > 10,
        "too few grants before the kill: {before_kill}"
    );
    killed.store(true, Ordering::SeqCst);
    one.kill9();
    for worker in workers {
        let current = worker.await.expect("worker");
        assert_eq!(current, two_url, "every client ends on the survivor");
    }
    let after = after_kill.load(Ordering::Relaxed);
    assert!(
        after > 10,
        "the survivor kept serving: {after} grants after the kill"
    );

    // No regression: a new grant of every key is above every fence seen.
    let mut raw = LeaseholdClient::connect(two_url).await.unwrap();
    let highest = ledger.highest.load(Ordering::SeqCst);
    for key in KEYS {
        let next = lease_of(
            raw.acquire(waiting(key, "after", 1_000, 10_000))
                .await
                .unwrap_or_else(|status| panic!("{key} after the run: {status:?}")),
        );
        assert!(
            next.fence > highest,
            "{key}: {} after {highest}",
            next.fence
        );
    }
}

/// The standard health service's status of the lease service on `client`.
async fn health_of(
    client: &mut tonic_health::pb::health_client::HealthClient<Channel>,
) -> tonic_health::pb::health_check_response::ServingStatus {
    let reply = client
        .check(tonic_health::pb::HealthCheckRequest {
            service: "leasehold.v1.Leasehold".into(),
        })
        .await
        .expect("health check");
    reply.into_inner().status()
}

/// Polls health until it is `wanted`, for at most `within`.
async fn health_becomes(
    client: &mut tonic_health::pb::health_client::HealthClient<Channel>,
    wanted: tonic_health::pb::health_check_response::ServingStatus,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let now = health_of(client).await;
        if now == wanted {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "health still {now:?}, not {wanted:?}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// gRPC health follows the database: SERVING while it answers, NOT_SERVING
/// while it cannot be reached (requests are refused UNAVAILABLE meanwhile),
/// SERVING again once it is back.
#[tokio::test]
async fn health_is_not_serving_while_the_database_is_unreachable() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let schema = schema_or_skip!();
    let (relay, url) = Relay::for_schema(&schema).await;
    let server = PgServer::start_with(PgConfig {
        connect_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_secs(2),
        health_interval: Duration::from_millis(100),
        ..PgConfig {
            url,
            ..schema.config()
        }
    })
    .await;
    let channel = Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    assert_eq!(health_of(&mut health).await, ServingStatus::Serving);

    relay.cut();
    health_becomes(
        &mut health,
        ServingStatus::NotServing,
        Duration::from_secs(5),
    )
    .await;
    let refused = server
        .client()
        .await
        .acquire(acquire("k", "a", 5_000))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    // It stays NOT_SERVING while the database is away, not just for a probe.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(health_of(&mut health).await, ServingStatus::NotServing);

    relay.restore();
    health_becomes(&mut health, ServingStatus::Serving, Duration::from_secs(10)).await;
    server
        .client()
        .await
        .acquire(acquire("k", "a", 5_000))
        .await
        .expect("served again");
}

/// When the database went away and came back during a load test, as
/// microseconds since `t0` (0: not yet).
struct Outage {
    t0: Instant,
    down_at: AtomicU64,
    up_at: AtomicU64,
}

impl Outage {
    fn new() -> Outage {
        Outage {
            t0: Instant::now(),
            down_at: AtomicU64::new(0),
            up_at: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    /// Call once the database is unreachable.
    fn went_down(&self) {
        self.down_at.store(self.now(), Ordering::SeqCst);
    }

    /// Call just before the database can be reached again.
    fn coming_up(&self) {
        self.up_at.store(self.now(), Ordering::SeqCst);
    }

    /// Whether a request sent at `sent` and answered at `answered` was
    /// wholly inside the outage.
    fn wholly_inside(&self, sent: u64, answered: u64) -> bool {
        let (down, up) = (
            self.down_at.load(Ordering::SeqCst),
            self.up_at.load(Ordering::SeqCst),
        );
        down != 0 && sent > down && (up == 0 || answered < up)
    }

    /// Whether `sent` was after the database came back.
    fn after(&self, sent: u64) -> bool {
        let up = self.up_at.load(Ordering::SeqCst);
        up != 0 && sent > up
    }
}

/// Workers acquiring and releasing hot keys through `clients` (one each)
/// until `run_for` has passed since the outage's `t0`. Each asserts that a
/// request wholly inside the outage was refused UNAVAILABLE, and records
/// grants in `ledger` (one holder per key, rising fences). Each returns how
/// many requests it had refused inside the outage and how many grants it
/// got after.
fn outage_workers(
    clients: Vec<LeaseholdClient<Channel>>,
    keys: &'static [&'static str],
    ledger: &Arc<Ledger>,
    outage: &Arc<Outage>,
    run_for: Duration,
) -> Vec<JoinHandle<(u64, u64)>> {
    let mut workers = Vec::new();
    for (worker, mut c) in clients.into_iter().enumerate() {
        let (ledger, outage) = (ledger.clone(), outage.clone());
        workers.push(tokio::spawn(async move {
            let owner = format!("w{worker}");
            let (mut in_outage, mut after_outage) = (0u64, 0u64);
            let mut round = 0;
            while outage.t0.elapsed() < run_for {
                round += 1;
                let k = (worker + round) % keys.len();
                let floor = ledger.highest.load(Ordering::SeqCst);
                let sent = outage.now();
                let request = pb::AcquireRequest {
                    request_id: format!("{owner}-{round}"),
                    ..waiting(keys[k], &owner, 2_000, 300)
                };
                let outcome = c.acquire(request).await;
                if outage.wholly_inside(sent, outage.now()) {
                    let status = outcome.as_ref().map(|_| ()).unwrap_err();
                    assert_eq!(status.code(), Code::Unavailable, "{owner}: {status:?}");
                    in_outage += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                let lease = match outcome {
                    Ok(reply) => lease_of(reply),
                    Err(status) if matches!(status.code(), Code::Aborted | Code::Unavailable) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    Err(status) => panic!("{owner}: acquire: {status:?}"),
                };
                ledger.granted(k, lease.fence, floor);
                if outage.after(sent) {
                    after_outage += 1;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                ledger.released(k);
                if let Err(status) = c.release(release(&lease, false)).await {
                    // The outage began while it held: it expires at its TTL.
                    assert_eq!(status.code(), Code::Unavailable, "{owner}: {status:?}");
                }
            }
            (in_outage, after_outage)
        }));
    }
    workers
}

/// Sums what [`outage_workers`] report and checks the outage was exercised
/// and service resumed.
async fn outage_totals(workers: Vec<JoinHandle<(u64, u64)>>) {
    let (mut in_outage, mut after_outage) = (0, 0);
    for worker in workers {
        let (during, after) = worker.await.expect("worker");
        in_outage += during;
        after_outage += after;
    }
    assert!(
        in_outage > 5,
        "the outage was exercised: {in_outage} refusals"
    );
    assert!(
        after_outage > 10,
        "service resumed: {after_outage} grants after"
    );
}

/// A new grant of every key is above every fence acknowledged before.
async fn no_fence_regression(c: &mut LeaseholdClient<Channel>, keys: &[&str], ledger: &Ledger) {
    let highest = ledger.highest.load(Ordering::SeqCst);
    for key in keys {
        let next = lease_of(
            c.acquire(waiting(key, "after", 1_000, 10_000))
                .await
                .unwrap_or_else(|status| panic!("{key} after the outage: {status:?}")),
        );
        assert!(
            next.fence > highest,
            "{key}: {} after {highest}",
            next.fence
        );
    }
}

const HOT_KEYS: [&str; 3] = ["hot/0", "hot/1", "hot/2"];

/// The database cut away under load from two servers: every request sent
/// while it is away and answered before it is back is refused UNAVAILABLE
/// (nothing is granted, refused as busy or stale, from a guess); after it
/// returns, service resumes by itself, still one holder per key, and fences
/// keep rising past every one acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_under_load_grants_nothing_and_resumes() {
    let schema = schema_or_skip!();
    let (relay, url) = Relay::for_schema(&schema).await;
    let config = PgConfig {
        connect_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_secs(2),
        ..PgConfig {
            url,
            ..schema.config()
        }
    };
    let servers = [
        PgServer::start_with(config.clone()).await,
        PgServer::start_with(config).await,
    ];
    let ledger = Arc::new(Ledger::new(HOT_KEYS.len()));
    let outage = Arc::new(Outage::new());
    let mut clients = Vec::new();
    for worker in 0..6 {
        clients.push(servers[worker % 2].client().await);
    }
    let workers = outage_workers(clients, &HOT_KEYS, &ledger, &outage, Duration::from_secs(9));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let before = ledger.grants.load(Ordering::Relaxed);
    assert!(before > 10, "too few grants before the outage: {before}");
    relay.cut();
    outage.went_down();
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    outage.coming_up();
    relay.restore();
    outage_totals(workers).await;
    no_fence_regression(&mut servers[0].client().await, &HOT_KEYS, &ledger).await;
}

/// A PostgreSQL cluster of the test's own (initdb in a temp dir, on a free
/// loopback port), which the test may stop and start: the shared database
/// must never be restarted. Run as the `postgres` user when the test runs
/// as root (PostgreSQL refuses root). Stopped and removed when dropped.
struct PrivateCluster {
    dir: tempfile::TempDir,
    bin: std::path::PathBuf,
    port: u16,
    /// Whether commands run through `runuser -u postgres`.
    as_postgres: bool,
}

impl PrivateCluster {
    /// A running cluster, or `None` with the reason when this machine
    /// cannot make one (no PostgreSQL binaries, no usable user).
    fn start() -> Result<PrivateCluster, String> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .map_err(|e| format!("no /usr/lib/postgresql: {e}"))?
            .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
            .filter(|bin| bin.join("initdb").exists())
            .max()
            .ok_or("no initdb under /usr/lib/postgresql/*/bin")?;
        let uid = std::process::Command::new("id")
            .arg("-u")
            .output()
            .map_err(|e| format!("id -u: {e}"))?;
        let as_postgres = String::from_utf8_lossy(&uid.stdout).trim() == "0";
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        if as_postgres {
            let owned = std::process::Command::new("chown")
                .args(["postgres"])
                .arg(dir.path())
                .status()
                .map_err(|e| format!("chown: {e}"))?;
            if !owned.success() {
                return Err("cannot give the temp dir to the postgres user".into());
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let cluster = PrivateCluster {
            dir,
            bin,
            port,
            as_postgres,
        };
        let data = cluster.data();
        cluster.run(
            "initdb",
            &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync"],
        )?;
        cluster.pg_ctl_start()?;
        Ok(cluster)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn run(&self, tool: &str, args: &[&str]) -> Result<(), String> {
        let program = self.bin.join(tool);
        let mut command = if self.as_postgres {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            std::process::Command::new(&program)
        };
        let output = command
            .args(args)
            .output()
            .map_err(|e| format!("{tool}: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{tool} failed: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "start",
            ],
        )
    }

    /// Stops the database as a crash would (`-m immediate`: no checkpoint,
    /// connections cut; crash recovery on the next start).
    fn crash(&self) {
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        )
        .expect("stop the private cluster");
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }
}

/// The database itself restarted (stopped as by a crash, then started
/// again) under load from two servers: requests wholly inside the outage
/// are UNAVAILABLE, health is NOT_SERVING while it is down and SERVING
/// after, service resumes by itself, one holder per key throughout, and
/// fences rise past every one acknowledged (the sequence survives crash
/// recovery). Runs on a private cluster; skipped when none can be made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_under_load_grants_nothing_and_resumes() {
    use tonic_health::pb::health_check_response::ServingStatus;
    if database().is_none() {
        return;
    }
    let cluster = match PrivateCluster::start() {
        Ok(cluster) => cluster,
        Err(why) => {
            eprintln!("database restart test skipped: cannot run a private PostgreSQL: {why}");
            return;
        }
    };
    let schema = Schema::fresh(cluster.url());
    let config = PgConfig {
        connect_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_secs(2),
        health_interval: Duration::from_millis(100),
        ..schema.config()
    };
    let servers = [
        PgServer::start_with(config.clone()).await,
        PgServer::start_with(config).await,
    ];
    let channel = Channel::from_shared(format!("http://{}", servers[1].addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    assert_eq!(health_of(&mut health).await, ServingStatus::Serving);
    let ledger = Arc::new(Ledger::new(HOT_KEYS.len()));
    let outage = Arc::new(Outage::new());
    let mut clients = Vec::new();
    for worker in 0..6 {
        clients.push(servers[worker % 2].client().await);
    }
    let workers = outage_workers(
        clients,
        &HOT_KEYS,
        &ledger,
        &outage,
        Duration::from_secs(10),
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let before = ledger.grants.load(Ordering::Relaxed);
    assert!(before > 10, "too few grants before the restart: {before}");
    cluster.crash();
    outage.went_down();
    health_becomes(
        &mut health,
        ServingStatus::NotServing,
        Duration::from_secs(5),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    outage.coming_up();
    cluster
        .pg_ctl_start()
        .expect("start the private cluster again");
    health_becomes(&mut health, ServingStatus::Serving, Duration::from_secs(10)).await;
    outage_totals(workers).await;
    no_fence_regression(&mut servers[0].client().await, &HOT_KEYS, &ledger).await;
    drop(servers);
    drop(schema); // on the private cluster, which is still up
}

/// Many renewals at once (batched into shared statements) each get their
/// own answer: the live ones are extended with their fence, a wrong lease
/// id is PERMISSION_DENIED and a released fence FAILED_PRECONDITION, as when
/// sent alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_renewals_each_get_their_own_answer() {
    let schema = schema_or_skip!();
    let server = PgServer::start(&schema).await;
    let mut c = server.client().await;
    let mut leases = Vec::new();
    for i in 0..60 {
        leases.push(lease_of(
            c.acquire(acquire(&format!("r/{i}"), "a", 5_000))
                .await
                .unwrap(),
        ));
    }
    // Every third is released first: its renewal must be refused as stale.
    for lease in leases.iter().step_by(3) {
        c.release(release(lease, false)).await.unwrap();
    }
    let mut renewals = Vec::new();
    for (i, lease) in leases.iter().enumerate() {
        let mut c = c.clone();
        let mut request = renew(lease, 60_000);
        if i % 3 == 1 {
            request.lease_id = "00000000-0000-4000-8000-000000000000".into();
        }
        renewals.push(tokio::spawn(async move { c.renew(request).await }));
    }
    for (i, (lease, renewal)) in leases.iter().zip(renewals).enumerate() {
        let outcome = renewal.await.unwrap();
        match i % 3 {
            0 => assert!(
                matches!(
                    stale_reason(&outcome.unwrap_err()),
                    StaleReason::Released { .. }
                ),
                "{i}"
            ),
            1 => assert_eq!(outcome.unwrap_err().code(), Code::PermissionDenied, "{i}"),
            _ => {
                let renewed = outcome.unwrap().into_inner().lease.unwrap();
                assert_eq!(renewed.fence, lease.fence, "{i}");
                assert_eq!(renewed.ttl_ms, 60_000, "{i}");
                assert!(renewed.expires_at_ms >= lease.expires_at_ms + 50_000, "{i}");
            }
        }
    }
    // They really shared statements: fewer statements than renewals.
    let mut out = leasehold_server::metrics::Exposition::default();
    leasehold_server::Backend::write_metrics(&server.backend, &mut out);
    let text = out.into_text();
    let value = |name: &str| -> u64 {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
    };
    let (statements, carried) = (
        value("leasehold_pg_renew_batches_total"),
        value("leasehold_pg_renew_batched_total"),
    );
    assert_eq!(carried, 60, "every renewal went through a batch");
    assert!(
        statements < carried,
        "{statements} statements for {carried} renewals"
    );
}

/// Concurrent Acquires of free keys share statements, and so do their
/// Releases: every one is granted with its own rising fence, released, and
/// recorded in its key's history, with fewer statements than requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_and_releases_of_free_keys_share_statements() {
    let schema = schema_or_skip!();
    let server = PgServer::start(&schema).await;
    let c = server.client().await;
    let keys: Vec<String> = (0..40).map(|i| format!("b/{i}")).collect();
    let acquires: Vec<_> = keys
        .iter()
        .map(|key| {
            let (mut c, key) = (c.clone(), key.clone());
            tokio::spawn(async move { c.acquire(acquire(&key, "a", 5_000)).await })
        })
        .collect();
    let mut leases = Vec::new();
    for (key, acquired) in keys.iter().zip(acquires) {
        let lease = lease_of(acquired.await.unwrap().unwrap());
        assert_eq!(&lease.key, key);
        leases.push(lease);
    }
    let fences: HashSet<u64> = leases.iter().map(|l| l.fence).collect();
    assert_eq!(fences.len(), leases.len(), "every grant its own fence");
    let (statements, carried) = (
        counter(&server, "leasehold_pg_grant_batches_total"),
        counter(&server, "leasehold_pg_grant_batched_total"),
    );
    assert_eq!(carried, 40, "every grant went through a batch");
    assert!(
        statements < carried,
        "{statements} statements, {carried} grants"
    );

    let releases: Vec<_> = leases
        .iter()
        .map(|lease| {
            let (mut c, request) = (c.clone(), release(lease, false));
            tokio::spawn(async move { c.release(request).await })
        })
        .collect();
    for released in releases {
        released.await.unwrap().unwrap();
    }
    let (statements, carried) = (
        counter(&server, "leasehold_pg_release_batches_total"),
        counter(&server, "leasehold_pg_release_batched_total"),
    );
    assert_eq!(carried, 40, "every release went through a batch");
    assert!(
        statements < carried,
        "{statements} statements, {carried} releases"
    );

    let mut c = c.clone();
    for lease in &leases {
        let view = c.get(get(&lease.key)).await.unwrap().into_inner();
        assert!(view.lease.is_none(), "{} released", lease.key);
        let history = c
            .history(pb::HistoryRequest {
                key: lease.key.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(history.entries.len(), 1, "{}", lease.key);
        assert_eq!(history.entries[0].fence, lease.fence);
        // Free again: the next grant's fence is above every earlier one.
        let again = lease_of(c.acquire(acquire(&lease.key, "b", 5_000)).await.unwrap());
        assert!(again.fence > *fences.iter().max().unwrap());
    }
}

/// One batch of Acquires mixing free keys, held keys, a replay and a
/// reserved key answers each as if it were sent alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_mixing_grants_and_refusals_answers_each_alone() {
    let schema = schema_or_skip!();
    let server = PgServer::start(&schema).await;
    let mut c = server.client().await;
    let held = lease_of(
        c.acquire(pb::AcquireRequest {
            request_id: "r1".into(),
            ..acquire("m/held", "holder", 10_000)
        })
        .await
        .unwrap(),
    );
    let handed = lease_of(c.acquire(acquire("m/handoff", "x", 10_000)).await.unwrap());
    c.release(release_to(&handed, false, "heir", 10_000))
        .await
        .unwrap();
    let before = counter(&server, "leasehold_pg_grant_batched_total");
    let requests = [
        acquire("m/free/0", "a", 5_000),
        acquire("m/held", "a", 5_000),
        pb::AcquireRequest {
            request_id: "r1".into(),
            ..acquire("m/held", "holder", 10_000)
        },
        acquire("m/free/1", "a", 5_000),
        acquire("m/handoff", "a", 5_000),
        acquire("m/handoff", "heir", 5_000),
        acquire("m/free/2", "a", 5_000),
    ];
    let sent: Vec<_> = requests
        .into_iter()
        .map(|request| {
            let mut c = c.clone();
            tokio::spawn(async move { c.acquire(request).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for s in sent {
        outcomes.push(s.await.unwrap());
    }
    for i in [0, 3, 6] {
        let granted = outcomes[i].as_ref().unwrap().get_ref();
        assert!(!granted.replayed, "{i}");
        assert!(granted.lease.as_ref().unwrap().fence > handed.fence, "{i}");
    }
    let busy = outcomes[1].as_ref().unwrap_err();
    assert_eq!(busy.code(), Code::Aborted, "{busy:?}");
    assert!(busy.message().contains("holder"), "{busy:?}");
    let replay = outcomes[2].as_ref().unwrap().get_ref();
    assert!(replay.replayed);
    assert_eq!(replay.lease.as_ref().unwrap().fence, held.fence);
    // The handoff's successor takes the key whichever of the two came first
    // in the batch; the other is refused (reserved, or held by the heir).
    let heir = lease_of(outcomes.remove(5).unwrap());
    assert_eq!(heir.owner, "heir");
    assert!(outcomes[4].is_err(), "{:?}", outcomes[4]);
    assert!(counter(&server, "leasehold_pg_grant_batched_total") >= before + 7);
}

/// A batch of Releases mixing keys nobody waits for, a key with a waiter,
/// a stale fence and a wrong lease id: the free ones are released, the
/// waiter is served, and the others are refused as when sent alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_releases_serves_waiters_and_refuses_stale_ones() {
    let schema = schema_or_skip!();
    let server = PgServer::start(&schema).await;
    let mut c = server.client().await;
    let mut leases = Vec::new();
    for i in 0..6 {
        leases.push(lease_of(
            c.acquire(acquire(&format!("rel/{i}"), "a", 10_000))
                .await
                .unwrap(),
        ));
    }
    // rel/5 is released before, so its release below is a retry; rel/4 gets
    // a wrong lease id; rel/1 has a waiter.
    c.release(release(&leases[5], false)).await.unwrap();
    let mut w = server.client().await;
    let waiter =
        tokio::spawn(async move { w.acquire(waiting("rel/1", "w", 10_000, 10_000)).await });
    schema.in_line("rel/1", 1).await;
    let sent: Vec<_> = leases
        .iter()
        .enumerate()
        .map(|(i, lease)| {
            let mut request = release(lease, i == 2);
            if i == 4 {
                request.lease_id = "00000000-0000-4000-8000-000000000000".into();
            }
            let mut c = c.clone();
            tokio::spawn(async move { c.release(request).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for s in sent {
        outcomes.push(s.await.unwrap());
    }
    for i in [0, 1, 2, 3, 5] {
        assert!(outcomes[i].is_ok(), "{i}: {:?}", outcomes[i]);
    }
    assert_eq!(
        outcomes[4].as_ref().unwrap_err().code(),
        Code::PermissionDenied
    );
    let served = lease_of(waiter.await.unwrap().unwrap());
    assert_eq!(served.owner, "w");
    assert!(served.fence > leases[5].fence);
    let view = c.get(get("rel/2")).await.unwrap().into_inner();
    assert!(
        view.recoverable,
        "a suspended release leaves the key recoverable"
    );
    let view = c.get(get("rel/4")).await.unwrap().into_inner();
    assert_eq!(view.lease.unwrap().fence, leases[4].fence, "still held");
}

/// Two servers whose clients take and drop many keys without waiting (so
/// both servers' grant and release batches contend for the same rows):
/// never two holders of a key, fences rise per key, no deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_batching_contended_keys_keep_exclusion() {
    let schema = schema_or_skip!();
    let servers = [
        PgServer::start(&schema).await,
        PgServer::start(&schema).await,
    ];
    const KEYS: usize = 6;
    let holding: Arc<Vec<AtomicBool>> =
        Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
    let last_fence: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let grants = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for worker in 0..16 {
        let mut client = servers[worker % 2].client().await;
        let (holding, last_fence, grants) = (holding.clone(), last_fence.clone(), grants.clone());
        workers.push(tokio::spawn(async move {
            let owner = format!("w{worker}");
            let deadline = Instant::now() + Duration::from_secs(3);
            let mut round = 0;
            while Instant::now() < deadline {
                round += 1;
                let k = (worker * 7 + round) % KEYS;
                let key = format!("contended/{k}");
                let lease = match client.acquire(acquire(&key, &owner, 5_000)).await {
                    Ok(reply) => lease_of(reply),
                    Err(status) if status.code() == Code::Aborted => continue,
                    Err(status) => panic!("acquire: {status:?}"),
                };
                assert!(
                    !holding[k].swap(true, Ordering::SeqCst),
                    "two live terms on {key}"
                );
                let previous = last_fence[k].swap(lease.fence, Ordering::SeqCst);
                assert!(
                    lease.fence > previous,
                    "fence {} after {previous}",
                    lease.fence
                );
                grants.fetch_add(1, Ordering::Relaxed);
                holding[k].store(false, Ordering::SeqCst);
                client
                    .release(release(&lease, false))
                    .await
                    .expect("release");
            }
        }));
    }
    for worker in workers {
        worker.await.expect("worker");
    }
    assert!(
        grants.load(Ordering::Relaxed) > 50,
        "too few grants to mean anything"
    );
    for server in &servers {
        assert!(counter(server, "leasehold_pg_grant_batches_total") > 0);
        assert!(counter(server, "leasehold_pg_release_batches_total") > 0);
    }
}

/// Every way a term ends records it in the history exactly once, and the
/// history keeps exactly the newest `history_len` (#12: the statements
/// that end a term write its entry into the key's ring, and a lone release
/// skips the row lock taken first): a lone release, an
/// expiry moved by the grant that replaces it, an expiry moved by the
/// sweeper and then found again by a grant (which must not record it twice,
/// nor fail), and releases batched together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ended_term_is_recorded_once_and_the_newest_are_kept() {
    let schema = schema_or_skip!();
    let server = PgServer::start_with(PgConfig {
        history_len: 6,
        ..schema.config_without_sweeper()
    })
    .await;
    let mut c = server.client().await;
    let history = |mut c: LeaseholdClient<Channel>, key: &str| {
        let key = key.to_string();
        async move {
            c.history(pb::HistoryRequest {
                key,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .entries
            .iter()
            .map(|h| (h.fence, h.end))
            .collect::<Vec<_>>()
        }
    };
    let (released, expired) = (pb::TermEnd::Released as i32, pb::TermEnd::Expired as i32);
    let mut ended = Vec::new();

    let lone = lease_of(c.acquire(acquire("h", "a", 5_000)).await.unwrap());
    c.release(release(&lone, false)).await.unwrap();
    ended.push((lone.fence, released));

    // Expired, and moved by the grant that replaces it.
    let lapsed = lease_of(c.acquire(acquire("h", "a", 200)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let next = lease_of(c.acquire(acquire("h", "b", 5_000)).await.unwrap());
    ended.push((lapsed.fence, expired));
    c.release(release(&next, false)).await.unwrap();
    ended.push((next.fence, released));

    // Expired, moved by the sweeper, then offered again by a grant.
    let lapsed = lease_of(c.acquire(acquire("h", "a", 200)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    server.backend.sweep().await.unwrap();
    let next = lease_of(c.acquire(acquire("h", "b", 5_000)).await.unwrap());
    ended.push((lapsed.fence, expired));
    c.release(release(&next, false)).await.unwrap();
    ended.push((next.fence, released));
    let mut newest_first = ended.clone();
    newest_first.reverse();
    assert_eq!(history(c.clone(), "h").await, newest_first);

    for i in 0..4 {
        let lease = lease_of(
            c.acquire(acquire("h", &format!("w{i}"), 5_000))
                .await
                .unwrap(),
        );
        c.release(release(&lease, false)).await.unwrap();
        ended.push((lease.fence, released));
    }
    // `ended` is in fence order (each term began after the one before).
    let newest_first: Vec<_> = ended.iter().rev().take(6).cloned().collect();
    assert_eq!(history(c.clone(), "h").await, newest_first);
    let db = schema.db().await;
    let rows: i64 = db
        .query_one("SELECT count(*) FROM term_history WHERE key = 'h'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 6, "a ring of 6");

    // Releases batched together: each term once.
    let keys: Vec<String> = (0..24).map(|i| format!("m/{i}")).collect();
    for round in 0..8 {
        let cycles: Vec<_> = keys
            .iter()
            .map(|key| {
                let (mut c, key) = (c.clone(), key.clone());
                tokio::spawn(async move {
                    let lease = lease_of(c.acquire(acquire(&key, "m", 5_000)).await.unwrap());
                    c.release(release(&lease, false)).await.unwrap();
                    lease.fence
                })
            })
            .collect();
        for (key, cycle) in keys.iter().zip(cycles) {
            let fence = cycle.await.unwrap();
            let got = history(c.clone(), key).await;
            assert_eq!(got.len(), (round + 1).min(6), "{key}: {got:?}");
            assert_eq!(got[0], (fence, released), "{key}");
        }
    }
    assert!(
        counter(&server, "leasehold_pg_release_batches_total")
            < counter(&server, "leasehold_pg_release_batched_total"),
        "some releases shared a statement"
    );
}

/// Every page of a key's History, newest first, `page_size` at a time: the
/// fences, and how each term ended.
async fn history_pages(
    c: &mut LeaseholdClient<Channel>,
    key: &str,
    page_size: u32,
) -> Vec<(u64, i32)> {
    let mut entries = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = c
            .history(pb::HistoryRequest {
                key: key.into(),
                page_size,
                page_token,
            })
            .await
            .unwrap()
            .into_inner();
        entries.extend(page.entries.iter().map(|h| (h.fence, h.end)));
        if page.next_page_token.is_empty() {
            return entries;
        }
        page_token = page.next_page_token;
    }
}

/// Acquires and releases `key` `n` times through `c`, appending each
/// term's fence to `ended`.
async fn cycles(c: &mut LeaseholdClient<Channel>, key: &str, n: usize, ended: &mut Vec<u64>) {
    for _ in 0..n {
        let lease = lease_of(c.acquire(acquire(key, "cycler", 5_000)).await.unwrap());
        c.release(release(&lease, false)).await.unwrap();
        ended.push(lease.fence);
    }
}

/// The newest `n` of `ended` (in fence order), newest first.
fn newest(ended: &[u64], n: usize) -> Vec<u64> {
    ended.iter().rev().take(n).copied().collect()
}

fn fences(entries: &[(u64, i32)]) -> Vec<u64> {
    entries.iter().map(|(fence, _)| *fence).collect()
}

/// The rows a key's history takes in the database.
async fn history_rows(schema: &Schema, key: &str) -> i64 {
    schema
        .db()
        .await
        .query_one("SELECT count(*) FROM term_history WHERE key = $1", &[&key])
        .await
        .unwrap()
        .get(0)
}

/// History wraps around the key's ring (#12, migration 0008): after many
/// more terms than `history_len`, every page shows exactly the newest, in
/// order, and the key keeps that many rows.
#[tokio::test]
async fn history_after_the_ring_wraps_shows_exactly_the_newest() {
    let schema = schema_or_skip!();
    let server = PgServer::start_with(PgConfig {
        history_len: 5,
        ..schema.config_without_sweeper()
    })
    .await;
    let mut c = server.client().await;
    let mut ended = Vec::new();
    for n in [3, 2, 1, 7, 4] {
        cycles(&mut c, "ring", n, &mut ended).await;
        let want = newest(&ended, 5);
        assert_eq!(fences(&history_pages(&mut c, "ring", 2).await), want);
        assert_eq!(fences(&history_pages(&mut c, "ring", 100).await), want);
        assert_eq!(history_rows(&schema, "ring").await, want.len() as i64);
    }
}

/// Servers restarted with another `history_len` on one schema (#12): a
/// longer length loses none of the entries kept and shows the newest as
/// they come (its ring grows, here from one that had wrapped mid-way); a
/// shorter one shows its own newest, and the entries beyond it stay for
/// a longer length started later.
#[tokio::test]
async fn history_survives_length_changes_between_starts() {
    let schema = schema_or_skip!();
    let start = |history_len| {
        PgServer::start_with(PgConfig {
            history_len,
            ..schema.config_without_sweeper()
        })
    };
    let mut ended = Vec::new();

    let mut four = start(4).await;
    let mut c = four.client().await;
    cycles(&mut c, "len", 6, &mut ended).await;
    assert_eq!(
        fences(&history_pages(&mut c, "len", 3).await),
        newest(&ended, 4)
    );
    four.stop().await;

    // Longer: the four kept stay, and the ring fills up to seven.
    let mut seven = start(7).await;
    let mut c = seven.client().await;
    assert_eq!(
        fences(&history_pages(&mut c, "len", 3).await),
        newest(&ended, 4)
    );
    for n in [1, 1, 1, 1, 5] {
        let kept = history_pages(&mut c, "len", 100).await.len();
        cycles(&mut c, "len", n, &mut ended).await;
        let want = newest(&ended, (kept + n).min(7));
        assert_eq!(fences(&history_pages(&mut c, "len", 3).await), want);
    }
    seven.stop().await;

    // Shorter: exactly its own newest three.
    let mut three = start(3).await;
    let mut c = three.client().await;
    for n in [0, 2, 4] {
        cycles(&mut c, "len", n, &mut ended).await;
        assert_eq!(
            fences(&history_pages(&mut c, "len", 2).await),
            newest(&ended, 3)
        );
    }
    three.stop().await;

    // Longer again: the terms the shorter server recorded, and the ones
    // before them, are all there.
    let seven = start(7).await;
    let mut c = seven.client().await;
    assert_eq!(
        fences(&history_pages(&mut c, "len", 3).await),
        newest(&ended, 7)
    );
    cycles(&mut c, "len", 2, &mut ended).await;
    assert_eq!(
        fences(&history_pages(&mut c, "len", 4).await),
        newest(&ended, 7)
    );
    assert_eq!(history_rows(&schema, "len").await, 7);
}

/// Two servers with different `history_len` serving one key at once (#12):
/// each shows exactly its own newest, whichever server ended the terms.
#[tokio::test]
async fn servers_with_different_lengths_each_show_their_newest() {
    let schema = schema_or_skip!();
    let start = |history_len| {
        PgServer::start_with(PgConfig {
            history_len,
            ..schema.config_without_sweeper()
        })
    };
    let (short, long) = (start(2).await, start(6).await);
    let (mut s, mut l) = (short.client().await, long.client().await);
    let mut ended = Vec::new();
    for n in [3, 0, 2, 1, 4] {
        cycles(&mut l, "two", 1, &mut ended).await;
        cycles(&mut s, "two", n, &mut ended).await;
        assert_eq!(
            fences(&history_pages(&mut s, "two", 1).await),
            newest(&ended, 2)
        );
        assert_eq!(
            fences(&history_pages(&mut l, "two", 4).await),
            newest(&ended, 6)
        );
    }

    // The shorter server first: what it kept, then the longer one's ring.
    let mut ended = Vec::new();
    cycles(&mut s, "short-first", 3, &mut ended).await;
    assert_eq!(
        fences(&history_pages(&mut l, "short-first", 4).await),
        newest(&ended, 2)
    );
    for (by_long, by_short, shown) in [(1, 0, 3), (0, 2, 5), (3, 0, 6), (0, 5, 6)] {
        cycles(&mut l, "short-first", by_long, &mut ended).await;
        cycles(&mut s, "short-first", by_short, &mut ended).await;
        assert_eq!(
            fences(&history_pages(&mut s, "short-first", 1).await),
            newest(&ended, 2)
        );
        assert_eq!(
            fences(&history_pages(&mut l, "short-first", 4).await),
            newest(&ended, shown)
        );
    }
}

/// A term the sweeper moved to ended is recorded once when a grant then
/// replaces it, also once the key's ring is full and wrapped (#12): the
/// grant offers the term again, and must neither record it a second time
/// nor overwrite an older entry with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swept_expiry_is_recorded_once_when_a_grant_replaces_it() {
    let schema = schema_or_skip!();
    let server = PgServer::start_with(PgConfig {
        history_len: 3,
        ..schema.config_without_sweeper()
    })
    .await;
    let mut c = server.client().await;
    let (released, expired) = (pb::TermEnd::Released as i32, pb::TermEnd::Expired as i32);
    let mut ended = Vec::new();
    for round in 0..4 {
        let mut fences_ended = Vec::new();
        cycles(&mut c, "swept", round + 1, &mut fences_ended).await;
        ended.extend(fences_ended.iter().map(|fence| (*fence, released)));
        let lapsed = lease_of(c.acquire(acquire("swept", "a", 200)).await.unwrap());
        tokio::time::sleep(Duration::from_millis(400)).await;
        server.backend.sweep().await.unwrap();
        ended.push((lapsed.fence, expired));
        let reply = c
            .acquire(acquire("swept", "b", 5_000))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.previous.unwrap().fence, lapsed.fence);
        let next = reply.lease.unwrap();
        let want: Vec<_> = ended.iter().rev().take(3).copied().collect();
        assert_eq!(
            history_pages(&mut c, "swept", 100).await,
            want,
            "round {round}"
        );
        c.release(release(&next, false)).await.unwrap();
        ended.push((next.fence, released));
        let want: Vec<_> = ended.iter().rev().take(3).copied().collect();
        assert_eq!(
            history_pages(&mut c, "swept", 2).await,
            want,
            "round {round}"
        );
    }
    assert_eq!(history_rows(&schema, "swept").await, 3);
}

/// Migration 0008 turns each key's history rows into its ring keeping every
/// entry (#12): a key with more rows than `history_len` shows its newest,
/// a key with fewer shows all, and both go on recording in order.
#[tokio::test]
async fn the_ring_migration_keeps_the_newest_entries() {
    let schema = schema_or_skip!();
    let (db, connection) = tokio_postgres::connect(&schema.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let name = &schema.name;
    db.batch_execute(&format!(
        "CREATE SCHEMA {name}; SET search_path = {name};
         CREATE TABLE leasehold_migrations (version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp());"
    ))
    .await
    .unwrap();
    // Version 7, as a server of that version left it.
    for (index, migration) in leasehold_server::postgres::migrate::MIGRATIONS[..7]
        .iter()
        .enumerate()
    {
        db.batch_execute(migration).await.unwrap();
        db.execute(
            "INSERT INTO leasehold_migrations (version) VALUES ($1)",
            &[&(index as i32 + 1)],
        )
        .await
        .unwrap();
    }
    db.batch_execute(
        "SELECT setval('fences', 1000);
         INSERT INTO keys (key, ended_fence, ended_owner, ended_lease_id, ended_end, ended_at_ms,
                           ended_acquired_at_ms)
         VALUES ('many', 110, 'o', gen_random_uuid(), 1, now_ms(), now_ms()),
                ('few', 202, 'o', gen_random_uuid(), 1, now_ms(), now_ms());
         INSERT INTO term_history (key, fence, owner, acquired_at_ms, ended_at_ms, end_kind,
                                   unsettled_tool_calls, handed_off)
         SELECT 'many', f, 'o', now_ms(), now_ms(), CASE WHEN f % 3 = 0 THEN 3 ELSE 1 END, 0, false
         FROM generate_series(101, 110) f
         UNION ALL
         SELECT 'few', f, 'o', now_ms(), now_ms(), 1, 0, false FROM generate_series(201, 202) f;",
    )
    .await
    .unwrap();

    let server = PgServer::start_with(PgConfig {
        history_len: 4,
        ..schema.config_without_sweeper()
    })
    .await;
    let mut c = server.client().await;
    let mut many: Vec<u64> = (101..=110).collect();
    let mut few: Vec<u64> = vec![201, 202];
    let got = history_pages(&mut c, "many", 3).await;
    assert_eq!(fences(&got), newest(&many, 4));
    let expired = pb::TermEnd::Expired as i32;
    assert_eq!(got[2], (108, expired), "the end kinds came along");
    assert_eq!(
        fences(&history_pages(&mut c, "few", 3).await),
        newest(&few, 4)
    );
    for n in [1, 3, 9] {
        cycles(&mut c, "many", n, &mut many).await;
        cycles(&mut c, "few", n, &mut few).await;
        assert_eq!(
            fences(&history_pages(&mut c, "many", 3).await),
            newest(&many, 4)
        );
        assert_eq!(
            fences(&history_pages(&mut c, "few", 3).await),
            newest(&few, 4)
        );
    }
    assert_eq!(
        history_rows(&schema, "many").await,
        10,
        "the ring never shrinks"
    );
    assert_eq!(history_rows(&schema, "few").await, 4);
}

/// A waiter cancelled while a release serves the line (its row deleted
/// after the serving statement's snapshot) is not granted the key: no ghost
/// term that nobody holds until its TTL runs out; the key is free at once.
#[tokio::test]
async fn a_waiter_cancelled_while_the_line_is_served_leaves_no_ghost_term() {
    let schema = schema_or_skip!();
    let server = PgServer::start(&schema).await;
    let mut c = server.client().await;
    let lease = lease_of(c.acquire(acquire("k", "a", 10_000)).await.unwrap());
    let db = schema.db().await;
    // A waiter in line (as a waiting Acquire's row is), alive for a minute.
    let waiter: i64 = db
        .query_one(
            "INSERT INTO waiters (key, owner, ttl_ms, wait_until_ms, alive_until_ms)
             SELECT 'k', 'leaving', 60000, now_ms() + 60000, now_ms() + 60000 RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // Its request is being cancelled: the row is locked for the delete.
    let cancel = schema.db().await;
    cancel
        .batch_execute(&format!(
            "BEGIN; SELECT id FROM waiters WHERE id = {waiter} FOR UPDATE"
        ))
        .await
        .unwrap();
    let mut r = server.client().await;
    let released = tokio::spawn(async move { r.release(release(&lease, false)).await });
    // The release has picked the waiter and waits to mark it granted.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let blocked: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE waiters SET granted_fence%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if blocked > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the release never tried to mark the waiter"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancel
        .batch_execute(&format!("DELETE FROM waiters WHERE id = {waiter}; COMMIT"))
        .await
        .unwrap();
    released.await.unwrap().expect("the release succeeds");
    let state = c.get(get("k")).await.unwrap().into_inner();
    assert!(
        state.lease.is_none(),
        "the key went to a waiter that had left: {:?}",
        state.lease
    );
    let newcomer = lease_of(c.acquire(acquire("k", "b", 5_000)).await.unwrap());
    assert_eq!(newcomer.owner, "b");
}
