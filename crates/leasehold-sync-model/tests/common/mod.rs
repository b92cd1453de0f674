//! Helpers shared by the loom tests.

/// Set in the child process that runs one planted check.
pub const CHILD: &str = "LEASEHOLD_SYNC_MODEL_PLANTED";

/// Whether this process is the child run of a planted check.
pub fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// Runs the test `name` of this binary in a child process and expects loom
/// to report a deadlock there. loom reports one by panicking, and the panic
/// then aborts the process while it unwinds its model threads, so
/// `#[should_panic]` cannot catch it in-process.
pub fn expect_deadlock(name: &str) {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the planted bug went unnoticed");
    assert!(
        stderr.contains("deadlock; threads ="),
        "expected loom to report a deadlock, got:\n{stderr}"
    );
}
