//! Scale mode: many live leases, a mass expiry, and Acquire latency around it.
//!
//! 1. Loads `leases - expiring` leases with a TTL of an hour, as fast as
//!    `--clients` clients can.
//! 2. Loads `expiring` more whose TTLs are chosen so that all of them end at
//!    one wall-clock instant a few seconds after the load (client and server
//!    share the machine, so they share the clock).
//! 3. Runs `--probe-clients` clients doing Acquire + Release of their own keys
//!    from then until 5 s after that instant, timing each Acquire, and
//!    reports the Acquire latency within [instant − 0.5 s, instant + 3 s] (the
//!    expiry and the commit of the expired rows fall in it) next to the
//!    latency before it.
//! 4. Spot-checks with Get that expiring keys did expire and live ones did not.
//!
//! The server's memory and restart time are measured from outside by
//! `bench/scale.sh`, which knows the server's PID.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use tokio::task::JoinSet;
use tonic::transport::Channel;

use super::lh::{self, Client};
use super::stats::Summary;
use super::{BenchArgs, Mode, Report, Target, run_id};
use leasehold_wire::pb;

/// TTL of the leases that stay live through the run.
const LIVE_TTL_MS: u64 = 60 * 60 * 1000;
/// How long after the mass expiry the probe keeps measuring.
const AFTER_EXPIRY: Duration = Duration::from_secs(5);
/// The window around the expiry instant whose Acquire latency is reported.
const WINDOW_BEFORE: Duration = Duration::from_millis(500);
const WINDOW_AFTER: Duration = Duration::from_secs(3);
/// How many keys of each kind are checked with Get afterwards.
const SPOT_CHECKS: usize = 100;

/// How a loaded lease's TTL is chosen.
#[derive(Clone, Copy)]
enum Ttl {
    Fixed(u64),
    /// Ends at this wall-clock time (ms since the epoch).
    EndsAt(u64),
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) async fn run(args: &BenchArgs) -> Result<Report, String> {
    let channels = lh::connect(&args.server, args.connections()).await?;
    let run = run_id();
    let expiring = args.expiring.min(args.leases);
    let live = args.leases - expiring;
    let live_prefix = format!("scale/{run}/live/");
    let exp_prefix = format!("scale/{run}/exp/");

    let started = Instant::now();
    let live_errors = load(
        &channels,
        args.clients,
        &live_prefix,
        live,
        Ttl::Fixed(LIVE_TTL_MS),
    )
    .await?;
    let live_secs = started.elapsed().as_secs_f64();
    let rate = if live > 0 {
        live as f64 / live_secs
    } else {
        10_000.0
    };
    eprintln!("loaded {live} live leases in {live_secs:.1} s ({rate:.0}/s)");

    // Leave time for the expiring batch to load at the measured rate, twice over.
    let margin = Duration::from_secs_f64(expiring as f64 / rate * 2.0) + Duration::from_secs(4);
    let expiry_wall = wall_ms() + margin.as_millis() as u64;
    let expiry_at = Instant::now() + margin;
    let exp_errors = load(
        &channels,
        args.clients,
        &exp_prefix,
        expiring,
        Ttl::EndsAt(expiry_wall),
    )
    .await?;
    eprintln!(
        "loaded {expiring} leases expiring together in {:.1} s later",
        expiry_at
            .saturating_duration_since(Instant::now())
            .as_secs_f64()
    );

    let probes = probe(
        &channels,
        args.probe_clients.max(1),
        &run,
        expiry_at + AFTER_EXPIRY,
    )
    .await?;
    let (from, to) = (expiry_at - WINDOW_BEFORE, expiry_at + WINDOW_AFTER);
    let mut window: Vec<u32> = Vec::new();
    let mut before: Vec<u32> = Vec::new();
    let mut probe_errors = 0u64;
    for p in &probes {
        match p.latency_us {
            Some(us) if p.at >= from && p.at <= to => window.push(us),
            Some(us) if p.at < from => before.push(us),
            Some(_) => {}
            None => probe_errors += 1,
        }
    }

    let mut client = lh::Client::new(channels[0].clone());
    let expired = spot_check(&mut client, &exp_prefix, expiring, false).await?;
    let still_live = spot_check(&mut client, &live_prefix, live, true).await?;

    let window_secs = (WINDOW_BEFORE + WINDOW_AFTER).as_secs_f64();
    let ops = window.len() as u64;
    Ok(Report {
        shape: None,
        target: Target::Leasehold,
        mode: Mode::Scale,
        clients: args.probe_clients.max(1),
        connections: args.connections(),
        label: args.label.clone(),
        seconds: window_secs,
        ops,
        errors: probe_errors,
        ops_per_sec: ops as f64 / window_secs,
        latency_ms: Summary::of(&mut window),
        error_samples: Vec::new(),
        details: json!({
            "what": "latency_ms is Acquire latency within [expiry - 0.5 s, expiry + 3 s]",
            "live_leases": live,
            "live_load_errors": live_errors,
            "live_load_per_sec": rate,
            "expiring_leases": expiring,
            "expiring_load_errors": exp_errors,
            "acquire_before_expiry_ms": Summary::of(&mut before),
            "spot_checked": SPOT_CHECKS,
            "expired_as_expected": expired,
            "live_as_expected": still_live,
        }),
    })
}

/// Acquires `count` keys `{prefix}{i}` with `clients` clients; returns how
/// many failed.
async fn load(
    channels: &[Channel],
    clients: usize,
    prefix: &str,
    count: usize,
    ttl: Ttl,
) -> Result<u64, String> {
    let next = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = JoinSet::new();
    for i in 0..clients.max(1) {
        let mut client = Client::new(channels[i % channels.len()].clone());
        let (next, errors, prefix) = (next.clone(), errors.clone(), prefix.to_owned());
        tasks.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= count {
                    return Ok(());
                }
                let ttl_ms = match ttl {
                    Ttl::Fixed(ms) => ms,
                    Ttl::EndsAt(at) => {
                        let left = at.saturating_sub(wall_ms());
                        if left < 100 {
                            return Err(format!(
                                "loading is too slow: lease {n} would expire in {left} ms"
                            ));
                        }
                        left
                    }
                };
                let key = format!("{prefix}{n}");
                if lh::acquire(&mut client, &key, "scale", ttl_ms, 0)
                    .await
                    .is_err()
                {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| format!("a load task failed: {e}"))??;
    }
    Ok(errors.load(Ordering::Relaxed))
}

/// One probe Acquire: when it ended and how long it took (`None`: failed).
struct Probe {
    at: Instant,
    latency_us: Option<u32>,
}

/// Acquire + Release of each client's own key until `until`, timing Acquire.
async fn probe(
    channels: &[Channel],
    clients: usize,
    run: &str,
    until: Instant,
) -> Result<Vec<Probe>, String> {
    let mut tasks = JoinSet::new();
    for i in 0..clients {
        let mut client = Client::new(channels[i % channels.len()].clone());
        let key = format!("scale/{run}/probe/{i}");
        tasks.spawn(async move {
            let mut probes = Vec::new();
            while Instant::now() < until {
                let began = Instant::now();
                let acquired = lh::acquire(&mut client, &key, "probe", 30_000, 0).await;
                let at = Instant::now();
                let latency_us = acquired.as_ref().ok().map(|_| {
                    u32::try_from(at.duration_since(began).as_micros()).unwrap_or(u32::MAX)
                });
                probes.push(Probe { at, latency_us });
                if let Ok(lease) = acquired {
                    let _ = lh::release(&mut client, &lease).await;
                }
            }
            probes
        });
    }
    let mut all = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        all.extend(joined.map_err(|e| format!("a probe task failed: {e}"))?);
    }
    Ok(all)
}

/// Gets up to [`SPOT_CHECKS`] keys spread over `{prefix}0..count`; returns how
/// many were live (`want_live`) or ended EXPIRED (otherwise).
async fn spot_check(
    client: &mut Client,
    prefix: &str,
    count: usize,
    want_live: bool,
) -> Result<usize, String> {
    let mut as_expected = 0;
    let checks = SPOT_CHECKS.min(count);
    for c in 0..checks {
        let key = format!("{prefix}{}", c * count / checks);
        let reply = client
            .get(pb::GetRequest { key })
            .await
            .map_err(lh::refused)?
            .into_inner();
        let expired = reply
            .last_ended
            .is_some_and(|e| e.end == pb::TermEnd::Expired as i32);
        if (want_live && reply.lease.is_some()) || (!want_live && reply.lease.is_none() && expired)
        {
            as_expected += 1;
        }
    }
    Ok(as_expected)
}
