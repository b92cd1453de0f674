//! `leasehold bench --summarize FILE`: the side-by-side table of a comparison.
//!
//! FILE holds one JSON report per line (as `--json` prints them), from several
//! rounds of the same rows. A row is a mode and a client count; for each target
//! the table shows the median ops/s and the median p99 over the rounds, and
//! for each peer the median over rounds of leasehold's ratio to it in that
//! round (rounds are interleaved, so a ratio compares runs made close in time).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

/// One run, as read back.
struct Run {
    target: String,
    mode: String,
    clients: u64,
    round: String,
    ops_per_sec: f64,
    p99_ms: f64,
    order_ok: Option<bool>,
    errors: u64,
}

fn parse(line: &str) -> Option<Run> {
    let v: Value = serde_json::from_str(line).ok()?;
    Some(Run {
        target: v["target"].as_str()?.to_owned(),
        mode: v["mode"].as_str()?.to_owned(),
        clients: v["clients"].as_u64()?,
        round: v["label"].as_str().unwrap_or("").to_owned(),
        ops_per_sec: v["ops_per_sec"].as_f64()?,
        p99_ms: v["latency_ms"]["p99"].as_f64()?,
        order_ok: v["details"]["order_ok"].as_bool(),
        errors: v["errors"].as_u64().unwrap_or(0),
    })
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    Some(if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    })
}

const MODES: [&str; 4] = ["cycle", "hot", "renew", "check"];
const PEERS: [&str; 2] = ["zookeeper", "etcd"];

/// The Markdown table for the reports in `text` (one JSON object a line).
pub fn summarize(text: &str) -> String {
    let runs: Vec<Run> = text.lines().filter_map(parse).collect();
    // (mode rank, clients) -> target -> runs
    let mut rows: BTreeMap<(usize, u64), BTreeMap<&str, Vec<&Run>>> = BTreeMap::new();
    for run in &runs {
        let rank = MODES
            .iter()
            .position(|m| *m == run.mode)
            .unwrap_or(MODES.len());
        rows.entry((rank, run.clients))
            .or_default()
            .entry(run.target.as_str())
            .or_default()
            .push(run);
    }
    let mut out = String::new();
    out.push_str(
        "| mode | clients | leasehold ops/s | p99 ms | ZooKeeper ops/s | p99 ms | etcd ops/s | p99 ms | × ZooKeeper | × etcd |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    let mut notes = Vec::new();
    for ((rank, clients), targets) in &rows {
        let mode = MODES.get(*rank).copied().unwrap_or("?");
        let cell = |target: &str| -> (String, String) {
            let Some(runs) = targets.get(target) else {
                return ("n/a".into(), "n/a".into());
            };
            let ops = median(runs.iter().map(|r| r.ops_per_sec).collect());
            let p99 = median(runs.iter().map(|r| r.p99_ms).collect());
            (
                ops.map_or("n/a".into(), |o| format!("{o:.0}")),
                p99.map_or("n/a".into(), |p| format!("{p:.2}")),
            )
        };
        let ratio = |peer: &str| -> String {
            let (Some(ours), Some(theirs)) = (targets.get("leasehold"), targets.get(peer)) else {
                return "n/a".into();
            };
            let theirs: BTreeMap<&str, f64> = theirs
                .iter()
                .map(|r| (r.round.as_str(), r.ops_per_sec))
                .collect();
            let ratios = ours
                .iter()
                .filter_map(|r| {
                    let t = theirs.get(r.round.as_str())?;
                    (*t > 0.0).then(|| r.ops_per_sec / t)
                })
                .collect();
            median(ratios).map_or("n/a".into(), |m| format!("{m:.2}"))
        };
        let (lh, lh99) = cell("leasehold");
        let (zk, zk99) = cell("zookeeper");
        let (et, et99) = cell("etcd");
        let _ = writeln!(
            out,
            "| {mode} | {clients} | {lh} | {lh99} | {zk} | {zk99} | {et} | {et99} | {} | {} |",
            ratio(PEERS[0]),
            ratio(PEERS[1]),
        );
        for (target, runs) in targets {
            for r in runs {
                if r.order_ok == Some(false) {
                    notes.push(format!(
                        "- {target} {mode} {clients} clients, round {}: hot-key order checks FAILED",
                        r.round
                    ));
                }
                if r.errors > 0 {
                    notes.push(format!(
                        "- {target} {mode} {clients} clients, round {}: {} errors",
                        r.round, r.errors
                    ));
                }
            }
        }
    }
    for note in notes {
        out.push_str(&note);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_are_medians_of_per_round_ratios() {
        let line = |target: &str, round: &str, ops: f64| {
            format!(
                r#"{{"target":"{target}","mode":"cycle","clients":64,"label":"{round}","ops_per_sec":{ops},"errors":0,"latency_ms":{{"p99":1.0}}}}"#
            )
        };
        let text = [
            line("leasehold", "1", 300.0),
            line("zookeeper", "1", 100.0),
            line("leasehold", "2", 200.0),
            line("zookeeper", "2", 200.0),
            line("leasehold", "3", 400.0),
            line("zookeeper", "3", 200.0),
        ]
        .join("\n");
        let table = summarize(&text);
        let row = table.lines().nth(2).unwrap();
        assert_eq!(
            row,
            "| cycle | 64 | 300 | 1.00 | 200 | 1.00 | n/a | n/a | 2.00 | n/a |"
        );
    }
}
