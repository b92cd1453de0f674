//! Several servers behind one [`Client`](crate::Client): failover.
//!
//! Servers on one PostgreSQL database are stateless: a term granted
//! through one can be renewed, checked and released through any other with
//! the same fence and lease id. A client given several endpoints sends to
//! one of them (the *current* one, the first that answered at connect
//! time) and, when it answers UNAVAILABLE (it died, is shutting down, lost
//! its database, or did not answer in time), moves on to the next in the
//! list and stays there.
//!
//! # What is retried on another server
//! Moving on is always right; *resending* is right only when a second
//! delivery cannot do anything the first did not (the first may have been
//! applied before its reply was lost):
//! - Renew, Check, Get, List, ListToolCalls: resent. A renewal applied twice
//!   extends the same term twice, and the guard's local deadline is measured
//!   from the send time of the *first* attempt, which is no later than the
//!   one acknowledged, so failing over never stretches what the guard
//!   believes.
//! - Release: resent. A retried release of the same fence returns the term
//!   as it first ended.
//! - Acquire: resent only with a request id (the guard always has one): the
//!   server replays the grant to the same owner and request id while the
//!   term is live. Without one, a resend could grant a second term, so the
//!   error is returned and only later calls go to the next server.
//! - SettleToolCall: resent (the first outcome wins; a resend gets the
//!   stored record back). BeginToolCalls: not resent, since a resend of a
//!   registration that was applied looks like a concurrent holder.
//!
//! Each attempt is bounded by the call's own timeout, so a call tries each
//! endpoint at most once and takes at most that many timeouts.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use leasehold_core::Error;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;
use tonic::transport::Channel;
use tonic_health::pb::health_client::HealthClient;

use crate::error::ClientError;
use crate::session::SessionMux;
use crate::{Credentials, Health, Rpc};

/// Whether a call may be sent again to another server after an UNAVAILABLE
/// answer (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// A second delivery changes nothing the first did not.
    Safe,
    /// A second delivery might act twice: return the error; later calls go
    /// to the next server.
    Unsafe,
}

/// One server: its channel and its own Session stream.
#[derive(Debug)]
pub(crate) struct Node {
    /// The endpoint as given, for messages.
    pub(crate) url: String,
    /// The generated gRPC client; cloned per call.
    pub(crate) rpc: Rpc,
    /// The same server's `grpc.health.v1` service, on the same channel.
    pub(crate) health: Health,
    /// The Session stream to this server, opened on first use.
    pub(crate) session: SessionMux,
}

/// The servers of a client, in the order given, and which one is current.
#[derive(Debug)]
pub(crate) struct Endpoints {
    /// At least one.
    nodes: Vec<Node>,
    /// The index of the server calls go to first.
    current: AtomicUsize,
}

impl Endpoints {
    /// `nodes` (at least one), starting with `nodes[first]`.
    pub(crate) fn new(nodes: Vec<(String, Channel, Credentials)>, first: usize) -> Endpoints {
        assert!(!nodes.is_empty(), "a client needs an endpoint");
        let first = first % nodes.len();
        Endpoints {
            nodes: nodes
                .into_iter()
                .map(|(url, channel, credentials)| {
                    let rpc =
                        LeaseholdClient::with_interceptor(channel.clone(), credentials.clone());
                    Node {
                        url,
                        session: SessionMux::new(rpc.clone()),
                        rpc,
                        health: HealthClient::with_interceptor(channel, credentials),
                    }
                })
                .collect(),
            current: AtomicUsize::new(first),
        }
    }

    /// The server calls go to first now.
    pub(crate) fn current(&self) -> &Node {
        &self.nodes[self.current.load(Ordering::Relaxed) % self.nodes.len()]
    }

    /// The endpoints, in the order given.
    pub(crate) fn urls(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|n| n.url.as_str())
    }

    /// Moves on from server `index` to the next one, unless another call
    /// already did (so that two calls failing together skip one server,
    /// not two).
    fn move_on_from(&self, index: usize) {
        let next = (index + 1) % self.nodes.len();
        if self
            .current
            .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && next != index
        {
            tracing::info!(
                from = %self.nodes[index].url,
                to = %self.nodes[next].url,
                "server unavailable; failing over"
            );
        }
    }

    /// Runs `op` against the current server; on UNAVAILABLE moves on to the
    /// next and, if `resend` allows, runs it there too, trying each server
    /// at most once. Any other answer (success or refusal) is final.
    ///
    /// # Errors
    /// The last server's error; with several servers, an UNAVAILABLE error
    /// names every endpoint tried.
    pub(crate) async fn run<'a, T, F, Fut>(
        &'a self,
        resend: Resend,
        mut op: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(&'a Node) -> Fut,
        Fut: Future<Output = Result<T, ClientError>> + 'a,
    {
        let count = self.nodes.len();
        let start = self.current.load(Ordering::Relaxed) % count;
        let mut failures = Vec::new();
        for attempt in 0..count {
            let index = (start + attempt) % count;
            let node = &self.nodes[index];
            match op(node).await {
                Err(ClientError::Server(Error::Unavailable(why))) => {
                    self.move_on_from(index);
                    if count == 1 {
                        return Err(Error::Unavailable(why).into());
                    }
                    if resend == Resend::Unsafe {
                        return Err(Error::Unavailable(format!(
                            "{}: {why} (not resent to another server: it may have been applied)",
                            node.url
                        ))
                        .into());
                    }
                    failures.push(format!("{}: {why}", node.url));
                }
                other => return other,
            }
        }
        Err(Error::Unavailable(format!("no server answered ({})", failures.join("; "))).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use leasehold_core::lease::{Fence, Key};
    /// Three endpoints that are never connected to (the ops below are fakes).
    fn three() -> Endpoints {
        let nodes = ["http://a", "http://b", "http://c"]
            .into_iter()
            .map(|url| {
                let channel = tonic::transport::Endpoint::from_static(url).connect_lazy();
                (url.to_owned(), channel, crate::Credentials::default())
            })
            .collect();
        Endpoints::new(nodes, 0)
    }

    fn down() -> ClientError {
        Error::Unavailable("connection refused".into()).into()
    }

    /// Records which endpoints an op was sent to, answering from `answer`.
    async fn run_recorded(
        endpoints: &Endpoints,
        resend: Resend,
        answer: impl Fn(&str) -> Result<u32, ClientError>,
    ) -> (Result<u32, ClientError>, Vec<String>) {
        let sent = Mutex::new(Vec::new());
        let outcome = endpoints
            .run(resend, |node| {
                sent.lock().unwrap().push(node.url.clone());
                let answer = answer(&node.url);
                async move { answer }
            })
            .await;
        (outcome, sent.into_inner().unwrap())
    }

    /// A safe call that meets a dead server is resent to the next, which
    /// then stays current for later calls.
    #[tokio::test]
    async fn a_safe_call_fails_over_and_stays() {
        let endpoints = three();
        let (outcome, sent) = run_recorded(&endpoints, Resend::Safe, |url| {
            if url == "http://a" {
                Err(down())
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(outcome.unwrap(), 7);
        assert_eq!(sent, ["http://a", "http://b"]);
        assert_eq!(endpoints.current().url, "http://b");
        let (_, sent) = run_recorded(&endpoints, Resend::Safe, |_| Ok(1)).await;
        assert_eq!(sent, ["http://b"], "the next call starts at the new server");
    }

    /// An unsafe call is sent once: its error comes back, and only later
    /// calls go to the next server.
    #[tokio::test]
    async fn an_unsafe_call_is_not_resent() {
        let endpoints = three();
        let (outcome, sent) = run_recorded(&endpoints, Resend::Unsafe, |url| {
            if url == "http://a" {
                Err(down())
            } else {
                Ok(7)
            }
        })
        .await;
        let err = outcome.unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(err.to_string().contains("not resent"), "{err}");
        assert_eq!(sent, ["http://a"]);
        assert_eq!(endpoints.current().url, "http://b");
    }

    /// A refusal is the answer: no failover, and the server stays current.
    #[tokio::test]
    async fn a_refusal_does_not_fail_over() {
        let endpoints = three();
        let stale = Error::StaleFence {
            key: Key::parse("k").unwrap(),
            fence: Fence(3),
            reason: leasehold_core::StaleReason::Superseded { by: Fence(4) },
        };
        let (outcome, sent) =
            run_recorded(&endpoints, Resend::Safe, |_| Err(stale.clone().into())).await;
        assert_eq!(outcome.unwrap_err(), ClientError::Server(stale));
        assert_eq!(sent, ["http://a"]);
        assert_eq!(endpoints.current().url, "http://a");
    }

    /// When every server is down, each is tried once and all are named.
    #[tokio::test]
    async fn every_server_down_names_them_all() {
        let endpoints = three();
        let (outcome, sent) = run_recorded(&endpoints, Resend::Safe, |_| Err(down())).await;
        assert_eq!(sent, ["http://a", "http://b", "http://c"]);
        let err = outcome.unwrap_err().to_string();
        for url in ["http://a", "http://b", "http://c"] {
            assert!(err.contains(url), "{err}");
        }
    }

    /// Two calls that fail on the same server together move on by one
    /// server, not two.
    #[tokio::test]
    async fn concurrent_failures_move_on_once() {
        let endpoints = three();
        endpoints.move_on_from(0);
        endpoints.move_on_from(0);
        assert_eq!(endpoints.current().url, "http://b");
    }
}
