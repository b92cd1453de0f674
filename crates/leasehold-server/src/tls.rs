//! TLS and mutual TLS for the gRPC listener (rustls, ring), with the
//! certificate reloadable while the server runs.
//!
//! Every `lease_id` (the capability to renew and release a term) travels in
//! requests and replies, so anything but loopback needs TLS. Rotating
//! certificates is routine, so the configuration lives behind a lock: each
//! new connection takes the current one, [`ServerTls::reload`] swaps in a
//! fresh one read from the same files (the CLI calls it on `SIGHUP`), and
//! connections already open keep theirs. A reload that fails (a half-written
//! file, a key that does not match) keeps the old configuration and says
//! why.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the server's TLS material lives (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key of the leaf (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificates that client certificates must chain to; when set,
    /// every client must present one (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// A TLS set-up that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The server's TLS configuration, swappable while it runs.
#[derive(Debug)]
pub struct ServerTls {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
}

impl ServerTls {
    /// Reads `files` and builds the configuration.
    ///
    /// # Errors
    /// [`TlsError`] when a file cannot be read or its contents do not make a
    /// valid configuration (no certificate, no key, a key that does not
    /// match the certificate, an empty client CA).
    pub fn load(files: TlsFiles) -> Result<Arc<ServerTls>, TlsError> {
        let config = build(&files)?;
        Ok(Arc::new(ServerTls {
            files,
            current: RwLock::new(Arc::new(config)),
        }))
    }

    /// Reads the files again; new connections use what they hold now.
    ///
    /// # Errors
    /// As [`ServerTls::load`]; the configuration in use is then kept.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = build(&self.files)?;
        *self.current.write().expect("tls config") = Arc::new(config);
        Ok(())
    }

    fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.read().expect("tls config").clone())
    }
}

fn read_err(path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| read_err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read_err(path, e))?;
    if certs.is_empty() {
        return Err(read_err(path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

fn build(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
    let chain = certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| read_err(&files.key, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certs(ca)? {
                roots.add(cert).map_err(|e| read_err(ca, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("certificate and key: {e}")))?;
    // gRPC over HTTP/2, and gRPC-Web over HTTP/1.1 on the same port.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The accepted, handshaken connections of `listener`, as a stream for
/// tonic, and the task that accepts them (abort it when the server stops).
/// A failed or slow handshake is logged and dropped without holding up
/// other connections.
pub(crate) fn incoming(
    listener: TcpListener,
    tls: Arc<ServerTls>,
) -> (
    ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>>,
    JoinHandle<()>,
) {
    let (tx, rx) = mpsc::channel(64);
    let task = tokio::spawn(async move {
        loop {
            let (tcp, peer): (TcpStream, SocketAddr) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let _ = tcp.set_nodelay(true);
            let acceptor = tls.acceptor();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    (ReceiverStream::new(rx), task)
}
