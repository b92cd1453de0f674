//! The Rust client: fenced session guards.
//!
//! The server alone cannot stop two processes from driving one session: a
//! process that lost its lease keeps running until it notices. This client
//! makes noticing the easy path. [`Client::acquire`] returns a
//! [`SessionGuard`] that renews itself, knows when it can no longer be sure it
//! holds the lease, and has one call to make before every continuation.
//!
//! ```no_run
//! use std::time::Duration;
//! use leasehold_client::{Client, ClientError};
//!
//! # async fn turn() -> Result<(), ClientError> {
//! let client = Client::connect("http://127.0.0.1:7420").await?;
//! let guard = client
//!     .acquire("session:42")
//!     .owner("graph-a")
//!     .ttl(Duration::from_secs(10))
//!     .wait(Duration::from_secs(30))
//!     .await?;
//! // Before each model request and each terminal write:
//! let fence = guard.gate().await?;
//! // ... send the request; store its result with `fence` (see `leasehold_client::fence`) ...
//! # let _ = fence;
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # The guard's life
//! 1. **Acquired.** The acquire carries a request id (a fresh UUID unless you
//!    set one) and is retried on transient failures with that same id, so a
//!    lost reply cannot leave a second, orphaned term behind: the server
//!    replays the term it granted.
//! 2. **Held.** A background task renews the term about every third of the
//!    TTL ([`AcquireBuilder::renew_every`]) and retries failed renewals with
//!    jittered, growing pauses. The guard keeps a *local deadline*: the time
//!    the last successful renewal (or the acquire) was *sent*, plus the TTL,
//!    less a safety margin ([`AcquireBuilder::safety_margin`]), on the local
//!    monotonic clock ([`tokio::time::Instant`]). The server granted or
//!    extended the term after that send, so the term cannot end before the
//!    deadline unless the server's clock runs fast. This is how a holder that
//!    cannot reach the server still learns it may have lost the lease, as
//!    Kubernetes' client-go leader election and Chubby's client do.
//! 3. **Unsure.** When the deadline passes without a successful renewal, the
//!    guard is not valid ([`SessionGuard::is_valid`] is false,
//!    [`SessionGuard::lost`] resolves with [`LossReason::DeadlinePassed`]).
//!    Renewal goes on: if a later one succeeds with the same fence, the
//!    server never ended the term, nobody else held the key in between, and
//!    the guard is valid again.
//! 4. **Lost.** A renewal or check refused with `FAILED_PRECONDITION` (the
//!    term expired on the server's clock, or a newer term superseded it)
//!    is final: the guard never becomes valid again, and renewal stops.
//! 5. **Ended.** [`SessionGuard::release`] ends the term as finished and
//!    [`SessionGuard::suspend`] as unfinished (the key becomes recoverable).
//!    Both present the fence and the secret lease id, so they can never end
//!    somebody else's term, and both consume the guard.
//!
//! # Dropping a guard
//! Dropping a guard without releasing it stops renewal at once and, in the
//! background, makes one best-effort attempt to **suspend** the term (release
//! it as unfinished). A guard is usually dropped on an error path, a panic or
//! a cancelled task, where the work is not known to be done; suspending frees
//! the key for the next holder at once and marks it recoverable, so whoever
//! takes it over looks at what was left. If that attempt fails (the runtime
//! is shutting down, the server is unreachable), the term simply expires at
//! its TTL. Call `release()` when the work is finished.
//!
//! # The gate
//! [`SessionGuard::gate`] is the one call to make before sending a request
//! to a model or committing a terminal write: a local check (no round trip
//! when the guard is already known to be invalid), then a `Check` round trip
//! proving the fence is still the key's live term, then the local check
//! again. It returns the fence to store with the write:
//!
//! ```no_run
//! # async fn step(guard: &leasehold_client::SessionGuard) -> Result<(), leasehold_client::ClientError> {
//! let fence = guard.gate().await?;
//! # let _ = fence;
//! # Ok(())
//! # }
//! ```
//!
//! [`SessionGuard::run`] goes one step further for work that takes time (a
//! model call, a tool): it passes the gate, runs the work while watching
//! [`SessionGuard::lost`] (cancelling the work if the lease is lost), and
//! passes the gate again before handing back the result.
//!
//! A gate narrows the window in which a stale holder can act; it cannot close
//! it. A process paused between the gate and its write still writes late.
//! Storage that checks the fence itself closes it: see [`crate::fence`].
//!
//! # Several servers
//! Servers on one PostgreSQL database share every term, so
//! [`Client::connect_any`] takes a list and fails over from one to the next
//! when a server is unavailable, resending only the calls that are safe to
//! send twice (renew, check, release, an acquire with its request id). A
//! guard keeps its lease across a failover; its deadline still rests on the
//! first send of the renewal the next server acknowledged.
//!
//! # Errors
//! Every call returns [`ClientError`]: what the server said, as the domain
//! [`Error`] (busy with the holder named, stale fence, permission,
//! invalid argument, unavailable), converted from the gRPC status in one
//! place, or [`ClientError::Lost`] with the [`LossReason`].

mod endpoints;
/// Sends one unary call through the client's endpoints, moving to the next
/// on UNAVAILABLE when `resend` says the call is safe to send again; yields
/// the reply: `unary!(endpoints, Resend::Safe, "Get", timeout, get, message)?`.
macro_rules! unary {
    ($endpoints:expr, $resend:expr, $name:literal, $timeout:expr, $method:ident, $message:expr) => {{
        let message = &$message;
        let timeout = $timeout;
        $endpoints
            .run($resend, |node| {
                let mut rpc = node.rpc.clone();
                let message = message.clone();
                async move {
                    $crate::call(
                        $name,
                        timeout,
                        rpc.$method($crate::request(message, timeout)),
                    )
                    .await
                }
            })
            .await
    }};
}

mod error;
#[cfg(feature = "sqlite-fence")]
pub mod fence;
mod guard;
mod ops;
mod session;
mod tools;
mod watch;

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use endpoints::{Endpoints, Resend};
use leasehold_wire::convert;
use leasehold_wire::pb;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;
use leasehold_wire::pb::session_request::Op;
use tonic::service::interceptor::InterceptedService;
use tonic_health::pb::health_client::HealthClient;

pub use error::{ClientError, LossReason};
pub use guard::{Ended, SessionGuard};
pub use leasehold_core::error::Held;
pub use leasehold_core::events::{Event, EventKind, Selector};
pub use leasehold_core::lease::{
    AcquireOptions, Fence, HistoryEntry, Key, KeyState, Lease, LeaseId, Owner, Reservation,
    TermEnd, Ttl,
};
pub use leasehold_core::ledger::{CallState, ToolCall};
pub use leasehold_core::lessor::{Acquire, ListFilter};
pub use leasehold_core::{Error, StaleReason};
pub use ops::{Granted, HistoryPage, KeyPage, NEEDS_PROTOCOL, ServerInfo};
pub use tools::{ToolCallRequest, ToolCalls, ToolInvocation, ToolOutcome, ToolResult};
pub use watch::Watch;

/// The TTL an acquire asks for unless told otherwise.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// How many times an acquire is sent, at most, when the server is unreachable.
pub const DEFAULT_ATTEMPTS: u32 = 3;
/// The longest the default safety margin gets, whatever the TTL.
const MAX_DEFAULT_MARGIN: Duration = Duration::from_secs(2);
/// The longest the default per-call timeout gets, whatever the TTL.
const MAX_DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an HTTP/2 ping checks the connection, even when idle.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// How long a ping may go unanswered before the connection counts as dead.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The generated gRPC client as this crate uses it: every call passes the
/// client's [`Credentials`].
pub type Rpc = LeaseholdClient<InterceptedService<Channel, Credentials>>;

/// The `grpc.health.v1` client on the same channel and credentials.
pub(crate) type Health = HealthClient<InterceptedService<Channel, Credentials>>;

/// What a client presents to a server run with `--auth`: a bearer token
/// (sent as `authorization: Bearer <token>`). A client certificate (mutual
/// TLS) is given in [`Tls`] instead.
#[derive(Clone, Default)]
pub struct Credentials {
    header: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl std::fmt::Debug for Credentials {
    // Never print the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &self.header.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Credentials {
    /// A bearer token.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the token cannot travel in a header
    /// (control characters, non-ASCII).
    pub fn bearer(token: &str) -> Result<Credentials, ClientError> {
        let mut value = format!("Bearer {token}")
            .parse::<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>()
            .map_err(|_| Error::InvalidArgument("the token is not a valid header value".into()))?;
        value.set_sensitive(true);
        Ok(Credentials {
            header: Some(value),
        })
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(header) = &self.header {
            request
                .metadata_mut()
                .insert("authorization", header.clone());
        }
        Ok(request)
    }
}

/// TLS options for [`Client::connect_tls`], as PEM bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    /// CA certificates the server's certificate must chain to; `None`
    /// trusts the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// A client certificate chain and its key, for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to check the server's certificate against, when it is not
    /// the endpoint's host.
    pub domain: Option<String>,
}

impl Tls {
    fn is_empty(&self) -> bool {
        self == &Tls::default()
    }

    fn client_config(&self) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let mut config = ClientTlsConfig::new();
        config = match &self.ca_pem {
            Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        config
    }
}

/// A connection to a leasehold server, or to several servers on one
/// PostgreSQL database with failover between them
/// ([`Client::connect_any`]). Cheap to clone; clones share the connections.
#[derive(Debug, Clone)]
pub struct Client {
    /// The servers, each with its generated gRPC client and the Session
    /// stream that carries every guard's checks, renewals and releases
    /// (opened on first use), and which one calls go to now.
    pub(crate) endpoints: Arc<Endpoints>,
}

impl Client {
    /// Connects to the server at `endpoint` (`http://host:port`; a bare
    /// `host:port` means plain HTTP/2; `https://host:port` is TLS, checked
    /// against the system's trusted roots).
    ///
    /// The connection is re-established on demand if it breaks later.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a malformed endpoint;
    /// [`Error::Unavailable`] when nothing answers there.
    pub async fn connect(endpoint: impl Into<String>) -> Result<Client, ClientError> {
        Self::connect_tls(endpoint, Tls::default()).await
    }

    /// Connects to `endpoint` over TLS with `tls` (a private CA, a client
    /// certificate for mutual TLS). The endpoint may be `https://host:port`
    /// or a bare `host:port`; `http://` with TLS options is refused rather
    /// than silently sent in clear text.
    ///
    /// # Errors
    /// As [`Client::connect`]; [`Error::InvalidArgument`] for unusable TLS
    /// material.
    pub async fn connect_tls(endpoint: impl Into<String>, tls: Tls) -> Result<Client, ClientError> {
        Self::connect_with(endpoint, tls, Credentials::default()).await
    }

    /// Connects to `endpoint` with `tls` (empty for plaintext) and sends
    /// `credentials` (a bearer token for servers run with `--auth`) with
    /// every call.
    ///
    /// # Errors
    /// As [`Client::connect_tls`].
    pub async fn connect_with(
        endpoint: impl Into<String>,
        tls: Tls,
        credentials: Credentials,
    ) -> Result<Client, ClientError> {
        Self::connect_any_with([endpoint], tls, credentials).await
    }

    /// Connects to several servers that share one PostgreSQL database
    /// (`leasehold serve --store postgres://…`), with failover: calls go to
    /// one server at a time (the first in `endpoints` that answers now)
    /// and move on to the next in the list when it answers UNAVAILABLE (it
    /// died, is stopping, lost its database, or did not answer in time).
    /// Guards keep renewing through the next server with the same fence and
    /// lease id; a call that is safe to send twice is resent there at once
    /// (renew, check, release, an acquire with its request id), others fail
    /// and the next call goes to the next server. Each endpoint is written
    /// as for [`Client::connect`].
    ///
    /// Do not list servers on different stores (two SQLite servers): a
    /// term granted by one is unknown to the other.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no endpoint or a malformed one;
    /// [`Error::Unavailable`] when none of them answers now (servers that
    /// do not answer yet are connected to when first needed).
    pub async fn connect_any<I, S>(endpoints: I) -> Result<Client, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::connect_any_with(endpoints, Tls::default(), Credentials::default()).await
    }

    /// [`Client::connect_any`] with `tls` (empty for plaintext) and
    /// `credentials`, the same for every endpoint.
    ///
    /// # Errors
    /// As [`Client::connect_any`] and [`Client::connect_tls`].
    pub async fn connect_any_with<I, S>(
        endpoints: I,
        tls: Tls,
        credentials: Credentials,
    ) -> Result<Client, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut built = Vec::new();
        for endpoint in endpoints {
            built.push(Self::endpoint(endpoint.into(), &tls)?);
        }
        if built.is_empty() {
            return Err(Error::InvalidArgument("no endpoint given".into()).into());
        }
        // All at once: a server that is down costs its connect timeout once,
        // not once per server behind it.
        let connected =
            futures_util::future::join_all(built.iter().map(|(_, e)| e.connect())).await;
        let mut nodes = Vec::with_capacity(built.len());
        let mut first = None;
        let mut failures = Vec::new();
        for (index, ((url, endpoint), outcome)) in built.into_iter().zip(connected).enumerate() {
            let channel = match outcome {
                Ok(channel) => {
                    first.get_or_insert(index);
                    channel
                }
                Err(e) => {
                    failures.push(format!("cannot connect to {url}: {}", chain(&e)));
                    // Connected to on first use, if it ever comes up.
                    endpoint.connect_lazy()
                }
            };
            nodes.push((url, channel, credentials.clone()));
        }
        let Some(first) = first else {
            return Err(Error::Unavailable(failures.join("; ")).into());
        };
        for failure in &failures {
            tracing::warn!("{failure}; trying it again when another server fails");
        }
        Ok(Client {
            endpoints: Arc::new(Endpoints::new(nodes, first)),
        })
    }

    /// One endpoint's URL and its settings, checked.
    fn endpoint(mut url: String, tls: &Tls) -> Result<(String, Endpoint), ClientError> {
        let wants_tls = !tls.is_empty();
        if !url.contains("://") {
            url = format!("{}://{url}", if wants_tls { "https" } else { "http" });
        }
        if wants_tls && url.starts_with("http://") {
            return Err(Error::InvalidArgument(format!(
                "endpoint {url:?} is plaintext but TLS options were given; use https://"
            ))
            .into());
        }
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| Error::InvalidArgument(format!("endpoint {url:?}: {}", chain(&e))))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            // A connection that goes silent (partition, dead peer: no FIN
            // or RST) would otherwise hold every guard's renewals until TCP
            // gives up, many minutes later; pings find it dead in seconds,
            // and the next call connects afresh.
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        if url.starts_with("https://") {
            endpoint = endpoint
                .tls_config(tls.client_config())
                .map_err(|e| Error::InvalidArgument(format!("TLS: {}", chain(&e))))?;
        }
        Ok((url, endpoint))
    }

    /// A client over a channel you configured yourself (TLS, interceptors...).
    pub fn new(channel: Channel) -> Client {
        Self::with_credentials(channel, Credentials::default())
    }

    /// A client over `channel` that sends `credentials` with every call.
    pub fn with_credentials(channel: Channel, credentials: Credentials) -> Client {
        Client {
            endpoints: Arc::new(Endpoints::new(
                vec![("channel".into(), channel, credentials)],
                0,
            )),
        }
    }

    /// The endpoint calls go to now: the first that answered, then the
    /// next in the list after each failover (`"channel"` for a client built
    /// on a channel).
    pub fn current_endpoint(&self) -> &str {
        &self.endpoints.current().url
    }

    /// Every endpoint of this client, in the order given.
    pub fn endpoints(&self) -> Vec<String> {
        self.endpoints.urls().map(str::to_owned).collect()
    }

    /// Starts an acquire of `key`; set options on the builder, then `.await` it.
    pub fn acquire(&self, key: impl Into<String>) -> AcquireBuilder {
        AcquireBuilder {
            endpoints: self.endpoints.clone(),
            key: key.into(),
            owner: None,
            ttl: DEFAULT_TTL,
            wait: Duration::ZERO,
            request_id: None,
            renew_every: None,
            safety_margin: None,
            rpc_timeout: None,
            attempts: DEFAULT_ATTEMPTS,
            options: AcquireOptions::default(),
        }
    }

    /// The generated gRPC client of the current server, for calls this API
    /// does not wrap. Calls made through it do not fail over.
    pub fn rpc(&self) -> Rpc {
        self.endpoints.current().rpc.clone()
    }

    /// Whether `fence` is the live term of `key` (Chubby's CheckSequencer),
    /// for a process that was handed a fence rather than holding the guard:
    /// `Ok` with the term while it is live, else the server's refusal
    /// ([`Error::StaleFence`] with the reason). Goes over the client's
    /// shared Session stream.
    ///
    /// # Errors
    /// [`Error::StaleFence`], [`Error::InvalidArgument`],
    /// [`Error::Unavailable`] (also when no reply came within `timeout`).
    pub async fn check(
        &self,
        key: &Key,
        fence: Fence,
        timeout: Duration,
    ) -> Result<Lease, ClientError> {
        let op = Op::Check(pb::CheckRequest {
            key: key.as_str().to_owned(),
            fence: fence.0,
        });
        let reply = self
            .endpoints
            .run(Resend::Safe, |node| {
                node.session.call("Check", op.clone(), timeout)
            })
            .await?;
        let lease = reply.lease.ok_or_else(|| guard::missing("Check"))?;
        Ok(convert::lease_from_pb(lease)?)
    }

    /// Sends one raw operation over the client's shared Session stream and
    /// waits up to `timeout` for its response; a refusal comes back as the
    /// [`ClientError`] the unary call would give. An escape hatch speaking
    /// the wire types, for tools (the load generator) that drive the
    /// protocol directly; applications use the guard. With several
    /// endpoints, an UNAVAILABLE answer moves on to the next server, and the
    /// operation is resent there only when that is safe (everything but an
    /// Acquire without a request id and BeginToolCalls).
    ///
    /// # Errors
    /// The operation's refusal, or [`Error::Unavailable`].
    pub async fn session_op(
        &self,
        op: Op,
        timeout: Duration,
    ) -> Result<pb::SessionResponse, ClientError> {
        let resend = match &op {
            Op::Acquire(acquire) if acquire.request_id.is_empty() => Resend::Unsafe,
            // A registration applied twice looks like another holder of the
            // term (as the unary BeginToolCalls, never resent).
            Op::BeginToolCalls(_) => Resend::Unsafe,
            _ => Resend::Safe,
        };
        self.endpoints
            .run(resend, |node| {
                node.session.call("Session", op.clone(), timeout)
            })
            .await
    }
}

/// An acquire being set up. `.await` it (or call [`AcquireBuilder::send`]).
#[must_use = "an acquire does nothing until it is awaited"]
#[derive(Debug, Clone)]
pub struct AcquireBuilder {
    /// Where to send it, and where the guard renews.
    endpoints: Arc<Endpoints>,
    /// The key to hold, e.g. a session id.
    key: String,
    /// Who holds it, shown to others in busy errors; `HOSTNAME:pid` by default.
    owner: Option<String>,
    /// How long a term lasts without renewal.
    ttl: Duration,
    /// How long to queue for a held key before giving up as busy.
    wait: Duration,
    /// The retry token; a fresh UUID by default.
    request_id: Option<String>,
    /// How often the guard renews; a third of the TTL by default.
    renew_every: Option<Duration>,
    /// How much earlier than the TTL the guard stops trusting itself.
    safety_margin: Option<Duration>,
    /// How long one call may take before it counts as failed.
    rpc_timeout: Option<Duration>,
    /// How many times the acquire is sent when the server is unreachable.
    attempts: u32,
    /// Lock-delay, recovery limit, force (see [`AcquireBuilder::lock_delay`]).
    options: AcquireOptions,
}

impl AcquireBuilder {
    /// Who holds the lease, as shown to others.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// The lease duration (the server accepts 100 ms to 24 h). Default 10 s.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long to wait in line for a held key (at most 5 min). Default 0:
    /// fail at once with [`Error::Busy`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The retry token. By default a fresh UUID, reused by this builder's own
    /// retries. Set it yourself to make an acquire repeated by a restarted
    /// process return the same term: such a replayed guard trusts nothing
    /// until its first renewal succeeds.
    pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }

    /// How often the guard renews. Default: a third of the TTL. Must be
    /// shorter than the TTL less the safety margin.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// How much earlier than the TTL the guard's local deadline falls. It
    /// covers the gap between checking the guard and acting on it, and a
    /// server clock that runs a little fast. Default: a tenth of the TTL, at
    /// most 2 s.
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = Some(margin);
        self
    }

    /// How long one renew, check or release may take before it counts as
    /// failed (an acquire may take its wait on top). Default: the renewal
    /// interval, at most 5 s.
    pub fn rpc_timeout(mut self, timeout: Duration) -> Self {
        self.rpc_timeout = Some(timeout);
        self
    }

    /// How many times to send the acquire when the server is unreachable
    /// (always with the same request id). Default 3; at least 1.
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    /// If this term ends by expiry, nobody may acquire the key for `delay`
    /// (at most 60 s), so writes this holder sent before it was lost drain
    /// before the next holder starts (Chubby's and Consul's lock-delay). A
    /// release or suspend skips it.
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.options.lock_delay_ms = millis(delay);
        self
    }

    /// Quarantine the key once `k` terms in a row end by expiry or
    /// suspension (a session that crashes every worker resuming it). 0 takes
    /// the server's default.
    pub fn max_recoveries(mut self, k: u32) -> Self {
        self.options.max_recoveries = (k > 0).then_some(k);
        self
    }

    /// Acquire the key even if it is quarantined (needs the admin right).
    pub fn force(mut self) -> Self {
        self.options.force = true;
        self
    }

    /// Sends the acquire and starts the guard's renewal.
    ///
    /// # Errors
    /// [`Error::Busy`] (holder named) when the key is still held after the
    /// wait; [`Error::InvalidArgument`] for a malformed key, owner or TTL or
    /// inconsistent timing options; [`Error::Unavailable`] when every attempt
    /// failed to reach the server; [`ClientError::Lost`] when a replayed or
    /// long-waited grant was refused on its first renewal.
    pub async fn send(self) -> Result<SessionGuard, ClientError> {
        let timing = Timing::resolve(
            self.ttl,
            self.renew_every,
            self.safety_margin,
            self.rpc_timeout,
        )?;
        let generated_id = self.request_id.is_none();
        // Parse at the edge: a malformed request is refused here, with the
        // server's own rules, before anything is sent.
        let acquire = convert::acquire(pb::AcquireRequest {
            key: self.key,
            owner: self.owner.unwrap_or_else(default_owner),
            ttl_ms: millis(self.ttl),
            wait_ms: millis(self.wait),
            request_id: self
                .request_id
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            lock_delay_ms: self.options.lock_delay_ms,
            max_recoveries: self.options.max_recoveries.unwrap_or(0),
            force: self.options.force,
        })?;
        let message = convert::acquire_to_pb(&acquire);
        // Saturating: an absurd wait is the server's to refuse (over 5 min), not a panic here.
        let timeout = self.wait.saturating_add(timing.rpc_timeout);
        let first_sent = tokio::time::Instant::now();
        let mut attempt = 1;
        let reply = loop {
            // Safe to resend on another server: the request id makes the
            // server replay a grant it made to an attempt whose reply was lost.
            let sent = unary!(
                self.endpoints,
                Resend::Safe,
                "Acquire",
                timeout,
                acquire,
                message
            );
            match sent {
                Ok(reply) => break reply,
                Err(err) if err.is_transient() && attempt < self.attempts => {
                    tracing::debug!(key = %message.key, attempt, error = %err, "acquire failed; retrying");
                    attempt += 1;
                    tokio::time::sleep(jittered(timing.retry_pause(attempt))).await;
                }
                Err(err) => return Err(err),
            }
        };
        // A fresh grant happened after our first send, so that send time is a
        // safe basis for the local deadline. A replayed one happened at some
        // earlier attempt: ours if we made up the id, unknown otherwise.
        let basis = (!reply.replayed || generated_id).then_some(first_sent);
        SessionGuard::start(self.endpoints, timing, reply, basis).await
    }
}

impl IntoFuture for AcquireBuilder {
    type Output = Result<SessionGuard, ClientError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.send())
    }
}

/// The guard's timing, checked for consistency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    /// The term's TTL.
    ttl: Duration,
    /// How often to renew.
    renew_every: Duration,
    /// Subtracted from the TTL for the local deadline.
    safety_margin: Duration,
    /// How long one call may take.
    pub(crate) rpc_timeout: Duration,
}

impl Timing {
    fn resolve(
        ttl: Duration,
        renew_every: Option<Duration>,
        safety_margin: Option<Duration>,
        rpc_timeout: Option<Duration>,
    ) -> Result<Timing, ClientError> {
        let invalid = |what: String| ClientError::Server(Error::InvalidArgument(what));
        let safety_margin = safety_margin.unwrap_or_else(|| (ttl / 10).min(MAX_DEFAULT_MARGIN));
        if safety_margin >= ttl {
            return Err(invalid(format!(
                "safety margin {safety_margin:?} must be shorter than the ttl {ttl:?}"
            )));
        }
        let renew_every = renew_every.unwrap_or(ttl / 3);
        if renew_every.is_zero() || renew_every >= ttl - safety_margin {
            return Err(invalid(format!(
                "renewal interval {renew_every:?} must be above zero and shorter than the ttl \
                 {ttl:?} less the safety margin {safety_margin:?}"
            )));
        }
        let rpc_timeout = rpc_timeout.unwrap_or_else(|| renew_every.min(MAX_DEFAULT_RPC_TIMEOUT));
        if rpc_timeout.is_zero() {
            return Err(invalid("rpc timeout must be above zero".into()));
        }
        Ok(Timing {
            ttl,
            renew_every,
            safety_margin,
            rpc_timeout,
        })
    }

    /// How long after a successful renewal was sent the guard trusts itself.
    fn valid_for(&self) -> Duration {
        self.ttl - self.safety_margin
    }

    /// The pause before retry number `failures` (1 = after the first
    /// failure): doubling from an eighth of the renewal interval (at least
    /// 10 ms), never longer than the interval. Jitter is applied by the caller.
    fn retry_pause(&self, failures: u32) -> Duration {
        let base = (self.renew_every / 8).max(Duration::from_millis(10));
        base.saturating_mul(1 << failures.saturating_sub(1).min(16))
            .min(self.renew_every)
    }
}

/// Awaits one call, bounded by `timeout`, and converts its status.
async fn call<T>(
    name: &str,
    timeout: Duration,
    reply: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, ClientError> {
    match tokio::time::timeout(timeout, reply).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(status.into()),
        Err(_) => Err(ClientError::timed_out(name, timeout)),
    }
}

/// A request that tells the server how long the client will wait for it.
fn request<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// A duration picked uniformly from `[d/2, d]`, so that many clients that
/// failed together do not retry together. The randomness comes from a v4
/// UUID (its low 62 bits are random) rather than a new dependency.
fn jittered(d: Duration) -> Duration {
    let random = (uuid::Uuid::new_v4().as_u128() as u64) & ((1 << 62) - 1);
    let fraction = random as f64 / (1u64 << 62) as f64;
    d / 2 + d.mul_f64(fraction / 2.0)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn default_owner() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "client".into());
    format!("{host}:{}", std::process::id())
}

/// An error with its sources, since tonic's transport errors say little on
/// their own.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Guards and clients can be shared across tasks and threads.
    #[test]
    fn guards_and_clients_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Client>();
        check::<SessionGuard>();
        check::<ClientError>();
    }

    /// Defaults: renew every third of the TTL, a tenth as margin, calls bounded by the interval.
    #[test]
    fn default_timing_follows_the_ttl() {
        let t = Timing::resolve(Duration::from_secs(9), None, None, None).unwrap();
        assert_eq!(t.renew_every, Duration::from_secs(3));
        assert_eq!(t.safety_margin, 900 * MS);
        assert_eq!(t.rpc_timeout, Duration::from_secs(3));
        assert_eq!(t.valid_for(), 8100 * MS);
        let long = Timing::resolve(Duration::from_secs(3600), None, None, None).unwrap();
        assert_eq!(long.safety_margin, MAX_DEFAULT_MARGIN);
        assert_eq!(long.rpc_timeout, MAX_DEFAULT_RPC_TIMEOUT);
    }

    /// Timing that would let the deadline pass before the first renewal is refused.
    #[test]
    fn inconsistent_timing_is_invalid() {
        let ttl = 300 * MS;
        assert!(Timing::resolve(ttl, None, Some(ttl), None).is_err());
        assert!(Timing::resolve(ttl, Some(280 * MS), Some(30 * MS), None).is_err());
        assert!(Timing::resolve(ttl, Some(Duration::ZERO), None, None).is_err());
        assert!(Timing::resolve(ttl, None, None, Some(Duration::ZERO)).is_err());
        assert!(Timing::resolve(ttl, Some(260 * MS), Some(30 * MS), None).is_ok());
    }

    /// Retry pauses double from an eighth of the interval and stop at the interval.
    #[test]
    fn retry_pauses_grow_and_are_capped() {
        let t = Timing::resolve(800 * MS, Some(240 * MS), None, None).unwrap();
        assert_eq!(t.retry_pause(1), 30 * MS);
        assert_eq!(t.retry_pause(2), 60 * MS);
        assert_eq!(t.retry_pause(4), 240 * MS);
        assert_eq!(t.retry_pause(40), 240 * MS);
    }

    /// Jitter stays within [d/2, d].
    #[test]
    fn jitter_stays_in_range() {
        let d = 100 * MS;
        for _ in 0..1000 {
            let j = jittered(d);
            assert!(j >= d / 2 && j <= d, "{j:?}");
        }
    }
}
