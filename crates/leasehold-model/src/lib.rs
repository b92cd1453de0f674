//! A model of the lease protocol, checked with [`stateright`] over every
//! interleaving up to a bound (see `docs/reliability.md`).
//!
//! One key, one server, two or three clients and one fenced store, with
//! lossy, duplicating, reordering messages and drifting clocks. Every rule
//! below names the file of the real implementation it copies; where the
//! model simplifies, it says so. `docs/reliability.md` says what is checked,
//! how deep, and what is not covered.
//!
//! # Time
//!
//! Time is discrete (one tick is any fixed fraction of the TTL). The
//! server's clock is the model's time axis (`State::now`); each client's
//! clock is `now + skew`, where the skew stays within `±max_drift` ticks for
//! the whole run, so any interval a client measures differs from the same
//! interval on the server's clock by at most `2 * max_drift` ticks. Clocks
//! only move forward: [`Action::Tick`] advances every clock,
//! [`Action::Stall`] advances every clock but one client's (that client's
//! clock runs slow), [`Action::Rush`] advances one client's clock alone (it
//! runs fast). Only drift *between* the server and the clients matters to
//! the properties, which compare what a client believes with what the
//! server holds at the same instant, so the server's clock is taken as the
//! reference. A client's safety margin must cover `2 * max_drift`
//! (the default configuration uses exactly that).
//!
//! # The server (`crates/leasehold-core/src/lessor/mod.rs`, `key_state.rs`)
//!
//! - A term is live while `now < expires_at` on the server's clock
//!   (`Term::is_live_at` in `crates/leasehold-core/src/lease.rs`); expiry
//!   needs no action, it is a comparison with the clock.
//! - Acquire of a free key grants a new term with the next fence; fences
//!   come from one counter and only go up (`Lessor::grant`). Acquire of a key
//!   whose live term has the same owner and request id replays that term
//!   (`Lessor::acquire`); any other Acquire of a held key is refused (the
//!   model has no waiting line: every Acquire has `wait = 0`, and a refusal
//!   is modelled as no reply, since the client only gives up on it).
//! - Renew of the live term sets `expires_at = max(expires_at, now + ttl)`:
//!   it never shortens (`Lessor::renew`); of anything else it is refused as
//!   stale (`holder` in `key_state.rs`).
//! - Release of the live term ends it; of anything else it is refused
//!   (`Lessor::release`).
//! - Check answers whether the fence is the live term (`Lessor::check`).
//!
//! # Durability and restarts (`docs/design.md`, "Request path and group
//! commit"; `Lessor::restore`; README "Guarantees" 2–4)
//!
//! - Grants and releases are committed, with the fence high-water mark,
//!   before their reply; the model makes them durable in the same step.
//!   (A crash before the commit sends no reply: the same as the request
//!   never arriving.)
//! - A renewal that keeps the TTL, and an expiry, are written lazily: only a
//!   [`Action::Flush`] (the writer's next batch) makes them durable. All
//!   terms in the model have one TTL, so every renewal is lazy.
//! - [`Action::Crash`] loses everything not durable. [`Action::Restart`]
//!   restores the durable record: the next fence is above the stored
//!   high-water mark and every stored fence, and a term that had not ended
//!   gets `expires_at = max(stored, now + ttl)`: a full TTL again, since its
//!   holder could not renew while the server was down.
//!
//! # The clients (`crates/leasehold-client/src/guard.rs`, `lib.rs`)
//!
//! - An Acquire carries a request id the client made up; retries reuse it
//!   (in the model a retry is a duplicate of the same message). The grant's
//!   local deadline is the *first send* of that Acquire plus `ttl - margin`
//!   (`AcquireBuilder` in `lib.rs`: "A fresh grant happened after our first
//!   send, so that send time is a safe basis").
//! - A holder renews in the background; a successful renewal moves the
//!   deadline to `max(deadline, sent + ttl - margin)`, where `sent` is when
//!   *that* renewal was sent (`Shared::renewed`). The client keeps renewing
//!   after its deadline passed: a later success with the same fence makes
//!   it valid again (the guard's "Unsure" state).
//! - A renewal or check refused as stale ends the guard for good
//!   (`Shared::judge`); release ends it before the request is sent
//!   (`SessionGuard::finish`).
//! - A client *believes* it holds the key while its guard has not ended and
//!   its local clock is before its deadline (`SessionGuard::is_valid`). It
//!   writes only then (the gate), but the write may reach the store at any
//!   later time: a process pause between the gate and the write, or a slow
//!   network, is a message delivered late.
//! - A pause is a client taking no step while time passes: the model never
//!   forces a client to act, so every pause length up to the time bound is
//!   explored.
//!
//! # The fenced store (`crates/leasehold-client/src/fence/sqlite.rs`)
//!
//! The store remembers the highest fence it accepted and accepts a write
//! only with a fence at least that high (`ADVANCE` ... `WHERE
//! excluded.fence >= leasehold_fence.fence`).
//!
//! # Messages
//!
//! The network is a set of messages, delivered in any order (reordering);
//! a message that is never delivered is lost. For the safety properties
//! checked here, a dropped message and a message that is never delivered
//! are the same, so there is no separate drop step. Messages to a crashed
//! server wait in the network (a client's retry).
//!
//! Duplication: delivering an Acquire or a Renew leaves it in the network,
//! so it may arrive again at any later time (a replayed or an orphan grant,
//! a late extension). The other messages are consumed on delivery, because
//! a second copy adds no behaviour: a client handles a reply at most once (a
//! Granted for a request it no longer waits for, a Renewed whose deadline is
//! already counted, a Stale for a guard already ended are ignored), a
//! Release of an ended term is refused, a duplicate Check is the same as the
//! client checking again, which it may, and a duplicate Write that arrives
//! late is the same as the one write arriving late (the properties are about
//! which writes the store accepts after which, and its first acceptance
//! changed nothing a late one depends on).
//!
//! # Ghost state
//!
//! `Ghost` and the store's `max_term` are the checker's bookkeeping, not
//! part of the protocol: every grant gets a term number that survives
//! crashes, so "an older term wrote after a newer one" can be told apart
//! from "a lower fence", and a repeated fence can be seen.

use std::collections::BTreeSet;

use stateright::{Model, Property, Representative};

/// A time on some node's clock, in ticks.
pub type Time = i16;

/// The rules the checker can switch off, each to show that it is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rules {
    /// A restart gives every unended term `max(stored, now + ttl)`
    /// (`Lessor::restore`). Off: the stored expiry is kept as it is.
    pub full_ttl_on_restart: bool,
    /// The store refuses a fence below the highest it accepted. Off: it
    /// accepts every write.
    pub store_checks_fence: bool,
    /// The local deadline counts from when the request was *sent*. Off: it
    /// counts from when the reply was received.
    pub deadline_from_send: bool,
    /// The fence counter is durable (the high-water mark is committed with
    /// every grant and restored above every stored fence). Off: a restart
    /// counts fences from 1 again.
    pub durable_fence_counter: bool,
}

impl Rules {
    /// leasehold's rules, as implemented.
    pub const REAL: Rules = Rules {
        full_ttl_on_restart: true,
        store_checks_fence: true,
        deadline_from_send: true,
        durable_fence_counter: true,
    };
}

/// The bounds and parameters of one check.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseModel {
    /// How many clients compete for the key (2 or 3).
    pub clients: usize,
    /// The TTL of every term, in ticks.
    pub ttl: Time,
    /// The client's safety margin: its deadline is `basis + ttl - margin`.
    pub margin: Time,
    /// How far a client's clock may be from the server's, in ticks.
    pub max_drift: Time,
    /// The server's clock stops at this time (bounds the state space).
    pub max_time: Time,
    /// How many Acquires (distinct request ids) each client may send.
    pub acquires: u8,
    /// How many renewals each client may send per term it holds.
    pub renewals: u8,
    /// How many times the server may crash.
    pub crashes: u8,
    /// Whether clients send Check (the gate's round trip). A Check can only
    /// end a guard early, which a client may do anyway by releasing (with a
    /// Release that is never delivered), so leaving it out loses no
    /// behaviour; it is off in most bounded runs to keep the state space
    /// small.
    pub checks: bool,
    /// Which rules hold.
    pub rules: Rules,
}

impl Default for LeaseModel {
    /// Two clients, TTL 4, margin 2 covering a drift of ±1, time up to 8,
    /// one Acquire and two renewals per client, one crash.
    fn default() -> Self {
        LeaseModel {
            clients: 2,
            ttl: 4,
            margin: 2,
            max_drift: 1,
            max_time: 8,
            acquires: 1,
            renewals: 2,
            crashes: 1,
            checks: false,
            rules: Rules::REAL,
        }
    }
}

/// A message in flight. `client` is the client's index; fences start at 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Msg {
    /// Client to server: Acquire with request id `req`.
    Acquire { client: u8, req: u8 },
    /// Client to server: Renew, sent at `sent` on the client's clock (the
    /// client remembers the send time of each call; the model carries it in
    /// the message and its reply).
    Renew { client: u8, fence: u8, sent: Time },
    /// Client to server: Check.
    Check { client: u8, fence: u8 },
    /// Client to server: Release.
    Release { client: u8, fence: u8 },
    /// Client to store: a fenced write. `term` is ghost.
    Write { client: u8, fence: u8, term: u8 },
    /// Server to client: the term granted (or replayed) for `req`.
    Granted {
        client: u8,
        req: u8,
        fence: u8,
        term: u8,
    },
    /// Server to client: the renewal sent at `sent` succeeded.
    Renewed { client: u8, fence: u8, sent: Time },
    /// Server to client: the fence is not the live term (a refused renewal
    /// or check: FAILED_PRECONDITION).
    Stale { client: u8, fence: u8 },
}

/// A term as the server records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Term {
    pub fence: u8,
    /// Ghost: the grant's number, unique across crashes.
    pub term: u8,
    pub owner: u8,
    pub req: u8,
    pub expires_at: Time,
    /// Released, or (in the durable record) written as expired.
    pub ended: bool,
}

impl Term {
    /// Live on the server at `now`: not ended and `now < expires_at`.
    pub fn is_live_at(&self, now: Time) -> bool {
        !self.ended && now < self.expires_at
    }
}

/// The server: its memory and its durable record.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Server {
    pub up: bool,
    /// The fence the next grant gets (meaningless while down).
    pub next_fence: u8,
    /// The key's term in memory (live or last ended); `None` while down.
    pub term: Option<Term>,
    /// The key's row as committed.
    pub durable: Option<Term>,
    /// The committed fence high-water mark.
    pub high_water: u8,
    /// Crashes left.
    pub crashes_left: u8,
}

/// What a client is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    Idle,
    /// Waiting for the grant of request `req`, first sent at `sent` (local).
    Acquiring {
        req: u8,
        sent: Time,
    },
    /// Holding a term (the guard has not ended).
    Holding {
        fence: u8,
        /// Ghost: the grant's number.
        term: u8,
        /// The local deadline.
        deadline: Time,
        renewals_left: u8,
    },
}

/// One client.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Client {
    /// Its clock minus the server's.
    pub skew: Time,
    pub acquires_left: u8,
    pub next_req: u8,
    pub phase: Phase,
}

/// The fenced store.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Store {
    /// The highest fence accepted (0: none yet).
    pub max_fence: u8,
    /// Ghost: the newest term whose write was accepted (0: none).
    pub max_term: u8,
    /// Ghost: how many times a newer term's write was accepted (up to 2).
    pub handovers: u8,
    /// Ghost: a write was refused.
    pub refused: bool,
    /// Ghost: a write with a fence below `max_fence` was accepted.
    pub fence_regressed: bool,
    /// Ghost: a write of an older term was accepted after a newer term's.
    pub older_after_newer: bool,
}

/// Ghost bookkeeping across crashes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ghost {
    /// The number the next grant gets.
    pub next_term: u8,
    /// Every fence granted so far, as a bit set.
    pub fences: u32,
    /// A grant repeated a fence.
    pub fence_repeated: bool,
    /// A restart restored a term that was live right after it.
    pub restored_live: bool,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct State {
    /// The server's clock: the model's time axis.
    pub now: Time,
    pub server: Server,
    pub clients: Vec<Client>,
    pub store: Store,
    pub network: BTreeSet<Msg>,
    pub ghost: Ghost,
}

impl State {
    /// Client `c`'s clock.
    pub fn local(&self, c: usize) -> Time {
        self.now + self.clients[c].skew
    }

    /// The fence client `c` believes it may act under, if any: its guard has
    /// not ended and its local deadline has not passed.
    pub fn belief(&self, c: usize) -> Option<u8> {
        match self.clients[c].phase {
            Phase::Holding {
                fence, deadline, ..
            } if self.local(c) < deadline => Some(fence),
            _ => None,
        }
    }

    /// The term live on the server now, if it is up and one is.
    pub fn live_term(&self) -> Option<&Term> {
        if !self.server.up {
            return None;
        }
        self.server.term.as_ref().filter(|t| t.is_live_at(self.now))
    }
}

impl Msg {
    /// The same message with its client renumbered by `perm`.
    fn renumbered(self, perm: &[usize]) -> Msg {
        let p = |c: u8| idx(perm[usize::from(c)]);
        match self {
            Msg::Acquire { client, req } => Msg::Acquire {
                client: p(client),
                req,
            },
            Msg::Renew {
                client,
                fence,
                sent,
            } => Msg::Renew {
                client: p(client),
                fence,
                sent,
            },
            Msg::Check { client, fence } => Msg::Check {
                client: p(client),
                fence,
            },
            Msg::Release { client, fence } => Msg::Release {
                client: p(client),
                fence,
            },
            Msg::Write {
                client,
                fence,
                term,
            } => Msg::Write {
                client: p(client),
                fence,
                term,
            },
            Msg::Granted {
                client,
                req,
                fence,
                term,
            } => Msg::Granted {
                client: p(client),
                req,
                fence,
                term,
            },
            Msg::Renewed {
                client,
                fence,
                sent,
            } => Msg::Renewed {
                client: p(client),
                fence,
                sent,
            },
            Msg::Stale { client, fence } => Msg::Stale {
                client: p(client),
                fence,
            },
        }
    }
}

impl State {
    /// The same state with client `i` renamed `perm[i]`.
    fn renumbered(&self, perm: &[usize]) -> State {
        let mut s = self.clone();
        for (i, client) in self.clients.iter().enumerate() {
            s.clients[perm[i]] = client.clone();
        }
        let owner = |t: &mut Term| t.owner = idx(perm[usize::from(t.owner)]);
        s.server.term.as_mut().map(owner);
        s.server.durable.as_mut().map(owner);
        s.network = self.network.iter().map(|m| m.renumbered(perm)).collect();
        s
    }
}

/// Every ordering of `0..n`.
fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for shorter in permutations(n - 1) {
        for at in 0..n {
            let mut perm = shorter.clone();
            perm.insert(at, n - 1);
            all.push(perm);
        }
    }
    all
}

/// Clients are interchangeable (same rules, same budgets), so states that
/// differ only in the clients' numbering are checked once
/// ([`stateright::CheckerBuilder::symmetry`], depth-first runs only).
impl Representative for State {
    fn representative(&self) -> State {
        permutations(self.clients.len())
            .iter()
            .map(|perm| self.renumbered(perm))
            .min()
            .expect("at least one ordering")
    }
}

/// A step of the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Every clock advances one tick.
    Tick,
    /// Every clock but client `c`'s advances (it runs slow).
    Stall(usize),
    /// Client `c`'s clock alone advances (it runs fast).
    Rush(usize),
    /// Client `c` sends an Acquire with a new request id.
    Acquire(usize),
    /// Client `c` gives up waiting for its grant.
    GiveUp(usize),
    /// Client `c` sends a renewal of its term.
    Renew(usize),
    /// Client `c` asks the server whether its fence is live.
    Check(usize),
    /// Client `c`, believing it holds the key, sends a write to the store.
    Write(usize),
    /// Client `c` ends its guard and sends a release.
    Release(usize),
    /// A message arrives (and stays in the network, to arrive again).
    Deliver(Msg),
    /// The server's writer commits its lazy changes.
    Flush,
    /// The server crashes, losing what is not durable.
    Crash,
    /// The server starts again on its durable record.
    Restart,
}

fn idx(c: usize) -> u8 {
    u8::try_from(c).expect("few clients")
}

impl LeaseModel {
    /// The local deadline for a call sent at `sent` and answered at `now`
    /// (both on the client's clock).
    fn deadline(&self, sent: Time, received: Time) -> Time {
        let basis = if self.rules.deadline_from_send {
            sent
        } else {
            received
        };
        basis + self.ttl - self.margin
    }

    /// The durable form of the server's term: expired terms are written as
    /// ended (the expiry timer ends them, the next batch writes them).
    fn flushed(term: Option<Term>, now: Time) -> Option<Term> {
        term.map(|t| Term {
            ended: t.ended || now >= t.expires_at,
            ..t
        })
    }

    fn server_receives(&self, s: &mut State, msg: Msg) {
        let now = s.now;
        let live = s.live_term().copied();
        match msg {
            Msg::Acquire { client, req } => match live {
                Some(t) if t.owner == client && t.req == req => {
                    // A retry of the live grant: replay it.
                    s.network.insert(Msg::Granted {
                        client,
                        req,
                        fence: t.fence,
                        term: t.term,
                    });
                }
                // Held by another request: refused (no reply matters).
                Some(_) => {}
                None => {
                    let fence = s.server.next_fence;
                    s.server.next_fence += 1;
                    let term = s.ghost.next_term;
                    s.ghost.next_term += 1;
                    let bit = 1u32 << fence;
                    if s.ghost.fences & bit != 0 {
                        s.ghost.fence_repeated = true;
                    }
                    s.ghost.fences |= bit;
                    let granted = Term {
                        fence,
                        term,
                        owner: client,
                        req,
                        expires_at: now + self.ttl,
                        ended: false,
                    };
                    s.server.term = Some(granted);
                    // Committed before the reply, with the high-water mark.
                    s.server.durable = Some(granted);
                    s.server.high_water = fence;
                    s.network.insert(Msg::Granted {
                        client,
                        req,
                        fence,
                        term,
                    });
                }
            },
            Msg::Renew {
                client,
                fence,
                sent,
            } => match (live, s.server.term.as_mut()) {
                (Some(t), Some(term)) if t.fence == fence => {
                    term.expires_at = term.expires_at.max(now + self.ttl);
                    // Lazy: the durable record keeps the old expiry until a flush.
                    s.network.insert(Msg::Renewed {
                        client,
                        fence,
                        sent,
                    });
                }
                _ => {
                    s.network.insert(Msg::Stale { client, fence });
                }
            },
            Msg::Check { client, fence } => {
                if live.is_none_or(|t| t.fence != fence) {
                    s.network.insert(Msg::Stale { client, fence });
                }
            }
            Msg::Release { fence, .. } => {
                if let (Some(t), Some(term)) = (live, s.server.term.as_mut()) {
                    if t.fence == fence {
                        term.ended = true;
                        s.server.durable = Some(*term);
                    }
                }
            }
            _ => unreachable!("not a message to the server"),
        }
    }

    fn client_receives(&self, s: &mut State, msg: Msg) {
        let (c, local) = match msg {
            Msg::Granted { client, .. }
            | Msg::Renewed { client, .. }
            | Msg::Stale { client, .. } => (usize::from(client), s.local(usize::from(client))),
            _ => unreachable!("not a message to a client"),
        };
        let client = &mut s.clients[c];
        match (msg, client.phase) {
            (
                Msg::Granted {
                    req, fence, term, ..
                },
                Phase::Acquiring { req: waiting, sent },
            ) if req == waiting => {
                client.phase = Phase::Holding {
                    fence,
                    term,
                    deadline: self.deadline(sent, local),
                    renewals_left: self.renewals,
                };
            }
            (
                Msg::Renewed { fence, sent, .. },
                Phase::Holding {
                    fence: held,
                    term,
                    deadline,
                    renewals_left,
                },
            ) if fence == held => {
                client.phase = Phase::Holding {
                    fence,
                    term,
                    deadline: deadline.max(self.deadline(sent, local)),
                    renewals_left,
                };
            }
            (Msg::Stale { fence, .. }, Phase::Holding { fence: held, .. }) if fence == held => {
                client.phase = Phase::Idle;
            }
            // A reply to a call the client no longer waits for.
            _ => {}
        }
    }

    fn store_receives(&self, s: &mut State, msg: Msg) {
        let Msg::Write { fence, term, .. } = msg else {
            unreachable!("not a message to the store")
        };
        let store = &mut s.store;
        if self.rules.store_checks_fence && fence < store.max_fence {
            store.refused = true;
            return;
        }
        if fence < store.max_fence {
            store.fence_regressed = true;
        }
        if term < store.max_term {
            store.older_after_newer = true;
        }
        if term > store.max_term {
            if store.max_term != 0 {
                store.handovers = (store.handovers + 1).min(2);
            }
            store.max_term = term;
        }
        store.max_fence = store.max_fence.max(fence);
    }
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            server: Server {
                up: true,
                next_fence: 1,
                term: None,
                durable: None,
                high_water: 0,
                crashes_left: self.crashes,
            },
            clients: (0..self.clients)
                .map(|_| Client {
                    skew: 0,
                    acquires_left: self.acquires,
                    next_req: 1,
                    phase: Phase::Idle,
                })
                .collect(),
            store: Store {
                max_fence: 0,
                max_term: 0,
                handovers: 0,
                refused: false,
                fence_regressed: false,
                older_after_newer: false,
            },
            network: BTreeSet::new(),
            ghost: Ghost {
                next_term: 1,
                fences: 0,
                fence_repeated: false,
                restored_live: false,
            },
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.now < self.max_time {
            actions.push(Action::Tick);
        }
        for (c, client) in s.clients.iter().enumerate() {
            if s.now < self.max_time && client.skew > -self.max_drift {
                actions.push(Action::Stall(c));
            }
            if client.skew < self.max_drift {
                actions.push(Action::Rush(c));
            }
            match client.phase {
                Phase::Idle if client.acquires_left > 0 => actions.push(Action::Acquire(c)),
                Phase::Idle => {}
                // Giving up for good is the same as waiting for a reply
                // that never comes, so a client gives up only to try again.
                Phase::Acquiring { .. } if client.acquires_left > 0 => {
                    actions.push(Action::GiveUp(c))
                }
                Phase::Acquiring { .. } => {}
                Phase::Holding { renewals_left, .. } => {
                    if renewals_left > 0 {
                        actions.push(Action::Renew(c));
                    }
                    if s.belief(c).is_some() {
                        if self.checks {
                            actions.push(Action::Check(c));
                        }
                        actions.push(Action::Write(c));
                    }
                    actions.push(Action::Release(c));
                }
            }
        }
        for msg in &s.network {
            let to_server = matches!(
                msg,
                Msg::Acquire { .. } | Msg::Renew { .. } | Msg::Check { .. } | Msg::Release { .. }
            );
            if !to_server || s.server.up {
                actions.push(Action::Deliver(*msg));
            }
        }
        if s.server.up {
            if Self::flushed(s.server.term, s.now) != s.server.durable {
                actions.push(Action::Flush);
            }
            if s.server.crashes_left > 0 {
                actions.push(Action::Crash);
            }
        } else {
            actions.push(Action::Restart);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => s.now += 1,
            Action::Stall(c) => {
                s.now += 1;
                s.clients[c].skew -= 1;
            }
            Action::Rush(c) => s.clients[c].skew += 1,
            Action::Acquire(c) => {
                let sent = s.local(c);
                let client = &mut s.clients[c];
                let req = client.next_req;
                client.next_req += 1;
                client.acquires_left -= 1;
                client.phase = Phase::Acquiring { req, sent };
                s.network.insert(Msg::Acquire {
                    client: idx(c),
                    req,
                });
            }
            Action::GiveUp(c) => s.clients[c].phase = Phase::Idle,
            Action::Renew(c) => {
                let sent = s.local(c);
                if let Phase::Holding {
                    fence,
                    renewals_left,
                    ..
                } = &mut s.clients[c].phase
                {
                    *renewals_left -= 1;
                    s.network.insert(Msg::Renew {
                        client: idx(c),
                        fence: *fence,
                        sent,
                    });
                }
            }
            Action::Check(c) => {
                if let Phase::Holding { fence, .. } = s.clients[c].phase {
                    s.network.insert(Msg::Check {
                        client: idx(c),
                        fence,
                    });
                }
            }
            Action::Write(c) => {
                if let Phase::Holding { fence, term, .. } = s.clients[c].phase {
                    s.network.insert(Msg::Write {
                        client: idx(c),
                        fence,
                        term,
                    });
                }
            }
            Action::Release(c) => {
                if let Phase::Holding { fence, .. } = s.clients[c].phase {
                    s.clients[c].phase = Phase::Idle;
                    s.network.insert(Msg::Release {
                        client: idx(c),
                        fence,
                    });
                }
            }
            Action::Deliver(msg) => match msg {
                // Consumed on delivery: a second copy would change nothing
                // (see "Messages" above).
                Msg::Check { .. } | Msg::Release { .. } => {
                    s.network.remove(&msg);
                    self.server_receives(&mut s, msg)
                }
                Msg::Granted { .. } | Msg::Renewed { .. } | Msg::Stale { .. } => {
                    s.network.remove(&msg);
                    self.client_receives(&mut s, msg)
                }
                Msg::Write { .. } => {
                    s.network.remove(&msg);
                    self.store_receives(&mut s, msg)
                }
                // Left in the network: it may arrive again, later.
                Msg::Acquire { .. } | Msg::Renew { .. } => self.server_receives(&mut s, msg),
            },
            Action::Flush => s.server.durable = Self::flushed(s.server.term, s.now),
            Action::Crash => {
                s.server.up = false;
                s.server.term = None;
                s.server.next_fence = 0;
                s.server.crashes_left -= 1;
            }
            Action::Restart => {
                let mut term = s.server.durable;
                if let Some(t) = term.as_mut() {
                    if !t.ended && self.rules.full_ttl_on_restart {
                        t.expires_at = t.expires_at.max(s.now + self.ttl);
                    }
                }
                s.server.next_fence = if self.rules.durable_fence_counter {
                    let stored = term.map_or(0, |t| t.fence);
                    s.server.high_water.max(stored) + 1
                } else {
                    1
                };
                if term.is_some_and(|t| t.is_live_at(s.now)) {
                    s.ghost.restored_live = true;
                }
                s.server.term = term;
                s.server.up = true;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ONE_BELIEVER, |_, s: &State| {
                (0..s.clients.len())
                    .filter(|&c| s.belief(c).is_some())
                    .count()
                    <= 1
            }),
            Property::always(BELIEF_IN_LIVE_TERM, |_, s: &State| {
                let live = s.live_term().map(|t| t.fence);
                (0..s.clients.len()).all(|c| match (s.belief(c), live) {
                    (Some(believed), Some(live)) => believed == live,
                    _ => true,
                })
            }),
            Property::always(STORE_FENCE_MONOTONE, |_, s: &State| {
                !s.store.fence_regressed
            }),
            Property::always(NO_OLD_WRITE_AFTER_NEWER, |_, s: &State| {
                !s.store.older_after_newer
            }),
            Property::always(FENCES_UNIQUE, |_, s: &State| !s.ghost.fence_repeated),
            // Reachability: the checks above are not vacuous.
            Property::sometimes(EX_HANDOVER_WRITE, |_, s: &State| s.store.handovers >= 1),
            Property::sometimes(EX_STALE_WRITE_REFUSED, |m: &LeaseModel, s: &State| {
                s.store.refused || !m.rules.store_checks_fence
            }),
            Property::sometimes(EX_TERM_SURVIVES_RESTART, |m: &LeaseModel, s: &State| {
                s.ghost.restored_live || m.crashes == 0
            }),
        ]
    }
}

/// At most one client believes it holds the key at any instant.
pub const ONE_BELIEVER: &str = "at most one client believes it holds the key";
/// A client's belief never overlaps another term live on the server.
pub const BELIEF_IN_LIVE_TERM: &str = "no belief overlaps another live term on the server";
/// The store never accepts a fence below one it accepted.
pub const STORE_FENCE_MONOTONE: &str = "the store never accepts a lower fence";
/// The store never accepts an older term's write after a newer term's.
pub const NO_OLD_WRITE_AFTER_NEWER: &str = "no write of an older term after a newer term's";
/// No fence is granted twice, crashes included.
pub const FENCES_UNIQUE: &str = "fences never repeat";
/// Example: a second term wrote after a first one.
pub const EX_HANDOVER_WRITE: &str = "example: a newer holder's write follows an older one's";
/// Example: the store refused a stale write.
pub const EX_STALE_WRITE_REFUSED: &str = "example: the store refuses a stale write";
/// Example: a term outlived a crash and was live after the restart.
pub const EX_TERM_SURVIVES_RESTART: &str = "example: a term is live after a restart";

/// The safety properties (the `always` ones).
pub const SAFETY: [&str; 5] = [
    ONE_BELIEVER,
    BELIEF_IN_LIVE_TERM,
    STORE_FENCE_MONOTONE,
    NO_OLD_WRITE_AFTER_NEWER,
    FENCES_UNIQUE,
];
