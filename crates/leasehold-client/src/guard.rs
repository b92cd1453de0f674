//! The session guard: one held term, kept alive in the background.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::endpoints::{Endpoints, Resend};
use super::error::{ClientError, LossReason, ends_the_term};
use super::{Timing, jittered, millis};
use leasehold_core::Error;
use leasehold_core::lease::{Fence, Key, Lease, Owner};
use leasehold_wire::convert;
use leasehold_wire::pb;

use leasehold_wire::pb::session_request::Op;

/// How many times a release is sent when the server is unreachable.
const RELEASE_ATTEMPTS: u32 = 3;

pub use leasehold_core::lease::Ended;

/// What the holder knows about its term right now; published to `lost()` waiters.
#[derive(Debug, Clone)]
struct Standing {
    /// The local deadline: when the last successful renewal (or the acquire)
    /// was sent, plus the TTL, less the safety margin.
    deadline: Instant,
    /// The term's expiry as the server last reported it, on the server's clock.
    expires_at_ms: u64,
    /// Set once the guard is lost for good (refused or released).
    ended: Option<LossReason>,
}

/// The part of a guard its keep-alive task shares.
pub(crate) struct Shared {
    /// The key held.
    pub(crate) key: Key,
    /// The owner name the term was granted to.
    owner: Owner,
    /// The term's fencing token.
    pub(crate) fence: Fence,
    /// The secret capability to renew and release the term; never shown.
    pub(crate) lease_id: String,
    /// Renewal and deadline settings.
    pub(crate) timing: Timing,
    /// The client's servers, each with its shared Session stream (renewals,
    /// checks and the release), failing over from one to the next.
    pub(crate) endpoints: Arc<Endpoints>,
    /// The current standing; a watch so `lost()` futures can wait on it.
    standing: watch::Sender<Standing>,
}

impl Shared {
    pub(crate) fn lost_error(&self, reason: LossReason) -> ClientError {
        ClientError::Lost {
            key: self.key.clone(),
            fence: self.fence,
            reason,
        }
    }

    /// Why the guard is not valid now, if it is not.
    fn loss(&self) -> Option<LossReason> {
        let standing = self.standing.borrow();
        if let Some(reason) = &standing.ended {
            return Some(reason.clone());
        }
        (Instant::now() >= standing.deadline).then_some(LossReason::DeadlinePassed)
    }

    /// The final loss, if the guard is lost for good.
    fn final_loss(&self) -> Option<LossReason> {
        self.standing.borrow().ended.clone()
    }

    /// Marks the guard lost for good, unless it already is.
    fn end(&self, reason: LossReason) {
        self.standing.send_if_modified(|standing| {
            if standing.ended.is_some() {
                return false;
            }
            standing.ended = Some(reason);
            true
        });
    }

    /// Records a successful renewal that was sent at `sent`.
    fn renewed(&self, sent: Instant, lease: &Lease) {
        let deadline = sent + self.timing.valid_for();
        self.standing.send_modify(|standing| {
            standing.deadline = standing.deadline.max(deadline);
            standing.expires_at_ms = lease.expires_at;
        });
    }

    /// Turns an answer about the term into a final loss where it is one.
    pub(crate) fn judge(&self, err: ClientError) -> ClientError {
        match err {
            ClientError::Server(err) if ends_the_term(&err) => {
                let reason = LossReason::Refused(err);
                self.end(reason.clone());
                self.lost_error(reason)
            }
            other => other,
        }
    }

    /// [`Shared::judge`] for a tool-call ledger answer: only a stale fence
    /// or a wrong lease id ends the term. An invalid argument or an unknown
    /// call id is about the call (an over-long payload, an id begun in
    /// several turns settled without its turn), not about the term.
    pub(crate) fn judge_ledger(&self, err: ClientError) -> ClientError {
        match err {
            ClientError::Server(
                Error::InvalidArgument(_) | Error::NotFound(_) | Error::ToolCallNotFound { .. },
            ) => err,
            other => self.judge(other),
        }
    }

    async fn renew_once(&self) -> Result<Lease, ClientError> {
        let op = Op::Renew(pb::RenewRequest {
            key: self.key.as_str().to_owned(),
            fence: self.fence.0,
            lease_id: self.lease_id.clone(),
            ttl_ms: millis(self.timing.ttl),
        });
        // Safe to resend on another server: a renewal applied twice extends
        // the same term, and the caller measures the deadline from before
        // the first attempt.
        let timeout = self.timing.rpc_timeout;
        let reply = self
            .endpoints
            .run(Resend::Safe, |node| {
                node.session.call("Renew", op.clone(), timeout)
            })
            .await?;
        let lease = reply.lease.ok_or_else(|| missing("Renew"))?;
        Ok(convert::lease_from_pb(lease)?)
    }

    async fn check_once(&self) -> Result<(), ClientError> {
        let op = Op::Check(pb::CheckRequest {
            key: self.key.as_str().to_owned(),
            fence: self.fence.0,
        });
        let timeout = self.timing.rpc_timeout;
        self.endpoints
            .run(Resend::Safe, |node| {
                node.session.call("Check", op.clone(), timeout)
            })
            .await?;
        Ok(())
    }

    async fn release_once(
        &self,
        suspend: bool,
        handoff: Option<&(String, Duration)>,
    ) -> Result<Ended, ClientError> {
        let (successor, handoff_ms) = match handoff {
            Some((successor, within)) => (successor.clone(), millis(*within)),
            None => (String::new(), 0),
        };
        let op = Op::Release(pb::ReleaseRequest {
            key: self.key.as_str().to_owned(),
            fence: self.fence.0,
            lease_id: self.lease_id.clone(),
            suspend,
            successor,
            handoff_ms,
        });
        // Safe to resend: a retried release of the fence returns the term
        // as it first ended.
        let timeout = self.timing.rpc_timeout;
        let reply = self
            .endpoints
            .run(Resend::Safe, |node| {
                node.session.call("Release", op.clone(), timeout)
            })
            .await?;
        let ended = reply.ended.ok_or_else(|| missing("Release"))?;
        Ok(convert::ended_from_pb(ended)?)
    }
}

pub(crate) fn missing(call: &str) -> ClientError {
    ClientError::Server(Error::Storage(format!(
        "the server's {call} reply carried no lease"
    )))
}

/// A held term of a key: renews itself in the background and knows when it
/// can no longer be sure it holds the key. See the [module docs](super) for
/// its life.
#[must_use = "dropping a guard suspends its term; call release() when the work is done"]
pub struct SessionGuard {
    /// What the keep-alive task shares.
    pub(crate) shared: Arc<Shared>,
    /// How the key's previous term ended, as the grant reported it.
    previous: Option<Ended>,
    /// Whether the grant repeated an earlier one for the same request id.
    replayed: bool,
    /// How many tool calls of the key were still running (unsettled) when
    /// the term was granted, as the grant reported it.
    unsettled_at_grant: u32,
    /// Tells the keep-alive task the guard was dropped, so it suspends the term.
    dropped: Option<oneshot::Sender<()>>,
    /// The keep-alive task; an explicit release aborts it.
    keep_alive: Option<JoinHandle<()>>,
}

impl fmt::Debug for SessionGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The lease id is a secret capability: leave it out.
        f.debug_struct("SessionGuard")
            .field("key", &self.shared.key)
            .field("fence", &self.shared.fence)
            .field("owner", &self.shared.owner)
            .field("loss", &self.loss())
            .finish_non_exhaustive()
    }
}

impl SessionGuard {
    /// Builds the guard for an Acquire reply and starts its renewal.
    ///
    /// `basis` is a time no later than the grant, if one is known.
    pub(crate) async fn start(
        endpoints: Arc<Endpoints>,
        timing: Timing,
        reply: pb::AcquireResponse,
        basis: Option<Instant>,
    ) -> Result<SessionGuard, ClientError> {
        let lease = reply.lease.ok_or_else(|| missing("Acquire"))?;
        let previous = reply.previous.map(convert::ended_from_pb).transpose()?;
        let lease = convert::lease_from_pb(lease)?;
        let lease_id = lease
            .lease_id
            .ok_or_else(|| missing("Acquire"))?
            .to_string();
        let now = Instant::now();
        let shared = Arc::new(Shared {
            key: lease.key,
            owner: lease.owner,
            fence: lease.fence,
            lease_id,
            timing,
            endpoints,
            standing: watch::Sender::new(Standing {
                // Without a basis the guard trusts nothing until it renews.
                deadline: basis.map_or(now, |sent| sent + timing.valid_for()),
                expires_at_ms: lease.expires_at,
                ended: None,
            }),
        });
        let mut next_renewal = basis.map_or(now, |sent| sent + timing.renew_every);
        if next_renewal <= now {
            // The grant is of unknown age (replayed) or a long wait ate into
            // it: renew now so the deadline rests on a send time we know.
            let sent = Instant::now();
            match shared.renew_once().await {
                Ok(lease) => {
                    shared.renewed(sent, &lease);
                    next_renewal = sent + timing.renew_every;
                }
                Err(err) => {
                    if let err @ ClientError::Lost { .. } = shared.judge(err) {
                        return Err(err);
                    }
                    // Transient: the keep-alive task retries at once.
                }
            }
        }
        let (dropped, on_drop) = oneshot::channel();
        let keep_alive = tokio::spawn(keep_alive(shared.clone(), on_drop, next_renewal));
        Ok(SessionGuard {
            shared,
            previous,
            replayed: reply.replayed,
            unsettled_at_grant: reply.unsettled_tool_calls,
            dropped: Some(dropped),
            keep_alive: Some(keep_alive),
        })
    }

    /// The key held.
    pub fn key(&self) -> &Key {
        &self.shared.key
    }

    /// The term's fencing token: present it with every write to the resource.
    pub fn fence(&self) -> Fence {
        self.shared.fence
    }

    /// The owner name the term was granted to.
    pub fn owner(&self) -> &Owner {
        &self.shared.owner
    }

    /// The term's TTL.
    pub fn ttl(&self) -> Duration {
        self.shared.timing.ttl
    }

    /// How the key's previous term ended, if it had one. A previous term that
    /// expired or was suspended left unfinished work to recover.
    pub fn previous(&self) -> Option<&Ended> {
        self.previous.as_ref()
    }

    /// Whether the grant repeated an earlier one for the same request id.
    pub fn replayed(&self) -> bool {
        self.replayed
    }

    /// How many of the key's tool calls were left running (neither succeeded
    /// nor failed) when this term was granted, as the grant reported it: a
    /// quick way to know, without another call, whether
    /// [`SessionGuard::unsettled_tool_calls`] has anything to recover.
    pub fn unsettled_at_grant(&self) -> u32 {
        self.unsettled_at_grant
    }

    /// The local deadline, on the local monotonic clock: the guard is valid
    /// until then unless the server refuses the term sooner. It moves forward
    /// with every successful renewal.
    pub fn deadline(&self) -> Instant {
        self.shared.standing.borrow().deadline
    }

    /// The term's expiry as the server last reported it, in milliseconds
    /// since the Unix epoch on the *server's* clock; for display, not for
    /// decisions (use [`SessionGuard::is_valid`]).
    pub fn server_expires_at_ms(&self) -> u64 {
        self.shared.standing.borrow().expires_at_ms
    }

    /// Whether the guard may act, by a local check with no round trip: the
    /// local deadline has not passed, no renewal was refused, and the guard
    /// was not released.
    pub fn is_valid(&self) -> bool {
        self.shared.loss().is_none()
    }

    /// Why the guard is not valid now, or `None` while it is.
    pub fn loss(&self) -> Option<LossReason> {
        self.shared.loss()
    }

    /// A future that resolves when the guard stops being valid, with the
    /// reason; at once if it already is not. Select on it to cancel running
    /// work. It owns what it needs, so it may be moved into a spawned task.
    ///
    /// [`LossReason::DeadlinePassed`] is not final: the guard may become
    /// valid again, and a new `lost()` then waits for the next loss.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        let mut standing = self.shared.standing.subscribe();
        async move {
            loop {
                let (deadline, ended) = {
                    let now = standing.borrow_and_update();
                    (now.deadline, now.ended.clone())
                };
                if let Some(reason) = ended {
                    return reason;
                }
                if Instant::now() >= deadline {
                    return LossReason::DeadlinePassed;
                }
                tokio::select! {
                    // The deadline may have moved meanwhile; the loop re-reads it.
                    () = tokio::time::sleep_until(deadline) => {}
                    changed = standing.changed() => {
                        if changed.is_err() {
                            // Guard and keep-alive task are both gone.
                            return LossReason::Released;
                        }
                    }
                }
            }
        }
    }

    /// Proves with a round trip (`Check`) that the fence is still the key's
    /// live term. It does not extend the term or revive a guard whose local
    /// deadline passed; see [`SessionGuard::gate`] for the check to make
    /// before acting.
    ///
    /// # Errors
    /// [`ClientError::Lost`] when the guard is lost for good or the server
    /// says the fence is stale (which makes it lost for good);
    /// [`Error::Unavailable`] when the server cannot be reached in time.
    pub async fn verify(&self) -> Result<(), ClientError> {
        if let Some(reason) = self.shared.final_loss() {
            return Err(self.shared.lost_error(reason));
        }
        self.shared
            .check_once()
            .await
            .map_err(|err| self.shared.judge(err))
    }

    /// The continuation gate: call it before each model request and each
    /// terminal write. A local check, then [`SessionGuard::verify`], then the
    /// local check again (a refusal or the deadline may have come meanwhile).
    /// Returns the fence to store with the write.
    ///
    /// # Errors
    /// [`ClientError::Lost`] when the guard is not valid (no round trip is
    /// made then) or the server refused the fence; [`Error::Unavailable`]
    /// when the server cannot be reached in time.
    pub async fn gate(&self) -> Result<Fence, ClientError> {
        self.ensure_valid()?;
        self.verify().await?;
        self.ensure_valid()?;
        Ok(self.shared.fence)
    }

    /// The gate for a model request: checks that `transcript` (the history
    /// about to be sent) has every tool call paired the way the provider
    /// requires, locally and before any round trip, then passes
    /// [`SessionGuard::gate`]. A transcript without tool activity passes.
    ///
    /// # Errors
    /// [`ClientError::UnhealthyTranscript`] with the findings when the
    /// provider would reject it; [`ClientError::UncheckableTranscript`] when
    /// it cannot be checked; otherwise what [`SessionGuard::gate`] returns.
    pub async fn gate_transcript(
        &self,
        transcript: &leasehold_transcript::Transcript,
        format: Option<leasehold_transcript::Format>,
    ) -> Result<Fence, ClientError> {
        match leasehold_transcript::check(transcript, format) {
            Err(err) => return Err(ClientError::UncheckableTranscript(err.to_string())),
            Ok(Some(report)) if !report.is_healthy() => {
                return Err(ClientError::UnhealthyTranscript(Box::new(report)));
            }
            Ok(_) => {}
        }
        self.gate().await
    }

    /// Runs `work` only while the lease is held: passes the gate, runs the
    /// work with the fence while watching [`SessionGuard::lost`] (the work is
    /// dropped, so cancelled, if the guard stops being valid), then passes
    /// the gate again before returning the work's output.
    ///
    /// # Errors
    /// What [`SessionGuard::gate`] returns, before or after the work;
    /// [`ClientError::Lost`] when the guard stopped being valid during it.
    /// On an error after the work finished, its output is discarded: do not
    /// commit what it produced.
    pub async fn run<F, Fut, T>(&self, work: F) -> Result<T, ClientError>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = T>,
    {
        let fence = self.gate().await?;
        let output = tokio::select! {
            output = work(fence) => output,
            reason = self.lost() => return Err(self.shared.lost_error(reason)),
        };
        self.gate().await?;
        Ok(output)
    }

    /// Ends the term as finished, presenting its fence and lease id.
    ///
    /// # Errors
    /// [`ClientError::Lost`] when the term was already lost (the server
    /// refused it, or refuses the release as stale); [`Error::Unavailable`]
    /// when the server could not be reached after a few attempts (the term
    /// then expires at its TTL).
    pub async fn release(self) -> Result<Ended, ClientError> {
        self.finish(false, None).await
    }

    /// Ends the term as unfinished, so the key is listed as recoverable.
    ///
    /// # Errors
    /// As for [`SessionGuard::release`].
    pub async fn suspend(self) -> Result<Ended, ClientError> {
        self.finish(true, None).await
    }

    /// Ends the term (as unfinished with `suspend`) and keeps the key for
    /// `successor` for `within` (0: 30 s; at most 10 min): only an Acquire
    /// by that owner gets it, ahead of every waiter. The successor's grant
    /// says `previous.handed_off`. Others get it once `within` runs out.
    ///
    /// # Errors
    /// As for [`SessionGuard::release`]; [`Error::InvalidArgument`] for a
    /// malformed successor or a time over the limit.
    pub async fn hand_off(
        self,
        successor: impl Into<String>,
        within: Duration,
        suspend: bool,
    ) -> Result<Ended, ClientError> {
        let successor = successor.into();
        leasehold_core::lease::Handoff::parse_optional(successor.clone(), millis(within))?;
        self.finish(suspend, Some((successor, within))).await
    }

    pub(crate) fn ensure_valid(&self) -> Result<(), ClientError> {
        match self.shared.loss() {
            Some(reason) => Err(self.shared.lost_error(reason)),
            None => Ok(()),
        }
    }

    async fn finish(
        mut self,
        suspend: bool,
        handoff: Option<(String, Duration)>,
    ) -> Result<Ended, ClientError> {
        // Stop renewing first, so no renewal races the release.
        if let Some(task) = self.keep_alive.take() {
            task.abort();
        }
        self.dropped = None;
        let already = self.shared.final_loss();
        self.shared.end(LossReason::Released);
        if let Some(reason) = already {
            return Err(self.shared.lost_error(reason));
        }
        let mut attempt = 1;
        loop {
            match self.shared.release_once(suspend, handoff.as_ref()).await {
                Ok(ended) => return Ok(ended),
                Err(err) if err.is_transient() && attempt < RELEASE_ATTEMPTS => {
                    attempt += 1;
                    let pause = self.shared.timing.retry_pause(attempt);
                    tokio::time::sleep(jittered(pause)).await;
                }
                Err(ClientError::Server(err)) if ends_the_term(&err) => {
                    return Err(self.shared.lost_error(LossReason::Refused(err)));
                }
                Err(err) => return Err(err),
            }
        }
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        // Hand the suspension to the keep-alive task, which also stops
        // renewing; if it already ended (the term was lost), there is
        // nothing to suspend.
        if let Some(dropped) = self.dropped.take() {
            let _ = dropped.send(());
        }
    }
}

/// Renews the term until it is lost for good or the guard goes away.
async fn keep_alive(shared: Arc<Shared>, mut on_drop: oneshot::Receiver<()>, first: Instant) {
    let timing = shared.timing;
    let mut next = first;
    let mut failures = 0u32;
    loop {
        if shared.final_loss().is_some() {
            return;
        }
        tokio::select! {
            biased;
            dropped = &mut on_drop => return suspend_on_drop(&shared, dropped.is_ok()).await,
            () = tokio::time::sleep_until(next) => {}
        }
        let sent = Instant::now();
        let outcome = tokio::select! {
            biased;
            dropped = &mut on_drop => return suspend_on_drop(&shared, dropped.is_ok()).await,
            outcome = shared.renew_once() => outcome,
        };
        match outcome.map_err(|err| shared.judge(err)) {
            Ok(lease) => {
                if failures > 0 {
                    tracing::info!(key = %shared.key, fence = %shared.fence, failures, "renewal succeeded again");
                }
                failures = 0;
                shared.renewed(sent, &lease);
                next = sent + timing.renew_every;
            }
            Err(err @ ClientError::Lost { .. }) => {
                tracing::warn!(key = %shared.key, fence = %shared.fence, error = %err, "lease lost");
                return;
            }
            Err(err) => {
                failures += 1;
                tracing::debug!(key = %shared.key, fence = %shared.fence, failures, error = %err, "renewal failed; retrying");
                next = Instant::now() + jittered(timing.retry_pause(failures));
            }
        }
    }
}

/// One best-effort suspension of a dropped guard's term.
async fn suspend_on_drop(shared: &Shared, was_dropped: bool) {
    let already = shared.final_loss();
    shared.end(LossReason::Released);
    if !was_dropped || already.is_some() {
        return;
    }
    match shared.release_once(true, None).await {
        Ok(_) => {
            tracing::debug!(key = %shared.key, fence = %shared.fence, "dropped guard suspended its term")
        }
        Err(err) => {
            tracing::debug!(key = %shared.key, fence = %shared.fence, error = %err, "dropped guard could not suspend its term; it expires at its TTL")
        }
    }
}
