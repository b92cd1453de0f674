//! The backend contract (`leasehold_backend::contract`) on the SQLite
//! engine: a real SQLite file per case, a manual clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use leasehold_backend::Backend;
use leasehold_backend::contract::{Settings, Subject};
use leasehold_core::clock::ManualClock;
use leasehold_core::lease::Key;
use leasehold_sqlite::sqlite::{SqliteStore, SyncMode};
use leasehold_sqlite::{Engine, EngineConfig};

struct Sqlite {
    engine: Engine,
    clock: ManualClock,
    // Dropped last: the file outlives the engine.
    _dir: tempfile::TempDir,
}

impl Subject for Sqlite {
    fn backend(&self) -> &dyn Backend {
        &self.engine
    }

    fn pass(&self, ms: u64) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.clock.advance(ms);
            // The engine's timer runs on the runtime: let it act.
            tokio::time::sleep(Duration::from_millis(20)).await;
        })
    }

    fn in_line<'a>(&'a self, _key: &'a Key, n: usize) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.engine.waiter_count() < n {
                assert!(Instant::now() < deadline, "fewer than {n} in line");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    }
}

async fn start(settings: Settings) -> Option<Box<dyn Subject>> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteStore::open(&dir.path().join("leases.db"), SyncMode::Full).expect("open");
    let clock = ManualClock::new(1_700_000_000_000);
    let config = EngineConfig {
        max_waiters_per_key: settings.max_waiters_per_key,
        ..EngineConfig::default()
    };
    let engine = Engine::start(Box::new(store), Arc::new(clock.clone()), config).expect("start");
    Some(Box::new(Sqlite {
        engine,
        clock,
        _dir: dir,
    }))
}

leasehold_backend::contract_tests!(start);
