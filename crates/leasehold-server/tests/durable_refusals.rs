//! Refusals, list pages and abandoned waits against a store whose commit the
//! test holds and then fails, standing in for a crash (or an fsync error)
//! mid-commit. A refusal describes a key's state ("held by a, fence 1",
//! "released", a live fence with the wrong lease_id), so it may only be sent
//! once that state is durable, exactly like a success: otherwise a client is
//! told of a grant or a release that the restart then undoes.

mod common;

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use leasehold_core::lessor::Acquire;
use leasehold_core::lessor::ListFilter;
use leasehold_core::store::Batch;
use leasehold_core::store::{Snapshot, Store, StoreError};
use leasehold_core::{
    Clock, Error, Fence, Key, LeaseId, ManualClock, Owner, StaleReason, Ttl, Wait,
};
use leasehold_server::sqlite::{SqliteStore, SyncMode};
use leasehold_server::{Engine, EngineConfig};
use leasehold_wire::pb;
use tokio_stream::StreamExt;
use tonic::Code;

use common::T0;

/// What the test tells a held commit to do.
#[derive(Debug, Default)]
struct GateState {
    /// The next commit blocks until it gets a verdict.
    armed: bool,
    /// A commit is blocked now.
    held: bool,
    /// `Some(true)`: fail the held commit; `Some(false)`: let it through.
    fail: Option<bool>,
}

/// A switch between the test and the store's commit.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<GateState>, Condvar)>);

impl Gate {
    fn arm(&self) {
        self.0.0.lock().unwrap().armed = true;
    }

    /// Waits (bounded) until a commit is held.
    async fn held(&self) {
        for _ in 0..500 {
            if self.0.0.lock().unwrap().held {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no commit was held");
    }

    fn fail(&self) {
        let (state, wake) = &*self.0;
        state.lock().unwrap().fail = Some(true);
        wake.notify_all();
    }
}

/// SQLite, with a gate in front of commit.
struct FaultStore {
    inner: SqliteStore,
    gate: Gate,
}

impl Store for FaultStore {
    fn load(&mut self) -> Result<Snapshot, StoreError> {
        self.inner.load()
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), StoreError> {
        let (state, wake) = &*self.gate.0;
        let mut s = state.lock().unwrap();
        if s.armed {
            s.armed = false;
            s.held = true;
            wake.notify_all();
            s = wake.wait_while(s, |s| s.fail.is_none()).unwrap();
            s.held = false;
            if s.fail.take() == Some(true) {
                return Err(StoreError::Io("injected commit failure".into()));
            }
        }
        drop(s);
        self.inner.commit(batch)
    }

    fn commits(&self) -> u64 {
        self.inner.commits()
    }
}

struct Fixture {
    engine: Engine,
    gate: Gate,
    db: std::path::PathBuf,
    clock: ManualClock,
    _dir: tempfile::TempDir,
}

fn start() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("leasehold.db");
    let gate = Gate::default();
    let clock = ManualClock::new(T0);
    let store = FaultStore {
        inner: SqliteStore::open(&db, SyncMode::Full).unwrap(),
        gate: gate.clone(),
    };
    let engine = Engine::start(
        Box::new(store),
        Arc::new(clock.clone()) as Arc<dyn Clock>,
        EngineConfig::default(),
    )
    .unwrap();
    Fixture {
        engine,
        gate,
        db,
        clock,
        _dir: dir,
    }
}

impl Fixture {
    /// "Restarts the server": the failed engine goes, a new one reads the file.
    async fn restart(self) -> (Engine, tempfile::TempDir) {
        let Fixture {
            engine,
            db,
            clock,
            _dir,
            ..
        } = self;
        engine.shutdown().await;
        drop(engine);
        // The failed writer keeps the file locked until the process exits
        // (so no second server takes it over meanwhile); a test can only
        // copy the file away to read it again.
        let copy = _dir.path().join("restarted.db");
        std::fs::copy(&db, &copy).unwrap();
        let wal = db.with_extension("db-wal");
        if wal.exists() {
            std::fs::copy(&wal, copy.with_extension("db-wal")).unwrap();
        }
        let engine = Engine::start(
            Box::new(SqliteStore::open(&copy, SyncMode::Full).unwrap()),
            Arc::new(clock) as Arc<dyn Clock>,
            EngineConfig::default(),
        )
        .unwrap();
        (engine, _dir)
    }
}

fn k(key: &str) -> Key {
    Key::parse(key).unwrap()
}

fn req(key: &str, owner: &str) -> Acquire {
    Acquire {
        key: k(key),
        owner: Owner::parse(owner).unwrap(),
        ttl: Ttl::from_millis(10_000).unwrap(),
        wait: Wait::default(),
        request_id: None,
        options: Default::default(),
    }
}

fn waiting(key: &str, owner: &str, wait_ms: u64) -> Acquire {
    Acquire {
        wait: Wait::from_millis(wait_ms).unwrap(),
        ..req(key, owner)
    }
}

fn unavailable<T: std::fmt::Debug>(result: Result<T, Error>) {
    assert!(
        matches!(result, Err(Error::Unavailable(_))),
        "expected UNAVAILABLE after the failed commit, got {result:?}"
    );
}

#[tokio::test]
async fn a_busy_refusal_waits_for_the_grant_it_names() {
    let f = start();
    f.gate.arm();
    let a = tokio::spawn(f.engine.acquire(req("k", "a")));
    f.gate.held().await;
    let mut b = f.engine.acquire(req("k", "b")).boxed();
    if let Some(early) = (&mut b).now_or_never() {
        panic!("b was answered before a's grant was durable: {early:?}");
    }
    f.gate.fail();
    unavailable(a.await.unwrap());
    unavailable(b.await);
    // The restart forgot a's grant: nobody was told of fence 1, so handing
    // it out now contradicts no one.
    let (engine, _dir) = f.restart().await;
    let c = engine.acquire(req("k", "c")).await.unwrap();
    assert_eq!(c.term.fence, Fence(1));
}

#[tokio::test]
async fn stale_and_denied_refusals_wait_for_the_release_they_reveal() {
    let f = start();
    let g = f.engine.acquire(req("k", "a")).await.unwrap();
    let (fence, id) = (g.term.fence, g.term.lease_id);
    f.gate.arm();
    let release = tokio::spawn(f.engine.release(&k("k"), fence, id, false, None));
    f.gate.held().await;

    let wrong = LeaseId::random();
    let check = f.engine.check(&k("k"), fence).boxed();
    let renew = f.engine.renew(&k("k"), fence, id, None).boxed();
    let denied = f.engine.release(&k("k"), fence, wrong, false, None).boxed();
    let mut probes = vec![
        ("check", check.map(|r| r.map(|_| ())).boxed()),
        ("renew", renew.map(|r| r.map(|_| ())).boxed()),
        (
            "release with the wrong lease_id",
            denied.map(|r| r.map(|_| ())).boxed(),
        ),
    ];
    for (what, probe) in &mut probes {
        assert!(
            probe.now_or_never().is_none(),
            "{what} was answered before the release was durable"
        );
    }
    f.gate.fail();
    unavailable(release.await.unwrap());
    for (_, probe) in probes {
        unavailable(probe.await);
    }
    // After the restart the release never happened: fence 1 is live again,
    // so a "released" answer would have been a lie.
    let (engine, _dir) = f.restart().await;
    assert_eq!(engine.check(&k("k"), fence).await.unwrap().fence, fence);
}

#[tokio::test]
async fn permission_denied_waits_for_the_grant_it_reveals() {
    let f = start();
    f.gate.arm();
    let a = tokio::spawn(f.engine.acquire(req("k", "a")));
    f.gate.held().await;
    let wrong = LeaseId::random();
    let mut renew = f.engine.renew(&k("k"), Fence(1), wrong, None).boxed();
    assert!((&mut renew).now_or_never().is_none());
    f.gate.fail();
    unavailable(a.await.unwrap());
    unavailable(renew.await);
}

#[tokio::test]
async fn a_filtered_list_waits_for_the_keys_it_leaves_out() {
    let f = start();
    let g = f.engine.acquire(req("s:1", "a")).await.unwrap();
    f.engine
        .release(&k("s:1"), g.term.fence, g.term.lease_id, true, None)
        .await
        .unwrap();
    f.gate.arm();
    let taken = tokio::spawn(f.engine.acquire(req("s:1", "b")));
    f.gate.held().await;
    let mut list = f
        .engine
        .list("s:", ListFilter::Recoverable, None, 10)
        .boxed();
    assert!(
        (&mut list).now_or_never().is_none(),
        "the page left out s:1 before the grant that hides it was durable"
    );
    f.gate.fail();
    unavailable(taken.await.unwrap());
    unavailable(list.await);
    let (engine, _dir) = f.restart().await;
    let page = engine
        .list("s:", ListFilter::Recoverable, None, 10)
        .await
        .unwrap();
    assert_eq!(
        page.keys.len(),
        1,
        "the grant was undone: s:1 is recoverable"
    );
}

/// A real gRPC server over a fault engine.
async fn serve(engine: Engine) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = leasehold_server::server::serve(listener, engine, std::future::pending()).await;
    });
    (addr, task)
}

#[tokio::test]
async fn over_grpc_unary_and_stream_refusals_wait_too() {
    let f = start();
    let (addr, _task) = serve(f.engine.clone()).await;
    let url = format!("http://{addr}");
    let mut unary = pb::leasehold_client::LeaseholdClient::connect(url.clone())
        .await
        .unwrap();
    let held = common::lease_of(
        unary
            .acquire(common::acquire("held", "a", 10_000))
            .await
            .unwrap(),
    );

    f.gate.arm();
    // Unary: a's grant of "k" in flight, then b is refused as busy.
    let mut a_client = unary.clone();
    let a = tokio::spawn(async move { a_client.acquire(common::acquire("k", "a", 10_000)).await });
    f.gate.held().await;
    let mut b_client = unary.clone();
    let b = tokio::spawn(async move { b_client.acquire(common::acquire("k", "b", 10_000)).await });

    // Stream: a Release of "held" and a Check right after it, on one stream.
    // The release is applied (in memory) behind the held commit.
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut responses = unary
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(pb::SessionRequest {
        id: 1,
        op: Some(pb::session_request::Op::Release(pb::ReleaseRequest {
            key: "held".into(),
            fence: held.fence,
            lease_id: held.lease_id.clone(),
            suspend: false,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    tx.send(pb::SessionRequest {
        id: 2,
        op: Some(pb::session_request::Op::Check(pb::CheckRequest {
            key: "held".into(),
            fence: held.fence,
        })),
    })
    .await
    .unwrap();
    // Both operations are in: the Check's refusal would come back at once
    // without the fix. Give the stream a moment to deliver them, bounded.
    let early = tokio::time::timeout(Duration::from_millis(300), responses.next()).await;
    assert!(
        early.is_err(),
        "a stream response came before the held commit: {early:?}"
    );
    f.gate.fail();

    assert_eq!(a.await.unwrap().unwrap_err().code(), Code::Unavailable);
    assert_eq!(b.await.unwrap().unwrap_err().code(), Code::Unavailable);
    for _ in 0..2 {
        let response = responses.next().await.unwrap().unwrap();
        assert_eq!(
            response.code,
            Code::Unavailable as i32,
            "operation {} answered {response:?}",
            response.id
        );
    }
}

#[tokio::test]
async fn a_failed_commit_turns_health_not_serving_and_ends_serve_with_an_error() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let f = start();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let engine = f.engine.clone();
    let serving = tokio::spawn(async move {
        leasehold_server::server::serve(listener, engine, std::future::pending()).await
    });
    // An orchestrator's health watch, opened while all is well.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let mut watch = health
        .watch(HealthCheckRequest {
            service: "leasehold.v1.Leasehold".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let status = |m: Option<tonic_health::pb::HealthCheckResponse>| m.unwrap().status;
    assert_eq!(
        status(watch.message().await.unwrap()),
        ServingStatus::Serving as i32
    );

    f.gate.arm();
    let a = tokio::spawn(f.engine.acquire(req("k", "a")));
    f.gate.held().await;
    f.gate.fail();
    unavailable(a.await.unwrap());
    let next = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("health must tell the orchestrator, not keep saying SERVING");
    assert_eq!(status(next.unwrap()), ServingStatus::NotServing as i32);
    drop(watch);
    let served = tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("serve stops after the storage failure")
        .unwrap();
    let err = served.expect_err("serve must fail, so the process exits non-zero");
    assert!(err.to_string().contains("storage"), "{err}");
}

#[tokio::test]
async fn abandoned_waits_leave_the_line() {
    let f = start();
    let g = f.engine.acquire(req("k", "holder")).await.unwrap();
    for batch in 0..3 {
        let waits: Vec<_> = (0..500)
            .map(|i| {
                f.engine
                    .acquire(waiting("k", &format!("w{batch}-{i}"), 300_000))
            })
            .collect();
        // Applied at call time: they are all in line now.
        assert_eq!(f.engine.waiter_count(), 500);
        drop(waits);
        assert_eq!(f.engine.waiter_count(), 0, "batch {batch} left waiters");
    }
    // The holder is untouched and the key still goes to a live waiter.
    let next = f.engine.acquire(waiting("k", "next", 60_000));
    f.engine
        .release(&k("k"), g.term.fence, g.term.lease_id, false, None)
        .await
        .unwrap();
    assert_eq!(next.await.unwrap().term.owner, "next");
    let _ = &f.clock;
}

#[tokio::test]
async fn waits_abandoned_by_grpc_clients_leave_the_line() {
    let f = start();
    f.engine.acquire(req("k", "holder")).await.unwrap();
    let (addr, _task) = serve(f.engine.clone()).await;
    let url = format!("http://{addr}");
    let client = pb::leasehold_client::LeaseholdClient::connect(url)
        .await
        .unwrap();

    // Unary: the client's deadline passes long before the wait.
    for i in 0..50 {
        let mut request = tonic::Request::new(pb::AcquireRequest {
            wait_ms: 300_000,
            ..common::acquire("k", &format!("u{i}"), 10_000)
        });
        request.set_timeout(Duration::from_millis(20));
        let refused = client.clone().acquire(request).await.unwrap_err();
        assert_eq!(refused.code(), Code::Cancelled, "{refused:?}");
    }
    wait_until_no_waiters(&f.engine).await;

    // Stream: waits in flight when the client drops its stream.
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let responses = client
        .clone()
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    for i in 0..50 {
        tx.send(pb::SessionRequest {
            id: i,
            op: Some(pb::session_request::Op::Acquire(pb::AcquireRequest {
                wait_ms: 300_000,
                ..common::acquire("k", &format!("s{i}"), 10_000)
            })),
        })
        .await
        .unwrap();
    }
    for _ in 0..200 {
        if f.engine.waiter_count() == 50 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(f.engine.waiter_count(), 50);
    drop(responses);
    drop(tx);
    wait_until_no_waiters(&f.engine).await;
}

async fn wait_until_no_waiters(engine: &Engine) {
    for _ in 0..500 {
        if engine.waiter_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} abandoned waiters still in line", engine.waiter_count());
}

#[tokio::test]
async fn a_superseded_release_over_grpc_is_refused() {
    let f = start();
    let first = f.engine.acquire(req("k", "a")).await.unwrap();
    let (fence, id) = (first.term.fence, first.term.lease_id);
    f.engine
        .release(&k("k"), fence, id, false, None)
        .await
        .unwrap();
    let second = f.engine.acquire(req("k", "b")).await.unwrap();
    let refused = f
        .engine
        .release(&k("k"), fence, id, false, None)
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        Error::StaleFence {
            key: k("k"),
            fence,
            reason: StaleReason::Superseded {
                by: second.term.fence
            },
        }
    );
}
