//! Shared helpers of the short runs.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use leasehold_chaos::check::{Config, Kind, check};
use leasehold_chaos::history::MS;
use leasehold_chaos::history::{Call, Outcome, Reply};
use leasehold_chaos::run::{
    Backend, PYTHON_WORKER, RunConfig, RunResult, TYPESCRIPT_WORKERS, run, typescript_client,
};
use leasehold_chaos::server::find_binary;

/// How long the workers of a short run start new terms.
pub const SHORT_RUN: Duration = Duration::from_secs(25);

/// The `leasehold` binary: `$LEASEHOLD_BIN`, else the one `cargo test`
/// builds into this target directory (`cargo build -p leasehold-server`
/// when testing this crate alone).
pub fn binary() -> PathBuf {
    let bin = find_binary().unwrap_or_else(|| {
        panic!(
            "no leasehold binary next to the test; run `cargo build -p leasehold-server` \
             first or set LEASEHOLD_BIN"
        )
    });
    eprintln!("chaos: server binary {}", bin.display());
    bin
}

/// Runs `backend` for [`SHORT_RUN`] with every fault and asserts the
/// history is clean and the run was not vacuous.
pub async fn short_run(backend: Backend) -> RunResult {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = RunConfig::new(backend, SHORT_RUN, &binary(), dir.path());
    config.worker_bin = Some(PathBuf::from(env!("CARGO_BIN_EXE_leasehold-chaos")));
    // A Python worker too, when an interpreter with the client is named.
    config.python = std::env::var_os("LEASEHOLD_CHAOS_PYTHON").map(PathBuf::from);
    // And two on the TypeScript client (one per transport) when Node is
    // named; the client must be built (`npm run build` in
    // clients/typescript; ./test.sh does it before cargo test).
    config.node = std::env::var_os("LEASEHOLD_CHAOS_NODE").map(PathBuf::from);
    if config.node.is_some() {
        let client = typescript_client();
        assert!(
            client.exists(),
            "LEASEHOLD_CHAOS_NODE is set but {} is missing: run `npm ci && npm run build` in \
             clients/typescript",
            client.display()
        );
    }
    let mut languages = Vec::new();
    if config.python.is_some() {
        languages.push(("Python", PYTHON_WORKER));
    }
    if config.node.is_some() {
        languages.push(("TypeScript (gRPC)", TYPESCRIPT_WORKERS));
        languages.push(("TypeScript (gRPC-Web)", TYPESCRIPT_WORKERS + 1));
    }
    let mut kinds = config.faults.len();
    let result = run(config).await.expect("the run could be set up");
    let stats = &result.report.stats;
    for skipped in &result.skipped {
        eprintln!("chaos: skipped {skipped}");
        kinds -= 1;
    }
    eprintln!(
        "chaos: faults {:?}, self exits {}, stats {}",
        result.faults,
        result.self_exits,
        serde_json::to_string(stats).unwrap()
    );
    assert!(
        result.report.is_clean(),
        "the history breaks a property:\n{}",
        result.report.explain(&result.history, 5)
    );
    // Not vacuous: every kind of fault fired, terms changed hands, the
    // store took writes, and faults made some outcomes unknown.
    assert_eq!(
        result.faults.len(),
        kinds,
        "every fault kind fired: {:?}",
        result.faults
    );
    assert!(stats.terms >= 10, "only {} terms", stats.terms);
    // Every worker of another language took part: it was granted terms and
    // its writes reached the store.
    for (language, worker) in languages {
        let ops = result.history.ops.iter().filter(|op| op.worker == worker);
        let (mut granted, mut checked) = (0, 0);
        for op in ops {
            match (&op.call, &op.outcome) {
                (Call::Acquire { .. }, Outcome::Ok(Reply::Granted { .. })) => granted += 1,
                (Call::Write { .. }, Outcome::Ok(_)) => checked += 1,
                _ => {}
            }
        }
        eprintln!("chaos: the {language} worker: {granted} terms, {checked} writes");
        assert!(
            granted > 0 && checked > 0,
            "the {language} worker (id {worker}) took no part: {granted} terms, {checked} \
             writes; see its log in the run's directory"
        );
    }
    assert!(stats.renewals_ok > 0 && stats.releases_ok > 0 && stats.gets_ok > 0);
    assert!(stats.writes_accepted > 0);
    assert!(stats.unknown > 0, "no fault made any outcome unknown");
    // The checks have reach on this very history: assume every term
    // outlives its TTL by a little and the takeovers after expiry must show
    // up as overlaps or early ends. How soon after an expiry the next
    // worker comes depends on the run's timing (workers retry, they do not
    // wait in line), so a run whose takeovers all came later than 300 ms
    // is tried again with a whole TTL: a takeover within a second of an
    // expiry still shows the check would catch a term ended a second early.
    let reach = [300, 1000].into_iter().find(|&ms| {
        let overreaching = Config {
            overreach: ms * MS,
            ..Config::default()
        };
        let wrong = check(&result.history, &overreaching);
        !wrong.of(Kind::Overlap).is_empty() || !wrong.of(Kind::EndedEarly).is_empty()
    });
    eprintln!("chaos: the check's reach: a term ended {reach:?} ms early would be caught");
    assert!(
        reach.is_some(),
        "terms assumed a whole TTL longer than their TTL, and still no overlap: the run \
         never handed a key over near expiry"
    );
    assert!(
        result.unreadable_at_end.is_empty(),
        "keys unreadable after the final restart: {:?}",
        result.unreadable_at_end
    );
    result
}
