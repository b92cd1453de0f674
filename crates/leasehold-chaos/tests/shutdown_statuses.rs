//! The open finding of the chaos runs, reproduced without faults: requests
//! sent while a server shuts down cleanly (SIGTERM) should come back
//! UNAVAILABLE ("the server is shutting down", or the transport's codes for
//! a closed connection), but a few come back INTERNAL with the message
//! `h2 protocol error: http2 error`: tonic maps the HTTP/2 reasons a
//! stream gets when it races the shutdown's GOAWAY (NO_ERROR among them)
//! to INTERNAL. See docs/reliability.md, "The open finding".
//!
//! Ignored because it fails today: when it was written, two runs saw 13
//! and 34 INTERNAL among about 10,000 answered calls each (40 shutdowns,
//! 8 connections with 4 request loops each). Run with
//! `cargo test -p leasehold-chaos --test shutdown_statuses -- --ignored --nocapture`.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold_chaos::server::{Server, Store};
use leasehold_client::Client;
use leasehold_wire::pb;
use tonic::Code;

/// No request sent while the server shuts down is answered INTERNAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fails today: INTERNAL during a clean shutdown (open finding, issue 17)"]
async fn requests_racing_a_clean_shutdown_are_never_internal() {
    let dir = tempfile::tempdir().unwrap();
    let mut codes: BTreeMap<String, usize> = BTreeMap::new();
    for round in 0..40u64 {
        let db = dir.path().join(format!("round-{round}.db"));
        let log = dir.path().join("server.log");
        let mut server = Server::new(&common::binary(), Store::Sqlite(db), &log);
        let addr = tokio::task::block_in_place(|| server.start()).unwrap();
        let pid = server.pid().unwrap();
        let mut tasks = Vec::new();
        let mut clients: Vec<Client> = Vec::new();
        for m in 0..32 {
            // Four request loops share each connection, as a process's
            // sessions do.
            if m % 4 == 0 {
                clients.push(Client::connect(format!("http://{addr}")).await.unwrap());
            }
            let client = clients[m / 4].clone();
            tasks.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                for i in 0..200 {
                    let request = pb::AcquireRequest {
                        key: format!("k-{m}-{i}"),
                        owner: "o".into(),
                        ttl_ms: 10_000,
                        wait_ms: 0,
                        request_id: String::new(),
                        ..Default::default()
                    };
                    let timeout = Duration::from_secs(2);
                    match tokio::time::timeout(timeout, client.rpc().acquire(request)).await {
                        Ok(Ok(_)) => seen.push(Code::Ok),
                        Ok(Err(status)) if status.code() == Code::Internal => {
                            seen.push(status.code());
                            eprintln!("INTERNAL: {}", status.message());
                        }
                        Ok(Err(status)) => seen.push(status.code()),
                        Err(_) => seen.push(Code::DeadlineExceeded),
                    }
                }
                seen
            }));
        }
        tokio::time::sleep(Duration::from_millis(50 + 5 * round)).await;
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        for task in tasks {
            for code in task.await.unwrap() {
                *codes.entry(format!("{code:?}")).or_default() += 1;
            }
        }
        server.kill9();
    }
    eprintln!("statuses: {codes:?}");
    assert_eq!(codes.get("Internal"), None, "statuses: {codes:?}");
}
