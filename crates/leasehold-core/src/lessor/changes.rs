//! Change tracking: which keys and tool calls changed since the last batch,
//! and the sequence numbers that make replies wait for durability.
//!
//! Every change that must be durable before anyone may observe it (a grant,
//! a release, a longer TTL, a tool call begun or settled) gets a new sequence
//! number, recorded as its key's visible sequence. The writer takes
//! everything changed so far as one [`crate::store::Batch`]; once storage commits it, every
//! change up to the batch's `seq` is durable.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::clock::Millis;
use crate::events::EventKind;
use crate::lease::{Fence, Key, Owner};
use crate::ledger::CallRef;

/// An event not yet handed to storage: it gets its revision then.
#[derive(Debug)]
pub(super) struct Draft {
    pub key: Key,
    pub kind: EventKind,
    pub fence: Fence,
    pub owner: Owner,
    pub at: Millis,
}

/// What changed since the last batch.
#[derive(Debug, Default)]
pub(super) struct Changes {
    /// Keys changed by a change that must be durable before a reply.
    dirty: HashSet<Key>,
    /// Keys changed by changes that need not be durable before any reply
    /// (expiries, renewals keeping the TTL). Kept apart so a mass expiry can
    /// be written in chunks without holding up urgent changes; in key order,
    /// so a chunk touches few table pages.
    lazy_dirty: BTreeSet<Key>,
    /// Whether some change must be durable before a reply.
    urgent: bool,
    /// The last sequence number given to a change that must be durable.
    seq: u64,
    /// Tool calls changed.
    calls: HashSet<(Key, CallRef)>,
    /// Tool calls pruned from ledgers.
    pruned_calls: Vec<(Key, Vec<CallRef>)>,
    /// Keys forgotten.
    forgotten: Vec<Key>,
    /// The fences of the forgotten keys' history entries.
    forgotten_history: Vec<Fence>,
    /// Events of changed keys, in the order they happened.
    events: Vec<Draft>,
    /// Events of keys that a partial take left for later, by key, each
    /// key's in order; all older than `events`. Kept by key so a take finds
    /// the events of the keys it takes without scanning every pending
    /// event: during a mass expiry 100,000 of them wait, and a scan per
    /// 500-key chunk held the lessor lock for over 10 ms each time.
    backlog_events: BTreeMap<Key, Vec<Draft>>,
}

/// The keys and calls a batch must write, before their rows are read.
pub(super) struct Taken {
    pub keys: Vec<Key>,
    pub calls: Vec<(Key, CallRef)>,
    pub pruned_calls: Vec<(Key, Vec<CallRef>)>,
    pub forgotten: Vec<Key>,
    pub forgotten_history: Vec<Fence>,
    pub seq: u64,
    /// The events of the keys taken, in the order they happened, for
    /// revisions to be given.
    pub events: Vec<Draft>,
}

impl Changes {
    /// A new sequence number for a change that must be durable before it is
    /// revealed; the caller records it as the key's visible sequence.
    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.urgent = true;
        self.seq
    }

    /// Records that `key`'s row changed: among the urgent keys when the
    /// change must be durable before a reply, otherwise among the lazy ones
    /// (unless it is already urgent, which writes its whole row anyway).
    pub fn key(&mut self, key: &Key, urgent: bool) {
        if urgent {
            self.lazy_dirty.remove(key);
            self.dirty.insert(key.clone());
        } else if !self.dirty.contains(key) {
            self.lazy_dirty.insert(key.clone());
        }
    }

    /// Records that a tool call of `key` changed.
    pub fn call(&mut self, key: &Key, call: CallRef) {
        self.calls.insert((key.clone(), call));
        self.urgent = true;
    }

    /// Records an event of `key` (whose row is recorded changed as well).
    pub fn event(&mut self, draft: Draft) {
        self.events.push(draft);
    }

    /// Records calls pruned from `key`'s ledger.
    pub fn pruned(&mut self, key: &Key, calls: Vec<CallRef>) {
        self.pruned_calls.push((key.clone(), calls));
    }

    /// Records that `key` was forgotten: its row and the history entries
    /// with these fences go, pending writes of it are dropped.
    pub fn forgotten(&mut self, key: Key, history: impl IntoIterator<Item = Fence>) {
        self.forgotten_history.extend(history);
        self.dirty.remove(&key);
        self.lazy_dirty.remove(&key);
        if !self.calls.is_empty() {
            self.calls.retain(|(k, _)| *k != key);
        }
        self.forgotten.push(key);
    }

    pub fn has_urgent(&self) -> bool {
        self.urgent
    }

    pub fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
            || !self.lazy_dirty.is_empty()
            || !self.calls.is_empty()
            || !self.pruned_calls.is_empty()
            || !self.forgotten.is_empty()
    }

    pub fn has_lazy_backlog(&self) -> bool {
        !self.lazy_dirty.is_empty()
    }

    pub fn lazy_backlog(&self) -> usize {
        self.lazy_dirty.len()
    }

    /// Takes every urgent change and at most `lazy_limit` lazily changed
    /// keys (the rest stay for the next batch), keys in order.
    pub fn take(&mut self, lazy_limit: usize) -> Taken {
        let mut keys: Vec<Key> = self.dirty.drain().collect();
        if self.lazy_dirty.len() <= lazy_limit {
            keys.extend(std::mem::take(&mut self.lazy_dirty));
        } else {
            keys.extend(std::iter::from_fn(|| self.lazy_dirty.pop_first()).take(lazy_limit));
        }
        // Rows written in key order share B-tree pages.
        keys.sort_unstable();
        self.urgent = false;
        let forgotten = std::mem::take(&mut self.forgotten);
        // An event goes with its key's row, so a revision is only ever given
        // to a change that is committed with it. Events of keys left for a
        // later batch stay, in order.
        // Each key's events stay in order: its left-over ones first.
        let events = if self.lazy_dirty.is_empty() {
            let mut events: Vec<Draft> = std::mem::take(&mut self.backlog_events)
                .into_values()
                .flatten()
                .collect();
            if events.is_empty() {
                std::mem::take(&mut self.events)
            } else {
                events.append(&mut self.events);
                events
            }
        } else {
            let mut now = Vec::new();
            if !self.backlog_events.is_empty() {
                for key in keys.iter().chain(&forgotten) {
                    if let Some(older) = self.backlog_events.remove(key) {
                        now.extend(older);
                    }
                }
            }
            for event in std::mem::take(&mut self.events) {
                if keys.binary_search(&event.key).is_ok() || forgotten.contains(&event.key) {
                    now.push(event);
                } else {
                    self.backlog_events
                        .entry(event.key.clone())
                        .or_default()
                        .push(event);
                }
            }
            now
        };
        Taken {
            keys,
            calls: self.calls.drain().collect(),
            pruned_calls: std::mem::take(&mut self.pruned_calls),
            forgotten,
            forgotten_history: std::mem::take(&mut self.forgotten_history),
            seq: self.seq,
            events,
        }
    }
}
