//! The values a lease is made of, and the rules for valid input.
//!
//! A *key* names a resource (a session id, `db:<path>`, ...). Each grant on a
//! key starts a *term*: a fence (fencing token), an owner, a secret lease id
//! and a deadline. A term ends when it is released, suspended (released
//! unfinished) or expires; the key then keeps a record of that ended term, so
//! a recoverer can see what it takes over.

use std::fmt;

use crate::clock::Millis;

/// Input that breaks one of the rules below, naming the rule broken. The
/// error table turns it into `Error::InvalidArgument` (a `From`, so `?`
/// carries it into any lessor result); it is a type of its own so that the
/// values need nothing of the table whose refusals name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub String);

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Invalid {}

type Result<T> = std::result::Result<T, Invalid>;

/// Longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Longest owner name, in bytes.
pub const MAX_OWNER_BYTES: usize = 256;
/// Longest request id, in bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 256;
/// Shortest TTL a term may have.
pub const MIN_TTL_MS: u64 = 100;
/// Longest TTL a term may have (24 h).
pub const MAX_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// Longest an Acquire may wait for a held key (5 min).
pub const MAX_WAIT_MS: u64 = 5 * 60 * 1000;

/// A fencing token: strictly increasing across all grants of a server, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(pub u64);

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The secret capability to renew or release one term. Never shown by Get, List or Check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(pub uuid::Uuid);

impl LeaseId {
    /// A fresh random id.
    pub fn random() -> Self {
        LeaseId(uuid::Uuid::new_v4())
    }

    /// Parses a lease id as sent by a client.
    ///
    /// # Errors
    /// [`Invalid`] when `text` is not a UUID.
    pub fn parse(text: &str) -> Result<Self> {
        uuid::Uuid::parse_str(text)
            .map(LeaseId)
            .map_err(|_| Invalid(format!("lease_id {text:?} is not a UUID")))
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

/// How a term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermEnd {
    /// Released by its holder: the work is done.
    Released,
    /// Released by its holder as unfinished: the key is recoverable.
    Suspended,
    /// Its TTL ran out: the key is recoverable.
    Expired,
}

impl TermEnd {
    /// Whether a key whose last term ended this way is listed as recoverable.
    pub fn is_recoverable(self) -> bool {
        matches!(self, TermEnd::Suspended | TermEnd::Expired)
    }
}

/// A granted term of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub fence: Fence,
    pub owner: Owner,
    pub lease_id: LeaseId,
    /// The client's retry token for the Acquire that granted this term, if it sent one.
    pub request_id: Option<RequestId>,
    pub ttl: Ttl,
    pub acquired_at: Millis,
    pub expires_at: Millis,
    /// What the Acquire asked for the end of this term, and how it began.
    pub lifecycle: Lifecycle,
}

/// The quarantine rule: a term that ends failed (suspended or expired) as
/// the `failures`-th failure in a row quarantines its key once that count
/// reaches `limit`, the recovery limit in force (`None` or 0: no limit).
/// The lessor applies it as a term ends; PostgreSQL's statements spell it
/// as `sql::earns_quarantine!`, and its rows are read back through it.
pub fn earns_quarantine(failures: u32, limit: Option<u32>) -> bool {
    limit.is_some_and(|k| k > 0 && failures >= k)
}

/// Where a key stands on failed terms: how many in a row ended failed
/// (suspended or expired), and whether that quarantined it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Failures {
    pub count: u32,
    pub quarantined: bool,
}

/// What ending a term does to its key (see [`Term::ending`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    /// The record the key keeps of the term.
    pub ended: EndedTerm,
    /// The key's failures after this end.
    pub failures: Failures,
    /// The lock-delay this end starts, if it starts one.
    pub lock_delay: Option<Reservation>,
}

impl Term {
    /// What ending this term with `end` at `at` does to a key that stood at
    /// `before`: the one rule of a term's end. The lessor applies it as it
    /// ends a term; PostgreSQL, whose statements record an end themselves,
    /// reads a term past its deadline that no statement has moved yet
    /// through it, so a reader of either backend sees what the end will
    /// write. A release clears the failures (and a quarantine, which only a
    /// forced term can end); a suspension or expiry counts one more and may
    /// earn quarantine; an expiry starts the term's lock-delay.
    /// `default_max_recoveries` is the limit for a term whose Acquire named
    /// none (PostgreSQL fixes it into the term at its grant: `None` there).
    pub fn ending(
        &self,
        end: TermEnd,
        at: Millis,
        before: Failures,
        default_max_recoveries: Option<u32>,
    ) -> Ending {
        let failures = if end == TermEnd::Released {
            Failures::default()
        } else {
            let count = before.count.saturating_add(1);
            let limit = self.lifecycle.max_recoveries.or(default_max_recoveries);
            Failures {
                count,
                quarantined: before.quarantined || earns_quarantine(count, limit),
            }
        };
        let lock_delay = (end == TermEnd::Expired && self.lifecycle.lock_delay_ms > 0).then(|| {
            Reservation::LockDelay {
                after: self.fence,
                until: at.saturating_add(self.lifecycle.lock_delay_ms),
            }
        });
        Ending {
            ended: EndedTerm {
                fence: self.fence,
                owner: self.owner.clone(),
                lease_id: self.lease_id,
                end,
                ended_at: at,
            },
            failures,
            lock_delay,
        }
    }

    /// [`Term::ending`] by expiry, at the term's deadline.
    pub fn expiry(&self, before: Failures, default_max_recoveries: Option<u32>) -> Ending {
        self.ending(
            TermEnd::Expired,
            self.expires_at,
            before,
            default_max_recoveries,
        )
    }
}

/// The parts of a term that only matter when it ends (lock-delay, recovery
/// limit) or that say how it began (handed off). Kept together so a term
/// that uses none of them is written `Lifecycle::default()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lifecycle {
    /// When the term ends by expiry, nobody may acquire the key for this
    /// long (0: no delay).
    pub lock_delay_ms: u64,
    /// Quarantine the key when this many terms in a row (this one included)
    /// end by expiry or suspension; `None` takes the server default.
    pub max_recoveries: Option<u32>,
    /// The term was granted to the successor its predecessor named.
    pub handed_off: bool,
}

/// The longest lock-delay an Acquire may ask for.
pub const MAX_LOCK_DELAY_MS: u64 = 60_000;

/// The longest reservation a Release may make for a successor.
pub const MAX_HANDOFF_MS: u64 = 10 * 60 * 1000;

/// How long a successor is waited for when a Release names one but no time.
pub const DEFAULT_HANDOFF_MS: u64 = 30_000;

/// What an Acquire asks beyond the key, owner and TTL: parsed once, at the
/// edge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    /// See [`Lifecycle::lock_delay_ms`].
    pub lock_delay_ms: u64,
    /// See [`Lifecycle::max_recoveries`].
    pub max_recoveries: Option<u32>,
    /// Acquire a quarantined key anyway (an operator's override; the server
    /// asks for the admin right).
    pub force: bool,
}

impl AcquireOptions {
    /// Checks the wire values; `max_recoveries = 0` means the server default.
    ///
    /// # Errors
    /// [`Invalid`] for a lock-delay over [`MAX_LOCK_DELAY_MS`].
    pub fn parse(lock_delay_ms: u64, max_recoveries: u32, force: bool) -> Result<AcquireOptions> {
        if lock_delay_ms > MAX_LOCK_DELAY_MS {
            return Err(Invalid(format!(
                "lock_delay_ms {lock_delay_ms} is over the limit of {MAX_LOCK_DELAY_MS}"
            )));
        }
        Ok(AcquireOptions {
            lock_delay_ms,
            max_recoveries: (max_recoveries > 0).then_some(max_recoveries),
            force,
        })
    }
}

/// A Release's request to keep the key for a named successor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handoff {
    pub successor: Owner,
    /// How long the key waits for the successor before waiters get it.
    pub for_ms: u64,
}

impl Handoff {
    /// Checks the wire values: an empty successor is no handoff; `for_ms = 0`
    /// is [`DEFAULT_HANDOFF_MS`].
    ///
    /// # Errors
    /// [`Invalid`] for a bad owner or a time over
    /// [`MAX_HANDOFF_MS`], or a time without a successor.
    pub fn parse_optional(successor: impl Into<String>, for_ms: u64) -> Result<Option<Handoff>> {
        let successor = successor.into();
        if successor.is_empty() {
            if for_ms != 0 {
                return Err(Invalid(
                    "handoff_ms is set but no successor is named".into(),
                ));
            }
            return Ok(None);
        }
        if for_ms > MAX_HANDOFF_MS {
            return Err(Invalid(format!(
                "handoff_ms {for_ms} is over the limit of {MAX_HANDOFF_MS}"
            )));
        }
        Ok(Some(Handoff {
            successor: Owner::parse(successor)?,
            for_ms: if for_ms == 0 {
                DEFAULT_HANDOFF_MS
            } else {
                for_ms
            },
        }))
    }
}

/// Who may take a free key, when it is not everyone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reservation {
    /// The term `after` expired; nobody may take the key until `until`,
    /// so writes its holder already sent can drain.
    LockDelay { after: Fence, until: Millis },
    /// The term `from` was released for `successor`, who alone may take the
    /// key until `until`.
    Handoff {
        from: Fence,
        successor: Owner,
        until: Millis,
    },
}

impl Reservation {
    pub fn until(&self) -> Millis {
        match self {
            Reservation::LockDelay { until, .. } | Reservation::Handoff { until, .. } => *until,
        }
    }
}

/// One ended term in a key's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    pub fence: Fence,
    pub owner: Owner,
    pub acquired_at: Millis,
    pub ended_at: Millis,
    pub end: TermEnd,
    /// Tool calls running when the term ended.
    pub unsettled_tool_calls: u32,
    /// The term was granted to its predecessor's named successor.
    pub handed_off: bool,
}

impl Term {
    /// Whether the term is live at `now`: it is until the instant it expires.
    pub fn is_live_at(&self, now: Millis) -> bool {
        now < self.expires_at
    }
}

/// The record a key keeps of its last ended term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndedTerm {
    pub fence: Fence,
    pub owner: Owner,
    /// Kept so a retried release can be told apart from a forged one.
    pub lease_id: LeaseId,
    pub end: TermEnd,
    pub ended_at: Millis,
}

/// A live term as a client sees it: what Acquire, Renew, Check, Get and List
/// return. `lease_id` is only ever shown to the holder (Acquire, Renew).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub key: Key,
    pub fence: Fence,
    pub owner: Owner,
    pub lease_id: Option<LeaseId>,
    pub ttl: Ttl,
    /// Server wall-clock milliseconds since the Unix epoch.
    pub acquired_at: Millis,
    pub expires_at: Millis,
}

impl Lease {
    /// The client's view of `term` of `key`, with or without its secret.
    pub fn of(key: &Key, term: &Term, with_secret: bool) -> Lease {
        Lease {
            key: key.clone(),
            fence: term.fence,
            owner: term.owner.clone(),
            lease_id: with_secret.then_some(term.lease_id),
            ttl: term.ttl,
            acquired_at: term.acquired_at,
            expires_at: term.expires_at,
        }
    }
}

/// An ended term as a client sees it (its lease id never leaves the server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub fence: Fence,
    pub owner: Owner,
    pub end: TermEnd,
    /// Server wall-clock milliseconds since the Unix epoch.
    pub ended_at: Millis,
    /// In an Acquire's `previous`: that term's release named this Acquire's
    /// owner as its successor, and the key was kept for it.
    pub handed_off: bool,
}

impl From<&EndedTerm> for Ended {
    fn from(ended: &EndedTerm) -> Ended {
        Ended {
            fence: ended.fence,
            owner: ended.owner.clone(),
            end: ended.end,
            ended_at: ended.ended_at,
            handed_off: false,
        }
    }
}

/// A key as readers see it (Get, List).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyState {
    pub key: Key,
    pub lease: Option<Lease>,
    pub last_ended: Option<Ended>,
    /// No live term, the last one ended expired or suspended, and the key
    /// is not quarantined.
    pub recoverable: bool,
    /// Acquires are refused until an admin lifts the quarantine.
    pub quarantined: bool,
    /// Who alone may take the key now, if it is free but reserved.
    pub reservation: Option<Reservation>,
}

/// A key: names a resource (a session id, `db:<path>`, ...). Non-empty, at
/// most [`MAX_KEY_BYTES`], no control characters; checked once, where it
/// enters (the gRPC layer, the client), so everything inside takes a `Key`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(String);

impl Key {
    /// Checks `key`.
    ///
    /// # Errors
    /// [`Invalid`] naming the rule broken.
    pub fn parse(key: impl Into<String>) -> Result<Key> {
        let key = key.into();
        check_name("key", &key, MAX_KEY_BYTES)?;
        Ok(Key(key))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// So a `BTreeMap<Key, _>` can be looked up and ranged over by `&str` (List
/// ranges by prefix, which need not be a valid key).
impl std::borrow::Borrow<str> for Key {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// Who holds a term: a process name such as `host:pid`. Non-empty, at most
/// [`MAX_OWNER_BYTES`], no control characters.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner(String);

impl Owner {
    /// Checks `owner`.
    ///
    /// # Errors
    /// [`Invalid`] naming the rule broken.
    pub fn parse(owner: impl Into<String>) -> Result<Owner> {
        let owner = owner.into();
        check_name("owner", &owner, MAX_OWNER_BYTES)?;
        Ok(Owner(owner))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The client's retry token for one Acquire: a retry with the same owner and
/// request id while the term it got is live gets that term back. At most
/// [`MAX_REQUEST_ID_BYTES`]; never empty (no token is `None`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RequestId(String);

impl RequestId {
    /// Checks a request id as it travels on the wire, where empty means none.
    ///
    /// # Errors
    /// [`Invalid`] when it is too long.
    pub fn parse_optional(request_id: impl Into<String>) -> Result<Option<RequestId>> {
        let request_id = request_id.into();
        if request_id.len() > MAX_REQUEST_ID_BYTES {
            return Err(Invalid(format!(
                "request_id is {} bytes; the limit is {MAX_REQUEST_ID_BYTES}",
                request_id.len()
            )));
        }
        Ok((!request_id.is_empty()).then_some(RequestId(request_id)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A term's time to live, in [`MIN_TTL_MS`]..=[`MAX_TTL_MS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(u64);

impl Ttl {
    /// Checks a TTL in milliseconds.
    ///
    /// # Errors
    /// [`Invalid`] when it is out of range.
    pub fn from_millis(ttl_ms: u64) -> Result<Ttl> {
        if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl_ms) {
            return Err(Invalid(format!(
                "ttl_ms {ttl_ms} is outside [{MIN_TTL_MS}, {MAX_TTL_MS}]"
            )));
        }
        Ok(Ttl(ttl_ms))
    }

    /// A Renew's TTL as it travels on the wire, where 0 means "keep the term's".
    ///
    /// # Errors
    /// [`Invalid`] when it is neither 0 nor in range.
    pub fn parse_optional(ttl_ms: u64) -> Result<Option<Ttl>> {
        if ttl_ms == 0 {
            Ok(None)
        } else {
            Ttl::from_millis(ttl_ms).map(Some)
        }
    }

    pub fn as_millis(self) -> u64 {
        self.0
    }
}

/// How long an Acquire may wait in line for a held key, at most
/// [`MAX_WAIT_MS`] (0: do not wait).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Wait(u64);

impl Wait {
    /// Checks a wait in milliseconds.
    ///
    /// # Errors
    /// [`Invalid`] when it is too long.
    pub fn from_millis(wait_ms: u64) -> Result<Wait> {
        if wait_ms > MAX_WAIT_MS {
            return Err(Invalid(format!(
                "wait_ms {wait_ms} is over the limit of {MAX_WAIT_MS}"
            )));
        }
        Ok(Wait(wait_ms))
    }

    pub fn as_millis(self) -> u64 {
        self.0
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    )*};
}
display_as_str!(Key, Owner, RequestId, Ttl, Wait);

// Text values debug-print as the quoted string they hold, so messages such as
// `key "session:42" is held by owner "graph-a"` read as they always did.
macro_rules! debug_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }
    )*};
}
debug_as_str!(Key, Owner, RequestId);

// Text values compare with plain strings, so `guard.key() == "session:42"`
// reads naturally.
macro_rules! eq_str {
    ($($t:ty),*) => {$(
        impl PartialEq<str> for $t {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }
        impl PartialEq<&str> for $t {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    )*};
}
eq_str!(Key, Owner, RequestId);

/// A key or owner: non-empty, at most `limit` bytes, no control characters.
fn check_name(what: &str, text: &str, limit: usize) -> Result<()> {
    if text.is_empty() {
        return Err(Invalid(format!("{what} must not be empty")));
    }
    if text.len() > limit {
        return Err(Invalid(format!(
            "{what} is {} bytes; the limit is {limit}",
            text.len()
        )));
    }
    if text.chars().any(char::is_control) {
        return Err(Invalid(format!(
            "{what} must not contain control characters"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_with_control_characters_are_refused() {
        assert!(Key::parse("session:1").is_ok());
        assert!(Key::parse("a\nb").is_err());
        assert!(Key::parse("a\u{7f}b").is_err());
        assert!(Key::parse("").is_err());
        assert!(Key::parse("k".repeat(MAX_KEY_BYTES)).is_ok());
        assert!(Key::parse("k".repeat(MAX_KEY_BYTES + 1)).is_err());
        assert!(Owner::parse("").is_err());
        assert!(Owner::parse("o".repeat(MAX_OWNER_BYTES + 1)).is_err());
    }

    #[test]
    fn ttl_bounds_are_inclusive() {
        assert!(Ttl::from_millis(MIN_TTL_MS).is_ok());
        assert!(Ttl::from_millis(MAX_TTL_MS).is_ok());
        assert!(Ttl::from_millis(MIN_TTL_MS - 1).is_err());
        assert!(Ttl::from_millis(MAX_TTL_MS + 1).is_err());
        assert_eq!(Ttl::parse_optional(0).unwrap(), None);
        assert!(Wait::from_millis(MAX_WAIT_MS + 1).is_err());
    }

    #[test]
    fn an_empty_request_id_is_none() {
        assert_eq!(RequestId::parse_optional("").unwrap(), None);
        assert_eq!(
            RequestId::parse_optional("r").unwrap().unwrap().as_str(),
            "r"
        );
        assert!(RequestId::parse_optional("r".repeat(MAX_REQUEST_ID_BYTES + 1)).is_err());
    }
}
