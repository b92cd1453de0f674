//! `serve --console-listen`: the web console's page and JSON endpoints on a
//! real `leasehold serve` process with `--auth`, checked with a plain HTTP
//! client next to a gRPC client.

mod common;
mod pg_harness;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use leasehold_server::auth::sha256_hex;
use leasehold_server::console::CONTENT_SECURITY_POLICY;
use leasehold_wire::pb;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;
use serde_json::Value;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const OPS: &str = "ops-token";
const VIEWER: &str = "viewer-token";
const TENANT_A: &str = "tenant-a-token";

/// A `leasehold serve --console-listen 127.0.0.1:0 --auth FILE` process.
struct Console {
    child: Child,
    grpc: SocketAddr,
    http: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn auth_file(dir: &tempfile::TempDir) -> String {
    let text = format!(
        r#"
        [[principal]]
        name = "ops"
        token_sha256 = "{}"
        scopes = [{{ prefix = "", rights = ["admin"] }}]

        [[principal]]
        name = "viewer"
        token_sha256 = "{}"
        scopes = [{{ prefix = "", rights = ["read"] }}]

        [[principal]]
        name = "tenant-a"
        token_sha256 = "{}"
        scopes = [{{ prefix = "a:", rights = ["read", "hold"] }}]
        "#,
        sha256_hex(OPS.as_bytes()),
        sha256_hex(VIEWER.as_bytes()),
        sha256_hex(TENANT_A.as_bytes()),
    );
    let path = dir.path().join("auth.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

impl Console {
    fn start() -> Console {
        Self::start_with(true, &[])
    }

    /// As [`Console::start`], without `--auth` when `auth` is false, on
    /// `store` (`--store …` arguments) instead of a fresh SQLite file.
    fn start_with(auth: bool, store: &[&str]) -> Console {
        let dir = tempfile::tempdir().unwrap();
        let auth_args = if auth {
            vec!["--auth".to_owned(), auth_file(&dir)]
        } else {
            Vec::new()
        };
        let db = dir.path().join("l.db");
        let db = db.to_str().unwrap();
        let store: Vec<&str> = match store {
            [] => vec!["--db", db],
            given => given.to_vec(),
        };
        let mut child = Command::new(common::binary())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--drain-timeout-ms",
                "300",
            ])
            .args(["--console-listen", "127.0.0.1:0"])
            .args(&auth_args)
            .args(&store)
            .env("RUST_LOG", "warn")
            .env_remove("LEASEHOLD_STORE")
            .env_remove("LEASEHOLD_DB")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn leasehold serve");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let grpc = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap()
            .parse()
            .unwrap();
        line.clear();
        out.read_line(&mut line).unwrap();
        let http = line
            .trim()
            .strip_prefix("console on http://")
            .and_then(|rest| rest.strip_suffix('/'))
            .unwrap_or_else(|| panic!("unexpected console line {line:?}"))
            .parse()
            .unwrap();
        Console {
            child,
            grpc,
            http,
            _dir: dir,
        }
    }

    /// A gRPC client presenting `token`.
    async fn grpc(
        &self,
        token: &'static str,
    ) -> LeaseholdClient<
        InterceptedService<
            Channel,
            impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone,
        >,
    > {
        let channel = Channel::from_shared(format!("http://{}", self.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        LeaseholdClient::with_interceptor(channel, move |mut request: tonic::Request<()>| {
            let value = format!("Bearer {token}").parse().unwrap();
            request.metadata_mut().insert("authorization", value);
            Ok(request)
        })
    }

    /// Sends one request; the response, its body still streaming.
    async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        content_type: Option<&str>,
        body: &str,
    ) -> http::Response<Incoming> {
        let stream = tokio::net::TcpStream::connect(self.http).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(connection);
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.http.to_string());
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        sender.send_request(request).await.unwrap()
    }

    /// A GET's status and body text.
    async fn get(&self, path: &str, token: Option<&str>) -> (http::StatusCode, String) {
        let response = self.send("GET", path, token, None, "").await;
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    /// A POST's status and body text.
    async fn post(
        &self,
        path: &str,
        token: &str,
        content_type: &str,
        body: &str,
    ) -> (http::StatusCode, String) {
        let response = self
            .send("POST", path, Some(token), Some(content_type), body)
            .await;
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }
}

/// Reads NDJSON lines from a streaming body until `done` says enough (or 5 s pass).
async fn read_lines(body: &mut Incoming, mut done: impl FnMut(&[Value]) -> bool) -> Vec<Value> {
    let mut lines = Vec::new();
    let mut buffered = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        while !done(&lines) {
            let Some(frame) = body.frame().await else {
                break;
            };
            if let Ok(data) = frame.unwrap().into_data() {
                buffered.extend_from_slice(&data);
            }
            while let Some(at) = buffered.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffered.drain(..=at).collect();
                lines.push(serde_json::from_slice(&line).unwrap());
            }
        }
    })
    .await;
    read.expect("the watch lines in time");
    lines
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| panic!("not JSON: {text}"))
}

async fn acquire(console: &Console, key: &str, ttl_ms: u64) -> pb::Lease {
    let mut client = console.grpc(OPS).await;
    client
        .acquire(common::acquire(key, "ops-worker", ttl_ms))
        .await
        .unwrap()
        .into_inner()
        .lease
        .unwrap()
}

/// The page is served with a strict CSP, nosniff and no referrer.
#[tokio::test]
async fn the_page_is_served_with_a_strict_content_security_policy() {
    let console = Console::start();
    let response = console.send("GET", "/", None, None, "").await;
    assert_eq!(response.status(), 200);
    let headers = response.headers();
    assert_eq!(
        headers["content-security-policy"], CONTENT_SECURITY_POLICY,
        "CSP"
    );
    assert!(CONTENT_SECURITY_POLICY.contains("script-src 'self'"));
    assert!(CONTENT_SECURITY_POLICY.contains("frame-ancestors 'none'"));
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["referrer-policy"], "no-referrer");
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let html = String::from_utf8(body.to_vec()).unwrap();
    assert!(html.contains("<script src=\"/console.js\""));
    assert!(!html.contains("<script>"), "no inline script");
    assert!(!html.contains("style="), "no inline style");
    let (status, _) = console.get("/api/keys", None).await;
    assert_eq!(status, 401, "the API needs a token");
    let api = console.send("GET", "/api/keys", None, None, "").await;
    assert_eq!(
        api.headers()["content-security-policy"],
        CONTENT_SECURITY_POLICY
    );
}

/// A lease a gRPC client acquired is listed, and no lease_id appears anywhere.
#[tokio::test]
async fn keys_lists_a_lease_without_its_lease_id() {
    let console = Console::start();
    let lease = acquire(&console, "a:listed", 30_000).await;
    assert!(!lease.lease_id.is_empty());
    let (status, body) = console
        .get("/api/keys?prefix=a%3A&filter=live", Some(VIEWER))
        .await;
    assert_eq!(status, 200, "{body}");
    let keys = json(&body);
    let row = &keys["keys"][0];
    assert_eq!(row["key"], "a:listed");
    assert_eq!(row["lease"]["fence"], lease.fence);
    assert_eq!(row["lease"]["owner"], "ops-worker");
    for path in [
        "/api/keys",
        "/api/key?key=a%3Alisted",
        "/api/key?key=a%3Alisted&brief=1",
    ] {
        let (status, body) = console.get(path, Some(OPS)).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert!(!body.contains(&lease.lease_id), "{path} shows the lease id");
        assert!(!body.contains("lease_id"), "{path}: {body}");
    }
}

/// A token scoped to `a:` sees no `b:` key: not listed, not readable, not watched.
#[tokio::test]
async fn a_viewer_scoped_to_a_never_sees_a_b_key() {
    let console = Console::start();
    acquire(&console, "b:hidden", 30_000).await;
    acquire(&console, "a:shown", 30_000).await;
    let (status, body) = console.get("/api/keys", Some(TENANT_A)).await;
    assert_eq!(status, 200);
    assert!(body.contains("a:shown"), "{body}");
    assert!(!body.contains("b:"), "{body}");
    let (status, body) = console.get("/api/key?key=b%3Ahidden", Some(TENANT_A)).await;
    assert_eq!(status, 403, "{body}");
    let (status, _) = console
        .get("/api/watch?key=b%3Ahidden", Some(TENANT_A))
        .await;
    assert_eq!(status, 403);

    let mut watch = console
        .send("GET", "/api/watch?prefix=", Some(TENANT_A), None, "")
        .await;
    assert_eq!(watch.status(), 200);
    assert_eq!(watch.headers()["content-type"], "application/x-ndjson");
    let body = watch.body_mut();
    read_lines(body, |lines| !lines.is_empty()).await;
    acquire(&console, "b:later", 30_000).await;
    acquire(&console, "a:later", 30_000).await;
    let lines = read_lines(body, |lines| lines.iter().any(|l| l["key"] == "a:later")).await;
    assert!(
        lines.iter().all(|l| !l.to_string().contains("b:")),
        "{lines:?}"
    );
}

/// A viewer without the admin right is refused both admin actions (403).
#[tokio::test]
async fn admin_actions_need_the_admin_right() {
    let console = Console::start();
    let lease = acquire(&console, "a:held", 30_000).await;
    let force = format!(r#"{{"key":"a:held","fence":{}}}"#, lease.fence);
    let (status, body) = console
        .post("/api/force-release", VIEWER, "application/json", &force)
        .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = console
        .post(
            "/api/unquarantine",
            VIEWER,
            "application/json",
            r#"{"key":"a:held"}"#,
        )
        .await;
    assert_eq!(status, 403, "{body}");
    let (_, body) = console.get("/api/me", Some(VIEWER)).await;
    let me = json(&body);
    assert_eq!(me["principal"], "viewer");
    assert_eq!(me["admin"], false);
    let (_, body) = console
        .get("/api/key?key=a%3Aheld&brief=1", Some(OPS))
        .await;
    assert_eq!(
        json(&body)["key"]["lease"]["fence"],
        lease.fence,
        "still held"
    );
}

/// An admin action in any content type but application/json is refused
/// (415): what a cross-site form could send.
#[tokio::test]
async fn admin_actions_refuse_form_and_text_bodies() {
    let console = Console::start();
    acquire(&console, "a:form", 30_000).await;
    for content_type in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        for path in ["/api/force-release", "/api/unquarantine"] {
            let (status, body) = console
                .post(path, OPS, content_type, r#"{"key":"a:form","fence":1}"#)
                .await;
            assert_eq!(status, 415, "{path} {content_type}: {body}");
        }
    }
    let response = console
        .send("GET", "/api/force-release", Some(OPS), None, "")
        .await;
    assert_eq!(response.status(), 405);
}

/// An admin's force-release ends the live term (as suspended); a stale
/// fence is refused.
#[tokio::test]
async fn an_admin_force_release_ends_the_term() {
    let console = Console::start();
    let lease = acquire(&console, "a:stuck", 30_000).await;
    let stale = format!(r#"{{"key":"a:stuck","fence":{}}}"#, lease.fence + 1);
    let (status, _) = console
        .post("/api/force-release", OPS, "application/json", &stale)
        .await;
    assert_eq!(status, 409, "a fence that is not live");
    let force = format!(r#"{{"key":"a:stuck","fence":{}}}"#, lease.fence);
    let (status, body) = console
        .post(
            "/api/force-release",
            OPS,
            "application/json; charset=utf-8",
            &force,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains(&lease.lease_id));
    assert_eq!(json(&body)["ended"]["end"], "suspended");
    let (_, body) = console.get("/api/key?key=a%3Astuck", Some(VIEWER)).await;
    let key = json(&body);
    assert!(key["key"]["lease"].is_null(), "{body}");
    assert_eq!(key["key"]["recoverable"], true);
    assert_eq!(key["history"][0]["fence"], lease.fence);
    // The holder's next renewal learns it lost the key.
    let mut client = console.grpc(OPS).await;
    let renewed = client
        .renew(pb::RenewRequest {
            key: "a:stuck".into(),
            fence: lease.fence,
            lease_id: lease.lease_id.clone(),
            ttl_ms: 0,
        })
        .await;
    assert!(renewed.is_err());
}

/// The watch stream delivers an acquire, then a release, one NDJSON line each.
#[tokio::test]
async fn the_watch_stream_delivers_a_grant_then_a_release() {
    let console = Console::start();
    let mut watch = console
        .send("GET", "/api/watch?prefix=a%3A", Some(VIEWER), None, "")
        .await;
    assert_eq!(watch.status(), 200);
    let body = watch.body_mut();
    let start = read_lines(body, |lines| !lines.is_empty()).await;
    assert_eq!(start[0]["type"], "start");
    let lease = acquire(&console, "a:watched", 30_000).await;
    let mut client = console.grpc(OPS).await;
    client
        .release(pb::ReleaseRequest {
            key: "a:watched".into(),
            fence: lease.fence,
            lease_id: lease.lease_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let lines = read_lines(body, |lines| lines.len() >= 2).await;
    let kinds: Vec<&str> = lines.iter().map(|l| l["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["granted", "released"]);
    assert!(
        lines
            .iter()
            .all(|l| l["key"] == "a:watched" && l["fence"] == lease.fence)
    );
    assert!(
        lines
            .iter()
            .all(|l| !l.to_string().contains(&lease.lease_id))
    );
}

/// Without --auth, a loopback console answers only requests for a loopback
/// host (no DNS rebinding), and says every viewer may do everything.
#[tokio::test]
async fn without_auth_only_loopback_hosts_are_answered() {
    let console = Console::start_with(false, &[]);
    let (status, body) = console.get("/api/me", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["auth"], false);
    let stream = tokio::net::TcpStream::connect(console.http).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let rebound = http::Request::builder()
        .uri("/api/keys")
        .header("host", "attacker.example:7421")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(rebound).await.unwrap();
    assert_eq!(response.status(), 421);
}

/// On PostgreSQL the console lists, and force-releases, through the same
/// service (skipped without LEASEHOLD_TEST_POSTGRES).
#[tokio::test]
async fn the_console_works_on_postgres() {
    let schema = schema_or_skip!();
    let console = Console::start_with(true, &["--store", &schema.url, "--pg-schema", &schema.name]);
    let lease = acquire(&console, "a:pg", 30_000).await;
    let (status, body) = console.get("/api/keys?prefix=a%3A", Some(VIEWER)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["keys"][0]["lease"]["fence"], lease.fence);
    assert!(!body.contains(&lease.lease_id));
    let (_, body) = console.get("/api/info", Some(VIEWER)).await;
    assert_eq!(json(&body)["backend"], "postgres");
    let force = format!(r#"{{"key":"a:pg","fence":{}}}"#, lease.fence);
    let (status, body) = console
        .post("/api/force-release", OPS, "application/json", &force)
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, body) = console
        .get("/api/key?key=a%3Apg&brief=1", Some(VIEWER))
        .await;
    assert!(json(&body)["key"]["lease"].is_null(), "{body}");
}

/// Off loopback, the console is refused without --auth unless --insecure.
#[test]
fn the_console_is_refused_off_loopback_without_auth() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let output = Command::new(common::binary())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--console-listen",
            "0.0.0.0:0",
        ])
        .args(["--db", db.to_str().unwrap()])
        .env_remove("LEASEHOLD_STORE")
        .env_remove("LEASEHOLD_DB")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("refusing to serve the console"), "{stderr}");
    assert!(stderr.contains("--insecure"), "{stderr}");
}
