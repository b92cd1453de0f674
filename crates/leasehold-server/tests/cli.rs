//! The `leasehold` command line against a live server process.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{ServerProcess, binary};
use serde_json::Value;

fn run(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .output()
        .expect("run leasehold")
}

fn json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

/// acquire, check, renew, get, list and release work from the shell, as text and JSON.
#[tokio::test]
async fn operator_commands_drive_a_live_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("cli.db"));
    let url = server.url();
    let s = ["--server", url.as_str()];

    let acquired = json(&run(&[
        &["acquire", "sess:1", "--owner", "ops", "--json"][..],
        &s,
    ]
    .concat()));
    let fence = acquired["lease"]["fence"].as_u64().unwrap();
    let lease_id = acquired["lease"]["lease_id"].as_str().unwrap().to_owned();
    let fence_arg = fence.to_string();

    let busy = run(&[&["acquire", "sess:1", "--owner", "other"][..], &s].concat());
    assert!(!busy.status.success());
    let stderr = String::from_utf8_lossy(&busy.stderr);
    assert!(
        stderr.contains("Aborted") && stderr.contains("ops"),
        "{stderr}"
    );

    let checked = run(&[&["check", "sess:1", "--fence", &fence_arg][..], &s].concat());
    assert!(checked.status.success());
    assert!(String::from_utf8_lossy(&checked.stdout).contains(&format!("fence={fence}")));

    let renewed = json(&run(&[
        &[
            "renew",
            "sess:1",
            "--fence",
            &fence_arg,
            "--lease-id",
            &lease_id,
            "--ttl-ms",
            "60000",
            "--json",
        ][..],
        &s,
    ]
    .concat()));
    assert_eq!(renewed["lease"]["ttl_ms"], 60000);

    let listed = json(&run(&[
        &["list", "--prefix", "sess:", "--filter", "live", "--json"][..],
        &s,
    ]
    .concat()));
    assert_eq!(listed["keys"][0]["key"], "sess:1");
    assert!(listed["keys"][0]["lease"].get("lease_id").is_none());

    let released = json(&run(&[
        &[
            "release",
            "sess:1",
            "--fence",
            &fence_arg,
            "--lease-id",
            &lease_id,
            "--suspend",
            "--json",
        ][..],
        &s,
    ]
    .concat()));
    assert_eq!(released["ended"]["end"], "SUSPENDED");

    let stale = run(&[&["check", "sess:1", "--fence", &fence_arg][..], &s].concat());
    assert!(!stale.status.success());
    let stderr = String::from_utf8_lossy(&stale.stderr);
    assert!(
        stderr.contains("FailedPrecondition") && stderr.contains("suspended"),
        "{stderr}"
    );

    let got = json(&run(&[&["get", "sess:1", "--json"][..], &s].concat()));
    assert_eq!(got["recoverable"], true);
    assert_eq!(got["last_ended"]["fence"], fence);

    let missing = run(&[&["get", "nope"][..], &s].concat());
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("NotFound"));
}

/// The lifecycle from the shell: a release to a successor, history, a
/// quarantine lifted, and `watch --count` printing what happened.
#[tokio::test]
async fn lifecycle_commands_drive_a_live_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("cli.db"));
    let url = server.url();
    let s = ["--server", url.as_str()];

    let acquired = json(&run(&[
        &[
            "acquire",
            "s:1",
            "--owner",
            "worker",
            "--max-recoveries",
            "1",
            "--json",
        ][..],
        &s,
    ]
    .concat()));
    let fence = acquired["lease"]["fence"].as_u64().unwrap().to_string();
    let lease_id = acquired["lease"]["lease_id"].as_str().unwrap().to_owned();
    let released = json(&run(&[
        &[
            "release",
            "s:1",
            "--fence",
            &fence,
            "--lease-id",
            &lease_id,
            "--successor",
            "ui",
            "--json",
        ][..],
        &s,
    ]
    .concat()));
    assert_eq!(released["ended"]["end"], "RELEASED");
    let got = json(&run(&[&["get", "s:1", "--json"][..], &s].concat()));
    assert_eq!(got["reservation"]["kind"], "HANDOFF");
    assert_eq!(got["reservation"]["successor"], "ui");
    let reserved = run(&[&["acquire", "s:1", "--owner", "x"][..], &s].concat());
    assert!(String::from_utf8_lossy(&reserved.stderr).contains("reserved for successor"));
    let ui = json(&run(&[
        &[
            "acquire",
            "s:1",
            "--owner",
            "ui",
            "--max-recoveries",
            "1",
            "--json",
        ][..],
        &s,
    ]
    .concat()));
    assert_eq!(ui["previous"]["handed_off"], true);
    let fence = ui["lease"]["fence"].as_u64().unwrap().to_string();
    let lease_id = ui["lease"]["lease_id"].as_str().unwrap().to_owned();
    run(&[
        &[
            "release",
            "s:1",
            "--fence",
            &fence,
            "--lease-id",
            &lease_id,
            "--suspend",
        ][..],
        &s,
    ]
    .concat());

    // One suspension at K = 1: quarantined.
    let refused = run(&[&["acquire", "s:1", "--owner", "w2"][..], &s].concat());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("quarantined"));
    let history = json(&run(&[&["history", "s:1", "--json"][..], &s].concat()));
    assert_eq!(history["entries"][0]["owner"], "ui");
    assert_eq!(history["entries"][0]["end"], "SUSPENDED");
    assert_eq!(history["entries"][1]["owner"], "worker");
    let lifted = json(&run(&[&["unquarantine", "s:1", "--json"][..], &s].concat()));
    assert_eq!(lifted["quarantined"], false);

    let watched = run(&[
        &[
            "watch",
            "--prefix",
            "s:",
            "--from-revision",
            "1",
            "--count",
            "4",
            "--json",
        ][..],
        &s,
    ]
    .concat());
    assert!(
        watched.status.success(),
        "{}",
        String::from_utf8_lossy(&watched.stderr)
    );
    let kinds: Vec<String> = String::from_utf8_lossy(&watched.stdout)
        .lines()
        .map(|line| {
            let event: Value = serde_json::from_str(line).unwrap();
            format!("{}:{}", event["revision"], event["kind"].as_str().unwrap())
        })
        .collect();
    assert_eq!(
        kinds,
        vec!["1:GRANTED", "2:RELEASED", "3:GRANTED", "4:SUSPENDED"]
    );
}

/// A database written by a newer schema is refused with a clear error, never reset.
/// A refusal under `--json` is one JSON object on stdout (code, message,
/// reason, the status's details), with the human line still on stderr and
/// exit status 1; without `--json` stdout stays empty.
#[tokio::test]
async fn a_refusal_under_json_is_one_json_object_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("cli.db"));
    let url = server.url();
    let s = ["--server", url.as_str()];
    let held = json(&run(&[
        &["acquire", "r:1", "--owner", "w1", "--json"][..],
        &s,
    ]
    .concat()));
    let fence = held["lease"]["fence"].as_u64().unwrap();

    let busy = run(&[&["acquire", "r:1", "--owner", "w2", "--json"][..], &s].concat());
    assert_eq!(busy.status.code(), Some(1));
    let refusal: Value = serde_json::from_slice(&busy.stdout).expect("JSON on stdout");
    assert_eq!(refusal["code"], "ABORTED", "{refusal}");
    assert_eq!(refusal["metadata"]["holder"], "w1", "{refusal}");
    assert_eq!(refusal["metadata"]["fence"], fence, "{refusal}");
    assert!(
        refusal["message"].as_str().unwrap().contains("held"),
        "{refusal}"
    );
    assert!(String::from_utf8_lossy(&busy.stderr).starts_with("error: "));

    let stale = run(&[
        &[
            "check",
            "r:1",
            "--fence",
            &(fence + 5).to_string(),
            "--json",
        ][..],
        &s,
    ]
    .concat());
    assert_eq!(stale.status.code(), Some(1));
    let refusal: Value = serde_json::from_slice(&stale.stdout).expect("JSON on stdout");
    assert_eq!(refusal["code"], "FAILED_PRECONDITION", "{refusal}");
    assert!(refusal["reason"].is_string(), "{refusal}");

    let plain = run(&[&["acquire", "r:1", "--owner", "w2"][..], &s].concat());
    assert_eq!(plain.status.code(), Some(1));
    assert!(plain.stdout.is_empty());
    assert!(!plain.stderr.is_empty());

    // A failure without a server's answer is reported the same way.
    let unreachable = run(&["get", "r:1", "--server", "http://127.0.0.1:1", "--json"]);
    assert_eq!(unreachable.status.code(), Some(1));
    let refusal: Value = serde_json::from_slice(&unreachable.stdout).expect("JSON on stdout");
    assert!(
        refusal["code"].is_string() && refusal["message"].is_string(),
        "{refusal}"
    );
}

#[test]
fn serve_refuses_a_newer_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("new.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.pragma_update(None, "user_version", 999).unwrap();
    drop(conn);
    let out = run(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--db",
        db.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("newer"), "{stderr}");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, 999);
}

/// A flag of the other backend is refused before anything is opened, not
/// silently ignored.
#[test]
fn serve_refuses_the_other_backends_flags() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let sqlite = format!("sqlite:{}", db.display());
    for (args, flag) in [
        (
            vec!["--store", sqlite.as_str(), "--pg-pool-size", "4"],
            "--pg-pool-size",
        ),
        (
            vec!["--db", db.to_str().unwrap(), "--pg-schema", "s"],
            "--pg-schema",
        ),
        (
            vec![
                "--store",
                "postgres://postgres@127.0.0.1:1/x",
                "--sync",
                "normal",
            ],
            "--sync",
        ),
        (
            vec![
                "--store",
                "postgres://postgres@127.0.0.1:1/x",
                "--writer-spin-us",
                "400",
            ],
            "--writer-spin-us",
        ),
    ] {
        let mut child = Command::new(binary())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(&args)
            .env_remove("LEASEHOLD_DB")
            .env_remove("LEASEHOLD_STORE")
            .env_remove("LEASEHOLD_PG_SCHEMA")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A server that took the flag would serve on: bounded, then killed.
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("error: {flag}")),
            "{args:?}: {stderr}"
        );
        assert!(!db.exists(), "{args:?} opened the database before refusing");
    }
}

/// A database that cannot be opened is a clear error and a non-zero exit.
#[test]
fn serve_reports_an_unopenable_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("no-such-dir").join("x.db");
    let out = run(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--db",
        db.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open database"));

    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![b'x'; 4096]).unwrap();
    let out = run(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--db",
        garbage.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `leasehold serve` over `db` with `extra` flags and stderr piped (not a
/// terminal), waits until it listens, stops it with SIGTERM and returns
/// everything it logged.
fn serve_and_collect_logs(db: &Path, extra: &[&str]) -> String {
    let mut child = Command::new(binary())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--drain-timeout-ms",
            "300",
        ])
        .arg("--db")
        .arg(db)
        .args(extra)
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .env_remove("LEASEHOLD_LOG_FORMAT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn leasehold serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read listening line");
    assert!(line.starts_with("listening on "), "first line {line:?}");
    let pid = child.id().to_string();
    let signalled = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill -TERM");
    assert!(signalled.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("leasehold serve did not exit within 10s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert!(status.success(), "exit {status:?}, stderr: {stderr}");
    stderr
}

/// `--log-format json`: every line on stderr is one JSON object, and the
/// start-up line carries its message and fields.
#[test]
fn serve_logs_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let stderr = serve_and_collect_logs(&dir.path().join("json.db"), &["--log-format", "json"]);
    let lines: Vec<Value> = stderr
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
        })
        .collect();
    assert!(lines.iter().all(Value::is_object), "{stderr}");
    let serving = lines
        .iter()
        .find(|l| l["fields"]["message"] == "leasehold serving")
        .unwrap_or_else(|| panic!("no start-up line in {stderr}"));
    assert_eq!(serving["level"], "INFO");
    assert!(serving["fields"]["addr"].as_str().is_some(), "{serving}");
    assert!(
        lines.iter().any(|l| l["fields"]["message"] == "stopped"),
        "{stderr}"
    );
}

/// Text logs to a pipe (not a terminal) carry no ANSI colour codes.
#[test]
fn serve_logs_plain_text_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let stderr = serve_and_collect_logs(&dir.path().join("text.db"), &[]);
    assert!(stderr.contains("leasehold serving"), "{stderr}");
    assert!(!stderr.contains("\x1b["), "{stderr:?}");
}

/// `--server` takes a comma-separated list: a dead first server is skipped.
#[tokio::test]
async fn operator_commands_take_several_servers() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("cli.db"));
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let servers = format!("http://{dead},{}", server.url());
    let acquired = json(&run(&[
        "acquire", "sess:any", "--owner", "ops", "--json", "--server", &servers,
    ]));
    assert_eq!(acquired["lease"]["owner"], "ops");
}

/// `leasehold health` (the container's HEALTHCHECK) exits 0 with the
/// server's release, protocol and backend while it serves, and 1 once it
/// is gone.
#[tokio::test]
async fn health_reports_a_serving_server_and_fails_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("cli.db"));
    let url = server.url();
    let version = String::from_utf8(run(&["--version"]).stdout).unwrap();

    let health = json(&run(&["health", "--server", &url, "--json"]));
    assert_eq!(health["serving"], true, "{health}");
    assert!(
        version.contains(health["version"].as_str().unwrap()),
        "{version} / {health}"
    );
    assert_eq!(health["protocol"], leasehold_wire::PROTOCOL, "{health}");
    assert_eq!(health["backend"], "sqlite", "{health}");
    let text = run(&["health", "--server", &url]);
    assert!(text.status.success());
    assert!(String::from_utf8_lossy(&text.stdout).contains("serving: true"));

    server.terminate();
    let gone = run(&["health", "--server", &url]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&gone.stderr).contains("cannot connect"));
}
