//! The leasehold side: one worker per client over the gRPC API, in one of
//! three shapes ([`Shape`]): unary calls, a Session stream of its own, or
//! the connection's Session stream shared through the library client.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use super::driver::{self, Worker};
use super::hot::{self, HotGrant, HotLog};
use super::{BenchArgs, Mode, Report, Shape, Target, run_id};
use leasehold_wire::pb;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;

pub(crate) type Client = LeaseholdClient<Channel>;

/// Runs `args.mode` against the leasehold server at `args.server`.
pub(crate) async fn run(args: &BenchArgs) -> Result<Report, String> {
    let channels = connect(&args.server, args.connections()).await?;
    // Pipelined, the clients of one connection share its Session stream.
    let streams: Vec<SessionStream> = channels.iter().cloned().map(SessionStream::over).collect();
    let shape = args.shape();
    let run = run_id();
    let via = |i: usize| {
        let channel = channels[i % channels.len()].clone();
        let shared = streams[i % streams.len()].clone();
        async move { Via::open(shape, channel, &shared).await }
    };
    let (warmup, duration) = (args.warmup(), args.duration());
    let ttl_ms = args.ttl_ms;
    match args.mode {
        Mode::Cycle => {
            let workers = driver::set_up(args.clients, |i| {
                let via = via(i);
                let key = format!("bench/{run}/cycle/{i}");
                async move {
                    Ok(Cycle {
                        via: via.await?,
                        key,
                        owner: format!("bench-{i}"),
                        ttl_ms,
                    })
                }
            })
            .await?;
            let outcome = driver::drive(workers, warmup, duration).await?;
            Ok(outcome.report(
                args,
                Target::Leasehold,
                Mode::Cycle,
                serde_json::Value::Null,
            ))
        }
        Mode::Hot => {
            let keys = args.keys.max(1);
            let wait_ms = args.wait_ms;
            let workers = driver::set_up(args.clients, |i| {
                let via = via(i);
                let key = format!("bench/{run}/hot/{}", i % keys);
                async move {
                    Ok(Hot {
                        via: via.await?,
                        index: i,
                        key_index: i % keys,
                        key,
                        owner: format!("bench-{i}"),
                        ttl_ms,
                        wait_ms,
                        log: HotLog::default(),
                    })
                }
            })
            .await?;
            let outcome = driver::drive(workers, warmup, duration).await?;
            let logs: Vec<&HotLog> = outcome.workers.iter().map(|w| &w.log).collect();
            let details = hot::check(&logs, Duration::from_millis(args.fifo_slack_ms));
            Ok(outcome.report(args, Target::Leasehold, Mode::Hot, details))
        }
        Mode::Renew | Mode::Check => {
            let mode = args.mode;
            let workers = driver::set_up(args.clients, |i| {
                let via = via(i);
                let key = format!("bench/{run}/held/{i}");
                async move {
                    let mut via = via.await?;
                    let lease = via.acquire(&key, &format!("bench-{i}"), ttl_ms, 0).await?;
                    Ok(Held { via, lease, mode })
                }
            })
            .await?;
            let mut outcome = driver::drive(workers, warmup, duration).await?;
            for mut held in std::mem::take(&mut outcome.workers) {
                let _ = held.via.release(held.lease.clone()).await;
            }
            Ok(outcome.report(args, Target::Leasehold, mode, serde_json::Value::Null))
        }
        Mode::Scale | Mode::Fsync => unreachable!("scale and fsync modes have their own modules"),
    }
}

/// Opens `n` HTTP/2 connections to `server`.
pub(crate) async fn connect(server: &str, n: usize) -> Result<Vec<Channel>, String> {
    let endpoint = Endpoint::from_shared(server.to_owned())
        .map_err(|e| format!("bad server URL {server}: {e}"))?
        .tcp_nodelay(true);
    let made = driver::set_up(n, |_| {
        let endpoint = endpoint.clone();
        async move {
            endpoint
                .connect()
                .await
                .map_err(|e| format!("cannot connect: {e}"))
        }
    })
    .await?;
    Ok(made)
}

/// A status as a short error string.
pub(crate) fn refused(status: tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

/// Acquires `key` (waiting up to `wait_ms`) and returns the lease.
pub(crate) async fn acquire(
    client: &mut Client,
    key: &str,
    owner: &str,
    ttl_ms: u64,
    wait_ms: u64,
) -> Result<pb::Lease, String> {
    let reply = client
        .acquire(acquire_request(key, owner, ttl_ms, wait_ms))
        .await
        .map_err(refused)?;
    reply
        .into_inner()
        .lease
        .ok_or_else(|| "Acquire replied without a lease".to_owned())
}

/// Releases `lease`.
pub(crate) async fn release(client: &mut Client, lease: &pb::Lease) -> Result<(), String> {
    client
        .release(release_request(lease.clone()))
        .await
        .map(drop)
        .map_err(refused)
}

fn acquire_request(key: &str, owner: &str, ttl_ms: u64, wait_ms: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: key.to_owned(),
        owner: owner.to_owned(),
        ttl_ms,
        wait_ms,
        request_id: String::new(),
        ..Default::default()
    }
}

fn release_request(lease: pb::Lease) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        key: lease.key,
        fence: lease.fence,
        lease_id: lease.lease_id,
        suspend: false,
        ..Default::default()
    }
}

/// How one client sends its operations (see [`Shape`]).
pub(crate) enum Via {
    /// One unary RPC per operation, on the client's shared connection.
    Unary(Client),
    /// The connection's one Session stream, shared with the other clients on
    /// it through the library client's multiplexer.
    Pipelined(SessionStream),
    /// A Session stream of the client's own, one operation in flight.
    Session(OwnSession),
}

impl Via {
    /// Opens the client's way to the server over `channel`.
    async fn open(shape: Shape, channel: Channel, shared: &SessionStream) -> Result<Via, String> {
        Ok(match shape {
            Shape::Unary => Via::Unary(LeaseholdClient::new(channel)),
            Shape::Pipelined => Via::Pipelined(shared.clone()),
            Shape::Session => Via::Session(OwnSession::open(channel).await?),
        })
    }

    async fn call(&mut self, op: pb::session_request::Op) -> Result<pb::SessionResponse, String> {
        use pb::session_request::Op;
        match self {
            Via::Pipelined(stream) => stream.call(op).await,
            Via::Session(session) => session.call(op).await,
            Via::Unary(client) => {
                let mut reply = pb::SessionResponse::default();
                match op {
                    Op::Acquire(request) => {
                        let r = client.acquire(request).await.map_err(refused)?;
                        reply.lease = r.into_inner().lease;
                    }
                    Op::Release(request) => {
                        client.release(request).await.map_err(refused)?;
                    }
                    Op::Renew(request) => {
                        client.renew(request).await.map_err(refused)?;
                    }
                    Op::Check(request) => {
                        client.check(request).await.map_err(refused)?;
                    }
                    Op::BeginToolCalls(request) => {
                        let r = client.begin_tool_calls(request).await.map_err(refused)?;
                        reply.ledger =
                            Some(pb::session_response::Ledger::BeginToolCalls(r.into_inner()));
                    }
                    Op::SettleToolCall(request) => {
                        let r = client.settle_tool_call(request).await.map_err(refused)?;
                        reply.ledger =
                            Some(pb::session_response::Ledger::SettleToolCall(r.into_inner()));
                    }
                }
                Ok(reply)
            }
        }
    }

    /// Acquires `key` (waiting up to `wait_ms`) and returns the lease.
    async fn acquire(
        &mut self,
        key: &str,
        owner: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Result<pb::Lease, String> {
        let request = acquire_request(key, owner, ttl_ms, wait_ms);
        let reply = self.call(pb::session_request::Op::Acquire(request)).await?;
        reply
            .lease
            .ok_or_else(|| "Acquire replied without a lease".to_owned())
    }

    /// Releases `lease`.
    async fn release(&mut self, lease: pb::Lease) -> Result<(), String> {
        self.call(pb::session_request::Op::Release(release_request(lease)))
            .await
            .map(drop)
    }
}

/// Cycle mode: Acquire + Release of the client's own key.
pub(crate) struct Cycle {
    pub via: Via,
    pub key: String,
    pub owner: String,
    pub ttl_ms: u64,
}

impl Worker for Cycle {
    async fn op(&mut self) -> Result<(), String> {
        let lease = self
            .via
            .acquire(&self.key, &self.owner, self.ttl_ms, 0)
            .await?;
        self.via.release(lease).await
    }
}

/// Hot mode: one handover of a contended key (wait in line, then release).
struct Hot {
    via: Via,
    index: usize,
    key_index: usize,
    key: String,
    owner: String,
    ttl_ms: u64,
    wait_ms: u64,
    log: HotLog,
}

impl Worker for Hot {
    async fn op(&mut self) -> Result<(), String> {
        let asked = Instant::now();
        let acquired = self
            .via
            .acquire(&self.key, &self.owner, self.ttl_ms, self.wait_ms)
            .await;
        let lease = match acquired {
            Ok(lease) => lease,
            Err(e) => {
                self.log.failed_acquires += 1;
                return Err(e);
            }
        };
        let granted = Instant::now();
        let releasing = Instant::now();
        self.log.grants.push(HotGrant {
            key: self.key_index,
            client: self.index,
            fence: lease.fence,
            asked,
            granted,
            releasing,
        });
        self.via.release(lease).await.inspect_err(|_| {
            self.log.failed_releases += 1;
        })
    }
}

/// Renew and check modes: operations on a lease the client holds.
struct Held {
    via: Via,
    lease: pb::Lease,
    mode: Mode,
}

impl Worker for Held {
    async fn op(&mut self) -> Result<(), String> {
        use pb::session_request::Op;
        let lease = &self.lease;
        let op = if self.mode == Mode::Renew {
            Op::Renew(pb::RenewRequest {
                key: lease.key.clone(),
                fence: lease.fence,
                lease_id: lease.lease_id.clone(),
                ttl_ms: 0,
            })
        } else {
            Op::Check(pb::CheckRequest {
                key: lease.key.clone(),
                fence: lease.fence,
            })
        };
        self.via.call(op).await.map(drop)
    }
}

/// The Session stream of a connection, shared (pipelined) by every client
/// on that connection: the library client's own multiplexer.
#[derive(Clone)]
pub(crate) struct SessionStream(leasehold_client::Client);

/// How long one operation over the stream may take before it counts as an
/// error.
const STREAM_OP_TIMEOUT: Duration = Duration::from_secs(30);

impl SessionStream {
    fn over(channel: Channel) -> SessionStream {
        SessionStream(leasehold_client::Client::new(channel))
    }

    async fn call(&self, op: pb::session_request::Op) -> Result<pb::SessionResponse, String> {
        self.0
            .session_op(op, STREAM_OP_TIMEOUT)
            .await
            .map_err(|e| e.to_string())
    }
}

/// A Session stream of one client's own, driven as a generated stub would
/// (a Python or TypeScript worker, grpcurl): send one operation, read its
/// reply, send the next.
pub(crate) struct OwnSession {
    /// The request side of the stream.
    requests: mpsc::Sender<pb::SessionRequest>,
    /// The reply side.
    replies: tonic::Streaming<pb::SessionResponse>,
    /// The id of the last operation sent.
    last_id: u64,
}

impl OwnSession {
    /// Opens a Session stream on `channel` (shared with other clients).
    async fn open(channel: Channel) -> Result<OwnSession, String> {
        let (requests, outgoing) = mpsc::channel(1);
        let replies = LeaseholdClient::new(channel)
            .session(ReceiverStream::new(outgoing))
            .await
            .map_err(refused)?
            .into_inner();
        Ok(OwnSession {
            requests,
            replies,
            last_id: 0,
        })
    }

    /// Sends `op` and waits for its reply; a refusal becomes an error.
    async fn call(&mut self, op: pb::session_request::Op) -> Result<pb::SessionResponse, String> {
        self.last_id += 1;
        let request = pb::SessionRequest {
            op: Some(op),
            id: self.last_id,
        };
        self.requests
            .send(request)
            .await
            .map_err(|_| "the Session stream closed".to_owned())?;
        let reply = self
            .replies
            .message()
            .await
            .map_err(refused)?
            .ok_or_else(|| "the Session stream ended".to_owned())?;
        if reply.id != self.last_id {
            return Err(format!(
                "reply to operation {} while waiting for {}",
                reply.id, self.last_id
            ));
        }
        if reply.code != 0 {
            return Err(format!(
                "{:?}: {}",
                tonic::Code::from(reply.code),
                reply.message
            ));
        }
        Ok(reply)
    }
}
