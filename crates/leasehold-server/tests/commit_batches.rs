//! What goes into each commit while a mass expiry is being written: a reply
//! waits for the commit that carries its change, so that commit stays short
//! however many lazily written changes (expiries, renewals) are pending.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::lessor::Acquire;
use leasehold_core::store::{Batch, Snapshot, Store, StoreError};
use leasehold_core::{Clock, Key, ManualClock, Owner, Ttl, Wait};
use leasehold_server::sqlite::{SqliteStore, SyncMode};
use leasehold_server::{Engine, EngineConfig};

/// One commit: how many keys it wrote, and which.
#[derive(Debug, Clone)]
struct Commit {
    keys: Vec<Key>,
}

/// SQLite, recording every batch it commits.
struct RecordingStore {
    inner: SqliteStore,
    commits: Arc<Mutex<Vec<Commit>>>,
}

impl Store for RecordingStore {
    fn load(&mut self) -> Result<Snapshot, StoreError> {
        self.inner.load()
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), StoreError> {
        self.commits.lock().unwrap().push(Commit {
            keys: batch.records.iter().map(|r| r.key.clone()).collect(),
        });
        self.inner.commit(batch)
    }

    fn commits(&self) -> u64 {
        self.inner.commits()
    }
}

fn acquire(key: &str, ttl_ms: u64) -> Acquire {
    Acquire {
        key: Key::parse(key).unwrap(),
        owner: Owner::parse("graph-a").unwrap(),
        ttl: Ttl::from_millis(ttl_ms).unwrap(),
        wait: Wait::default(),
        request_id: None,
        options: Default::default(),
    }
}

/// An engine on `store` with a manual clock, whose lazy changes are written
/// only as a backlog after an urgent commit (or at the lazy flush, an hour
/// away here).
fn start(store: Box<dyn Store>) -> (Engine, ManualClock) {
    let clock = ManualClock::new(1_000_000);
    let config = EngineConfig {
        lazy_flush: Duration::from_secs(3600),
        ..EngineConfig::default()
    };
    let engine = Engine::start(store, Arc::new(clock.clone()) as Arc<dyn Clock>, config).unwrap();
    (engine, clock)
}

/// 300 terms expire at once and their rows wait to be written lazily; an
/// Acquire made then is committed with at most a small slice of them (it
/// used to carry up to 500, and during a mass expiry every Acquire waited
/// for such commits), and the expiries still all reach the disk after it.
#[tokio::test]
async fn an_urgent_commit_carries_few_lazy_changes() {
    const EXPIRING: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let commits = Arc::new(Mutex::new(Vec::new()));
    let store = RecordingStore {
        inner: SqliteStore::open(&dir.path().join("leasehold.db"), SyncMode::Full).unwrap(),
        commits: commits.clone(),
    };
    let (engine, clock) = start(Box::new(store));

    for i in 0..EXPIRING {
        engine
            .acquire(acquire(&format!("session/{i:04}"), 1_000))
            .await
            .unwrap();
    }
    clock.advance(2_000);
    let mut expired = false;
    for _ in 0..500 {
        if engine.stats().expirations == EXPIRING as u64 {
            expired = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(expired, "the expiry timer ended every term");
    let before = commits.lock().unwrap().len();

    let urgent = Key::parse("urgent").unwrap();
    engine.acquire(acquire("urgent", 30_000)).await.unwrap();

    let seen = commits.lock().unwrap()[before..].to_vec();
    let carrying = seen
        .iter()
        .find(|c| c.keys.contains(&urgent))
        .expect("a commit carried the urgent grant");
    assert!(
        carrying.keys.len() <= 1 + 32,
        "the Acquire's commit carried {} keys",
        carrying.keys.len()
    );

    // The rest of the expiries follow as lazy commits, none lost.
    let mut written = 0;
    for _ in 0..500 {
        written = commits.lock().unwrap()[before..]
            .iter()
            .flat_map(|c| c.keys.iter())
            .filter(|k| k.as_str().starts_with("session/"))
            .count();
        if written == EXPIRING {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        written, EXPIRING,
        "every expiry was written after the Acquire"
    );
    engine.shutdown().await;
}

/// A mass expiry larger than the writer keeps up with: the timer ends terms
/// only while at most about 4,000 lazily changed keys wait for storage (the
/// expired terms already look expired to readers), so the writer's takes
/// stay small and the lessor lock stays free; once the writer drains the
/// backlog, the timer ends the rest.
#[tokio::test]
async fn the_expiry_timer_waits_for_the_writer_to_catch_up() {
    const EXPIRING: u64 = 6_000;
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("leasehold.db"), SyncMode::Normal).unwrap();
    let (engine, clock) = start(Box::new(store));
    let mut grants = tokio::task::JoinSet::new();
    for i in 0..EXPIRING {
        let engine = engine.clone();
        grants.spawn(async move { engine.acquire(acquire(&format!("s/{i:05}"), 1_000)).await });
    }
    while let Some(granted) = grants.join_next().await {
        granted.unwrap().unwrap();
    }
    clock.advance(2_000);

    // The timer stops once the unwritten expiries pass its limit.
    let mut last = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = engine.stats().expirations;
        if now > 0 && now == last {
            break;
        }
        last = now;
    }
    assert!(
        (4_000..EXPIRING).contains(&last),
        "the timer ended {last} terms with nothing written"
    );

    // An urgent commit starts the writer on the backlog; the rest then end.
    engine.acquire(acquire("urgent", 30_000)).await.unwrap();
    let mut ended = 0;
    for _ in 0..500 {
        ended = engine.stats().expirations;
        if ended == EXPIRING {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        ended, EXPIRING,
        "every term ended once the writer caught up"
    );
    engine.shutdown().await;
}
