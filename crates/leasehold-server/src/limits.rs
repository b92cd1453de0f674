//! Limits against greedy or broken clients: one client reaching a limit gets
//! RESOURCE_EXHAUSTED naming it, and everyone else goes on being served.
//!
//! - waiting Acquires per connection and Session streams per connection
//!   (a connection is its peer address): a client cannot pin the server's
//!   memory with thousands of abandoned waits or streams;
//! - operations per second per caller (its principal under `--auth`, else
//!   its IP address), a token bucket with a one-second burst; off by default
//!   (a process multiplexing many sessions legitimately sends a lot);
//! - keys held per principal (under `--auth`): one tenant cannot fill the
//!   lease table (see [`KeyReservation`] for how live terms are counted);
//! - waiters per key ([`DEFAULT_MAX_WAITERS_PER_KEY`]: the lessor's on
//!   SQLite, the database's count on PostgreSQL, across the whole fleet),
//!   and the gRPC message size (tonic's).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use leasehold_core::error::Error;
use leasehold_core::lease::{Fence, Key, Term};

pub use leasehold_backend::DEFAULT_MAX_WAITERS_PER_KEY;

/// The limits' settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Acquires waiting in line at once from one connection.
    pub waits_per_connection: usize,
    /// Session streams open at once on one connection.
    pub streams_per_connection: usize,
    /// Operations per second per caller; 0 is no limit.
    pub ops_per_second: u32,
    /// The largest request message, in bytes.
    pub max_message_bytes: usize,
    /// Keys one principal may hold at once (live terms it was granted, plus
    /// its Acquires in flight); 0 is no limit. Without `--auth` there are no
    /// principals and nothing is counted.
    pub keys_per_principal: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            waits_per_connection: 10_000,
            streams_per_connection: 64,
            ops_per_second: 0,
            max_message_bytes: 4 * 1024 * 1024,
            keys_per_principal: 10_000,
        }
    }
}

/// What a slot counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Wait,
    Stream,
}

/// A token bucket: `rate` tokens a second, at most `rate` held.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The running counts the limits are checked against.
#[derive(Debug, Default)]
pub struct Gate {
    limits: Limits,
    slots: Mutex<HashMap<(Kind, SocketAddr), usize>>,
    buckets: Mutex<HashMap<String, Bucket>>,
    /// The keys each principal holds, for `keys_per_principal`.
    holdings: Mutex<Holdings>,
}

/// A taken slot (a wait or a stream); dropping it gives it back.
#[derive(Debug)]
pub struct Slot {
    gate: Arc<Gate>,
    kind: Kind,
    peer: SocketAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut slots = self.gate.slots.lock().expect("slots");
        if let Some(n) = slots.get_mut(&(self.kind, self.peer)) {
            *n -= 1;
            if *n == 0 {
                slots.remove(&(self.kind, self.peer));
            }
        }
    }
}

impl Gate {
    pub fn new(limits: Limits) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            ..Gate::default()
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A waiting Acquire's slot on the connection from `peer` (none is
    /// counted when the peer is unknown).
    ///
    /// # Errors
    /// [`Error::ResourceExhausted`] (`waits_per_connection`).
    pub fn wait_slot(self: &Arc<Self>, peer: Option<SocketAddr>) -> Result<Option<Slot>, Error> {
        self.slot(
            Kind::Wait,
            peer,
            self.limits.waits_per_connection,
            "waits_per_connection",
        )
    }

    /// A Session stream's slot on the connection from `peer`.
    ///
    /// # Errors
    /// [`Error::ResourceExhausted`] (`streams_per_connection`).
    pub fn stream_slot(self: &Arc<Self>, peer: Option<SocketAddr>) -> Result<Option<Slot>, Error> {
        self.slot(
            Kind::Stream,
            peer,
            self.limits.streams_per_connection,
            "streams_per_connection",
        )
    }

    fn slot(
        self: &Arc<Self>,
        kind: Kind,
        peer: Option<SocketAddr>,
        max: usize,
        name: &str,
    ) -> Result<Option<Slot>, Error> {
        let Some(peer) = peer else {
            return Ok(None);
        };
        let mut slots = self.slots.lock().expect("slots");
        let n = slots.entry((kind, peer)).or_default();
        if *n >= max {
            return Err(Error::ResourceExhausted {
                limit: name.to_owned(),
                detail: format!("{max} already open on this connection"),
            });
        }
        *n += 1;
        Ok(Some(Slot {
            gate: self.clone(),
            kind,
            peer,
        }))
    }

    /// Takes one operation from `caller`'s budget.
    ///
    /// # Errors
    /// [`Error::ResourceExhausted`] (`ops_per_second`) when it is spent.
    pub fn take_op(&self, caller: &str) -> Result<(), Error> {
        let rate = self.limits.ops_per_second;
        if rate == 0 {
            return Ok(());
        }
        let rate = f64::from(rate);
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("buckets");
        let bucket = buckets.entry(caller.to_owned()).or_insert(Bucket {
            tokens: rate,
            at: now,
        });
        let refill = now.duration_since(bucket.at).as_secs_f64() * rate;
        bucket.tokens = (bucket.tokens + refill).min(rate);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return Err(Error::ResourceExhausted {
                limit: "ops_per_second".into(),
                detail: format!("{caller} may send {rate} operations a second"),
            });
        }
        bucket.tokens -= 1.0;
        Ok(())
    }
}

/// Who a rate limit counts against: the principal, else the peer's IP.
pub fn caller_name(principal: Option<&str>, peer: Option<SocketAddr>) -> String {
    match (principal, peer) {
        (Some(name), _) => format!("principal {name:?}"),
        (None, Some(peer)) => format!("address {}", peer.ip()),
        (None, None) => format!("address {}", IpAddr::from([0, 0, 0, 0])),
    }
}

/// The terms this server granted to principals and has not seen end, for
/// `keys_per_principal`.
///
/// Terms end in three ways, and each is seen differently: a release (by
/// whoever holds the lease id) removes the key at once; a takeover of an
/// expired key by another grant moves it to the new holder; an expiry that
/// nobody follows is noticed lazily, when the principal is at its limit and
/// its entries past their deadline are swept. The deadline is the gate's own
/// monotonic estimate, taken *after* the reply (now + TTL), so it is never
/// earlier than the server's: a principal is never let past its limit, and
/// at worst waits a round trip longer for an expired key to stop counting.
///
/// Memory is bounded: at most `keys_per_principal` entries per principal,
/// and principals are the auth file's.
///
/// # Locking
/// One std mutex, taken (with the limit on and `--auth`) by each Acquire,
/// Renew and Release for a few hash-map operations, never across an
/// `.await`; the sweep, only at the limit, walks at most the limit's worth
/// of one principal's entries.
#[derive(Debug, Default)]
struct Holdings {
    /// Each principal's keys and Acquires in flight.
    by_principal: HashMap<Arc<str>, Held>,
    /// Which principal holds each counted key (a key has at most one live
    /// term), so a release or takeover by anyone finds the entry.
    holder: HashMap<Key, Arc<str>>,
}

/// What one principal holds.
#[derive(Debug, Default)]
struct Held {
    /// Its live terms: the fence, and when the term is over at the latest.
    keys: HashMap<Key, (Fence, Instant)>,
    /// Acquires counted before their answer (they may be granted): without
    /// them, concurrent Acquires could all pass the check and overshoot.
    in_flight: usize,
}

impl Held {
    fn count(&self) -> usize {
        self.keys.len() + self.in_flight
    }
}

impl Holdings {
    /// Forgets `key`'s entry if it is the term `fence` (any term when `None`).
    fn forget(&mut self, key: &Key, fence: Option<Fence>) {
        let Some(principal) = self.holder.get(key) else {
            return;
        };
        let Some(held) = self.by_principal.get_mut(principal) else {
            return;
        };
        if fence.is_some_and(|f| held.keys.get(key).is_some_and(|(at, _)| *at != f)) {
            return;
        }
        held.keys.remove(key);
        self.holder.remove(key);
    }
}

/// A counted Acquire of a principal; [`KeyReservation::granted`] turns it
/// into a held key, dropping it (a refusal, a cancelled wait) gives it back.
#[derive(Debug)]
pub struct KeyReservation {
    gate: Arc<Gate>,
    principal: Arc<str>,
    /// False when the principal already holds the key: a replay or a busy
    /// refusal adds no key, and must not be refused at the limit.
    counted: bool,
}

impl KeyReservation {
    /// Records the grant the Acquire got (a replay only refreshes it).
    pub fn granted(self, key: &Key, term: &Term) {
        let until = deadline(term);
        let mut holdings = self.gate.holdings.lock().expect("holdings");
        // A grant ends whatever term the key had: an expired one of another
        // principal's stops counting against it now.
        holdings.forget(key, None);
        holdings
            .by_principal
            .entry(self.principal.clone())
            .or_default()
            .keys
            .insert(key.clone(), (term.fence, until));
        holdings.holder.insert(key.clone(), self.principal.clone());
        // Released before `self` drops, which takes the lock to give back
        // the in-flight count.
        drop(holdings);
    }
}

impl Drop for KeyReservation {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let mut holdings = self.gate.holdings.lock().expect("holdings");
        if let Some(held) = holdings.by_principal.get_mut(&self.principal) {
            held.in_flight -= 1;
        }
    }
}

/// When `term` is over at the latest, on the gate's clock: now (after the
/// reply was made) plus its TTL.
fn deadline(term: &Term) -> Instant {
    Instant::now() + std::time::Duration::from_millis(term.ttl.as_millis())
}

impl Gate {
    /// Counts an Acquire of `key` by `principal` against its
    /// `keys_per_principal` until it is answered; `None` when the limit is
    /// off.
    ///
    /// # Errors
    /// [`Error::ResourceExhausted`] (`keys_per_principal`) when the
    /// principal's live terms and Acquires in flight already reach it.
    pub fn reserve_key(
        self: &Arc<Self>,
        principal: &str,
        key: &Key,
    ) -> Result<Option<KeyReservation>, Error> {
        let max = self.limits.keys_per_principal;
        if max == 0 {
            return Ok(None);
        }
        let now = Instant::now();
        let mut guard = self.holdings.lock().expect("holdings");
        let holdings = &mut *guard;
        let principal: Arc<str> = match holdings.by_principal.get_key_value(principal) {
            Some((name, _)) => name.clone(),
            None => Arc::from(principal),
        };
        let held = holdings.by_principal.entry(principal.clone()).or_default();
        if held.keys.get(key).is_some_and(|(_, until)| *until > now) {
            return Ok(Some(KeyReservation {
                gate: self.clone(),
                principal,
                counted: false,
            }));
        }
        if held.count() >= max {
            // Terms that ran out with nobody taking over stop counting here.
            let holder = &mut holdings.holder;
            held.keys.retain(|key, (_, until)| {
                let live = *until > now;
                if !live && holder.get(key) == Some(&principal) {
                    holder.remove(key);
                }
                live
            });
            if held.count() >= max {
                return Err(Error::ResourceExhausted {
                    limit: "keys_per_principal".into(),
                    detail: format!("principal {principal:?} may hold {max} keys at once"),
                });
            }
        }
        held.in_flight += 1;
        Ok(Some(KeyReservation {
            gate: self.clone(),
            principal,
            counted: true,
        }))
    }

    /// A renewal of `key`'s term `fence` succeeded: it lasts until now + `term.ttl`
    /// at least (a renewal never shortens a term).
    pub fn renewed(&self, key: &Key, term: &Term) {
        if self.limits.keys_per_principal == 0 {
            return;
        }
        let until = deadline(term);
        let mut guard = self.holdings.lock().expect("holdings");
        let holdings = &mut *guard;
        let Some(principal) = holdings.holder.get(key) else {
            return;
        };
        if let Some((fence, at)) = holdings
            .by_principal
            .get_mut(principal)
            .and_then(|held| held.keys.get_mut(key))
        {
            if *fence == term.fence {
                *at = (*at).max(until);
            }
        }
    }

    /// `key`'s term `fence` ended (released or suspended).
    pub fn released(&self, key: &Key, fence: Fence) {
        if self.limits.keys_per_principal == 0 {
            return;
        }
        self.holdings
            .lock()
            .expect("holdings")
            .forget(key, Some(fence));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::lease::{LeaseId, Owner, Ttl};

    fn gate(keys_per_principal: usize) -> Arc<Gate> {
        Gate::new(Limits {
            keys_per_principal,
            ..Limits::default()
        })
    }

    fn key(k: &str) -> Key {
        Key::parse(k).unwrap()
    }

    fn term(fence: u64) -> Term {
        Term {
            fence: Fence(fence),
            owner: Owner::parse("o").unwrap(),
            lease_id: LeaseId::random(),
            request_id: None,
            ttl: Ttl::from_millis(60_000).unwrap(),
            acquired_at: 0,
            expires_at: 60_000,
            lifecycle: Default::default(),
        }
    }

    fn refused(result: Result<Option<KeyReservation>, Error>) -> bool {
        matches!(result, Err(Error::ResourceExhausted { limit, .. }) if limit == "keys_per_principal")
    }

    /// Acquires in flight count, so concurrent ones cannot all slip past.
    #[test]
    fn acquires_in_flight_count_until_answered() {
        let gate = gate(2);
        let first = gate.reserve_key("p", &key("a")).unwrap();
        let _second = gate.reserve_key("p", &key("b")).unwrap();
        assert!(refused(gate.reserve_key("p", &key("c"))));
        assert!(gate.reserve_key("q", &key("c")).unwrap().is_some());
        drop(first); // refused or cancelled: the count comes back
        assert!(gate.reserve_key("p", &key("c")).is_ok());
    }

    /// A grant holds a key until its release; a release of another fence
    /// (an older term) does not free it.
    #[test]
    fn a_grant_counts_until_its_own_release() {
        let gate = gate(1);
        gate.reserve_key("p", &key("a"))
            .unwrap()
            .unwrap()
            .granted(&key("a"), &term(7));
        assert!(refused(gate.reserve_key("p", &key("b"))));
        gate.released(&key("a"), Fence(6));
        assert!(refused(gate.reserve_key("p", &key("b"))));
        gate.released(&key("a"), Fence(7));
        assert!(gate.reserve_key("p", &key("b")).is_ok());
    }

    /// A takeover of a key moves it to its new holder.
    #[test]
    fn a_takeover_moves_the_key() {
        let gate = gate(1);
        gate.reserve_key("p", &key("a"))
            .unwrap()
            .unwrap()
            .granted(&key("a"), &term(1));
        gate.reserve_key("q", &key("a"))
            .unwrap()
            .unwrap()
            .granted(&key("a"), &term(2));
        assert!(gate.reserve_key("p", &key("b")).is_ok());
        assert!(refused(gate.reserve_key("q", &key("b"))));
    }

    /// Without a limit nothing is counted.
    #[test]
    fn zero_is_no_limit() {
        let gate = gate(0);
        for k in ["a", "b", "c"] {
            assert!(gate.reserve_key("p", &key(k)).unwrap().is_none());
        }
    }
}
