//! Change events: what Watch streams.
//!
//! Every change of a key's ownership (a grant, the end of a term, the key
//! being forgotten) is an [`Event`] with a **revision**: a server-wide counter
//! that only goes up and is stored with the change. Revisions are given when
//! the change is handed to storage, in the order changes are committed, so
//! the revision order is the durability order: a watcher that saw revision
//! `r` has seen every change committed before it, and a watcher that resumes
//! from `r + 1` after a restart misses nothing and sees nothing twice (a
//! change lost in a crash never got a revision anyone saw).

use crate::clock::Millis;
use crate::lease::{Fence, Key, Owner, TermEnd};

/// How many events the Watch log keeps by default (older revisions are
/// compacted: a watcher asking for them is told to re-list).
pub const DEFAULT_EVENT_LOG_LEN: usize = 100_000;

/// What happened to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A new term began (`fence`, `owner` are the new holder's).
    Granted,
    /// The holder released the term.
    Released,
    /// The holder released the term as unfinished: the key is recoverable.
    Suspended,
    /// The term's TTL ran out: the key is recoverable.
    Expired,
    /// The key was released long enough ago to be forgotten (`fence`,
    /// `owner` are its last term's).
    Forgotten,
}

impl EventKind {
    /// The event of a term that ended `end`.
    pub fn of_end(end: TermEnd) -> EventKind {
        match end {
            TermEnd::Released => EventKind::Released,
            TermEnd::Suspended => EventKind::Suspended,
            TermEnd::Expired => EventKind::Expired,
        }
    }

    /// Whether the key may be free for a recoverer after this event.
    pub fn frees_the_key(self) -> bool {
        !matches!(self, EventKind::Granted)
    }
}

/// One change, as Watch streams it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub revision: u64,
    pub key: Key,
    pub kind: EventKind,
    pub fence: Fence,
    pub owner: Owner,
    /// Server wall-clock milliseconds: when the change happened (for an
    /// expiry, when the TTL ran out).
    pub at: Millis,
}

/// Which keys a watcher follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Exactly this key.
    Key(Key),
    /// Every key starting with this prefix (empty: every key).
    Prefix(String),
}

impl Selector {
    pub fn matches(&self, key: &Key) -> bool {
        match self {
            Selector::Key(k) => k == key,
            Selector::Prefix(prefix) => key.as_str().starts_with(prefix.as_str()),
        }
    }
}
