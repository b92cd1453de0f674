//! The `leasehold` command line against a live server process.

mod common;

use std::process::{Command, Output};

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

/// A database written by a newer schema is refused with a clear error, never reset.
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
