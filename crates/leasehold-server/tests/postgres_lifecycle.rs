//! The ownership lifecycle (#15) where only PostgreSQL has something to
//! show, over real gRPC: several servers on one schema (a successor waiting
//! through another server, contention, turns), history trimmed per server,
//! waiters refused by a quarantine from the server default, a term's
//! recovery limit fixed at its grant, and one expiry acted on by many. The
//! lifecycle contract both backends share is in `contract.rs`, which also
//! runs its expiry cases on PostgreSQL without the sweeper
//! (`postgres_lazy::…`).

mod common;
mod pg_harness;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::requests::{acquire, lease_of, limited, reason, release_to};
use leasehold_server::postgres::PgConfig;
use leasehold_wire::pb;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;
use pg_harness::PgServer;
use tonic::Code;
use tonic::transport::Channel;

fn waiting(request: pb::AcquireRequest, wait_ms: u64) -> pb::AcquireRequest {
    pb::AcquireRequest { wait_ms, ..request }
}

async fn get(client: &mut LeaseholdClient<Channel>, key: &str) -> pb::GetResponse {
    client
        .get(pb::GetRequest { key: key.into() })
        .await
        .unwrap()
        .into_inner()
}

async fn history(client: &mut LeaseholdClient<Channel>, key: &str) -> Vec<pb::HistoryEntry> {
    client
        .history(pb::HistoryRequest {
            key: key.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries
}

/// Sleeps until the database's clock has passed `at_ms`.
async fn until_db_time(schema: &pg_harness::Schema, at_ms: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = schema.now_ms().await;
        if now > at_ms {
            return;
        }
        assert!(Instant::now() < deadline, "the database clock stands still");
        tokio::time::sleep(Duration::from_millis((at_ms - now + 1).min(200))).await;
    }
}

/// Two servers on one schema: the successor already waits in line (through
/// the other server) behind an earlier waiter; the release hands it the key
/// at once, ahead of that waiter, and the earlier waiter is served next.
/// A successor that arrives later through the other server gets it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_in_line_on_another_server_goes_first() {
    let schema = schema_or_skip!();
    let one = PgServer::start(&schema).await;
    let two = PgServer::start(&schema).await;
    let mut c1 = one.client().await;
    let held = lease_of(c1.acquire(acquire("s", "worker", 5000)).await.unwrap());
    let mut early = one.client().await;
    let early_wait = tokio::spawn(async move {
        early
            .acquire(waiting(acquire("s", "early", 5000), 10_000))
            .await
    });
    schema.in_line("s", 1).await;
    let mut ui = two.client().await;
    let ui_wait =
        tokio::spawn(async move { ui.acquire(waiting(acquire("s", "ui", 5000), 10_000)).await });
    schema.in_line("s", 2).await;
    c1.release(release_to(&held, false, "ui", 10_000))
        .await
        .unwrap();
    let ui_reply = tokio::time::timeout(Duration::from_secs(5), ui_wait)
        .await
        .expect("the successor is served at once")
        .unwrap()
        .unwrap()
        .into_inner();
    assert!(ui_reply.previous.as_ref().unwrap().handed_off);
    assert!(!early_wait.is_finished(), "the earlier waiter went first");
    let ui_lease = ui_reply.lease.unwrap();
    let mut c2 = two.client().await;
    c2.release(release_to(&ui_lease, false, "", 0))
        .await
        .unwrap();
    let early_reply = tokio::time::timeout(Duration::from_secs(10), early_wait)
        .await
        .expect("the earlier waiter follows")
        .unwrap()
        .unwrap()
        .into_inner();
    let early_lease = early_reply.lease.unwrap();
    assert_eq!(early_lease.owner, "early");
    assert!(early_lease.fence > ui_lease.fence);

    // Handed off through one server, taken through the other.
    c1.release(release_to(&early_lease, false, "late-ui", 10_000))
        .await
        .unwrap();
    let refused = c1.acquire(acquire("s", "x", 5000)).await.unwrap_err();
    assert_eq!(reason(&refused), "handoff");
    let late = c2
        .acquire(acquire("s", "late-ui", 5000))
        .await
        .unwrap()
        .into_inner();
    assert!(late.previous.unwrap().handed_off);
}

/// Each key keeps its newest `history_len` entries (in a ring of that many
/// rows, overwritten in turn), and the history goes with the key when it
/// is forgotten.
#[tokio::test]
async fn history_is_bounded_and_forgotten_with_the_key() {
    let schema = schema_or_skip!();
    let server = PgServer::start_with(PgConfig {
        history_len: 3,
        retention_ms: 300,
        ..schema.config()
    })
    .await;
    let mut client = server.client().await;
    let mut fences = Vec::new();
    for i in 0..5 {
        let lease = lease_of(
            client
                .acquire(acquire("b", &format!("w{i}"), 5000))
                .await
                .unwrap(),
        );
        fences.push(lease.fence);
        client
            .release(release_to(&lease, false, "", 0))
            .await
            .unwrap();
    }
    let got: Vec<u64> = history(&mut client, "b")
        .await
        .iter()
        .map(|h| h.fence)
        .collect();
    assert_eq!(got, vec![fences[4], fences[3], fences[2]]);
    let db = schema.db().await;
    let rows: i64 = db
        .query_one("SELECT count(*) FROM term_history WHERE key = 'b'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 3);

    // Released cleanly: forgotten after the retention, history and all.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = client.get(pb::GetRequest { key: "b".into() }).await.err();
        if status.is_some_and(|s| s.code() == Code::NotFound) {
            break;
        }
        assert!(Instant::now() < deadline, "never forgotten");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows: i64 = db
        .query_one("SELECT count(*) FROM term_history WHERE key = 'b'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);
    let again = lease_of(client.acquire(acquire("b", "new", 5000)).await.unwrap());
    assert!(again.fence > fences[4]);
    client
        .release(release_to(&again, false, "", 0))
        .await
        .unwrap();
    let got: Vec<u64> = history(&mut client, "b")
        .await
        .iter()
        .map(|h| h.fence)
        .collect();
    assert_eq!(got, vec![again.fence]);
}

/// The server default (`--max-recoveries`) quarantines keys whose Acquire
/// sets no limit; a waiting Acquire is refused (not left waiting) when the
/// key it waits for becomes quarantined, while a forced one waiting
/// alongside gets the key.
#[tokio::test]
async fn waiters_are_refused_when_the_key_becomes_quarantined() {
    let schema = schema_or_skip!();
    let server = PgServer::start_with(PgConfig {
        default_max_recoveries: Some(1),
        ..schema.config()
    })
    .await;
    let mut client = server.client().await;
    let held = lease_of(client.acquire(acquire("p", "worker", 5000)).await.unwrap());
    let mut plain = server.client().await;
    let plain_wait = tokio::spawn(async move {
        plain
            .acquire(waiting(acquire("p", "w", 5000), 10_000))
            .await
    });
    schema.in_line("p", 1).await;
    let mut forced = server.client().await;
    let forced_wait = tokio::spawn(async move {
        let request = pb::AcquireRequest {
            force: true,
            ..waiting(acquire("p", "ops", 5000), 10_000)
        };
        forced.acquire(request).await
    });
    schema.in_line("p", 2).await;
    client
        .release(release_to(&held, true, "", 0))
        .await
        .unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(5), plain_wait)
        .await
        .expect("refused at once, not at the end of its wait")
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(reason(&refused), "quarantined");
    let ops = tokio::time::timeout(Duration::from_secs(5), forced_wait)
        .await
        .expect("the forced waiter is served")
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(ops.lease.unwrap().owner, "ops");

    // With nobody forced in line, the key stays free and the waiter is
    // refused all the same.
    let held = lease_of(client.acquire(acquire("p2", "worker", 5000)).await.unwrap());
    let mut plain = server.client().await;
    let plain_wait = tokio::spawn(async move {
        plain
            .acquire(waiting(acquire("p2", "w", 5000), 10_000))
            .await
    });
    schema.in_line("p2", 1).await;
    client
        .release(release_to(&held, true, "", 0))
        .await
        .unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(5), plain_wait)
        .await
        .expect("refused at once, not at the end of its wait")
        .unwrap()
        .unwrap_err();
    assert_eq!(reason(&refused), "quarantined", "{refused:?}");
    assert!(get(&mut client, "p2").await.lease.is_none());
}

/// A term carries the recovery limit of the server that granted it: with
/// two servers on one schema whose `--max-recoveries` differ, a term's end
/// quarantines the key (or not) whichever server ends it.
#[tokio::test]
async fn a_terms_recovery_limit_is_fixed_when_it_is_granted() {
    let schema = schema_or_skip!();
    let strict = PgServer::start_with(PgConfig {
        default_max_recoveries: Some(1),
        ..schema.config()
    })
    .await;
    let lenient = PgServer::start(&schema).await;
    let mut s = strict.client().await;
    let mut l = lenient.client().await;

    // Granted by the lenient server, suspended through the strict one.
    let a = lease_of(l.acquire(acquire("a", "w", 5000)).await.unwrap());
    s.release(release_to(&a, true, "", 0)).await.unwrap();
    assert!(!get(&mut s, "a").await.quarantined);

    // Granted by the strict server, suspended through the lenient one.
    let b = lease_of(s.acquire(acquire("b", "w", 5000)).await.unwrap());
    l.release(release_to(&b, true, "", 0)).await.unwrap();
    let refused = l.acquire(acquire("b", "w", 5000)).await.unwrap_err();
    assert_eq!(reason(&refused), "quarantined", "{refused:?}");
}

/// Many Acquires through two servers race for a key whose term expired with
/// nobody acting on it: exactly one wins, and the expiry is recorded once
/// (one history entry, one failure: K = 2 does not quarantine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_is_recorded_once_however_many_act_on_it() {
    let schema = schema_or_skip!();
    let one = PgServer::start_with(schema.config_without_sweeper()).await;
    let two = PgServer::start_with(schema.config_without_sweeper()).await;
    let mut c1 = one.client().await;
    let held = lease_of(c1.acquire(limited("e", "dead", 200, 2)).await.unwrap());
    until_db_time(&schema, held.expires_at_ms).await;
    let mut racers = Vec::new();
    for i in 0..8 {
        let mut client = if i % 2 == 0 {
            one.client().await
        } else {
            two.client().await
        };
        racers.push(tokio::spawn(async move {
            client
                .acquire(limited("e", &format!("r{i}"), 5000, 2))
                .await
        }));
    }
    let mut winners = Vec::new();
    for racer in racers {
        match racer.await.unwrap() {
            Ok(reply) => winners.push(reply.into_inner()),
            Err(status) => assert_eq!(status.code(), Code::Aborted, "{status:?}"),
        }
    }
    assert_eq!(winners.len(), 1);
    assert_eq!(winners[0].previous.as_ref().unwrap().fence, held.fence);
    let entries = history(&mut c1, "e").await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].fence, held.fence);
    assert_eq!(entries[0].end, pb::TermEnd::Expired as i32);
    let state = get(&mut c1, "e").await;
    assert!(!state.quarantined, "one expiry counted twice");
}

/// Eight workers through two servers take two keys over and over, each
/// release handing the key to a named successor, suspending it or
/// releasing it, with quarantine at K = 3 (even workers force): at most one
/// holder at a time, fences rise, a handed-off grant always went to the
/// owner its predecessor named, and nothing fails but with a refusal
/// (never UNAVAILABLE from a deadlock or a race).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_hand_off_and_quarantine_under_contention() {
    let schema = schema_or_skip!();
    let servers = [
        PgServer::start(&schema).await,
        PgServer::start(&schema).await,
    ];
    let keys = ["hot/0", "hot/1"];
    let holding: Arc<Vec<AtomicBool>> =
        Arc::new(keys.iter().map(|_| AtomicBool::new(false)).collect());
    let last_fence: Arc<Vec<AtomicU64>> =
        Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
    let named: Arc<Mutex<HashMap<(usize, u64), String>>> = Arc::default();
    let (grants, handed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut workers = Vec::new();
    for worker in 0..8usize {
        let mut client = servers[worker % 2].client().await;
        let (holding, last_fence, named) = (holding.clone(), last_fence.clone(), named.clone());
        let (grants, handed) = (grants.clone(), handed.clone());
        workers.push(tokio::spawn(async move {
            let owner = format!("w{worker}");
            let deadline = Instant::now() + Duration::from_secs(4);
            let mut round = 0;
            while Instant::now() < deadline {
                round += 1;
                let k = (worker + round) % keys.len();
                let request = pb::AcquireRequest {
                    max_recoveries: 3,
                    force: worker % 2 == 0,
                    ..waiting(acquire(keys[k], &owner, 5_000), 1_000)
                };
                let reply = match client.acquire(request).await {
                    Ok(reply) => reply.into_inner(),
                    Err(status)
                        if status.code() == Code::Aborted
                            || (status.code() == Code::FailedPrecondition
                                && reason(&status) == "quarantined") =>
                    {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    Err(status) => panic!("acquire: {status:?}"),
                };
                let lease = reply.lease.clone().unwrap();
                assert!(
                    !holding[k].swap(true, Ordering::SeqCst),
                    "two live terms on {}",
                    keys[k]
                );
                let previous_fence = last_fence[k].swap(lease.fence, Ordering::SeqCst);
                assert!(
                    lease.fence > previous_fence,
                    "fence {} after {previous_fence}",
                    lease.fence
                );
                grants.fetch_add(1, Ordering::Relaxed);
                if let Some(previous) = reply.previous.as_ref().filter(|p| p.handed_off) {
                    let successor = named.lock().unwrap().get(&(k, previous.fence)).cloned();
                    assert_eq!(
                        successor.as_deref(),
                        Some(owner.as_str()),
                        "handed to the wrong owner"
                    );
                    handed.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                holding[k].store(false, Ordering::SeqCst);
                let release = match round % 3 {
                    0 => {
                        let successor = format!("w{}", (worker + 1) % 8);
                        named
                            .lock()
                            .unwrap()
                            .insert((k, lease.fence), successor.clone());
                        release_to(&lease, false, &successor, 300)
                    }
                    1 => release_to(&lease, true, "", 0),
                    _ => release_to(&lease, false, "", 0),
                };
                client.release(release).await.expect("release");
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
    assert!(handed.load(Ordering::Relaxed) > 0, "no handoff was taken");
}

fn calls_in_turn(
    lease: &pb::Lease,
    ids: &[&str],
    turn: &str,
    across_turns: bool,
) -> pb::BeginToolCallsRequest {
    pb::BeginToolCallsRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        calls: ids
            .iter()
            .map(|id| pb::ToolCallSpec {
                call_id: (*id).into(),
                name: "shell".into(),
                input_digest: String::new(),
            })
            .collect(),
        turn: turn.into(),
        across_turns,
    }
}

fn settle_in_turn(lease: &pb::Lease, id: &str, turn: &str) -> pb::SettleToolCallRequest {
    pb::SettleToolCallRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        call_id: id.into(),
        outcome: pb::ToolCallState::Succeeded as i32,
        turn: turn.into(),
        ..Default::default()
    }
}

/// Turn-scoped call ids through two servers on one schema: what one
/// server recorded in each turn, the other sees, refuses and settles by
/// turn. (The turn rules themselves are in the contract suite,
/// `tool_calls.rs`, on both backends.)
#[tokio::test]
async fn a_second_server_applies_the_same_turn_rules() {
    let schema = schema_or_skip!();
    let one = PgServer::start(&schema).await;
    let mut client = one.client().await;
    let lease = lease_of(client.acquire(acquire("s", "w", 60_000)).await.unwrap());
    for turn in ["t1", "t2"] {
        let begun = client
            .begin_tool_calls(calls_in_turn(&lease, &["call_0"], turn, false))
            .await
            .unwrap()
            .into_inner();
        assert!(!begun.duplicate);
    }
    client
        .settle_tool_call(settle_in_turn(&lease, "call_0", "t1"))
        .await
        .unwrap();

    // Another server on the schema sees the same ledger and rules.
    let two = PgServer::start(&schema).await;
    let mut other = two.client().await;
    let calls = other
        .list_tool_calls(pb::ListToolCallsRequest {
            key: "s".into(),
            filter: 2, // ALL
        })
        .await
        .unwrap()
        .into_inner()
        .calls;
    let turns: Vec<(&str, i32)> = calls.iter().map(|c| (c.turn.as_str(), c.state)).collect();
    assert_eq!(
        turns,
        [
            ("t1", pb::ToolCallState::Succeeded as i32),
            ("t2", pb::ToolCallState::Running as i32)
        ]
    );
    let dup = other
        .begin_tool_calls(calls_in_turn(&lease, &["call_0"], "t2", false))
        .await
        .unwrap()
        .into_inner();
    assert!(dup.duplicate, "refused through the other server too");
    let settled = other
        .settle_tool_call(settle_in_turn(&lease, "call_0", "t2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(settled.call.unwrap().turn, "t2");
}

/// Begins of one id racing through two servers, one asking `across_turns`
/// in a turn and one naming no turn, never both record: each checks every
/// turn, whichever comes second sees the first (they cannot both read the
/// ledger before either wrote), though no unique index covers the pair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_begins_in_different_turns_respect_the_unscoped_rule() {
    let schema = schema_or_skip!();
    let (one, two) = (
        PgServer::start(&schema).await,
        PgServer::start(&schema).await,
    );
    let (mut a, mut b) = (one.client().await, two.client().await);
    let lease = lease_of(a.acquire(acquire("race", "w", 60_000)).await.unwrap());
    for round in 0..30 {
        let id = format!("call_{round}");
        let (scoped, unscoped) = tokio::join!(
            a.begin_tool_calls(calls_in_turn(&lease, &[&id], "t1", true)),
            b.begin_tool_calls(calls_in_turn(&lease, &[&id], "", false)),
        );
        let recorded = [scoped, unscoped]
            .into_iter()
            .filter(|r| !r.as_ref().unwrap().get_ref().duplicate)
            .count();
        assert_eq!(recorded, 1, "round {round}: both or neither recorded {id}");
    }
}
