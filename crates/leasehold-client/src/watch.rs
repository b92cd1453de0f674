//! Watch: being told when a key's ownership changes instead of polling.
//!
//! ```no_run
//! # async fn demo(client: leasehold_client::Client) -> Result<(), leasehold_client::ClientError> {
//! use futures_util::StreamExt;
//! use leasehold_client::{EventKind, Selector};
//!
//! let mut watch = client.watch(Selector::Prefix("session:".into()), 0).await?;
//! while let Some(event) = watch.next().await {
//!     let event = event?;
//!     if matches!(event.kind, EventKind::Expired | EventKind::Suspended) {
//!         // recover event.key (acquire it; the server keeps its history)
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Each event has a revision; to resume after the stream ends (a restart, a
//! network cut, being cut off as too slow), watch again from
//! [`Watch::next_revision`]: nothing is missed or repeated. A revision the
//! server no longer holds is [`Error::Compacted`](leasehold_core::Error::Compacted):
//! list the keys again and watch from [`Watch::next_revision`] of a new watch
//! started with 0.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use leasehold_core::events::{Event, Selector};
use leasehold_wire::{convert, pb};

use crate::Client;
use crate::error::ClientError;

/// A running watch: a [`Stream`] of events, revisions rising.
pub struct Watch {
    inner: tonic::Streaming<pb::WatchResponse>,
    ready: VecDeque<Event>,
    /// The revision to watch from to continue after what was yielded.
    next_revision: u64,
    done: bool,
}

impl Watch {
    /// The revision to pass to [`Client::watch`] to continue exactly after
    /// the last event this stream yielded (or after the revision the watch
    /// started at, if it yielded none).
    pub fn next_revision(&self) -> u64 {
        self.next_revision
    }
}

impl Client {
    /// Starts watching the keys `selector` picks, from revision `start`
    /// (0: only what happens from now on). Returns once the server has
    /// accepted the watch.
    ///
    /// # Errors
    /// [`Error::Compacted`](leasehold_core::Error::Compacted) for a revision
    /// the server no longer holds; the usual refusals and transport errors.
    pub async fn watch(&self, selector: Selector, start: u64) -> Result<Watch, ClientError> {
        let (key, prefix) = match selector {
            Selector::Key(key) => (key.into_string(), String::new()),
            Selector::Prefix(prefix) => (String::new(), prefix),
        };
        let message = pb::WatchRequest {
            key,
            prefix,
            start_revision: start,
        };
        let mut inner = self
            .rpc()
            .watch(message)
            .await
            .map_err(ClientError::from)?
            .into_inner();
        // The first response says where the watch starts (and carries what
        // the log still holds from `start`).
        let first = inner
            .message()
            .await
            .map_err(ClientError::from)?
            .ok_or_else(|| crate::guard::missing("Watch"))?;
        let mut watch = Watch {
            inner,
            ready: VecDeque::new(),
            next_revision: if start == 0 {
                first.revision + 1
            } else {
                start
            },
            done: false,
        };
        watch.take(first)?;
        Ok(watch)
    }
}

impl Watch {
    fn take(&mut self, response: pb::WatchResponse) -> Result<(), ClientError> {
        for event in response.events {
            self.ready.push_back(convert::event_from_pb(event)?);
        }
        Ok(())
    }
}

impl Stream for Watch {
    type Item = Result<Event, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                self.next_revision = event.revision + 1;
                return Poll::Ready(Some(Ok(event)));
            }
            if self.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.inner).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.done = true;
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(status))) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(ClientError::from(status))));
                }
                Poll::Ready(Some(Ok(response))) => {
                    if let Err(err) = self.take(response) {
                        self.done = true;
                        return Poll::Ready(Some(Err(err)));
                    }
                }
            }
        }
    }
}
