//! The baseline for the PostgreSQL backend: a lease row written by hand, as
//! a user of PostgreSQL would, on the same database (`--target pgrow`).
//!
//! - cycle: an upsert that takes the key only when it is free or expired
//!   and returns a fence from a sequence, then a delete fenced on it;
//! - renew: an update of the held row, fenced and only while not expired.
//!
//! Expiry uses the database clock (`clock_timestamp()`). The table and the
//! sequence live in the schema `leasehold_bench_row` (created if missing).

use std::sync::Arc;

use tokio_postgres::{Client, NoTls, Statement};

use super::driver::{self, Worker};
use super::{BenchArgs, Mode, Report, Target, run_id};

const SET_UP: &str = "CREATE SCHEMA IF NOT EXISTS leasehold_bench_row;
    CREATE TABLE IF NOT EXISTS leasehold_bench_row.lease (
        key        text PRIMARY KEY,
        fence      bigint NOT NULL,
        owner      text NOT NULL,
        expires_at timestamptz NOT NULL);
    CREATE SEQUENCE IF NOT EXISTS leasehold_bench_row.fence";

const TAKE: &str = "INSERT INTO leasehold_bench_row.lease AS l (key, fence, owner, expires_at)
    VALUES ($1, nextval('leasehold_bench_row.fence'), $2, clock_timestamp() + $3 * interval '1 millisecond')
    ON CONFLICT (key) DO UPDATE
        SET fence = excluded.fence, owner = excluded.owner, expires_at = excluded.expires_at
        WHERE l.expires_at <= clock_timestamp()
    RETURNING fence";

const DROP: &str = "DELETE FROM leasehold_bench_row.lease WHERE key = $1 AND fence = $2";

const RENEW: &str = "UPDATE leasehold_bench_row.lease
    SET expires_at = clock_timestamp() + $3 * interval '1 millisecond'
    WHERE key = $1 AND fence = $2 AND expires_at > clock_timestamp()";

fn failed(e: tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

async fn connect(url: &str) -> Result<Arc<Client>, String> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| format!("cannot connect to {url}: {}", failed(e)))?;
    tokio::spawn(connection);
    Ok(Arc::new(client))
}

/// One worker's connection (shared by `--connections`) and statements.
struct Row {
    client: Arc<Client>,
    take: Statement,
    drop: Statement,
    renew: Statement,
    key: String,
    owner: String,
    ttl_ms: f64,
    /// Renew mode: the fence held.
    fence: i64,
}

impl Row {
    async fn take(&self) -> Result<i64, String> {
        let row = self
            .client
            .query_opt(&self.take, &[&self.key, &self.owner, &self.ttl_ms])
            .await
            .map_err(failed)?;
        row.map(|r| r.get(0))
            .ok_or_else(|| format!("{} is held", self.key))
    }
}

pub(crate) async fn run(args: &BenchArgs) -> Result<Report, String> {
    let url = args.pg.clone();
    connect(&url)
        .await?
        .batch_execute(SET_UP)
        .await
        .map_err(failed)?;
    let clients = driver::set_up(args.connections(), |_| {
        let url = url.clone();
        async move { connect(&url).await }
    })
    .await?;
    let run = run_id();
    let (warmup, duration) = (args.warmup(), args.duration());
    let mode = args.mode;
    if !matches!(mode, Mode::Cycle | Mode::Renew) {
        return Err("--target pgrow runs the cycle and renew modes".into());
    }
    let workers = driver::set_up(args.clients, |i| {
        let client = clients[i % clients.len()].clone();
        let key = format!("bench/{run}/{i}");
        let ttl_ms = args.ttl_ms as f64;
        async move {
            let prepare = |sql| {
                let client = client.clone();
                async move { client.prepare(sql).await.map_err(failed) }
            };
            let mut row = Row {
                take: prepare(TAKE).await?,
                drop: prepare(DROP).await?,
                renew: prepare(RENEW).await?,
                client,
                key,
                owner: format!("bench-{i}"),
                ttl_ms,
                fence: 0,
            };
            if mode == Mode::Renew {
                row.fence = row.take().await?;
            }
            Ok(row)
        }
    })
    .await?;
    let report = if mode == Mode::Cycle {
        let cycling = workers.into_iter().map(Cycle).collect();
        driver::drive(cycling, warmup, duration).await?.report(
            args,
            Target::Pgrow,
            mode,
            serde_json::Value::Null,
        )
    } else {
        // The renewed rows stay behind and expire on their own.
        let renewing = workers.into_iter().map(Renew).collect();
        driver::drive(renewing, warmup, duration).await?.report(
            args,
            Target::Pgrow,
            mode,
            serde_json::Value::Null,
        )
    };
    Ok(report)
}

/// Cycle mode: take the row, then delete it under its fence.
struct Cycle(Row);

impl Worker for Cycle {
    async fn op(&mut self) -> Result<(), String> {
        let row = &self.0;
        let fence = row.take().await?;
        let deleted = row
            .client
            .execute(&row.drop, &[&row.key, &fence])
            .await
            .map_err(failed)?;
        if deleted == 1 {
            Ok(())
        } else {
            Err(format!("{} was taken from fence {fence}", row.key))
        }
    }
}

/// Renew mode: extend the held row.
struct Renew(Row);

impl Worker for Renew {
    async fn op(&mut self) -> Result<(), String> {
        let row = &self.0;
        let renewed = row
            .client
            .execute(&row.renew, &[&row.key, &row.fence, &row.ttl_ms])
            .await
            .map_err(failed)?;
        if renewed == 1 {
            Ok(())
        } else {
            Err(format!("{} is no longer held at {}", row.key, row.fence))
        }
    }
}
