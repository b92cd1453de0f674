//! Why a turn failed.

use leasehold_client::ClientError;
use leasehold_client::fence::sqlite::FenceError;

/// Why a turn failed.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    /// The lease said no: busy, lost, unreachable.
    #[error(transparent)]
    Lease(#[from] ClientError),
    /// The session database refused a write with a stale fence.
    #[error("the session database refused the write: {0}")]
    Fence(#[from] FenceError),
    /// The model provider refused the request.
    #[error("the provider refused the request: {0}")]
    Provider(String),
    #[error("session database: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("malformed item: {0}")]
    Json(#[from] serde_json::Error),
}
