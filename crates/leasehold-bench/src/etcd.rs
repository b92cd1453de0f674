//! The etcd side (feature `peers`): the same modes as etcd users write them.
//!
//! - cycle: LeaseGrant, a Txn that puts the key with the lease only if it does
//!   not exist (create revision 0; the revision is the fence), LeaseRevoke
//!   (which deletes the key).
//! - hot: the v3lock service, `Lock` with a session lease held for the run,
//!   then `Unlock`; waiters are served in revision order.
//! - renew: one round trip on a `LeaseKeepAlive` stream.
//! - check: a linearizable Get of the held key, comparing its create revision.

use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, LockOptions};
use etcd_client::{PutOptions, Txn, TxnOp};

use super::driver::{self, Worker};
use super::hot::{self, HotGrant, HotLog};
use super::{BenchArgs, Mode, Report, Target, run_id};

fn failed(e: etcd_client::Error) -> String {
    e.to_string()
}

/// etcd lease TTLs are whole seconds.
fn ttl_secs(ttl_ms: u64) -> i64 {
    i64::try_from(ttl_ms.div_ceil(1000).max(1)).unwrap_or(i64::MAX)
}

pub(crate) async fn run(args: &BenchArgs) -> Result<Report, String> {
    let clients = driver::set_up(args.connections(), |_| {
        let endpoint = args.etcd.clone();
        async move {
            Client::connect([endpoint], None)
                .await
                .map_err(|e| format!("cannot connect to etcd: {e}"))
        }
    })
    .await?;
    let client = |i: usize| clients[i % clients.len()].clone();
    let run = run_id();
    let ttl = ttl_secs(args.ttl_ms);
    let (warmup, duration) = (args.warmup(), args.duration());
    match args.mode {
        Mode::Cycle => {
            let workers = driver::set_up(args.clients, |i| {
                let worker = Cycle {
                    client: client(i),
                    key: format!("bench/{run}/cycle/{i}"),
                    ttl,
                };
                async move { Ok(worker) }
            })
            .await?;
            let outcome = driver::drive(workers, warmup, duration).await?;
            Ok(outcome.report(args, Target::Etcd, Mode::Cycle, serde_json::Value::Null))
        }
        Mode::Hot => {
            let keys = args.keys.max(1);
            // The session lease must outlive the run and its waits.
            let session_ttl = ttl_secs(args.ttl_ms)
                .max((warmup + duration).as_secs() as i64 + ttl_secs(args.wait_ms) + 10);
            let workers = driver::set_up(args.clients, |i| {
                let mut client = client(i);
                let name = format!("bench/{run}/hot/{}", i % keys);
                async move {
                    let lease = client
                        .lease_grant(session_ttl, None)
                        .await
                        .map_err(failed)?
                        .id();
                    Ok(Hot {
                        client,
                        index: i,
                        key_index: i % keys,
                        name,
                        lease,
                        log: HotLog::default(),
                    })
                }
            })
            .await?;
            let mut outcome = driver::drive(workers, warmup, duration).await?;
            let logs: Vec<&HotLog> = outcome.workers.iter().map(|w| &w.log).collect();
            let details = hot::check(&logs, Duration::from_millis(args.fifo_slack_ms));
            for w in &mut outcome.workers {
                let _ = w.client.lease_revoke(w.lease).await;
            }
            Ok(outcome.report(args, Target::Etcd, Mode::Hot, details))
        }
        Mode::Renew => {
            let workers = driver::set_up(args.clients, |i| {
                let mut client = client(i);
                async move {
                    let lease = client.lease_grant(ttl, None).await.map_err(failed)?.id();
                    let (keeper, stream) = client.lease_keep_alive(lease).await.map_err(failed)?;
                    Ok(KeepAlive { keeper, stream })
                }
            })
            .await?;
            let outcome = driver::drive(workers, warmup, duration).await?;
            Ok(outcome.report(args, Target::Etcd, Mode::Renew, serde_json::Value::Null))
        }
        Mode::Check => {
            let workers = driver::set_up(args.clients, |i| {
                let mut client = client(i);
                let key = format!("bench/{run}/held/{i}");
                async move {
                    let (lease, fence) = take(&mut client, &key, ttl).await?;
                    Ok(Check {
                        client,
                        key,
                        lease,
                        fence,
                    })
                }
            })
            .await?;
            let mut outcome = driver::drive(workers, warmup, duration).await?;
            for w in &mut outcome.workers {
                let _ = w.client.lease_revoke(w.lease).await;
            }
            Ok(outcome.report(args, Target::Etcd, Mode::Check, serde_json::Value::Null))
        }
        Mode::Scale | Mode::Fsync => {
            unreachable!("scale and fsync modes are handled by the caller")
        }
    }
}

/// Grants a lease and puts `key` with it if the key is free; returns the
/// lease and the fence (the revision of the put).
async fn take(client: &mut Client, key: &str, ttl: i64) -> Result<(i64, i64), String> {
    let lease = client.lease_grant(ttl, None).await.map_err(failed)?.id();
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            "bench",
            Some(PutOptions::new().with_lease(lease)),
        )]);
    let reply = client.txn(txn).await.map_err(failed)?;
    if !reply.succeeded() {
        let _ = client.lease_revoke(lease).await;
        return Err(format!("{key} is held"));
    }
    let fence = reply.header().map_or(0, |h| h.revision());
    Ok((lease, fence))
}

/// Cycle mode: grant, put-if-absent, revoke.
struct Cycle {
    client: Client,
    key: String,
    ttl: i64,
}

impl Worker for Cycle {
    async fn op(&mut self) -> Result<(), String> {
        let (lease, _fence) = take(&mut self.client, &self.key, self.ttl).await?;
        self.client
            .lease_revoke(lease)
            .await
            .map(drop)
            .map_err(failed)
    }
}

/// Hot mode: Lock (waiting in line) and Unlock under a session lease.
struct Hot {
    client: Client,
    index: usize,
    key_index: usize,
    name: String,
    lease: i64,
    log: HotLog,
}

impl Worker for Hot {
    async fn op(&mut self) -> Result<(), String> {
        let asked = Instant::now();
        let options = LockOptions::new().with_lease(self.lease);
        let locked = match self.client.lock(self.name.as_str(), Some(options)).await {
            Ok(locked) => locked,
            Err(e) => {
                self.log.failed_acquires += 1;
                return Err(failed(e));
            }
        };
        let granted = Instant::now();
        let fence = locked.header().map_or(0, |h| h.revision()) as u64;
        let key = locked.key().to_vec();
        self.log.grants.push(HotGrant {
            key: self.key_index,
            client: self.index,
            fence,
            asked,
            granted,
            releasing: Instant::now(),
        });
        match self.client.unlock(key).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.log.failed_releases += 1;
                Err(failed(e))
            }
        }
    }
}

/// Renew mode: one keep-alive round trip on the lease's stream.
struct KeepAlive {
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

impl Worker for KeepAlive {
    async fn op(&mut self) -> Result<(), String> {
        self.keeper.keep_alive().await.map_err(failed)?;
        match self.stream.message().await.map_err(failed)? {
            Some(reply) if reply.ttl() > 0 => Ok(()),
            Some(_) => Err("the lease expired".into()),
            None => Err("the keep-alive stream ended".into()),
        }
    }
}

/// Check mode: a linearizable read of the held key, comparing the fence.
struct Check {
    client: Client,
    key: String,
    lease: i64,
    fence: i64,
}

impl Worker for Check {
    async fn op(&mut self) -> Result<(), String> {
        let reply = self
            .client
            .get(self.key.as_str(), None)
            .await
            .map_err(failed)?;
        match reply.kvs().first() {
            Some(kv) if kv.create_revision() == self.fence => Ok(()),
            _ => Err(format!("{} is no longer held at {}", self.key, self.fence)),
        }
    }
}
