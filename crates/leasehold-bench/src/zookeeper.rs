//! The ZooKeeper side (feature `peers`): one session per client.
//!
//! - cycle: create an ephemeral-sequential node, then delete it; the node's
//!   czxid is the fence.
//! - hot: the lock recipe. Create an ephemeral-sequential node under the
//!   lock's directory; the lowest sequence holds the lock; every other
//!   contender watches only its predecessor (no herd effect) and looks again
//!   when it goes. Release deletes the node.
//! - check: `exists` of the held node, comparing its czxid. ZooKeeper serves
//!   reads from the local replica without a `sync`, so unlike leasehold's
//!   Check this read is not linearizable.
//! - renew: ZooKeeper sessions are kept alive by the client library's own
//!   pings; there is no operation to measure, so the mode is refused.

use std::time::{Duration, Instant};

use zookeeper_client::{Acls, Client, CreateMode, CreateOptions};

use super::driver::{self, Worker};
use super::hot::{self, HotGrant, HotLog};
use super::{BenchArgs, Mode, Report, Target, run_id};

fn failed(e: zookeeper_client::Error) -> String {
    e.to_string()
}

fn node_options() -> CreateOptions<'static> {
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all())
}

pub(crate) async fn run(args: &BenchArgs) -> Result<Report, String> {
    if args.mode == Mode::Renew {
        return Err("ZooKeeper has no client-driven renew: its sessions ping by themselves".into());
    }
    let session_timeout = Duration::from_millis(args.ttl_ms.clamp(4_000, 40_000));
    let sessions = driver::set_up(args.connections(), |_| {
        let cluster = args.zookeeper.clone();
        async move {
            Client::connector()
                .with_session_timeout(session_timeout)
                .connect(&cluster)
                .await
                .map_err(|e| format!("cannot connect to ZooKeeper: {e}"))
        }
    })
    .await?;
    let session = |i: usize| sessions[i % sessions.len()].clone();
    let dir = format!("/leasehold-bench/{}", run_id());
    let keys = args.keys.max(1);
    let directory = CreateMode::Persistent.with_acls(Acls::anyone_all());
    sessions[0].mkdir(&dir, &directory).await.map_err(failed)?;
    if args.mode == Mode::Hot {
        for k in 0..keys {
            sessions[0]
                .mkdir(&format!("{dir}/hot{k}"), &directory)
                .await
                .map_err(failed)?;
        }
    }
    let (warmup, duration) = (args.warmup(), args.duration());
    let report = match args.mode {
        Mode::Cycle => {
            let workers = driver::set_up(args.clients, |i| {
                let worker = Cycle {
                    client: session(i),
                    prefix: format!("{dir}/c{i}-"),
                };
                async move { Ok(worker) }
            })
            .await?;
            let outcome = driver::drive(workers, warmup, duration).await?;
            outcome.report(
                args,
                Target::Zookeeper,
                Mode::Cycle,
                serde_json::Value::Null,
            )
        }
        Mode::Hot => {
            let workers = driver::set_up(args.clients, |i| {
                let worker = Hot {
                    client: session(i),
                    index: i,
                    key_index: i % keys,
                    dir: format!("{dir}/hot{}", i % keys),
                    log: HotLog::default(),
                };
                async move { Ok(worker) }
            })
            .await?;
            let outcome = driver::drive(workers, warmup, duration).await?;
            let logs: Vec<&HotLog> = outcome.workers.iter().map(|w| &w.log).collect();
            let details = hot::check(&logs, Duration::from_millis(args.fifo_slack_ms));
            outcome.report(args, Target::Zookeeper, Mode::Hot, details)
        }
        Mode::Check => {
            let workers = driver::set_up(args.clients, |i| {
                let client = session(i);
                let prefix = format!("{dir}/held{i}-");
                async move {
                    let (stat, seq) = client
                        .create(&prefix, b"", &node_options())
                        .await
                        .map_err(failed)?;
                    Ok(Check {
                        client,
                        path: format!("{prefix}{seq}"),
                        fence: stat.czxid,
                    })
                }
            })
            .await?;
            let outcome = driver::drive(workers, warmup, duration).await?;
            for w in &outcome.workers {
                let _ = w.client.delete(&w.path, None).await;
            }
            outcome.report(
                args,
                Target::Zookeeper,
                Mode::Check,
                serde_json::Value::Null,
            )
        }
        Mode::Renew | Mode::Scale | Mode::Fsync => unreachable!("refused above or by the caller"),
    };
    Ok(report)
}

/// Cycle mode: create an ephemeral-sequential node and delete it.
struct Cycle {
    client: Client,
    prefix: String,
}

impl Worker for Cycle {
    async fn op(&mut self) -> Result<(), String> {
        let (_stat, seq) = self
            .client
            .create(&self.prefix, b"", &node_options())
            .await
            .map_err(failed)?;
        let path = format!("{}{seq}", self.prefix);
        self.client.delete(&path, None).await.map_err(failed)
    }
}

/// Hot mode: the ZooKeeper lock recipe, then release.
struct Hot {
    client: Client,
    index: usize,
    key_index: usize,
    dir: String,
    log: HotLog,
}

impl Hot {
    /// Waits until the node `mine` (a child name) has the lowest sequence.
    async fn wait_turn(&self, mine: &str) -> Result<(), String> {
        loop {
            let mut children = self.client.list_children(&self.dir).await.map_err(failed)?;
            // Names are "n-" and a zero-padded sequence, so they sort by it.
            children.sort_unstable();
            let at = children
                .iter()
                .position(|c| c == mine)
                .ok_or_else(|| format!("lock node {mine} vanished"))?;
            if at == 0 {
                return Ok(());
            }
            let predecessor = format!("{}/{}", self.dir, children[at - 1]);
            let (stat, watcher) = self
                .client
                .check_and_watch_stat(&predecessor)
                .await
                .map_err(failed)?;
            if stat.is_some() {
                watcher.changed().await;
            }
        }
    }
}

impl Worker for Hot {
    async fn op(&mut self) -> Result<(), String> {
        let asked = Instant::now();
        let prefix = format!("{}/n-", self.dir);
        let created = self.client.create(&prefix, b"", &node_options()).await;
        let (stat, seq) = match created {
            Ok(created) => created,
            Err(e) => {
                self.log.failed_acquires += 1;
                return Err(failed(e));
            }
        };
        let mine = format!("n-{seq}");
        if let Err(e) = self.wait_turn(&mine).await {
            self.log.failed_acquires += 1;
            return Err(e);
        }
        let granted = Instant::now();
        self.log.grants.push(HotGrant {
            key: self.key_index,
            client: self.index,
            fence: stat.czxid as u64,
            asked,
            granted,
            releasing: Instant::now(),
        });
        let path = format!("{}/{mine}", self.dir);
        self.client.delete(&path, None).await.map_err(|e| {
            self.log.failed_releases += 1;
            failed(e)
        })
    }
}

/// Check mode: `exists` of the held node, comparing its czxid.
struct Check {
    client: Client,
    path: String,
    fence: i64,
}

impl Worker for Check {
    async fn op(&mut self) -> Result<(), String> {
        match self.client.check_stat(&self.path).await.map_err(failed)? {
            Some(stat) if stat.czxid == self.fence => Ok(()),
            _ => Err(format!("{} is no longer held", self.path)),
        }
    }
}
