//! One pipelined Session stream per [`Client`](super::Client), shared by all
//! its guards.
//!
//! A process that holds many sessions checks and renews them all the time.
//! As unary calls each of those is an HTTP/2 stream of its own (headers,
//! a task on each side, a write and a read); over one shared Session stream
//! they are small messages that travel many to a write. Operations from every
//! guard go out as they come, each tagged with an id, and a reader task hands
//! each response to the caller waiting for that id. The server applies them
//! in arrival order and answers each as soon as it completes, so a Check is
//! never held up behind a Release that waits for its commit.
//!
//! The stream is opened on first use and again after it breaks (the server
//! restarted, the connection dropped). Operations in flight when it breaks
//! fail with [`Error::Unavailable`], as a unary call would; the guard's usual
//! retries then go over the new stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::error::ClientError;
use leasehold_core::Error;
use leasehold_wire::pb;

use crate::Rpc;
use leasehold_wire::pb::session_request::Op;
use leasehold_wire::status;

/// The shared stream of one client, opened lazily.
#[derive(Debug)]
pub(crate) struct SessionMux {
    rpc: Rpc,
    /// The stream in use, if one is open.
    current: Mutex<Option<Stream>>,
    /// Serialises opening, so callers that find no stream open just one.
    opening: tokio::sync::Mutex<()>,
    /// Ids for operations; unique per client, across streams.
    next_id: AtomicU64,
}

/// One open Session stream: where requests go, and who waits for what.
#[derive(Debug, Clone)]
struct Stream {
    requests: mpsc::UnboundedSender<pb::SessionRequest>,
    waiting: Arc<Waiting>,
}

type Reply = Result<pb::SessionResponse, ClientError>;

/// The callers waiting for a response, by operation id. Once the stream has
/// broken, `broken` holds why, and nobody may start waiting.
#[derive(Debug, Default)]
struct Waiting(Mutex<WaitingState>);

#[derive(Debug, Default)]
struct WaitingState {
    callers: HashMap<u64, oneshot::Sender<Reply>>,
    broken: Option<Error>,
}

impl Waiting {
    fn register(&self, id: u64) -> Result<oneshot::Receiver<Reply>, Error> {
        let mut state = self.0.lock().expect("session waiters");
        if let Some(err) = &state.broken {
            return Err(err.clone());
        }
        let (tx, rx) = oneshot::channel();
        state.callers.insert(id, tx);
        Ok(rx)
    }

    fn forget(&self, id: u64) {
        self.0.lock().expect("session waiters").callers.remove(&id);
    }

    fn deliver(&self, response: pb::SessionResponse) {
        let caller = self
            .0
            .lock()
            .expect("session waiters")
            .callers
            .remove(&response.id);
        if let Some(caller) = caller {
            let reply = if response.code == 0 {
                Ok(response)
            } else {
                Err(ClientError::Server(status::from_refusal(
                    response.code,
                    &response.message,
                    &response.details,
                )))
            };
            let _ = caller.send(reply);
        }
    }

    /// Fails every waiting caller and refuses new ones.
    fn break_with(&self, err: Error) {
        let callers = {
            let mut state = self.0.lock().expect("session waiters");
            state.broken = Some(err.clone());
            std::mem::take(&mut state.callers)
        };
        for (_, caller) in callers {
            let _ = caller.send(Err(ClientError::Server(err.clone())));
        }
    }

    fn is_broken(&self) -> bool {
        self.0.lock().expect("session waiters").broken.is_some()
    }
}

impl SessionMux {
    pub(crate) fn new(rpc: Rpc) -> SessionMux {
        SessionMux {
            rpc,
            current: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(1),
        }
    }

    /// Sends `op` and waits up to `timeout` for its response. A refusal comes
    /// back as the same [`ClientError`] the unary call would give.
    pub(crate) async fn call(
        &self,
        name: &str,
        op: Op,
        timeout: Duration,
    ) -> Result<pb::SessionResponse, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = pb::SessionRequest { op: Some(op), id };
        let stream = match tokio::time::timeout(timeout, self.stream()).await {
            Ok(stream) => stream?,
            Err(_) => return Err(ClientError::timed_out(name, timeout)),
        };
        let reply = stream.waiting.register(id)?;
        if stream.requests.send(request).is_err() {
            stream.waiting.forget(id);
            return Err(Error::Unavailable("the Session stream closed".into()).into());
        }
        match tokio::time::timeout(timeout, reply).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(Error::Unavailable("the Session stream closed".into()).into()),
            Err(_) => {
                stream.waiting.forget(id);
                Err(ClientError::timed_out(name, timeout))
            }
        }
    }

    /// The open stream, opening one if there is none or it broke.
    async fn stream(&self) -> Result<Stream, ClientError> {
        if let Some(stream) = self.usable() {
            return Ok(stream);
        }
        let _opening = self.opening.lock().await;
        if let Some(stream) = self.usable() {
            return Ok(stream);
        }
        let stream = self.open().await?;
        *self.current.lock().expect("session stream") = Some(stream.clone());
        Ok(stream)
    }

    fn usable(&self) -> Option<Stream> {
        let current = self.current.lock().expect("session stream");
        current
            .as_ref()
            .filter(|s| !s.waiting.is_broken() && !s.requests.is_closed())
            .cloned()
    }

    /// Opens a stream and starts the task that reads its responses. The
    /// task holds only the waiters, not the request sender, so the stream
    /// closes (and the task ends) when the client is dropped.
    async fn open(&self) -> Result<Stream, ClientError> {
        let (requests, outbound) = mpsc::unbounded_channel();
        let mut rpc = self.rpc.clone();
        let mut responses = rpc
            .session(tokio_stream::wrappers::UnboundedReceiverStream::new(
                outbound,
            ))
            .await?
            .into_inner();
        let waiting = Arc::new(Waiting::default());
        let reader = waiting.clone();
        tokio::spawn(async move {
            let why = loop {
                match responses.message().await {
                    Ok(Some(response)) => reader.deliver(response),
                    Ok(None) => break Error::Unavailable("the Session stream ended".into()),
                    Err(status) => break status::from_status(&status),
                }
            };
            let why = match why {
                err @ Error::Unavailable(_) => err,
                other => Error::Unavailable(format!("the Session stream failed: {other}")),
            };
            reader.break_with(why);
        });
        Ok(Stream { requests, waiting })
    }
}
