//! The web console: `serve --console-listen ADDR` (off unless given).
//!
//! One page (`assets/`, embedded in the binary: no CDN, no build step) and a
//! few JSON endpoints under `/api/`, on plain HTTP/1.1 over the hyper that
//! tonic already builds on.
//!
//! # One copy of the rules
//! Every endpoint calls the very [`LeaseholdService`] the gRPC listener
//! serves, with the browser's `Authorization` header passed on as request
//! metadata: authentication, scopes (a List or a Watch shows only the keys
//! the caller may read), limits and request metrics are gRPC's own. The one
//! action with no RPC of its own, force-release, checks the admin right with
//! the same `grpc::identify` and
//! [`Principal::allow`](crate::auth::Principal::allow) the RPCs use, then
//! calls the Release RPC with the live term's lease id, read in-process: the
//! lease id never leaves the server (no reply, page, URL or log line holds
//! one).
//!
//! # Security
//! - A strict Content-Security-Policy on every response: scripts and styles
//!   only from the console itself, no inline code, no framing.
//! - Admin actions are `POST` with `Content-Type: application/json` (a
//!   cross-site form can send neither that type nor an `Authorization`
//!   header; anything else is 415), and a request whose `Origin` is not the
//!   console's own is refused.
//! - Without `--auth`, on a loopback listener, the `Host` header must name
//!   a loopback host, so a page on another site cannot reach a local console
//!   by DNS rebinding.
//! - Mutual TLS is not offered here: off loopback the console needs
//!   `--auth` (bearer tokens) or `--insecure`, as `serve` decides.
//!
//! # Cost
//! Nothing runs for the console while nobody has it open: a watch exists
//! only while a page's `/api/watch` request streams, and ends when the page
//! goes away.

mod json;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::StreamExt;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::Code;

use crate::auth::{AuthConfig, Right};
use crate::backend::Backend;
use crate::grpc::{LeaseholdService, identify};
use crate::metrics::Exposition;
use leasehold_core::lease::Key;
use leasehold_wire::pb;
use leasehold_wire::pb::leasehold_server::Leasehold;

const INDEX_HTML: &str = include_str!("assets/index.html");
const CONSOLE_JS: &str = include_str!("assets/console.js");
const CONSOLE_CSS: &str = include_str!("assets/console.css");

/// The Content-Security-Policy of every response.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The largest request body (an admin action's JSON) the console reads.
const MAX_BODY_BYTES: usize = 16 * 1024;

/// How often an idle watch stream sends a `ping` line, so a page that went
/// away is noticed (its write fails) and its watch ends.
const WATCH_PING: Duration = Duration::from_secs(15);

/// How many history entries the key page shows.
const HISTORY_PAGE: u32 = 50;

/// The backend's own gauges the Activity page shows, as `/metrics` names them.
const HEALTH_GAUGES: &[(&str, &str)] = &[
    ("leasehold_leases_live", "leases_live"),
    ("leasehold_keys", "keys"),
    ("leasehold_waiters", "waiters"),
    ("leasehold_watchers", "watchers"),
    ("leasehold_keys_quarantined", "keys_quarantined"),
    ("leasehold_tool_calls_unsettled", "tool_calls_unsettled"),
    ("leasehold_revision", "revision"),
    ("leasehold_pg_database_up", "database_up"),
];

type Body = UnsyncBoxBody<Bytes, Infallible>;
type Reply = http::Response<Body>;

/// The console of one server: a cheap handle, cloned into every connection.
#[derive(Clone)]
pub struct Console {
    /// The gRPC service the listener serves: every read and write of the
    /// console is one of its RPCs.
    service: LeaseholdService,
    /// For what no RPC tells: health, and the live term's lease id that
    /// force-release hands to the Release RPC.
    backend: Arc<dyn Backend>,
    /// The principals `--auth` loaded; `None` serves everyone.
    auth: Option<Arc<AuthConfig>>,
    /// The console's watch streams open now.
    watchers: Arc<AtomicUsize>,
    /// Whether requests must name a loopback `Host` (against DNS
    /// rebinding): without auth, on a loopback listener.
    check_host: bool,
}

impl Console {
    /// A console over `service` (the one the gRPC listener serves).
    pub fn new(
        service: LeaseholdService,
        backend: Arc<dyn Backend>,
        auth: Option<Arc<AuthConfig>>,
    ) -> Self {
        Console {
            service,
            backend,
            auth,
            watchers: Arc::default(),
            check_host: false,
        }
    }
}

/// Serves `console` on `listener` until `stop` turns true; open
/// connections (watch streams included) are closed then.
pub async fn serve(listener: TcpListener, console: Console, mut stop: watch::Receiver<bool>) {
    // Off loopback without auth (--insecure) any host name is expected.
    let on_loopback = listener
        .local_addr()
        .is_ok_and(|addr| addr.ip().is_loopback());
    let console = Console {
        check_host: console.auth.is_none() && on_loopback,
        ..console
    };
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.changed() => return,
        };
        let (socket, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!(error = %e, "console: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let local = socket.local_addr().ok();
        let console = console.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let console = console.clone();
                async move { Ok::<_, Infallible>(console.handle(request, peer, local).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(socket), service);
            tokio::select! {
                _ = connection => {}
                _ = stop.changed() => {}
            }
        });
    }
}

/// What one request asked for, with what the RPCs need from it.
struct Call {
    headers: HeaderMap,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    query: Vec<(String, String)>,
}

impl Call {
    /// The query parameter `name` ("" when absent).
    fn param(&self, name: &str) -> &str {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }

    /// `message` as a gRPC request from this caller: its `Authorization`
    /// header as metadata, its address as the peer (for per-address limits).
    fn grpc<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(value) = self
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| tonic::metadata::MetadataValue::try_from(v).ok())
        {
            request.metadata_mut().insert("authorization", value);
        }
        request
            .extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo {
                local_addr: self.local,
                remote_addr: Some(self.peer),
            });
        request
    }
}

impl Console {
    /// Answers one request, with the security headers every response carries.
    async fn handle(
        &self,
        request: http::Request<Incoming>,
        peer: SocketAddr,
        local: Option<SocketAddr>,
    ) -> Reply {
        let mut reply = self.route(request, peer, local).await;
        let headers = reply.headers_mut();
        let fixed = [
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CONTENT_SECURITY_POLICY),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ];
        for (name, value) in fixed {
            headers.insert(name, value);
        }
        reply
    }

    async fn route(
        &self,
        request: http::Request<Incoming>,
        peer: SocketAddr,
        local: Option<SocketAddr>,
    ) -> Reply {
        let (parts, body) = request.into_parts();
        if self.check_host && !loopback_host(&parts.headers) {
            return error(
                StatusCode::MISDIRECTED_REQUEST,
                "bad_host",
                "without --auth the console answers only requests for a loopback host",
            );
        }
        let call = Call {
            query: parse_query(parts.uri.query().unwrap_or("")),
            headers: parts.headers,
            peer,
            local,
        };
        let path = parts.uri.path();
        match (&parts.method, path) {
            (&Method::GET, "/" | "/index.html") => asset("text/html; charset=utf-8", INDEX_HTML),
            (&Method::GET, "/console.js") => asset("text/javascript; charset=utf-8", CONSOLE_JS),
            (&Method::GET, "/console.css") => asset("text/css; charset=utf-8", CONSOLE_CSS),
            (&Method::GET, "/api/me") => self.me(&call),
            (&Method::GET, "/api/info") => self.info(&call).await,
            (&Method::GET, "/api/keys") => self.keys(&call).await,
            (&Method::GET, "/api/key") => self.key(&call).await,
            (&Method::GET, "/api/watch") => self.watch(&call).await,
            (&Method::POST, "/api/unquarantine" | "/api/force-release") => {
                let input = match admin_input(&call.headers, body).await {
                    Ok(input) => input,
                    Err(refusal) => return refusal,
                };
                if path == "/api/unquarantine" {
                    self.unquarantine(&call, &input).await
                } else {
                    self.force_release(&call, &input).await
                }
            }
            (
                _,
                "/" | "/index.html" | "/console.js" | "/console.css" | "/api/me" | "/api/info"
                | "/api/keys" | "/api/key" | "/api/watch" | "/api/unquarantine"
                | "/api/force-release",
            ) => error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "reads are GET, admin actions POST",
            ),
            _ => error(StatusCode::NOT_FOUND, "not_found", "no such page"),
        }
    }

    /// `GET /api/me`: who the caller is and its scopes, so the page shows
    /// admin actions only where they would be allowed.
    fn me(&self, call: &Call) -> Reply {
        let Some(auth) = &self.auth else {
            return ok(json!({
                "auth": false,
                "principal": null,
                "admin": true,
                "scopes": [{ "prefix": "", "rights": ["admin"] }],
            }));
        };
        match identify(auth, &call.grpc(())) {
            Err(err) => status_error(leasehold_wire::status::to_status(err)),
            Ok(who) => {
                let scopes: Vec<Value> = who
                    .scopes
                    .iter()
                    .map(|s| {
                        let rights: Vec<&str> = s.rights.iter().map(|r| r.name()).collect();
                        json!({ "prefix": s.prefix, "rights": rights })
                    })
                    .collect();
                let admin = who.scopes.iter().any(|s| s.rights.contains(&Right::Admin));
                ok(json!({
                    "auth": true,
                    "principal": who.name,
                    "admin": admin,
                    "scopes": scopes,
                }))
            }
        }
    }

    /// `GET /api/info`: the server (ServerInfo) and its health.
    async fn info(&self, call: &Call) -> Reply {
        let info = match self
            .service
            .server_info(call.grpc(pb::ServerInfoRequest {}))
            .await
        {
            Ok(reply) => reply.into_inner(),
            Err(status) => return status_error(status),
        };
        let serving = *self.backend.serving().borrow();
        let mut exposition = Exposition::default();
        self.backend.write_metrics(&mut exposition);
        let text = exposition.into_text();
        let mut gauges = serde_json::Map::new();
        for (metric, name) in HEALTH_GAUGES {
            if let Some(value) = sample(&text, metric) {
                gauges.insert((*name).to_owned(), json!(value));
            }
        }
        ok(json!({
            "version": info.version,
            "protocol": info.protocol,
            "backend": info.backend,
            "serving": serving,
            "console_watchers": self.watchers.load(Ordering::Relaxed),
            "gauges": gauges,
            "now_ms": now_ms(),
        }))
    }

    /// `GET /api/keys?prefix=&filter=&page_token=&page_size=`: one List page.
    async fn keys(&self, call: &Call) -> Reply {
        let filter = match call.param("filter") {
            "" | "all" => pb::ListFilter::All,
            "live" => pb::ListFilter::Live,
            "recoverable" => pb::ListFilter::Recoverable,
            "quarantined" => pb::ListFilter::Quarantined,
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_argument",
                    "filter is one of all, live, recoverable, quarantined",
                );
            }
        };
        let page_size = call.param("page_size").parse().unwrap_or(50);
        let request = pb::ListRequest {
            prefix: call.param("prefix").to_owned(),
            filter: filter as i32,
            page_size,
            page_token: call.param("page_token").to_owned(),
        };
        match self.service.list(call.grpc(request)).await {
            Err(status) => status_error(status),
            Ok(reply) => {
                let reply = reply.into_inner();
                let keys: Vec<Value> = reply.keys.iter().map(json::key_state).collect();
                ok(json!({
                    "keys": keys,
                    "next_page_token": reply.next_page_token,
                    "now_ms": now_ms(),
                }))
            }
        }
    }

    /// `GET /api/key?key=K`: the key's state, history and tool-call ledger
    /// (`&brief=1`: the state alone).
    async fn key(&self, call: &Call) -> Reply {
        let key = call.param("key").to_owned();
        let got = self
            .service
            .get(call.grpc(pb::GetRequest { key: key.clone() }))
            .await;
        let state = match got {
            Ok(reply) => json::get_response(&key, &reply.into_inner()),
            Err(status) => return status_error(status),
        };
        if call.param("brief") == "1" {
            return ok(json!({ "key": state, "now_ms": now_ms() }));
        }
        let history = self
            .service
            .history(call.grpc(pb::HistoryRequest {
                key: key.clone(),
                page_size: HISTORY_PAGE,
                page_token: String::new(),
            }))
            .await;
        let history: Vec<Value> = match history {
            Ok(reply) => reply
                .into_inner()
                .entries
                .iter()
                .map(json::history_entry)
                .collect(),
            Err(status) => return status_error(status),
        };
        let calls = self
            .service
            .list_tool_calls(call.grpc(pb::ListToolCallsRequest {
                key,
                filter: pb::list_tool_calls_request::Filter::All as i32,
            }))
            .await;
        let calls: Vec<Value> = match calls {
            Ok(reply) => reply
                .into_inner()
                .calls
                .iter()
                .map(json::tool_call)
                .collect(),
            Err(status) => return status_error(status),
        };
        ok(json!({
            "key": state,
            "history": history,
            "tool_calls": calls,
            "now_ms": now_ms(),
        }))
    }

    /// `GET /api/watch?prefix=P` (or `?key=K`): the Watch stream as NDJSON,
    /// a `start` line, then one line per event (and a `ping` line when idle).
    async fn watch(&self, call: &Call) -> Reply {
        let request = pb::WatchRequest {
            key: call.param("key").to_owned(),
            prefix: call.param("prefix").to_owned(),
            start_revision: 0,
        };
        let stream = match self.service.watch(call.grpc(request)).await {
            Ok(reply) => reply.into_inner(),
            Err(status) => return status_error(status),
        };
        let open = WatcherCount::new(self.watchers.clone());
        let lines = stream.flat_map(|reply| {
            let lines: Vec<Value> = match reply {
                Ok(reply) if reply.events.is_empty() => {
                    vec![json!({ "type": "start", "revision": reply.revision })]
                }
                Ok(reply) => reply.events.iter().map(json::event).collect(),
                Err(status) => vec![json!({
                    "type": "error",
                    "code": code_name(status.code()),
                    "message": status.message(),
                })],
            };
            futures_util::stream::iter(lines)
        });
        // The stream ends with the watch (an error line is its last word);
        // a ping fills each long silence.
        let lines = futures_util::stream::unfold(lines.boxed(), |mut lines| async move {
            tokio::select! {
                next = lines.next() => next.map(|line| (line, lines)),
                () = tokio::time::sleep(WATCH_PING) => Some((json!({ "type": "ping" }), lines)),
            }
        });
        let body = lines
            .map(move |line| {
                let _open = &open;
                let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
                bytes.push(b'\n');
                Ok::<_, Infallible>(Frame::data(Bytes::from(bytes)))
            })
            .boxed();
        http::Response::builder()
            .header(header::CONTENT_TYPE, "application/x-ndjson")
            .body(BodyExt::boxed_unsync(StreamBody::new(body)))
            .unwrap_or_else(|_| internal())
    }

    /// `POST /api/unquarantine {"key"}`: the Unquarantine RPC.
    async fn unquarantine(&self, call: &Call, input: &AdminInput) -> Reply {
        let request = pb::UnquarantineRequest {
            key: input.key.clone(),
        };
        match self.service.unquarantine(call.grpc(request)).await {
            Ok(reply) => {
                let state = reply.into_inner().key.unwrap_or_default();
                ok(json!({ "key": json::key_state(&state) }))
            }
            Err(status) => status_error(status),
        }
    }

    /// `POST /api/force-release {"key", "fence"}`: ends the live term
    /// `fence` of `key` as suspended (unfinished: the key is recoverable and
    /// its unsettled tool calls stay for a recoverer). Needs the admin right
    /// on the key; a `fence` that is no longer the live term is refused
    /// (409), so what was confirmed is what ends.
    async fn force_release(&self, call: &Call, input: &AdminInput) -> Reply {
        let Some(fence) = input.fence else {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                "force-release needs the fence of the term to end",
            );
        };
        if let Some(auth) = &self.auth {
            let allowed =
                identify(auth, &call.grpc(())).and_then(|who| who.allow(Right::Admin, &input.key));
            if let Err(err) = allowed {
                return status_error(leasehold_wire::status::to_status(err));
            }
        }
        let key = match Key::parse(input.key.clone()) {
            Ok(key) => key,
            Err(err) => return status_error(leasehold_wire::status::to_status(err.into())),
        };
        let live = match self.backend.get(&key).await {
            Ok(view) => view.live,
            Err(err) => return status_error(leasehold_wire::status::to_status(err)),
        };
        let Some(term) = live.filter(|t| t.fence.0 == fence) else {
            return error(
                StatusCode::CONFLICT,
                "not_live",
                &format!("fence {fence} is not the live term of {key}"),
            );
        };
        let request = pb::ReleaseRequest {
            key: input.key.clone(),
            fence,
            lease_id: term.lease_id.to_string(),
            suspend: true,
            successor: String::new(),
            handoff_ms: 0,
        };
        match self.service.release(call.grpc(request)).await {
            Ok(reply) => {
                let ended = reply.into_inner().ended.unwrap_or_default();
                tracing::info!(%key, fence, "console: term force-released");
                ok(json!({ "ended": json::ended(&ended) }))
            }
            Err(status) => status_error(status),
        }
    }
}

/// An admin action's request body.
struct AdminInput {
    key: String,
    fence: Option<u64>,
}

/// Reads an admin action's JSON body, refusing what a cross-site form could
/// send: a content type other than `application/json` (415) or another
/// site's `Origin` (403).
async fn admin_input(headers: &HeaderMap, body: Incoming) -> Result<AdminInput, Reply> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    if !media.eq_ignore_ascii_case("application/json") {
        return Err(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "admin actions take Content-Type: application/json",
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        let same = match (origin.to_str().ok(), host) {
            (Some(origin), Some(host)) => {
                origin == format!("http://{host}") || origin == format!("https://{host}")
            }
            _ => false,
        };
        if !same {
            return Err(error(
                StatusCode::FORBIDDEN,
                "cross_origin",
                "admin actions are taken from the console's own page only",
            ));
        }
    }
    let bytes = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                "the request body is too large",
            ));
        }
    };
    let parsed: Value = serde_json::from_slice(&bytes).map_err(|_| {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "the body is not JSON",
        )
    })?;
    let Some(key) = parsed.get("key").and_then(Value::as_str) else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "the body names no key",
        ));
    };
    Ok(AdminInput {
        key: key.to_owned(),
        fence: parsed.get("fence").and_then(Value::as_u64),
    })
}

/// Counts a console watch stream while it is open.
struct WatcherCount(Arc<AtomicUsize>);

impl WatcherCount {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        WatcherCount(count)
    }
}

impl Drop for WatcherCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether the request's `Host` names a loopback host (`localhost`,
/// `127.0.0.1`, `[::1]`, with any port).
fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The `name=value` pairs of a query string, percent-decoded (`+` is a space).
fn parse_query(query: &str) -> Vec<(String, String)> {
    let decode = |text: &str| {
        let text = text.replace('+', " ");
        percent_encoding::percent_decode_str(&text)
            .decode_utf8_lossy()
            .into_owned()
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) => (decode(name), decode(value)),
            None => (decode(pair), String::new()),
        })
        .collect()
}

/// The value of the unlabelled sample `name` in a metrics exposition.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|value| value.trim().parse().ok())
}

/// The server's wall clock, for the page's countdowns.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn asset(content_type: &'static str, text: &'static str) -> Reply {
    http::Response::builder()
        .header(header::CONTENT_TYPE, content_type)
        .body(BodyExt::boxed_unsync(Full::new(Bytes::from_static(
            text.as_bytes(),
        ))))
        .unwrap_or_else(|_| internal())
}

fn respond(status: StatusCode, value: &Value) -> Reply {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    http::Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(BodyExt::boxed_unsync(Full::new(Bytes::from(bytes))))
        .unwrap_or_else(|_| internal())
}

fn ok(value: Value) -> Reply {
    respond(StatusCode::OK, &value)
}

fn error(status: StatusCode, code: &str, message: &str) -> Reply {
    respond(
        status,
        &json!({ "error": { "code": code, "message": message } }),
    )
}

fn internal() -> Reply {
    let mut reply = http::Response::new(BodyExt::boxed_unsync(Full::new(Bytes::new())));
    *reply.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    reply
}

/// A gRPC refusal as an HTTP one: the one table from status codes to HTTP.
fn status_error(status: tonic::Status) -> Reply {
    let http = match status.code() {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::Aborted | Code::FailedPrecondition | Code::AlreadyExists => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(http, code_name(status.code()), status.message())
}

/// A gRPC code as the snake_case word the page shows.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_decoded() {
        let query = parse_query("prefix=a%3Ab+c&filter=live&flag");
        assert_eq!(
            query,
            vec![
                ("prefix".to_owned(), "a:b c".to_owned()),
                ("filter".to_owned(), "live".to_owned()),
                ("flag".to_owned(), String::new()),
            ]
        );
    }

    #[test]
    fn only_loopback_hosts_pass_without_auth() {
        let host = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_static(value));
            loopback_host(&headers)
        };
        assert!(host("127.0.0.1:7421"));
        assert!(host("localhost:7421"));
        assert!(host("[::1]:7421"));
        assert!(!host("evil.example:7421"));
        assert!(!host("10.0.0.1"));
    }

    #[test]
    fn unlabelled_samples_are_read_from_an_exposition() {
        let text = "# HELP leasehold_waiters x\nleasehold_waiters 3\nleasehold_waiters_total 9\n";
        assert_eq!(sample(text, "leasehold_waiters"), Some(3.0));
        assert_eq!(sample(text, "leasehold_keys"), None);
    }
}
