//! `serve --auth`: principals by bearer token or client-certificate subject,
//! each right and prefix allowed or refused as the file says, over unary
//! calls, the Session stream and the transcript service.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::T0;
use leasehold_client::{Client, ClientError, Credentials, Key, ListFilter, Tls};
use leasehold_core::{Clock, Error, Fence, ManualClock};
use leasehold_server::EngineConfig;
use leasehold_server::auth::{AuthConfig, sha256_hex};
use leasehold_server::server::{self, Listeners};
use leasehold_server::sqlite::SyncMode;
use leasehold_server::tls::{ServerTls, TlsFiles};
use leasehold_wire::pb;

fn auth_file() -> AuthConfig {
    let text = format!(
        r#"
        [[principal]]
        name = "fleet"
        token_sha256 = "{fleet}"
        bind_owner = true
        scopes = [{{ prefix = "session:", rights = ["hold", "check"] }}]

        [[principal]]
        name = "recoverer"
        token_sha256 = "{recoverer}"
        scopes = [{{ prefix = "session:", rights = ["read", "hold"] }}]

        [[principal]]
        name = "dashboard"
        token_sha256 = "{dashboard}"
        scopes = [{{ prefix = "", rights = ["read"] }}]

        [[principal]]
        name = "ops"
        token_sha256 = "{ops}"
        scopes = [{{ prefix = "", rights = ["admin"] }}]

        [[principal]]
        name = "worker-9"
        subject = "worker-9"
        scopes = [{{ prefix = "job:", rights = ["hold"] }}]
        "#,
        fleet = sha256_hex(b"fleet-token"),
        recoverer = sha256_hex(b"recoverer-token"),
        dashboard = sha256_hex(b"dashboard-token"),
        ops = sha256_hex(b"ops-token"),
    );
    AuthConfig::parse(&text).unwrap()
}

async fn serve(tls: Option<Arc<ServerTls>>, dir: &tempfile::TempDir) -> std::net::SocketAddr {
    let engine = server::open_engine(
        &dir.path().join("l.db"),
        SyncMode::Full,
        Arc::new(ManualClock::new(T0)) as Arc<dyn Clock>,
        EngineConfig::default(),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listeners = Listeners {
        tls,
        auth: Some(Arc::new(auth_file())),
        ..Listeners::plain(listener)
    };
    tokio::spawn(server::serve_on(
        listeners,
        engine,
        std::future::pending(),
        server::ServeOptions::default(),
    ));
    addr
}

async fn client(addr: std::net::SocketAddr, token: Option<&str>) -> Client {
    let credentials = token.map_or_else(Credentials::default, |t| Credentials::bearer(t).unwrap());
    Client::connect_with(format!("http://{addr}"), Tls::default(), credentials)
        .await
        .unwrap()
}

fn key(k: &str) -> Key {
    Key::parse(k).unwrap()
}

fn not_allowed<T: std::fmt::Debug>(result: Result<T, ClientError>, principal: &str, right: &str) {
    match result {
        Err(ClientError::Server(Error::NotAllowed {
            principal: p,
            right: r,
            ..
        })) => {
            assert_eq!((p.as_str(), r.as_str()), (principal, right));
        }
        other => panic!("expected {principal} to lack {right}, got {other:?}"),
    }
}

fn unauthenticated<T: std::fmt::Debug>(result: Result<T, ClientError>) {
    assert!(
        matches!(result, Err(ClientError::Server(Error::Unauthenticated(_)))),
        "expected UNAUTHENTICATED, got {result:?}"
    );
}

#[tokio::test]
async fn each_right_and_prefix_is_allowed_or_refused_as_the_file_says() {
    let dir = tempfile::tempdir().unwrap();
    let addr = serve(None, &dir).await;

    // No credential, or an unknown one.
    unauthenticated(
        client(addr, None)
            .await
            .acquire("session:1")
            .await
            .map(|_| ()),
    );
    unauthenticated(
        client(addr, Some("guess"))
            .await
            .get(&key("session:1"))
            .await,
    );

    // The fleet holds and checks session keys, under its own owner names.
    let fleet = client(addr, Some("fleet-token")).await;
    let guard = fleet
        .acquire("session:1")
        .owner("fleet:w1")
        .ttl(Duration::from_secs(10))
        .await
        .unwrap();
    guard.verify().await.unwrap();
    let checked = fleet
        .check(&key("session:1"), guard.fence(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(checked.fence, guard.fence());
    not_allowed(
        fleet
            .acquire("session:2")
            .owner("someone-else")
            .await
            .map(|_| ()),
        "fleet",
        "owner \"someone-else\" (owners must start with \"fleet\")",
    );
    not_allowed(
        fleet.acquire("db:1").owner("fleet:w1").await.map(|_| ()),
        "fleet",
        "hold",
    );
    not_allowed(fleet.get(&key("session:1")).await, "fleet", "read");

    // The dashboard reads everything and holds nothing, not even over the
    // Session stream.
    let ops = client(addr, Some("ops-token")).await;
    let _other = ops
        .acquire("other:1")
        .ttl(Duration::from_secs(10))
        .await
        .unwrap();
    let dashboard = client(addr, Some("dashboard-token")).await;
    let state = dashboard.get(&key("session:1")).await.unwrap();
    assert_eq!(state.lease.unwrap().fence, guard.fence());
    let all = dashboard
        .list("", ListFilter::All, 100, None)
        .await
        .unwrap();
    assert_eq!(all.keys.len(), 2);
    not_allowed(
        dashboard.acquire("session:9").await.map(|_| ()),
        "dashboard",
        "hold",
    );
    let over_stream = dashboard
        .session_op(
            pb::session_request::Op::Check(pb::CheckRequest {
                key: "session:1".into(),
                fence: guard.fence().0,
            }),
            Duration::from_secs(5),
        )
        .await;
    not_allowed(over_stream, "dashboard", "check");

    // A recoverer reads only its prefix: List leaves the rest out.
    let recoverer = client(addr, Some("recoverer-token")).await;
    let page = recoverer
        .list("", ListFilter::All, 100, None)
        .await
        .unwrap();
    let keys: Vec<_> = page
        .keys
        .iter()
        .map(|k| k.key.as_str().to_owned())
        .collect();
    assert_eq!(keys, vec!["session:1".to_string()]);
    not_allowed(
        recoverer
            .check(&key("session:1"), Fence(1), Duration::from_secs(5))
            .await,
        "recoverer",
        "check",
    );

    // The fleet releases over its Session stream.
    guard.release().await.unwrap();

    // The transcript service wants a known caller, nothing more.
    let mut transcripts =
        pb::transcripts_client::TranscriptsClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
    let check = pb::TranscriptCheckRequest {
        transcript: "[]".into(),
        format: "openai-chat".into(),
    };
    let refused = transcripts.check(check.clone()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let mut request = tonic::Request::new(check);
    request
        .metadata_mut()
        .insert("authorization", "Bearer dashboard-token".parse().unwrap());
    transcripts.check(request).await.unwrap();
}

#[tokio::test]
async fn a_client_certificate_subject_is_a_principal() {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    };
    let dir = tempfile::tempdir().unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "test CA");
    let ca = params.self_signed(&ca_key).unwrap();
    let issue = |cn: &str, purpose| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![purpose];
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        (cert.pem().into_bytes(), key.serialize_pem().into_bytes())
    };
    let (cert, key_pem) = issue("server", ExtendedKeyUsagePurpose::ServerAuth);
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let tls = ServerTls::load(TlsFiles {
        cert: write("server.pem", &cert),
        key: write("server.key", &key_pem),
        client_ca: Some(write("ca.pem", ca.pem().as_bytes())),
    })
    .unwrap();
    let addr = serve(Some(tls), &dir).await;
    let url = format!("https://localhost:{}", addr.port());
    let as_subject = |cn: &str| Tls {
        ca_pem: Some(ca.pem().into_bytes()),
        identity: Some(issue(cn, ExtendedKeyUsagePurpose::ClientAuth)),
        domain: None,
    };

    let worker = Client::connect_tls(url.clone(), as_subject("worker-9"))
        .await
        .unwrap();
    let job = worker.acquire("job:1").await.unwrap();
    not_allowed(
        worker.acquire("session:1").await.map(|_| ()),
        "worker-9",
        "hold",
    );
    job.release().await.unwrap();

    // A valid certificate whose subject no principal names is not enough.
    let stranger = Client::connect_tls(url, as_subject("stranger"))
        .await
        .unwrap();
    unauthenticated(stranger.acquire("job:2").await.map(|_| ()));
}

/// The ledger's operations on the Session stream need the hold right, as
/// the unary BeginToolCalls and SettleToolCall do: the holder's principal
/// records and settles, a reader is refused naming the right.
#[tokio::test]
async fn the_ledger_on_the_session_stream_needs_the_hold_right() {
    use pb::session_request::Op;
    let dir = tempfile::tempdir().unwrap();
    let addr = serve(None, &dir).await;
    let fleet = client(addr, Some("fleet-token")).await;
    let granted = fleet
        .session_op(
            Op::Acquire(pb::AcquireRequest {
                key: "session:5".into(),
                owner: "fleet:w1".into(),
                ttl_ms: 10_000,
                ..Default::default()
            }),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let lease = granted.lease.unwrap();
    let begin = Op::BeginToolCalls(pb::BeginToolCallsRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        calls: vec![pb::ToolCallSpec {
            call_id: "c".into(),
            name: "shell".into(),
            input_digest: String::new(),
        }],
        ..Default::default()
    });
    let settle = Op::SettleToolCall(pb::SettleToolCallRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        call_id: "c".into(),
        outcome: pb::ToolCallState::Succeeded as i32,
        ..Default::default()
    });

    let dashboard = client(addr, Some("dashboard-token")).await;
    let timeout = Duration::from_secs(5);
    not_allowed(
        dashboard.session_op(begin.clone(), timeout).await,
        "dashboard",
        "hold",
    );
    fleet.session_op(begin, timeout).await.unwrap();
    not_allowed(
        dashboard.session_op(settle.clone(), timeout).await,
        "dashboard",
        "hold",
    );
    let settled = fleet.session_op(settle, timeout).await.unwrap();
    let Some(pb::session_response::Ledger::SettleToolCall(reply)) = settled.ledger else {
        panic!("no SettleToolCall reply: {settled:?}");
    };
    assert!(
        !reply.already_settled,
        "the reader's settle was not applied"
    );
}
