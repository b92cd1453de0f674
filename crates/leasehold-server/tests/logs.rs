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
