//! Running the gRPC server: the lease service, gRPC health and reflection
//! (v1 and v1alpha).
//!
//! The caller binds the listener (tests bind `127.0.0.1:0`) and provides the
//! shutdown future, as in mini-redis. On shutdown, waiting Acquires give up,
//! in-flight requests finish, and the engine commits what is pending.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tonic::transport::server::TcpIncoming;

use crate::auth::AuthConfig;
use crate::backend::Backend;
use crate::coalesce::Coalesce;
use crate::engine::{Engine, EngineConfig};
use crate::grpc::LeaseholdService;
use crate::grpc::transcripts::{DEFAULT_MAX_TRANSCRIPT_BYTES, TranscriptsService};
use crate::limits::Limits;
use crate::metrics::{Exposition, ServiceMetrics};
use crate::sqlite::{SqliteStore, SyncMode};
use crate::tls::ServerTls;
use leasehold_core::clock::Clock;
use leasehold_core::store::StoreError;
use leasehold_wire::pb;

/// A failure to run the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// A commit failed: the server stopped serving so that a supervisor
    /// restarts it on the durable file.
    #[error("stopped after a storage failure: {0}")]
    StorageFailed(String),
}

/// Opens the SQLite database at `db`, raises its fence high-water mark to
/// `config.fence_floor` (durably, never downwards), and starts an engine
/// on it.
///
/// # Errors
/// [`StoreError`] when the database cannot be opened, is locked by another
/// server, or was written by a newer leasehold.
pub fn open_engine(
    db: &Path,
    sync: SyncMode,
    clock: Arc<dyn Clock>,
    config: EngineConfig,
) -> Result<Engine, StoreError> {
    let mut store = SqliteStore::open(db, sync)?;
    store.set_event_log_len(config.event_log_len);
    if config.fence_floor > 0 {
        let floor = store.raise_fence_floor(config.fence_floor)?;
        tracing::info!(
            floor = floor.floor,
            before = floor.before,
            raised = floor.raised(),
            "{}",
            floor.describe()
        );
    }
    Engine::start(Box::new(store), clock, config)
}

/// How long a shutdown waits for connections to drain by default.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How the server runs its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// On shutdown, how long to wait for open connections to finish.
    ///
    /// Draining waits for in-flight requests and for clients to close their
    /// connections; an idle client that keeps its HTTP/2 connection open
    /// would otherwise hold the server up indefinitely (hyperium/hyper#4170).
    /// Every acknowledged write is already durable, so cutting the drain
    /// short loses nothing: the engine still commits what is pending.
    pub drain_timeout: Duration,
    /// How often the server pings each connection over HTTP/2.
    ///
    /// A client that vanished without closing its connection (a crashed
    /// host, a partition) would otherwise keep its Acquires waiting in line
    /// until their waits run out: the key could be handed to a waiter nobody
    /// will ever use, and stay held until that grant's TTL. A connection that
    /// does not answer a ping within `keep_alive_timeout` is closed, which
    /// cancels its waiting Acquires, so the line moves on to live waiters.
    pub keep_alive_interval: Duration,
    /// How long a ping may go unanswered before the connection is closed.
    pub keep_alive_timeout: Duration,
    /// Limits against greedy clients (per connection, per caller).
    pub limits: Limits,
    /// The largest `Transcripts` request (and reply), in bytes: transcripts
    /// are far larger than any lease request, so they have a limit of their
    /// own instead of `limits.max_message_bytes`.
    pub max_transcript_bytes: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            keep_alive_interval: Duration::from_secs(10),
            keep_alive_timeout: Duration::from_secs(10),
            limits: Limits::default(),
            max_transcript_bytes: DEFAULT_MAX_TRANSCRIPT_BYTES,
        }
    }
}

/// Serves leases from `backend` (an [`Engine`], or any other [`Backend`]) on
/// `listener` until `shutdown` resolves, then drains and flushes it, with the
/// default [`ServeOptions`].
///
/// # Errors
/// [`ServeError`] when the transport fails.
pub async fn serve(
    listener: TcpListener,
    backend: impl Backend,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    serve_with(listener, backend, shutdown, ServeOptions::default()).await
}

/// As [`serve`], with `options`.
///
/// # Errors
/// [`ServeError`] when the transport fails.
pub async fn serve_with(
    listener: TcpListener,
    backend: impl Backend,
    shutdown: impl Future<Output = ()> + Send,
    options: ServeOptions,
) -> Result<(), ServeError> {
    serve_on(Listeners::plain(listener), backend, shutdown, options).await
}

/// As [`serve_with`], also serving Prometheus metrics at `/metrics` (plain
/// HTTP/1.1) on `metrics_listener`, until the server stops.
///
/// # Errors
/// [`ServeError`] when the transport fails.
pub async fn serve_with_metrics(
    listener: TcpListener,
    metrics_listener: TcpListener,
    backend: impl Backend,
    shutdown: impl Future<Output = ()> + Send,
    options: ServeOptions,
) -> Result<(), ServeError> {
    let listeners = Listeners {
        metrics: Some(metrics_listener),
        ..Listeners::plain(listener)
    };
    serve_on(listeners, backend, shutdown, options).await
}

/// Where a server listens, and how.
#[derive(Debug)]
pub struct Listeners {
    /// gRPC (and gRPC-Web) connections.
    pub grpc: TcpListener,
    /// Prometheus scrapes, if any.
    pub metrics: Option<TcpListener>,
    /// TLS (and mutual TLS) on the gRPC listener; `None` is plaintext.
    pub tls: Option<Arc<ServerTls>>,
    /// Principals and scopes every request is checked against; `None`
    /// serves everyone.
    pub auth: Option<Arc<AuthConfig>>,
    /// The web console (plain HTTP/1.1), if any: see [`crate::console`].
    pub console: Option<TcpListener>,
}

impl Listeners {
    /// Plaintext gRPC on `grpc`, nothing else.
    pub fn plain(grpc: TcpListener) -> Self {
        Listeners {
            grpc,
            metrics: None,
            tls: None,
            auth: None,
            console: None,
        }
    }
}

/// Serves leases from `backend` on `listeners` until `shutdown` resolves,
/// then drains and flushes it.
///
/// # Errors
/// [`ServeError`] when the transport fails, or the backend's storage did.
pub async fn serve_on(
    listeners: Listeners,
    backend: impl Backend,
    shutdown: impl Future<Output = ()> + Send,
    options: ServeOptions,
) -> Result<(), ServeError> {
    let Listeners {
        grpc: listener,
        metrics: metrics_listener,
        tls,
        auth,
        console: console_listener,
    } = listeners;
    let drain_timeout = options.drain_timeout;
    let (health_reporter, health) = tonic_health::server::health_reporter();
    // Reflection in both versions over the same descriptors: v1 for current
    // tools, v1alpha for those that speak nothing else (Python's
    // grpcio-reflection, older grpcurl, several GUI clients).
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let backend: Arc<dyn Backend> = Arc::new(backend);
    // Health follows the backend (a database that stops answering turns it
    // NOT_SERVING until it is back) until the server stops, when it turns
    // NOT_SERVING for good. One task owns every change, so a late SERVING
    // can never overwrite the final NOT_SERVING.
    let mut serving = backend.serving();
    let initially = *serving.borrow_and_update();
    set_health(&health_reporter, initially).await;
    let (stop_health, health_stop) = tokio::sync::oneshot::channel::<()>();
    let health_task = tokio::spawn(follow_health(health_reporter, serving, health_stop));
    let service_metrics = Arc::new(ServiceMetrics::default());
    let mut lease_service =
        LeaseholdService::with_metrics(backend.clone(), service_metrics.clone())
            .with_limits(options.limits);
    if let Some(auth) = &auth {
        lease_service = lease_service.with_auth(auth.clone());
    }
    // The console calls this very service (its auth, limits and metrics).
    let (stop_console, console_stop) = tokio::sync::watch::channel(false);
    let console_task = console_listener.map(|listener| {
        let console =
            crate::console::Console::new(lease_service.clone(), backend.clone(), auth.clone());
        tokio::spawn(crate::console::serve(listener, console, console_stop))
    });
    // A larger request is refused by tonic before it is decoded; the wrapper
    // makes that refusal RESOURCE_EXHAUSTED like every other limit.
    let service = crate::grpc::OversizeIsExhausted(
        pb::leasehold_server::LeaseholdServer::new(lease_service)
            .max_decoding_message_size(options.limits.max_message_bytes),
    );
    let metrics_task = metrics_listener.map(|listener| {
        tokio::spawn(serve_metrics(
            listener,
            backend.clone(),
            service_metrics.clone(),
        ))
    });
    // The transcript check touches no key: any authenticated caller may use
    // it. An oversized transcript is refused like any oversized request.
    let transcripts = tonic::service::interceptor::InterceptedService::new(
        crate::grpc::OversizeIsExhausted(
            pb::transcripts_server::TranscriptsServer::new(TranscriptsService)
                .max_decoding_message_size(options.max_transcript_bytes)
                .max_encoding_message_size(options.max_transcript_bytes),
        ),
        move |request: tonic::Request<()>| {
            if let Some(auth) = &auth {
                crate::grpc::identify(auth, &request).map_err(leasehold_wire::status::to_status)?;
            }
            Ok(request)
        },
    );
    let signalled = Arc::new(Notify::new());
    let storage_failure = Arc::new(std::sync::Mutex::new(None::<String>));
    let draining = {
        let backend = backend.clone();
        let signalled = signalled.clone();
        let storage_failure = storage_failure.clone();
        async move {
            tokio::select! {
                () = shutdown => tracing::info!("shutting down: draining requests"),
                failure = backend.failed() => {
                    tracing::error!(%failure, "storage failed: reporting NOT_SERVING and stopping");
                    *storage_failure.lock().expect("failure slot") = Some(failure);
                }
            }
            let _ = stop_health.send(());
            let _ = health_task.await;
            backend.begin_shutdown();
            signalled.notify_one();
        }
    };
    // gRPC-Web on the same port (HTTP/1.1 and HTTP/2), for fetch-based
    // clients (Bun, browsers-like runtimes) without a proxy. No CORS layer:
    // cross-origin browser calls stay refused unless a deployment adds one.
    let router = tonic::transport::Server::builder()
        .accept_http1(true)
        .http2_keepalive_interval(Some(options.keep_alive_interval))
        .http2_keepalive_timeout(Some(options.keep_alive_timeout))
        .trace_fn(crate::request_log::request_span)
        .layer(tonic_web::GrpcWebLayer::new())
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .add_service(transcripts);
    let mut accept_task = None;
    let serving: futures_util::future::BoxFuture<'_, Result<(), tonic::transport::Error>> =
        match tls {
            None => {
                let incoming = TcpIncoming::from(listener)
                    .with_nodelay(Some(true))
                    .map_ok(Coalesce::new);
                Box::pin(router.serve_with_incoming_shutdown(incoming, draining))
            }
            Some(tls) => {
                let (incoming, task) = crate::tls::incoming(listener, tls);
                accept_task = Some(task);
                let incoming = incoming.map_ok(Coalesce::new);
                Box::pin(router.serve_with_incoming_shutdown(incoming, draining))
            }
        };
    let served = tokio::select! {
        served = serving => served,
        _ = async {
            signalled.notified().await;
            tokio::time::sleep(drain_timeout).await;
        } => {
            tracing::warn!(?drain_timeout, "connections still open after the drain timeout; closing");
            Ok(())
        }
    };
    for task in metrics_task.into_iter().chain(accept_task) {
        task.abort();
    }
    // Closes the console's connections (its watch streams) before the
    // backend stops.
    let _ = stop_console.send(true);
    if let Some(task) = console_task {
        let _ = task.await;
    }
    backend.shutdown().await;
    tracing::info!("stopped");
    served?;
    match storage_failure.lock().expect("failure slot").take() {
        Some(failure) => Err(ServeError::StorageFailed(failure)),
        None => Ok(()),
    }
}

/// Sets the health of both services.
async fn set_health(reporter: &tonic_health::server::HealthReporter, serving: bool) {
    type Leases = pb::leasehold_server::LeaseholdServer<LeaseholdService>;
    type Transcripts = pb::transcripts_server::TranscriptsServer<TranscriptsService>;
    if serving {
        reporter.set_serving::<Leases>().await;
        reporter.set_serving::<Transcripts>().await;
    } else {
        reporter.set_not_serving::<Leases>().await;
        reporter.set_not_serving::<Transcripts>().await;
    }
}

/// Reports the backend's [`Backend::serving`] as gRPC health until `stop`,
/// then NOT_SERVING for good.
async fn follow_health(
    reporter: tonic_health::server::HealthReporter,
    mut serving: tokio::sync::watch::Receiver<bool>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let mut watching = true;
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            changed = serving.changed(), if watching => {
                if changed.is_err() {
                    // The backend will never change its mind; wait for the stop.
                    watching = false;
                    continue;
                }
                let up = *serving.borrow_and_update();
                set_health(&reporter, up).await;
            }
        }
    }
    set_health(&reporter, false).await;
}

/// The metrics page: the backend's numbers, then the services'.
pub fn render_metrics(backend: &dyn Backend, service: &ServiceMetrics) -> String {
    let mut out = Exposition::default();
    backend.write_metrics(&mut out);
    service.write(&mut out);
    out.into_text()
}

/// Answers `GET /metrics` on `listener` with a minimal HTTP/1.1 responder
/// (one request per connection): a scrape endpoint needs nothing more, and
/// it keeps an HTTP server framework out of the build.
async fn serve_metrics(
    listener: TcpListener,
    backend: Arc<dyn Backend>,
    service: Arc<ServiceMetrics>,
) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let backend = backend.clone();
        let service = service.clone();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut request = Vec::with_capacity(512);
            let mut buf = [0u8; 1024];
            // A bounded read of the request head: 8 KiB within 5 s.
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
            })
            .await;
            if read.is_err() {
                return;
            }
            let line = request.split(|b| *b == b'\n').next().unwrap_or_default();
            let mut words = line.split(|b| *b == b' ');
            let (method, path) = (words.next(), words.next());
            let (status, content_type, body) = match (method, path) {
                (Some(b"GET"), Some(b"/metrics")) => (
                    "200 OK",
                    "text/plain; version=0.0.4; charset=utf-8",
                    render_metrics(backend.as_ref(), &service),
                ),
                _ => (
                    "404 Not Found",
                    "text/plain; charset=utf-8",
                    "metrics are at GET /metrics\n".to_owned(),
                ),
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(body.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}
