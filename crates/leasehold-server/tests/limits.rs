//! Every limit is hit once and answers RESOURCE_EXHAUSTED naming it, while
//! other clients keep being served.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{T0, acquire};
use leasehold_core::{Clock, ManualClock};
use leasehold_server::EngineConfig;
use leasehold_server::auth::{AuthConfig, sha256_hex};
use leasehold_server::limits::Limits;
use leasehold_server::server::{self, Listeners};
use leasehold_server::sqlite::SyncMode;
use leasehold_wire::pb;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::transport::Channel;

const LIMITS: Limits = Limits {
    waits_per_connection: 3,
    streams_per_connection: 2,
    ops_per_second: 0,
    max_message_bytes: 64 * 1024,
    keys_per_principal: 0,
};

async fn serve(limits: Limits, max_waiters_per_key: usize) -> (String, tempfile::TempDir) {
    serve_as(limits, max_waiters_per_key, None).await
}

/// A server that checks `auth`'s principals, when given.
async fn serve_as(
    limits: Limits,
    max_waiters_per_key: usize,
    auth: Option<AuthConfig>,
) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let engine = server::open_engine(
        &dir.path().join("l.db"),
        SyncMode::Full,
        Arc::new(ManualClock::new(T0)) as Arc<dyn Clock>,
        EngineConfig {
            max_waiters_per_key,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let listeners = Listeners {
        auth: auth.map(Arc::new),
        ..Listeners::plain(listener)
    };
    tokio::spawn(server::serve_on(
        listeners,
        engine,
        std::future::pending(),
        server::ServeOptions {
            limits,
            ..server::ServeOptions::default()
        },
    ));
    (url, dir)
}

/// A client on a connection of its own.
async fn connection(url: &str) -> LeaseholdClient<Channel> {
    LeaseholdClient::connect(url.to_owned()).await.unwrap()
}

fn exhausted(status: &tonic::Status, limit: &str) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        status.metadata().get("leasehold-limit").unwrap(),
        limit,
        "{status:?}"
    );
}

fn waiting(key: &str, owner: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        wait_ms: 60_000,
        ..acquire(key, owner, 10_000)
    }
}

#[tokio::test]
async fn a_full_line_refuses_one_more_waiter_and_other_keys_go_on() {
    let (url, _dir) = serve(Limits::default(), 2).await;
    let mut holder = connection(&url).await;
    holder
        .acquire(acquire("k", "holder", 10_000))
        .await
        .unwrap();
    let mut waits = Vec::new();
    for i in 0..2 {
        let mut c = connection(&url).await;
        let wait = tokio::spawn(async move { c.acquire(waiting("k", &format!("w{i}"))).await });
        // In line before the next one starts (a refusal would end it).
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!wait.is_finished(), "waiter {i} was not kept in line");
        waits.push(wait);
    }
    let mut third = connection(&url).await;
    let refused = tokio::time::timeout(Duration::from_secs(5), third.acquire(waiting("k", "w3")))
        .await
        .expect("refused at once, not queued")
        .unwrap_err();
    exhausted(&refused, "waiters_per_key");
    // Another key is served as ever.
    holder
        .acquire(acquire("other", "holder", 10_000))
        .await
        .unwrap();
    for w in waits {
        w.abort();
    }
}

#[tokio::test]
async fn one_connection_cannot_open_unbounded_waits() {
    let (url, _dir) = serve(LIMITS, 1_000).await;
    let mut holder = connection(&url).await;
    for k in ["a", "b", "c", "d"] {
        holder.acquire(acquire(k, "holder", 10_000)).await.unwrap();
    }
    let greedy = connection(&url).await;
    let mut waits = Vec::new();
    for k in ["a", "b", "c"] {
        let mut c = greedy.clone();
        let wait = tokio::spawn(async move { c.acquire(waiting(k, "greedy")).await });
        // In line before the next one starts (a refusal would end it).
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!wait.is_finished(), "wait for {k} was not kept in line");
        waits.push(wait);
    }
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        greedy.clone().acquire(waiting("d", "greedy")),
    )
    .await
    .expect("refused at once, not queued")
    .unwrap_err();
    exhausted(&refused, "waits_per_connection");
    // Another connection may still wait.
    let mut other = connection(&url).await;
    let patient = tokio::time::timeout(
        Duration::from_millis(200),
        other.acquire(waiting("d", "other")),
    )
    .await;
    assert!(
        patient.is_err(),
        "the other connection's wait is in line: {patient:?}"
    );
    for w in waits {
        w.abort();
    }
}

#[tokio::test]
async fn one_connection_cannot_open_unbounded_streams() {
    let (url, _dir) = serve(LIMITS, 1_000).await;
    let greedy = connection(&url).await;
    let mut open = Vec::new();
    for _ in 0..2 {
        let (tx, rx) = tokio::sync::mpsc::channel::<pb::SessionRequest>(1);
        let stream = greedy
            .clone()
            .session(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        open.push((tx, stream));
    }
    let (_tx, rx) = tokio::sync::mpsc::channel::<pb::SessionRequest>(1);
    let third = greedy
        .clone()
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap_err();
    exhausted(&third, "streams_per_connection");
    // A stream that ends gives its slot back.
    let (tx, mut stream) = open.pop().unwrap();
    drop(tx);
    assert!(stream.next().await.is_none());
    let mut reopened = None;
    for _ in 0..100 {
        let (tx, rx) = tokio::sync::mpsc::channel::<pb::SessionRequest>(1);
        if let Ok(s) = greedy
            .clone()
            .session(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
        {
            reopened = Some((tx, s));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reopened.is_some(), "the slot came back");
    // Another connection opens streams as ever.
    let (_tx2, rx2) = tokio::sync::mpsc::channel::<pb::SessionRequest>(1);
    connection(&url)
        .await
        .session(tokio_stream::wrappers::ReceiverStream::new(rx2))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_caller_over_its_rate_is_refused_until_its_budget_refills() {
    let (url, _dir) = serve(
        Limits {
            ops_per_second: 5,
            ..LIMITS
        },
        1_000,
    )
    .await;
    let mut fast = connection(&url).await;
    fast.acquire(acquire("k", "fast", 10_000)).await.unwrap();
    let mut refused = None;
    for _ in 0..20 {
        if let Err(status) = fast.get(pb::GetRequest { key: "k".into() }).await {
            refused = Some(status);
            break;
        }
    }
    exhausted(
        &refused.expect("the budget of 5 a second ran out"),
        "ops_per_second",
    );
    // One second later the budget is back.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    fast.get(pb::GetRequest { key: "k".into() }).await.unwrap();
}

#[tokio::test]
async fn an_oversized_request_is_refused_before_it_is_decoded() {
    let (url, _dir) = serve(LIMITS, 1_000).await;
    let mut client = connection(&url).await;
    let huge = pb::AcquireRequest {
        owner: "o".repeat(128 * 1024),
        ..acquire("k", "o", 10_000)
    };
    let status = client.acquire(huge).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::ResourceExhausted | Code::OutOfRange),
        "{status:?}"
    );
    client.acquire(acquire("k", "o", 10_000)).await.unwrap();
}

/// Two principals that may hold any key: "greedy" and "modest".
fn two_principals() -> AuthConfig {
    let text = format!(
        r#"
        [[principal]]
        name = "greedy"
        token_sha256 = "{greedy}"
        scopes = [{{ prefix = "", rights = ["hold", "check", "read"] }}]

        [[principal]]
        name = "modest"
        token_sha256 = "{modest}"
        scopes = [{{ prefix = "", rights = ["hold", "check", "read"] }}]
        "#,
        greedy = sha256_hex(b"greedy-token"),
        modest = sha256_hex(b"modest-token"),
    );
    AuthConfig::parse(&text).unwrap()
}

/// `message` sent with `token` as its bearer credential.
fn as_principal<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

#[tokio::test]
async fn a_principal_at_its_key_limit_is_refused_and_others_are_served() {
    let limits = Limits {
        keys_per_principal: 3,
        ..LIMITS
    };
    let (url, _dir) = serve_as(limits, 1_000, Some(two_principals())).await;
    let mut c = connection(&url).await;
    let mut held = Vec::new();
    for k in ["a", "b", "c"] {
        let reply = c
            .acquire(as_principal("greedy-token", acquire(k, "greedy", 10_000)))
            .await
            .unwrap();
        held.push(common::lease_of(reply));
    }
    let refused = c
        .acquire(as_principal("greedy-token", acquire("d", "greedy", 10_000)))
        .await
        .unwrap_err();
    exhausted(&refused, "keys_per_principal");
    assert!(refused.message().contains("greedy"), "{refused:?}");
    assert!(!refused.message().contains("greedy-token"), "{refused:?}");
    // The same limit on the Session stream, answered in the response.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut stream = c
        .session(as_principal(
            "greedy-token",
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .await
        .unwrap()
        .into_inner();
    tx.send(pb::SessionRequest {
        id: 1,
        op: Some(pb::session_request::Op::Acquire(acquire(
            "d", "greedy", 10_000,
        ))),
    })
    .await
    .unwrap();
    let answer = stream.next().await.unwrap().unwrap();
    assert_eq!(answer.code, Code::ResourceExhausted as i32, "{answer:?}");
    // Another principal is served as ever.
    c.acquire(as_principal("modest-token", acquire("d", "modest", 10_000)))
        .await
        .unwrap();
    // A release gives a key back (here over the stream).
    let a = held.remove(0);
    tx.send(pb::SessionRequest {
        id: 2,
        op: Some(pb::session_request::Op::Release(pb::ReleaseRequest {
            key: a.key.clone(),
            fence: a.fence,
            lease_id: a.lease_id.clone(),
            suspend: false,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let released = stream.next().await.unwrap().unwrap();
    assert_eq!(released.code, 0, "{released:?}");
    let again = pb::AcquireRequest {
        request_id: "retry-e".into(),
        ..acquire("e", "greedy", 10_000)
    };
    c.acquire(as_principal("greedy-token", again.clone()))
        .await
        .unwrap();
    // At the limit again, a retry of a granted Acquire still gets its term
    // back: it adds no key.
    let replay = c
        .acquire(as_principal("greedy-token", again))
        .await
        .unwrap()
        .into_inner();
    assert!(replay.replayed);
    let refused = c
        .acquire(as_principal("greedy-token", acquire("f", "greedy", 10_000)))
        .await
        .unwrap_err();
    exhausted(&refused, "keys_per_principal");
}

#[tokio::test]
async fn a_term_that_ran_out_stops_counting_against_its_principal() {
    let limits = Limits {
        keys_per_principal: 1,
        ..LIMITS
    };
    let (url, _dir) = serve_as(limits, 1_000, Some(two_principals())).await;
    let mut c = connection(&url).await;
    c.acquire(as_principal("greedy-token", acquire("a", "greedy", 200)))
        .await
        .unwrap();
    let refused = c
        .acquire(as_principal("greedy-token", acquire("b", "greedy", 10_000)))
        .await
        .unwrap_err();
    exhausted(&refused, "keys_per_principal");
    // Nobody released "a", but its TTL ran out (on the gate's clock).
    tokio::time::sleep(Duration::from_millis(400)).await;
    c.acquire(as_principal("greedy-token", acquire("b", "greedy", 10_000)))
        .await
        .unwrap();
}

/// `serve --max-keys-per-principal N` reaches the gate: the binary refuses
/// the principal's key N + 1.
#[tokio::test]
async fn the_flag_sets_the_key_limit_of_the_binary() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().unwrap();
    let auth = dir.path().join("auth.toml");
    std::fs::write(
        &auth,
        format!(
            "[[principal]]\nname = \"greedy\"\ntoken_sha256 = \"{}\"\nscopes = [{{ prefix = \"\", rights = [\"hold\"] }}]\n",
            sha256_hex(b"greedy-token")
        ),
    )
    .unwrap();
    let mut child = Command::new(common::binary())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--drain-timeout-ms",
            "200",
        ])
        .args(["--max-keys-per-principal", "1", "--auth"])
        .arg(&auth)
        .arg("--db")
        .arg(dir.path().join("l.db"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
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
    let mut c = connection(&format!("http://{addr}")).await;
    c.acquire(as_principal("greedy-token", acquire("a", "greedy", 10_000)))
        .await
        .unwrap();
    let refused = c
        .acquire(as_principal("greedy-token", acquire("b", "greedy", 10_000)))
        .await
        .unwrap_err();
    child.kill().unwrap();
    child.wait().unwrap();
    exhausted(&refused, "keys_per_principal");
}
