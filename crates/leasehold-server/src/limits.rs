//! Limits against greedy or broken clients: one client reaching a limit gets
//! RESOURCE_EXHAUSTED naming it, and everyone else goes on being served.
//!
//! - waiting Acquires per connection and Session streams per connection
//!   (a connection is its peer address): a client cannot pin the server's
//!   memory with thousands of abandoned waits or streams;
//! - operations per second per caller (its principal under `--auth`, else
//!   its IP address), a token bucket with a one-second burst; off by default
//!   (a process multiplexing many sessions legitimately sends a lot);
//! - waiters per key (the lessor's), and the gRPC message size (tonic's).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use leasehold_core::error::Error;

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
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            waits_per_connection: 10_000,
            streams_per_connection: 64,
            ops_per_second: 0,
            max_message_bytes: 4 * 1024 * 1024,
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
