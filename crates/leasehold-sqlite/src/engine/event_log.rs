//! The Watch event log: the tail of committed events in memory, and the
//! fan-out to watchers.
//!
//! The writer publishes each commit's events here once the commit is
//! durable, so a watcher never sees a change a crash could undo. The last
//! `len` events stay in a ring: a watcher (re)starting from a revision still
//! in the ring gets every event from there on, then the live ones; one
//! asking for an older, compacted revision is refused with the oldest it
//! could have. Subscribing and publishing take the same lock, so the switch
//! from the ring to the live feed loses and repeats nothing.
//!
//! A watcher that does not keep up is cut off, never buffered without
//! bound: the live feed is a bounded broadcast of commits, and one that
//! falls further behind than it holds ends with RESOURCE_EXHAUSTED naming
//! the revision to resume from.

use std::collections::VecDeque;
use std::sync::Mutex;

use futures_util::stream::{self, StreamExt};
use tokio::sync::broadcast;

use leasehold_core::error::{Error, Result};

use leasehold_backend::{Commit, Watching, cut_off};
use leasehold_core::events::{Event, Selector};

pub(super) struct EventLog {
    inner: Mutex<LogInner>,
    /// How many commits the live feed holds for a slow watcher.
    buffer: usize,
}

struct LogInner {
    /// The last `len` events, revisions rising.
    ring: VecDeque<Event>,
    len: usize,
    /// The highest revision published.
    revision: u64,
    live: broadcast::Sender<Commit>,
}

impl EventLog {
    /// A log holding the last `len` events, starting from `stored` (the
    /// stored tail) and the highest revision ever given.
    pub fn new(stored: Vec<Event>, revision: u64, len: usize, buffer: usize) -> EventLog {
        let len = len.max(1);
        let skip = stored.len().saturating_sub(len);
        let ring: VecDeque<Event> = stored.into_iter().skip(skip).collect();
        let buffer = buffer.max(1);
        EventLog {
            inner: Mutex::new(LogInner {
                ring,
                len,
                revision,
                live: broadcast::channel(buffer).0,
            }),
            buffer,
        }
    }

    /// Publishes a committed batch's events.
    pub fn publish(&self, events: Vec<Event>) {
        let Some(last) = events.last().map(|e| e.revision) else {
            return;
        };
        let mut inner = self.inner.lock().expect("event log lock");
        for event in &events {
            if inner.ring.len() == inner.len {
                inner.ring.pop_front();
            }
            inner.ring.push_back(event.clone());
        }
        inner.revision = last;
        // No receiver is fine: nobody watches.
        let _ = inner.live.send(events.into());
    }

    /// How many watchers follow the live feed, and the highest revision
    /// published (for metrics).
    pub fn stats(&self) -> (usize, u64) {
        let inner = self.inner.lock().expect("event log lock");
        (inner.live.receiver_count(), inner.revision)
    }

    /// Starts a watch of `selector` from `start` (0: only what comes next).
    ///
    /// # Errors
    /// [`Error::Compacted`] when `start` is older than the log holds.
    pub fn watch(&self, selector: Selector, start: u64) -> Result<Watching> {
        let inner = self.inner.lock().expect("event log lock");
        let oldest = inner
            .ring
            .front()
            .map_or(inner.revision + 1, |e| e.revision);
        if start != 0 && start < oldest {
            return Err(Error::Compacted {
                requested: start,
                oldest,
            });
        }
        let backlog: Vec<Event> = if start == 0 {
            Vec::new()
        } else {
            inner
                .ring
                .iter()
                .filter(|e| e.revision >= start && selector.matches(&e.key))
                .cloned()
                .collect()
        };
        let live = inner.live.subscribe();
        let revision = inner.revision;
        drop(inner);
        let buffer = self.buffer;
        let backlog = (!backlog.is_empty()).then_some(Ok(backlog));
        let first = stream::iter(backlog);
        let after = revision;
        let feed = stream::unfold(
            (live, selector, after, false),
            move |(mut live, selector, mut seen, done)| async move {
                if done {
                    return None;
                }
                loop {
                    match live.recv().await {
                        Ok(commit) => {
                            let last = commit.last().map_or(seen, |e| e.revision);
                            let events: Vec<Event> = commit
                                .iter()
                                .filter(|e| e.revision > seen && selector.matches(&e.key))
                                .cloned()
                                .collect();
                            seen = seen.max(last);
                            if !events.is_empty() {
                                return Some((Ok(events), (live, selector, seen, false)));
                            }
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            let cut = cut_off(buffer, seen + 1);
                            return Some((Err(cut), (live, selector, seen, true)));
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            },
        );
        Ok(Watching {
            revision,
            events: first.chain(feed).boxed(),
        })
    }
}
