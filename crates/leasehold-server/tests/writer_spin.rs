//! The writer stays awake for a while after a commit
//! (`EngineConfig::writer_spin`), so a request that follows a reply closely
//! is committed without waking it; past the window it sleeps, so an idle
//! server costs no CPU.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::lessor::Acquire;
use leasehold_core::{Clock, Key, ManualClock, Owner, Ttl, Wait};
use leasehold_server::sqlite::{SqliteStore, SyncMode};
use leasehold_server::{Engine, EngineConfig};

fn acquire(key: &str) -> Acquire {
    Acquire {
        key: Key::parse(key).unwrap(),
        owner: Owner::parse("graph-a").unwrap(),
        ttl: Ttl::from_millis(60_000).unwrap(),
        wait: Wait::default(),
        request_id: None,
        options: Default::default(),
    }
}

fn start(dir: &tempfile::TempDir, writer_spin: Duration) -> Engine {
    start_with(
        dir,
        EngineConfig {
            writer_spin,
            ..EngineConfig::default()
        },
    )
}

fn start_with(dir: &tempfile::TempDir, config: EngineConfig) -> Engine {
    let store = SqliteStore::open(&dir.path().join("leasehold.db"), SyncMode::Full).unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000)) as Arc<dyn Clock>;
    Engine::start(Box::new(store), clock, config).unwrap()
}

/// Requests a few milliseconds apart, inside a long window: the writer
/// commits each without going to sleep in between.
#[tokio::test]
async fn requests_inside_the_window_find_the_writer_awake() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(&dir, Duration::from_secs(30));
    engine.acquire(acquire("first")).await.unwrap();
    let sleeps = engine.writer_sleeps();
    let commits = engine.commits();
    for i in 0..20 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        engine.acquire(acquire(&format!("k{i}"))).await.unwrap();
    }
    assert!(engine.commits() >= commits + 20);
    assert_eq!(
        engine.writer_sleeps(),
        sleeps,
        "the writer slept between requests inside its window"
    );
    // A stop does not wait out the window.
    let stopping = Instant::now();
    engine.shutdown().await;
    assert!(stopping.elapsed() < Duration::from_secs(10));
}

/// With no window, the writer sleeps between the same requests; with a
/// short one, it sleeps once the window has passed.
#[tokio::test]
async fn the_writer_sleeps_past_its_window() {
    for spin in [Duration::ZERO, Duration::from_millis(20)] {
        let dir = tempfile::tempdir().unwrap();
        let engine = start(&dir, spin);
        engine.acquire(acquire("first")).await.unwrap();
        let sleeps = engine.writer_sleeps();
        tokio::time::sleep(Duration::from_millis(100)).await;
        engine.acquire(acquire("second")).await.unwrap();
        let mut slept = false;
        for _ in 0..200 {
            if engine.writer_sleeps() > sleeps {
                slept = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(slept, "the writer never slept with a window of {spin:?}");
        engine.shutdown().await;
    }
}

/// A window longer than the lazy flush does not hold lazy changes (a
/// renewal) past the flush: the spin ends at the flush.
#[tokio::test]
async fn a_long_window_does_not_hold_lazy_changes_past_the_flush() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start_with(
        &dir,
        EngineConfig {
            writer_spin: Duration::from_secs(30),
            lazy_flush: Duration::from_millis(50),
            ..EngineConfig::default()
        },
    );
    let grant = engine.acquire(acquire("k")).await.unwrap();
    let commits = engine.commits();
    // A renewal keeping its TTL is lazy: no reply waits for its commit.
    engine
        .renew(&grant.key, grant.term.fence, grant.term.lease_id, None)
        .await
        .unwrap();
    let mut flushed = false;
    for _ in 0..200 {
        if engine.commits() > commits {
            flushed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(flushed, "the renewal waited out the writer's spin");
    engine.shutdown().await;
}
