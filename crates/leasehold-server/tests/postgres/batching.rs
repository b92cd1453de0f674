//! Statements shared by concurrent requests: renewals, grants and releases
//! batched, each answered alone, exclusion across servers.

use super::*;

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
