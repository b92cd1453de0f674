//! A lease id (the capability to renew and release a term) never reaches
//! the server's logs, even at debug level, whatever the operations.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::binary;
use leasehold_client::{Acquire, Client, Key, Owner, Ttl};
use leasehold_core::{Fence, LeaseId, Wait};

#[tokio::test]
async fn lease_ids_never_reach_the_logs() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(binary())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--drain-timeout-ms",
            "200",
            "--db",
        ])
        .arg(dir.path().join("l.db"))
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    let mut stderr = child.stderr.take().unwrap();
    let logs = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let mut issued = Vec::new();
    // A guard: acquire, renewals and a release over the Session stream.
    let guard = client
        .acquire("session:guarded")
        .ttl(Duration::from_millis(900))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    guard.verify().await.unwrap();
    guard.release().await.unwrap();
    // One-shot unary calls, and refusals that name the key.
    let key = Key::parse("session:unary").unwrap();
    let acquire = Acquire {
        key: key.clone(),
        owner: Owner::parse("logger").unwrap(),
        ttl: Ttl::from_millis(5_000).unwrap(),
        wait: Wait::default(),
        request_id: None,
        options: Default::default(),
    };
    let granted = client.grant(&acquire).await.unwrap();
    let id = granted.lease.lease_id.unwrap();
    issued.push(id);
    client
        .renew_term(&key, granted.lease.fence, id, None)
        .await
        .unwrap();
    assert!(client.grant(&acquire).await.is_err(), "busy");
    let wrong = LeaseId::random();
    assert!(
        client
            .release_term(&key, granted.lease.fence, wrong, false)
            .await
            .is_err()
    );
    assert!(
        client
            .renew_term(&key, Fence(granted.lease.fence.0 + 99), id, None)
            .await
            .is_err()
    );
    client.get(&key).await.unwrap();
    client
        .release_term(&key, granted.lease.fence, id, true)
        .await
        .unwrap();
    drop(client);

    let pid = child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let _ = child.wait();
    let logs = logs.join().unwrap();
    assert!(logs.contains("DEBUG"), "debug logging was on:\n{logs}");
    for id in &issued {
        let text = id.to_string();
        assert!(
            !logs.contains(&text),
            "lease id {text} leaked into the logs"
        );
        assert!(
            !logs.contains(&text.replace('-', "")),
            "lease id {text} leaked"
        );
    }
}

/// One parsed line of `--log-format json`.
fn json_lines(logs: &str) -> Vec<serde_json::Value> {
    logs.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
}

fn field<'a>(line: &'a serde_json::Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(line, |value, name| value.get(name))
        .and_then(serde_json::Value::as_str)
}

/// With `--log-format json`, every line logged while a request is handled
/// carries its request id: the client's `x-request-id`, else a generated
/// one; a Session stream's operations carry the stream's.
#[tokio::test]
async fn every_line_of_a_request_carries_its_request_id() {
    use leasehold_wire::pb;
    use leasehold_wire::pb::leasehold_client::LeaseholdClient;

    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(binary())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--drain-timeout-ms",
            "200",
            "--log-format",
            "json",
            "--db",
        ])
        .arg(dir.path().join("l.db"))
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    let mut stderr = child.stderr.take().unwrap();
    let logs = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    fn named<T>(id: &str, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request
            .metadata_mut()
            .insert("x-request-id", id.parse().unwrap());
        request
    }
    let acquire = |key: &str| pb::AcquireRequest {
        key: key.into(),
        owner: "logger".into(),
        ttl_ms: 5_000,
        wait_ms: 0,
        request_id: String::new(),
        ..Default::default()
    };
    let mut raw = LeaseholdClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    raw.acquire(named("acquire-by-test", acquire("session:a")))
        .await
        .unwrap();
    let missing = pb::GetRequest {
        key: "session:never".into(),
    };
    raw.get(named("get-by-test", missing)).await.unwrap_err();
    raw.acquire(acquire("session:anonymous")).await.unwrap();
    // A guard: its renewals, checks and release travel on one Session stream.
    let client = Client::connect(format!("http://{addr}")).await.unwrap();
    let guard = client.acquire("session:guarded").await.unwrap();
    guard.verify().await.unwrap();
    guard.release().await.unwrap();
    drop((raw, client));

    let pid = child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let _ = child.wait();
    let lines = json_lines(&logs.join().unwrap());
    let of = |id: &str| -> Vec<&serde_json::Value> {
        lines
            .iter()
            .filter(|l| field(l, &["span", "request_id"]) == Some(id))
            .collect()
    };
    let message = |l: &serde_json::Value| field(l, &["fields", "message"]).map(str::to_owned);

    // The client's id is on its request's lines, and only on them.
    let acquired = of("acquire-by-test");
    assert!(
        acquired
            .iter()
            .any(|l| message(l).as_deref() == Some("answered")
                && field(l, &["fields", "rpc"]) == Some("Acquire")),
        "the Acquire's answer carries its id: {acquired:#?}"
    );
    for l in &acquired {
        assert_eq!(
            field(l, &["span", "path"]),
            Some("/leasehold.v1.Leasehold/Acquire"),
            "{l}"
        );
    }
    let got = of("get-by-test");
    assert!(
        got.iter().any(|l| message(l).as_deref() == Some("refused")
            && field(l, &["fields", "code"]) == Some("NOT_FOUND")),
        "the Get's refusal carries its id: {got:#?}"
    );

    // Every answer and refusal is logged inside a request with an id.
    let answers: Vec<_> = lines
        .iter()
        .filter(|l| matches!(message(l).as_deref(), Some("answered" | "refused")))
        .collect();
    assert!(answers.len() >= 6, "{answers:#?}");
    for l in &answers {
        let id = field(l, &["span", "request_id"]).unwrap_or_default();
        assert!(!id.is_empty(), "an answer without a request id: {l}");
    }
    // A request without x-request-id gets an id of its own.
    let unary_acquires: Vec<_> = answers
        .iter()
        .filter(|l| field(l, &["fields", "rpc"]) == Some("Acquire"))
        .filter_map(|l| field(l, &["span", "request_id"]))
        .collect();
    let generated: Vec<_> = unary_acquires
        .iter()
        .filter(|id| **id != "acquire-by-test")
        .collect();
    assert!(!generated.is_empty(), "{unary_acquires:?}");
    // The Session stream's operations share the stream's id.
    let stream_ids: std::collections::BTreeSet<_> = answers
        .iter()
        .filter(|l| field(l, &["fields", "rpc"]).is_some_and(|r| r.starts_with("Session.")))
        .filter_map(|l| field(l, &["span", "request_id"]))
        .collect();
    assert_eq!(stream_ids.len(), 1, "one stream, one id: {stream_ids:?}");
    assert!(!stream_ids.contains("acquire-by-test"));
}
