//! The leasehold side: one worker per client over the gRPC API.

use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

use super::driver::{self, Worker};
use super::hot::{self, HotGrant, HotLog};
use super::{BenchArgs, Mode, Report, Target, run_id};
use leasehold_wire::pb;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;

pub(crate) type Client = LeaseholdClient<Channel>;

/// Runs `args.mode` against the leasehold server at `args.server`.
pub(crate) async fn run(args: &BenchArgs) -> Result<Report, String> {
    let channels = connect(&args.server, args.connections()).await?;
    // With --stream, the clients of one connection share its Session stream.
    let streams: Vec<SessionStream> = channels.iter().cloned().map(SessionStream::over).collect();
    let run = run_id();
    let client = |i: usize| LeaseholdClient::new(channels[i % channels.len()].clone());
    let stream_of = |i: usize| args.stream.then(|| streams[i % streams.len()].clone());
    let (warmup, duration) = (args.warmup(), args.duration());
    let ttl_ms = args.ttl_ms;
    match args.mode {
        Mode::Cycle => {
            let workers = driver::set_up(args.clients, |i| {
                let client = client(i);
                let key = format!("bench/{run}/cycle/{i}");
                let stream = stream_of(i);
                async move {
                    Ok(Cycle {
                        client,
                        key,
                        owner: format!("bench-{i}"),
                        ttl_ms,
                        stream,
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
                let client = client(i);
                let key = format!("bench/{run}/hot/{}", i % keys);
                let stream = stream_of(i);
                async move {
                    Ok(Hot {
                        client,
                        index: i,
                        key_index: i % keys,
                        key,
                        owner: format!("bench-{i}"),
                        ttl_ms,
                        wait_ms,
                        log: HotLog::default(),
                        stream,
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
                let mut client = client(i);
                let key = format!("bench/{run}/held/{i}");
                let stream = stream_of(i);
                async move {
                    let lease =
                        acquire(&mut client, &key, &format!("bench-{i}"), ttl_ms, 0).await?;
                    Ok(Held {
                        client,
                        lease,
                        mode,
                        stream,
                    })
                }
            })
            .await?;
            let mut outcome = driver::drive(workers, warmup, duration).await?;
            for mut held in std::mem::take(&mut outcome.workers) {
                let _ = release(&mut held.client, &held.lease).await;
            }
            Ok(outcome.report(args, Target::Leasehold, mode, serde_json::Value::Null))
        }
        Mode::Scale => unreachable!("scale mode has its own module"),
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
        .acquire(pb::AcquireRequest {
            key: key.to_owned(),
            owner: owner.to_owned(),
            ttl_ms,
            wait_ms,
            request_id: String::new(),
            ..Default::default()
        })
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
        .release(pb::ReleaseRequest {
            key: lease.key.clone(),
            fence: lease.fence,
            lease_id: lease.lease_id.clone(),
            suspend: false,
            ..Default::default()
        })
        .await
        .map(drop)
        .map_err(refused)
}

/// Cycle mode: Acquire + Release of the client's own key.
pub(crate) struct Cycle {
    pub client: Client,
    pub key: String,
    pub owner: String,
    pub ttl_ms: u64,
    /// With `--stream`: Acquire and Release go over this Session stream.
    pub stream: Option<SessionStream>,
}

impl Worker for Cycle {
    async fn op(&mut self) -> Result<(), String> {
        if let Some(stream) = &self.stream {
            let lease = stream
                .acquire(&self.key, &self.owner, self.ttl_ms, 0)
                .await?;
            return stream.release(lease).await;
        }
        let lease = acquire(&mut self.client, &self.key, &self.owner, self.ttl_ms, 0).await?;
        release(&mut self.client, &lease).await
    }
}

/// Hot mode: one handover of a contended key (wait in line, then release).
struct Hot {
    client: Client,
    index: usize,
    key_index: usize,
    key: String,
    owner: String,
    ttl_ms: u64,
    wait_ms: u64,
    log: HotLog,
    /// With `--stream`: Acquire and Release go over this Session stream.
    stream: Option<SessionStream>,
}

impl Worker for Hot {
    async fn op(&mut self) -> Result<(), String> {
        let asked = Instant::now();
        let acquired = match &self.stream {
            Some(stream) => {
                stream
                    .acquire(&self.key, &self.owner, self.ttl_ms, self.wait_ms)
                    .await
            }
            None => {
                acquire(
                    &mut self.client,
                    &self.key,
                    &self.owner,
                    self.ttl_ms,
                    self.wait_ms,
                )
                .await
            }
        };
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
        let released = match &self.stream {
            Some(stream) => stream.release(lease).await,
            None => release(&mut self.client, &lease).await,
        };
        released.inspect_err(|_| {
            self.log.failed_releases += 1;
        })
    }
}

/// Renew and check modes: operations on a lease the client holds.
struct Held {
    client: Client,
    lease: pb::Lease,
    mode: Mode,
    /// With `--stream`: the client's Session stream.
    stream: Option<SessionStream>,
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

    /// Acquire over the stream, as [`acquire`] does with a unary call.
    async fn acquire(
        &self,
        key: &str,
        owner: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Result<pb::Lease, String> {
        let reply = self
            .call(pb::session_request::Op::Acquire(pb::AcquireRequest {
                key: key.to_owned(),
                owner: owner.to_owned(),
                ttl_ms,
                wait_ms,
                request_id: String::new(),
                ..Default::default()
            }))
            .await?;
        reply
            .lease
            .ok_or_else(|| "Acquire replied without a lease".to_owned())
    }

    /// Release over the stream, as [`release`] does with a unary call.
    async fn release(&self, lease: pb::Lease) -> Result<(), String> {
        let request = pb::ReleaseRequest {
            key: lease.key,
            fence: lease.fence,
            lease_id: lease.lease_id,
            suspend: false,
            ..Default::default()
        };
        self.call(pb::session_request::Op::Release(request))
            .await
            .map(drop)
    }

    async fn call(&self, op: pb::session_request::Op) -> Result<pb::SessionResponse, String> {
        self.0
            .session_op(op, STREAM_OP_TIMEOUT)
            .await
            .map_err(|e| e.to_string())
    }
}

impl Worker for Held {
    async fn op(&mut self) -> Result<(), String> {
        let lease = &self.lease;
        if let Some(stream) = &self.stream {
            use pb::session_request::Op;
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
            return stream.call(op).await.map(drop);
        }
        if self.mode == Mode::Renew {
            let request = pb::RenewRequest {
                key: lease.key.clone(),
                fence: lease.fence,
                lease_id: lease.lease_id.clone(),
                ttl_ms: 0,
            };
            self.client.renew(request).await.map(drop).map_err(refused)
        } else {
            let request = pb::CheckRequest {
                key: lease.key.clone(),
                fence: lease.fence,
            };
            self.client.check(request).await.map(drop).map_err(refused)
        }
    }
}
