//! An in-process leasehold server, for the demo and the test. An agent
//! server needs none of this: it connects to a running leasehold with
//! `leasehold_client::Client`, as [`graph`](crate::graph) does.

use std::path::Path;
use std::sync::Arc;

use leasehold_core::Clock;
use leasehold_server::EngineConfig;
use leasehold_server::server::{self, ServeError};
use leasehold_server::sqlite::SyncMode;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A leasehold server on 127.0.0.1 (a free port), serving until stopped or
/// dropped.
pub struct LocalServer {
    url: String,
    stop: oneshot::Sender<()>,
    serving: JoinHandle<Result<(), ServeError>>,
}

impl LocalServer {
    /// Opens (or creates) the database file `db` and serves it on `clock`.
    ///
    /// # Errors
    /// When the database cannot be opened or the port cannot be bound.
    pub async fn start(
        db: &Path,
        clock: Arc<dyn Clock>,
    ) -> Result<LocalServer, Box<dyn std::error::Error>> {
        let engine = server::open_engine(db, SyncMode::Full, clock, EngineConfig::default())?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = tokio::spawn(server::serve(listener, engine, async {
            let _ = stopped.await;
        }));
        Ok(LocalServer { url, stop, serving })
    }

    /// The URL a client connects to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stops the server cleanly (drain, flush).
    ///
    /// # Errors
    /// What the server stopped with.
    pub async fn stop(self) -> Result<(), Box<dyn std::error::Error>> {
        let _ = self.stop.send(());
        self.serving.await??;
        Ok(())
    }
}
