//! The values a lease is made of, and the rules for valid input.
//!
//! A *key* names a resource (a session id, `db:<path>`, ...). Each grant on a
//! key starts a *term*: a fence (fencing token), an owner, a secret lease id
//! and a deadline. A term ends when it is released, suspended (released
//! unfinished) or expires; the key then keeps a record of that ended term, so
//! a recoverer can see what it takes over.

use std::fmt;

use crate::clock::Millis;
use crate::error::{Error, Result};

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
    /// [`Error::InvalidArgument`] when `text` is not a UUID.
    pub fn parse(text: &str) -> Result<Self> {
        uuid::Uuid::parse_str(text)
            .map(LeaseId)
            .map_err(|_| Error::InvalidArgument(format!("lease_id {text:?} is not a UUID")))
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
    pub owner: String,
    pub lease_id: LeaseId,
    /// The client's retry token for the Acquire that granted this term, if it sent one.
    pub request_id: Option<String>,
    pub ttl_ms: u64,
    pub acquired_at: Millis,
    pub expires_at: Millis,
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
    pub owner: String,
    /// Kept so a retried release can be told apart from a forged one.
    pub lease_id: LeaseId,
    pub end: TermEnd,
    pub ended_at: Millis,
}

/// Checks a key: non-empty, at most [`MAX_KEY_BYTES`], no control characters.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the rule broken.
pub fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::InvalidArgument("key must not be empty".into()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::InvalidArgument(format!(
            "key is {} bytes; the limit is {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    if key.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(
            "key must not contain control characters".into(),
        ));
    }
    Ok(())
}

/// Checks an owner name: non-empty, at most [`MAX_OWNER_BYTES`], no control characters.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the rule broken.
pub fn validate_owner(owner: &str) -> Result<()> {
    if owner.is_empty() {
        return Err(Error::InvalidArgument("owner must not be empty".into()));
    }
    if owner.len() > MAX_OWNER_BYTES {
        return Err(Error::InvalidArgument(format!(
            "owner is {} bytes; the limit is {MAX_OWNER_BYTES}",
            owner.len()
        )));
    }
    if owner.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(
            "owner must not contain control characters".into(),
        ));
    }
    Ok(())
}

/// Checks a request id: at most [`MAX_REQUEST_ID_BYTES`] (empty means none).
///
/// # Errors
/// [`Error::InvalidArgument`] when it is too long.
pub fn validate_request_id(request_id: &str) -> Result<()> {
    if request_id.len() > MAX_REQUEST_ID_BYTES {
        return Err(Error::InvalidArgument(format!(
            "request_id is {} bytes; the limit is {MAX_REQUEST_ID_BYTES}",
            request_id.len()
        )));
    }
    Ok(())
}

/// Checks a TTL against [`MIN_TTL_MS`]..=[`MAX_TTL_MS`].
///
/// # Errors
/// [`Error::InvalidArgument`] when it is out of range.
pub fn validate_ttl(ttl_ms: u64) -> Result<()> {
    if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl_ms) {
        return Err(Error::InvalidArgument(format!(
            "ttl_ms {ttl_ms} is outside [{MIN_TTL_MS}, {MAX_TTL_MS}]"
        )));
    }
    Ok(())
}

/// Checks a wait against [`MAX_WAIT_MS`].
///
/// # Errors
/// [`Error::InvalidArgument`] when it is too long.
pub fn validate_wait(wait_ms: u64) -> Result<()> {
    if wait_ms > MAX_WAIT_MS {
        return Err(Error::InvalidArgument(format!(
            "wait_ms {wait_ms} is over the limit of {MAX_WAIT_MS}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_with_control_characters_are_refused() {
        assert!(validate_key("session:1").is_ok());
        assert!(validate_key("a\nb").is_err());
        assert!(validate_key("a\u{7f}b").is_err());
        assert!(validate_key("").is_err());
        assert!(validate_key(&"k".repeat(MAX_KEY_BYTES)).is_ok());
        assert!(validate_key(&"k".repeat(MAX_KEY_BYTES + 1)).is_err());
    }

    #[test]
    fn ttl_bounds_are_inclusive() {
        assert!(validate_ttl(MIN_TTL_MS).is_ok());
        assert!(validate_ttl(MAX_TTL_MS).is_ok());
        assert!(validate_ttl(MIN_TTL_MS - 1).is_err());
        assert!(validate_ttl(MAX_TTL_MS + 1).is_err());
    }
}
