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
//!
//! By topic:
//! - [`line`]: The line of waiters, shared by every server on the schema:
//!   replays, cancellation, supersession, a dead server's waiters, the limit
//!   across servers.
//! - [`start`]: Starting: schemas, URL options, migrations (once, refused
//!   when newer), an unreachable database, `leasehold serve` with either
//!   store and its refusals.
//! - [`fleet`]: Several servers on one schema: mutual exclusion and rising
//!   fences, a stopped or killed server, the Session stream, the Rust guard
//!   renewing through another server.
//! - [`outage`]: The database away: Unavailable then resuming, health,
//!   outages and restarts under load granting nothing.
//! - [`batching`]: Statements shared by concurrent requests: renewals, grants
//!   and releases batched, each answered alone, exclusion across servers.
//! - [`history`]: What is kept: term history (the ring, its length changing,
//!   its migration), a swept expiry recorded once, released keys forgotten
//!   with fences never repeating.

#[path = "../common/mod.rs"]
mod common;
#[macro_use]
#[path = "../pg_harness/mod.rs"]
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

mod batching;
mod fleet;
mod history;
mod line;
mod outage;
mod start;

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

fn fences(entries: &[(u64, i32)]) -> Vec<u64> {
    entries.iter().map(|(fence, _)| *fence).collect()
}
