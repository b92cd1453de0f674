//! One-shot calls with no guard behind them: for operators, dashboards and
//! recoverers that read the table or act on a term they were handed (the
//! `leasehold` CLI's operator commands use these). Applications that hold
//! a session use [`Client::acquire`] and its [`SessionGuard`](crate::SessionGuard),
//! which renews, fences and releases for them.
//!
//! Every call takes and returns domain values; a refusal is the server's
//! [`Error`] inside [`ClientError::Server`].

use std::time::Duration;

use leasehold_core::Error;
use leasehold_core::lease::{
    Ended, Fence, Handoff, HistoryEntry, Key, KeyState, Lease, LeaseId, Ttl,
};
use leasehold_core::lessor::{Acquire, ListFilter};
use leasehold_wire::{convert, pb};

use crate::endpoints::Resend;
use crate::error::ClientError;
use crate::guard::missing;
use crate::{Client, call, request};

/// How long a one-shot call waits for its reply (an Acquire adds its wait).
const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// The reply to a one-shot [`Client::grant`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    /// The term, with its lease id: whoever holds it may renew and release.
    pub lease: Lease,
    /// How the key's previous term ended, if it had one.
    pub previous: Option<Ended>,
    /// True when this repeated an earlier grant for the same request id.
    pub replayed: bool,
    /// Tool calls earlier terms began and never settled.
    pub unsettled_tool_calls: u32,
}

/// What [`Client::server_info`] tells of the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// Its release, as `leasehold --version` prints it.
    pub version: String,
    /// The revision of `leasehold.v1` it speaks (see [`leasehold_wire::PROTOCOL`]).
    pub protocol: u32,
    /// Its storage backend: `"sqlite"` or `"postgres"`.
    pub backend: String,
}

/// The oldest revision of `leasehold.v1` whose RPCs this client calls. It
/// lags [`leasehold_wire::PROTOCOL`] when a revision only adds what this
/// client does not use (revision 2 put the tool-call ledger on the Session
/// stream; this client calls the ledger's unary RPCs).
pub const NEEDS_PROTOCOL: u32 = 1;

impl ServerInfo {
    /// Whether this client can speak to that server: it speaks at least
    /// the revision this client needs ([`NEEDS_PROTOCOL`]).
    pub fn is_compatible(&self) -> bool {
        self.protocol >= NEEDS_PROTOCOL
    }
}

/// One page of [`Client::history`], newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryPage {
    pub entries: Vec<HistoryEntry>,
    /// Pass to the next call for older entries; `None` at the end.
    pub next_before: Option<Fence>,
}

/// One page of [`Client::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPage {
    pub keys: Vec<KeyState>,
    /// Pass to the next call for the following page; `None` at the end.
    pub next_page_token: Option<String>,
}

impl Client {
    /// Acquires a term once, with no guard: nothing renews it, and it lapses
    /// at its TTL unless whoever holds its lease id renews or releases it.
    ///
    /// # Errors
    /// [`Error::Busy`] when the key is still held after the wait, and the
    /// other refusals of Acquire.
    pub async fn grant(&self, acquire: &Acquire) -> Result<Granted, ClientError> {
        let timeout = Duration::from_millis(acquire.wait.as_millis()) + OP_TIMEOUT;
        let message = convert::acquire_to_pb(acquire);
        // With a request id the server replays a grant whose reply was
        // lost, so another server may be asked; without one, it might grant
        // a second term.
        let resend = if acquire.request_id.is_some() {
            Resend::Safe
        } else {
            Resend::Unsafe
        };
        let reply = self
            .endpoints
            .run(resend, |node| {
                let mut rpc = node.rpc.clone();
                let message = message.clone();
                async move { call("Acquire", timeout, rpc.acquire(request(message, timeout))).await }
            })
            .await?;
        Ok(Granted {
            lease: convert::lease_from_pb(reply.lease.ok_or_else(|| missing("Acquire"))?)?,
            previous: reply.previous.map(convert::ended_from_pb).transpose()?,
            replayed: reply.replayed,
            unsettled_tool_calls: reply.unsettled_tool_calls,
        })
    }

    /// Renews the live term `fence` of `key` (`ttl = None` keeps its TTL).
    ///
    /// # Errors
    /// [`Error::StaleFence`], [`Error::PermissionDenied`], [`Error::Unavailable`].
    pub async fn renew_term(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        ttl: Option<Ttl>,
    ) -> Result<Lease, ClientError> {
        let message = pb::RenewRequest {
            key: key.as_str().to_owned(),
            fence: fence.0,
            lease_id: lease_id.to_string(),
            ttl_ms: ttl.map_or(0, Ttl::as_millis),
        };
        let reply = unary!(
            self.endpoints,
            Resend::Safe,
            "Renew",
            OP_TIMEOUT,
            renew,
            message
        )?;
        Ok(convert::lease_from_pb(
            reply.lease.ok_or_else(|| missing("Renew"))?,
        )?)
    }

    /// Ends the live term `fence` of `key` (as unfinished with `suspend`).
    ///
    /// # Errors
    /// [`Error::StaleFence`], [`Error::PermissionDenied`], [`Error::Unavailable`].
    pub async fn release_term(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        suspend: bool,
    ) -> Result<Ended, ClientError> {
        self.release_term_to(key, fence, lease_id, suspend, None)
            .await
    }

    /// As [`Client::release_term`], keeping the key for `handoff`'s
    /// successor for a while (ahead of every waiter).
    ///
    /// # Errors
    /// As for [`Client::release_term`].
    pub async fn release_term_to(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        suspend: bool,
        handoff: Option<&Handoff>,
    ) -> Result<Ended, ClientError> {
        let message = pb::ReleaseRequest {
            key: key.as_str().to_owned(),
            fence: fence.0,
            lease_id: lease_id.to_string(),
            suspend,
            successor: handoff
                .map(|h| h.successor.as_str().to_owned())
                .unwrap_or_default(),
            handoff_ms: handoff.map_or(0, |h| h.for_ms),
        };
        let reply = unary!(
            self.endpoints,
            Resend::Safe,
            "Release",
            OP_TIMEOUT,
            release,
            message
        )?;
        Ok(convert::ended_from_pb(
            reply.ended.ok_or_else(|| missing("Release"))?,
        )?)
    }

    /// Which server this is: its release, protocol revision and backend.
    /// [`ServerInfo::is_compatible`] says whether this client can speak to it.
    ///
    /// # Errors
    /// [`Error::Unsupported`] from a server older than `ServerInfo` itself
    /// (or not a leasehold server).
    pub async fn server_info(&self) -> Result<ServerInfo, ClientError> {
        let reply = unary!(
            self.endpoints,
            Resend::Safe,
            "ServerInfo",
            OP_TIMEOUT,
            server_info,
            pb::ServerInfoRequest {}
        )?;
        Ok(ServerInfo {
            version: reply.version,
            protocol: reply.protocol,
            backend: reply.backend,
        })
    }

    /// Whether the server calls go to now reports itself `SERVING` on the
    /// standard gRPC health service (`grpc.health.v1`, service
    /// `leasehold.v1.Leasehold`): its storage answers and it is not
    /// draining. Asks that one server only, with no failover, as a probe must.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when it cannot be reached in time.
    pub async fn health(&self) -> Result<bool, ClientError> {
        use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
        let mut health = self.endpoints.current().health.clone();
        let message = HealthCheckRequest {
            service: "leasehold.v1.Leasehold".to_owned(),
        };
        let reply = call(
            "Health.Check",
            OP_TIMEOUT,
            health.check(request(message, OP_TIMEOUT)),
        )
        .await?;
        Ok(reply.status == ServingStatus::Serving as i32)
    }

    /// The state of `key`: its live term (without lease id), its last ended
    /// term, and whether it is recoverable.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a key never acquired (or forgotten).
    pub async fn get(&self, key: &Key) -> Result<KeyState, ClientError> {
        let message = pb::GetRequest {
            key: key.as_str().to_owned(),
        };
        let reply = unary!(
            self.endpoints,
            Resend::Safe,
            "Get",
            OP_TIMEOUT,
            get,
            message
        )?;
        Ok(convert::key_state_from_pb(pb::KeyState {
            key: key.as_str().to_owned(),
            lease: reply.lease,
            last_ended: reply.last_ended,
            recoverable: reply.recoverable,
            quarantined: reply.quarantined,
            reservation: reply.reservation,
        })?)
    }

    /// One page of `key`'s ended terms, newest first: `before` is `None` for
    /// the newest, then the previous page's `next_before`.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a key the server does not hold.
    pub async fn history(
        &self,
        key: &Key,
        page_size: u32,
        before: Option<Fence>,
    ) -> Result<HistoryPage, ClientError> {
        let message = pb::HistoryRequest {
            key: key.as_str().to_owned(),
            page_size,
            page_token: before.map(|f| f.0.to_string()).unwrap_or_default(),
        };
        let reply = unary!(
            self.endpoints,
            Resend::Safe,
            "History",
            OP_TIMEOUT,
            history,
            message
        )?;
        let (entries, next_before) = convert::history_from_pb(reply)?;
        Ok(HistoryPage {
            entries,
            next_before,
        })
    }

    /// Lifts `key`'s quarantine (admin right) and returns its state.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a key the server does not hold.
    pub async fn unquarantine(&self, key: &Key) -> Result<KeyState, ClientError> {
        let message = pb::UnquarantineRequest {
            key: key.as_str().to_owned(),
        };
        // Safe to resend: lifting a quarantine twice changes nothing more.
        let reply = unary!(
            self.endpoints,
            Resend::Safe,
            "Unquarantine",
            OP_TIMEOUT,
            unquarantine,
            message
        )?;
        let state = reply.key.ok_or_else(|| missing("Unquarantine"))?;
        Ok(convert::key_state_from_pb(state)?)
    }

    /// One page of keys starting with `prefix`, in key order. `page_token`
    /// is `None` for the first page, then the previous page's token.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a page size over 1000 or a malformed
    /// token.
    pub async fn list(
        &self,
        prefix: &str,
        filter: ListFilter,
        page_size: u32,
        page_token: Option<&str>,
    ) -> Result<KeyPage, ClientError> {
        let message = pb::ListRequest {
            prefix: prefix.to_owned(),
            filter: convert::list_filter_to_pb(filter) as i32,
            page_size,
            page_token: page_token.unwrap_or_default().to_owned(),
        };
        let reply = unary!(
            self.endpoints,
            Resend::Safe,
            "List",
            OP_TIMEOUT,
            list,
            message
        )?;
        let keys = reply
            .keys
            .into_iter()
            .map(convert::key_state_from_pb)
            .collect::<Result<_, Error>>()?;
        Ok(KeyPage {
            keys,
            next_page_token: (!reply.next_page_token.is_empty()).then_some(reply.next_page_token),
        })
    }
}
