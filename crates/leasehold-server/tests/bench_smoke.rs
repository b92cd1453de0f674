//! Short runs of the load generator against an in-process server. They check
//! what the runs did, never how fast: benchmarks are not pass/fail.

mod common;

use clap::Parser;
use common::TestServer;
use leasehold_bench::{self as bench, BenchArgs, Mode, Shape};
use leasehold_core::lessor::ListFilter;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

fn args(server: &TestServer, extra: &[&str]) -> BenchArgs {
    let url = format!("http://{}", server.addr);
    let mut argv = vec![
        "bench",
        "--server",
        &url,
        "--duration-secs",
        "0.5",
        "--warmup-secs",
        "0.1",
    ];
    argv.extend_from_slice(extra);
    Cli::parse_from(argv).args
}

/// Cycle mode acquires and releases: it counts operations, and leaves no lease live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cycle_mode_releases_every_lease_it_acquires() {
    let server = TestServer::start().await;
    let report = bench::measure(&args(&server, &["--mode", "cycle", "--clients", "4"]))
        .await
        .expect("bench ran");
    assert_eq!(report.mode, Mode::Cycle);
    assert!(report.ops > 0, "{report:?}");
    assert_eq!(report.errors, 0, "{report:?}");
    let live = server
        .engine
        .list("bench/", ListFilter::Live, None, 1000)
        .await
        .unwrap();
    assert!(live.keys.is_empty(), "still live: {:?}", live.keys);
    let all = server
        .engine
        .list("bench/", ListFilter::All, None, 1000)
        .await
        .unwrap();
    assert_eq!(all.keys.len(), 4, "one key per client");
}

/// Hot mode hands a few keys around many clients with no lost wake-up, in
/// order; streamed, all clients share one connection, so waiting Acquires
/// and the Releases that end the waits are pipelined on one stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_mode_hands_over_in_order_without_lost_wakeups() {
    let streamed_server = TestServer::start().await;
    let streamed = bench::measure(&args(
        &streamed_server,
        &[
            "--mode",
            "hot",
            "--clients",
            "8",
            "--keys",
            "2",
            "--stream",
            "--connections",
            "1",
        ],
    ))
    .await
    .expect("streamed bench ran");
    assert_eq!(streamed.details["order_ok"], true, "{}", streamed.details);
    assert_eq!(streamed.details["lost_wakeups"], 0, "{}", streamed.details);
    assert_eq!(
        streamed.details["exclusion_violations"], 0,
        "{}",
        streamed.details
    );
    assert!(streamed.ops > 0, "{streamed:?}");
    let server = TestServer::start().await;
    let report = bench::measure(&args(
        &server,
        &["--mode", "hot", "--clients", "8", "--keys", "2"],
    ))
    .await
    .expect("bench ran");
    let details = &report.details;
    assert_eq!(details["order_ok"], true, "{details}");
    assert_eq!(details["lost_wakeups"], 0, "{details}");
    assert_eq!(details["exclusion_violations"], 0, "{details}");
    assert!(report.ops > 0, "{report:?}");
    // Every counted handover is in the grant log (which also holds the warm-up's).
    assert!(details["handovers_logged"].as_u64().unwrap() >= report.ops);
    // The server's fences saw every handover the clients logged.
    let keys = server
        .engine
        .list("bench/", ListFilter::All, None, 1000)
        .await
        .unwrap();
    assert_eq!(keys.keys.len(), 2);
    let last_fence: u64 = keys
        .keys
        .iter()
        .filter_map(|k| k.last_ended.as_ref().map(|e| e.fence.0))
        .max()
        .unwrap();
    assert!(last_fence >= details["handovers_logged"].as_u64().unwrap());
}

/// Renew and check modes run on held leases without errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_and_check_modes_succeed_on_held_leases() {
    let server = TestServer::start().await;
    for mode in ["renew", "check"] {
        for stream in [false, true] {
            let mut extra = vec!["--mode", mode, "--clients", "3"];
            if stream {
                extra.extend(["--stream", "--connections", "1"]);
            }
            let report = bench::measure(&args(&server, &extra))
                .await
                .expect("bench ran");
            assert!(report.ops > 0, "{mode} stream={stream}: {report:?}");
            assert_eq!(report.errors, 0, "{mode} stream={stream}: {report:?}");
        }
    }
}

/// Cycle mode over the Session stream (all clients pipelined on one
/// connection) acquires and releases without errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cycle_mode_runs_over_the_session_stream() {
    let server = TestServer::start().await;
    let report = bench::measure(&args(
        &server,
        &[
            "--mode",
            "cycle",
            "--clients",
            "3",
            "--stream",
            "--connections",
            "1",
        ],
    ))
    .await
    .expect("bench ran");
    assert!(report.ops > 0, "{report:?}");
    assert_eq!(report.errors, 0, "{report:?}");
    let page = server
        .engine
        .list("bench/", ListFilter::Live, None, 1000)
        .await
        .unwrap();
    assert!(
        page.keys.is_empty(),
        "every streamed acquire was released: {page:?}"
    );
}

/// The shapes of unary clients (the issue-16 rows): each client one
/// operation at a time, many clients sharing few connections, by unary
/// calls or by a Session stream of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_operation_at_a_time_shapes_share_connections() {
    let server = TestServer::start().await;
    for (mode, shape) in [
        ("cycle", "session"),
        ("check", "session"),
        ("check", "unary"),
    ] {
        let report = bench::measure(&args(
            &server,
            &[
                "--mode",
                mode,
                "--shape",
                shape,
                "--clients",
                "4",
                "--connections",
                "2",
            ],
        ))
        .await
        .expect("bench ran");
        let expected = if shape == "session" {
            Shape::Session
        } else {
            Shape::Unary
        };
        assert_eq!(report.shape, Some(expected), "{report:?}");
        assert_eq!(report.connections, 2, "{report:?}");
        assert!(report.ops > 0, "{mode} {shape}: {report:?}");
        assert_eq!(report.errors, 0, "{mode} {shape}: {report:?}");
    }
    let page = server
        .engine
        .list("bench/", ListFilter::Live, None, 1000)
        .await
        .unwrap();
    assert!(page.keys.is_empty(), "every acquire was released: {page:?}");
}

/// Fsync mode times pairs of fdatasyncs in the given directory, with no
/// server, and leaves no file behind.
#[tokio::test]
async fn fsync_mode_times_pairs_of_syncs_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap();
    let argv = [
        "bench",
        "--mode",
        "fsync",
        "--fsync-dir",
        dir_arg,
        "--duration-secs",
        "0.3",
        "--warmup-secs",
        "0.05",
    ];
    let report = bench::measure(&Cli::parse_from(argv).args)
        .await
        .expect("fsync mode ran");
    assert_eq!(report.mode, Mode::Fsync);
    assert!(report.ops > 0, "{report:?}");
    assert!(report.latency_ms.p50 > 0.0, "{report:?}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let missing = Cli::parse_from([
        "bench",
        "--mode",
        "fsync",
        "--fsync-dir",
        "/nonexistent/dir",
    ]);
    let err = bench::measure(&missing.args).await.unwrap_err();
    assert!(err.contains("/nonexistent/dir"), "{err}");
}

/// Without the `peers` feature (this crate's dev-dependency does not turn
/// it on), the peer targets are refused with advice.
#[tokio::test]
async fn peer_targets_need_the_peers_feature() {
    let server = TestServer::start().await;
    let err = bench::measure(&args(&server, &["--target", "etcd"]))
        .await
        .unwrap_err();
    assert!(err.contains("--features peers"), "{err}");
}
