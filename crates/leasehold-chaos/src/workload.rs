//! The workers: each holds hot keys in turn through the Rust client crate,
//! writes to the fenced store while it believes it holds the key, renews,
//! sometimes pauses past its TTL and writes late, and releases. Every call
//! goes into the history with its times and outcome.
//!
//! Workers drive the protocol with one-shot calls (`Client::rpc()`, the
//! generated client of `leasehold-client`), not the `SessionGuard`, so that
//! every renewal is visible to the checker: a guard renews in the
//! background, and a renewal the checker cannot see cannot bound a term.
//! The worker keeps the guard's rule for its own belief: the local deadline
//! is the last successful send (the Acquire's first send, or a Renew's)
//! plus the TTL less a margin.

use std::future::Future;
use std::time::Duration;

use leasehold_client::{Client, ClientError, Error, StaleReason};
use leasehold_wire::pb;
use tokio::time::Instant;

use crate::history::{Call, Nanos, Op, Outcome, Recorder, Refusal, Reply};
use crate::store::FencedStore;

/// A small deterministic generator (xorshift64*): runs are repeatable in
/// their choices (not in their timing), with no dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[lo, hi)` (`lo` when empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.next_u64() % (hi - lo)
        }
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }

    /// A duration uniform in `[lo, hi)`.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        Duration::from_micros(self.range(lo.as_micros() as u64, hi.as_micros() as u64))
    }
}

/// How the workers behave.
#[derive(Debug, Clone)]
pub struct Workload {
    pub keys: Vec<String>,
    pub ttl: Duration,
    /// Subtracted from the TTL for the worker's local deadline.
    pub margin: Duration,
    /// How long a worker holds a key, at most (uniform from a tenth of it).
    pub hold: Duration,
    /// Chance (percent) that a term includes a pause past the TTL followed
    /// by a late write.
    pub pause_percent: u64,
    /// How long a worker waits for any reply before calling it unknown.
    pub call_timeout: Duration,
}

impl Workload {
    pub fn new(keys: usize, ttl: Duration) -> Workload {
        Workload {
            keys: (0..keys).map(|k| format!("chaos:{k}")).collect(),
            ttl,
            margin: ttl / 5,
            hold: ttl * 2,
            pause_percent: 30,
            call_timeout: Duration::from_millis(1500),
        }
    }
}

/// A term the worker got.
struct Held {
    key: String,
    fence: u64,
    lease_id: String,
    /// The local deadline: last successful send plus TTL less margin.
    deadline: Instant,
    /// When the last Renew (or the Acquire) was sent.
    last_renew: Instant,
}

/// One worker: its own connection, its own choices.
pub struct Worker {
    pub id: u32,
    client: Client,
    recorder: Recorder,
    store: FencedStore,
    rng: Rng,
    load: Workload,
}

/// The domain error of a status, through the client's one status table.
fn refusal(status: &tonic::Status) -> Refusal {
    let err = leasehold_wire::status::from_status(status);
    let (reason, fence) = match &err {
        Error::Busy { fence, .. } => (None, Some(fence.0)),
        Error::StaleFence { reason, .. } => (
            Some(reason.name().to_owned()),
            match reason {
                StaleReason::Superseded { by } => Some(by.0),
                _ => None,
            },
        ),
        _ => (None, None),
    };
    Refusal {
        code: status.code() as i32,
        reason,
        fence,
        message: status.message().to_owned(),
    }
}

/// How a client-crate call ended, for the history: a server refusal as its
/// status (through the one status table); the guard's own verdicts
/// (`Lost`) as unknown, since they may be local decisions.
fn client_outcome(err: &ClientError) -> Outcome {
    match err {
        ClientError::Server(e) => {
            Outcome::Err(refusal(&leasehold_wire::status::to_status(e.clone())))
        }
        other => Outcome::Unknown(other.to_string()),
    }
}

impl Worker {
    pub fn new(
        id: u32,
        client: Client,
        recorder: Recorder,
        store: FencedStore,
        seed: u64,
        load: Workload,
    ) -> Worker {
        Worker {
            id,
            client,
            recorder,
            store,
            rng: Rng::new(seed ^ (u64::from(id) << 32)),
            load,
        }
    }

    /// Sends one call, records it, and returns the reply when it was OK.
    async fn op<T, F>(
        &self,
        key: &str,
        call: Call,
        timeout: Duration,
        sent: F,
        reply: impl FnOnce(&T) -> Option<Reply>,
    ) -> (Nanos, Option<T>, Outcome)
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let invoked = self.recorder.now();
        let result = tokio::time::timeout(timeout, sent).await;
        let completed = self.recorder.now();
        let (outcome, value) = match result {
            Err(_) => (
                Outcome::Unknown(format!("no reply within {} ms", timeout.as_millis())),
                None,
            ),
            Ok(Err(status)) => (Outcome::Err(refusal(&status)), None),
            Ok(Ok(response)) => {
                let value = response.into_inner();
                match reply(&value) {
                    Some(r) => (Outcome::Ok(r), Some(value)),
                    None => (
                        Outcome::Unknown("an OK reply without its lease".into()),
                        None,
                    ),
                }
            }
        };
        self.recorder.op(Op {
            worker: self.id,
            key: key.to_owned(),
            call,
            invoked,
            completed,
            outcome: outcome.clone(),
        });
        (invoked, value, outcome)
    }

    /// Runs terms until `until`, then returns (after at most one more term).
    /// Odd-numbered workers hold their terms through the client's
    /// [`SessionGuard`](leasehold_client::SessionGuard), even-numbered ones
    /// with one-shot calls.
    pub async fn run(mut self, until: Instant) {
        while Instant::now() < until {
            let key =
                self.load.keys[self.rng.range(0, self.load.keys.len() as u64) as usize].clone();
            if self.id % 2 == 1 {
                if !self.guarded_term(&key).await {
                    let pause = self
                        .rng
                        .between(Duration::from_millis(10), Duration::from_millis(100));
                    tokio::time::sleep(pause).await;
                }
                continue;
            }
            match self.acquire(&key).await {
                Some(held) => self.hold(held).await,
                None => {
                    let pause = self
                        .rng
                        .between(Duration::from_millis(10), Duration::from_millis(100));
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// Acquires `key`, sending at most twice with one request id when the
    /// first outcome is unknown (so a lost reply is replayed, not orphaned).
    async fn acquire(&mut self, key: &str) -> Option<Held> {
        let ttl_ms = self.load.ttl.as_millis() as u64;
        let wait_ms = [0, ttl_ms / 2, ttl_ms * 2][self.rng.range(0, 3) as usize];
        let request_id = uuid::Uuid::new_v4().to_string();
        let owner = format!("worker-{}", self.id);
        let first_send = Instant::now();
        for _attempt in 0..2 {
            let message = pb::AcquireRequest {
                key: key.to_owned(),
                owner: owner.clone(),
                ttl_ms,
                wait_ms,
                request_id: request_id.clone(),
                ..Default::default()
            };
            let call = Call::Acquire {
                owner: owner.clone(),
                request_id: request_id.clone(),
                ttl_ms,
                wait_ms,
            };
            let mut rpc = self.client.rpc();
            let timeout = self.load.call_timeout + Duration::from_millis(wait_ms);
            let (_, reply, outcome) = self
                .op(
                    key,
                    call,
                    timeout,
                    async move { rpc.acquire(message).await },
                    |r: &pb::AcquireResponse| {
                        r.lease.as_ref().map(|l| Reply::Granted {
                            fence: l.fence,
                            ttl_ms: l.ttl_ms,
                            replayed: r.replayed,
                        })
                    },
                )
                .await;
            if let Some(lease) = reply.and_then(|r| r.lease) {
                return Some(Held {
                    key: key.to_owned(),
                    fence: lease.fence,
                    lease_id: lease.lease_id,
                    deadline: first_send + self.load.ttl - self.load.margin,
                    last_renew: first_send,
                });
            }
            match outcome {
                Outcome::Err(r) if r.is_definite() => return None,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        None
    }

    /// Holds a term: writes while the local deadline has not passed,
    /// renews every third of the TTL, may pause past the TTL and write
    /// late, then releases.
    async fn hold(&mut self, mut held: Held) {
        let hold = self.rng.between(self.load.hold / 10, self.load.hold);
        let end = Instant::now() + hold;
        let pause_at = self
            .rng
            .chance(self.load.pause_percent)
            .then(|| Instant::now() + self.rng.between(Duration::ZERO, hold));
        let mut paused = false;
        let step = self.load.ttl / 6;
        while Instant::now() < end {
            if let Some(at) = pause_at.filter(|at| !paused && Instant::now() >= *at) {
                let _ = at;
                paused = true;
                // The worker passed its gate, then stalls (GC, SIGSTOP, a
                // slow disk) past its TTL; its write arrives late. The
                // store must refuse it if a newer holder has written.
                let believed = Instant::now() < held.deadline;
                let pause = self.rng.between(self.load.ttl, self.load.ttl * 2);
                tokio::time::sleep(pause).await;
                if believed {
                    self.store
                        .write(&self.recorder, self.id, &held.key, held.fence);
                }
            }
            let now = Instant::now();
            if now >= held.last_renew + self.load.ttl / 3 || now >= held.deadline {
                match self.renew(&mut held).await {
                    Some(true) | None => {}
                    Some(false) => return, // the term is over: nothing to release
                }
            }
            if Instant::now() < held.deadline {
                self.store
                    .write(&self.recorder, self.id, &held.key, held.fence);
            }
            if self.rng.chance(20) {
                self.check(&held).await;
            }
            tokio::time::sleep(step).await;
        }
        let suspend = self.rng.chance(10);
        for _attempt in 0..2 {
            match self.release(&held, suspend).await {
                Outcome::Unknown(_) => {}
                Outcome::Err(r) if !r.is_definite() => {}
                _ => return,
            }
        }
    }

    /// One term through the client's guard: acquire (the guard retries with
    /// one request id), then gate-and-write until the hold ends (sometimes
    /// pausing past the TTL between a passed gate and its write), then
    /// release. Returns whether a term was granted.
    ///
    /// The guard renews in the background over the Session stream, and the
    /// checker does not see those renewals: the term's must-live interval
    /// is bounded by the Acquire alone, which is conservative. Each gate
    /// is recorded as a Check (it ends with a Check round trip: OK means the
    /// server found the fence live while the gate ran); a failed gate as an
    /// unknown outcome, since the guard may have refused locally. The guard
    /// is always released explicitly (never dropped), so no release the
    /// checker cannot see ends a term early.
    async fn guarded_term(&mut self, key: &str) -> bool {
        let ttl_ms = self.load.ttl.as_millis() as u64;
        let wait_ms = [0, ttl_ms / 2, ttl_ms * 2][self.rng.range(0, 3) as usize];
        let request_id = uuid::Uuid::new_v4().to_string();
        let owner = format!("guard-{}", self.id);
        let call = Call::Acquire {
            owner: owner.clone(),
            request_id: request_id.clone(),
            ttl_ms,
            wait_ms,
        };
        let invoked = self.recorder.now();
        let acquired = self
            .client
            .acquire(key)
            .owner(owner)
            .ttl(self.load.ttl)
            .wait(Duration::from_millis(wait_ms))
            .request_id(request_id)
            .safety_margin(self.load.margin)
            .rpc_timeout(self.load.call_timeout.min(self.load.ttl / 3))
            .attempts(2)
            .await;
        let completed = self.recorder.now();
        let (outcome, guard) = match acquired {
            Ok(guard) => (
                Outcome::Ok(Reply::Granted {
                    fence: guard.fence().0,
                    ttl_ms: guard.ttl().as_millis() as u64,
                    replayed: guard.replayed(),
                }),
                Some(guard),
            ),
            Err(err) => (client_outcome(&err), None),
        };
        self.recorder.op(Op {
            worker: self.id,
            key: key.to_owned(),
            call,
            invoked,
            completed,
            outcome,
        });
        let Some(guard) = guard else { return false };
        let fence = guard.fence().0;
        let hold = self.rng.between(self.load.hold / 10, self.load.hold);
        let end = Instant::now() + hold;
        let mut paused = false;
        while Instant::now() < end {
            let invoked = self.recorder.now();
            let gate = guard.gate().await;
            let completed = self.recorder.now();
            let outcome = match &gate {
                Ok(_) => Outcome::Ok(Reply::Live),
                Err(err) => Outcome::Unknown(format!("gate: {err}")),
            };
            self.recorder.op(Op {
                worker: self.id,
                key: key.to_owned(),
                call: Call::Check { fence },
                invoked,
                completed,
                outcome,
            });
            match gate {
                Ok(_) => {
                    if !paused && self.rng.chance(self.load.pause_percent / 3) {
                        paused = true;
                        let pause = self.rng.between(self.load.ttl, self.load.ttl * 2);
                        tokio::time::sleep(pause).await;
                    }
                    self.store.write(&self.recorder, self.id, key, fence);
                }
                Err(err) if !err.is_transient() => break,
                Err(_) => {}
            }
            tokio::time::sleep(self.load.ttl / 6).await;
        }
        let suspend = self.rng.chance(10);
        let invoked = self.recorder.now();
        let released = if suspend {
            guard.suspend().await
        } else {
            guard.release().await
        };
        let completed = self.recorder.now();
        let outcome = match released {
            Ok(_) => Outcome::Ok(Reply::Released),
            Err(err) => client_outcome(&err),
        };
        self.recorder.op(Op {
            worker: self.id,
            key: key.to_owned(),
            call: Call::Release { fence, suspend },
            invoked,
            completed,
            outcome,
        });
        true
    }

    /// Renews; `Some(true)` on success, `Some(false)` when refused for
    /// good, `None` when the outcome is unknown.
    async fn renew(&mut self, held: &mut Held) -> Option<bool> {
        let ttl_ms = self.load.ttl.as_millis() as u64;
        let message = pb::RenewRequest {
            key: held.key.clone(),
            fence: held.fence,
            lease_id: held.lease_id.clone(),
            ttl_ms,
        };
        let sent = Instant::now();
        let mut rpc = self.client.rpc();
        let (_, reply, outcome) = self
            .op(
                &held.key,
                Call::Renew {
                    fence: held.fence,
                    ttl_ms,
                },
                self.load.call_timeout,
                async move { rpc.renew(message).await },
                |r: &pb::RenewResponse| {
                    r.lease
                        .as_ref()
                        .map(|l| Reply::Renewed { ttl_ms: l.ttl_ms })
                },
            )
            .await;
        held.last_renew = sent;
        if let Some(lease) = reply.and_then(|r| r.lease) {
            let basis = sent + Duration::from_millis(lease.ttl_ms) - self.load.margin;
            held.deadline = held.deadline.max(basis);
            return Some(true);
        }
        match outcome {
            Outcome::Err(r) if r.is_definite() => Some(false),
            _ => None,
        }
    }

    async fn check(&self, held: &Held) {
        let message = pb::CheckRequest {
            key: held.key.clone(),
            fence: held.fence,
        };
        let mut rpc = self.client.rpc();
        self.op(
            &held.key,
            Call::Check { fence: held.fence },
            self.load.call_timeout,
            async move { rpc.check(message).await },
            |_: &pb::CheckResponse| Some(Reply::Live),
        )
        .await;
    }

    async fn release(&self, held: &Held, suspend: bool) -> Outcome {
        let message = pb::ReleaseRequest {
            key: held.key.clone(),
            fence: held.fence,
            lease_id: held.lease_id.clone(),
            suspend,
            ..Default::default()
        };
        let mut rpc = self.client.rpc();
        let (_, _, outcome) = self
            .op(
                &held.key,
                Call::Release {
                    fence: held.fence,
                    suspend,
                },
                self.load.call_timeout,
                async move { rpc.release(message).await },
                |_: &pb::ReleaseResponse| Some(Reply::Released),
            )
            .await;
        outcome
    }
}

/// Gets `key` once and records it (the observer, and the final reads).
pub async fn get(
    client: &Client,
    recorder: &Recorder,
    worker: u32,
    key: &str,
    timeout: Duration,
) -> bool {
    let invoked = recorder.now();
    let mut rpc = client.rpc();
    let message = pb::GetRequest {
        key: key.to_owned(),
    };
    let result = tokio::time::timeout(timeout, rpc.get(message)).await;
    let completed = recorder.now();
    let outcome = match result {
        Err(_) => Outcome::Unknown(format!("no reply within {} ms", timeout.as_millis())),
        Ok(Err(status)) => Outcome::Err(refusal(&status)),
        Ok(Ok(reply)) => {
            let reply = reply.into_inner();
            Outcome::Ok(Reply::State {
                live: reply.lease.map(|l| l.fence),
                last_ended: reply.last_ended.map(|e| e.fence),
            })
        }
    };
    let definite = match &outcome {
        Outcome::Ok(_) => true,
        Outcome::Err(r) => r.is_definite(),
        Outcome::Unknown(_) => false,
    };
    recorder.op(Op {
        worker,
        key: key.to_owned(),
        call: Call::Get,
        invoked,
        completed,
        outcome,
    });
    definite
}

/// Connects to `url`, retrying until `until` (the server may be down).
pub async fn connect(url: &str, until: Instant) -> Option<Client> {
    loop {
        if let Ok(client) = Client::connect(url.to_owned()).await {
            return Some(client);
        }
        if Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
