//! Several servers on one schema: mutual exclusion and rising fences, a
//! stopped or killed server, the Session stream, the Rust guard renewing
//! through another server.

use super::*;

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
