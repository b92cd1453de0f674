//! Hot-key checks: what the handovers of a contended key must look like.
//!
//! Each hot-mode client logs every grant it got: the key, the fence (etcd: the
//! lock key's revision; ZooKeeper: the node's czxid, both from counters that
//! rise with every write), when it asked, when the grant arrived and when it
//! sent the release. From those logs alone:
//!
//! - **No lost wake-ups**: every waiting acquire was granted within its wait.
//!   A waiter the server forgot would time out (the wait is far longer than
//!   the run), so a failed acquire counts here.
//! - **Mutual exclusion**: on each key, in fence order, a grant arrives only
//!   after the previous holder sent its release. This is sound: a grant that
//!   reached its client before the holder before it had even asked to release
//!   proves two holders at once.
//! - **First come, first served**: no grant goes to a request sent more than
//!   `slack` later than a request still waiting for the same key. Send times
//!   are the clients' (the server's arrival order is not visible from
//!   outside), so the slack allows for send jitter; a server that let
//!   newcomers barge in would show up here at once under contention.
//! - **Fairness**: with FIFO handover every client of a key gets about the
//!   same share of grants; the spread is reported.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

/// One grant, as its client saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HotGrant {
    pub key: usize,
    pub client: usize,
    pub fence: u64,
    /// When the acquire was sent.
    pub asked: Instant,
    /// When the grant arrived.
    pub granted: Instant,
    /// When the release was sent.
    pub releasing: Instant,
}

/// One hot-mode client's log.
#[derive(Debug, Default)]
pub(crate) struct HotLog {
    pub grants: Vec<HotGrant>,
    /// Acquires that were not granted within their wait (or failed).
    pub failed_acquires: u64,
    /// Releases that were refused (a lost lease would show here).
    pub failed_releases: u64,
}

/// Checks the merged logs of every client; `order_ok` in the result is false
/// when any check failed.
pub(crate) fn check(logs: &[&HotLog], slack: Duration) -> serde_json::Value {
    let mut by_key: BTreeMap<usize, Vec<HotGrant>> = BTreeMap::new();
    let mut per_client: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    let mut failed_acquires = 0;
    let mut failed_releases = 0;
    for log in logs {
        failed_acquires += log.failed_acquires;
        failed_releases += log.failed_releases;
        for g in &log.grants {
            by_key.entry(g.key).or_default().push(*g);
            *per_client.entry((g.key, g.client)).or_default() += 1;
        }
    }
    let mut exclusion_violations = 0u64;
    let mut out_of_order = 0u64;
    let mut handovers = 0u64;
    for grants in by_key.values_mut() {
        grants.sort_by_key(|g| g.fence);
        handovers += grants.len() as u64;
        for pair in grants.windows(2) {
            if pair[1].granted < pair[0].releasing {
                exclusion_violations += 1;
            }
        }
        // A grant is out of order when some grant before it (in fence order)
        // went to a request sent more than `slack` after this one was.
        let mut latest_ask: Option<Instant> = None;
        for g in grants.iter() {
            if latest_ask.is_some_and(|latest| latest > g.asked + slack) {
                out_of_order += 1;
            }
            latest_ask = Some(latest_ask.map_or(g.asked, |l| l.max(g.asked)));
        }
    }
    let shares: Vec<u64> = per_client.values().copied().collect();
    let order_ok = failed_acquires == 0
        && failed_releases == 0
        && exclusion_violations == 0
        && out_of_order == 0;
    json!({
        "order_ok": order_ok,
        "handovers_logged": handovers,
        "lost_wakeups": failed_acquires,
        "failed_releases": failed_releases,
        "exclusion_violations": exclusion_violations,
        "out_of_order_grants": out_of_order,
        "fifo_slack_ms": slack.as_millis() as u64,
        "grants_per_client_min": shares.iter().min().copied().unwrap_or(0),
        "grants_per_client_max": shares.iter().max().copied().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(t0: Instant, client: usize, fence: u64, asked: u64, granted: u64) -> HotGrant {
        let ms = |m| t0 + Duration::from_millis(m);
        HotGrant {
            key: 0,
            client,
            fence,
            asked: ms(asked),
            granted: ms(granted),
            releasing: ms(granted + 1),
        }
    }

    #[test]
    fn fifo_handovers_pass() {
        let t0 = Instant::now();
        let log = HotLog {
            grants: vec![
                grant(t0, 0, 1, 0, 1),
                grant(t0, 1, 2, 0, 3),
                grant(t0, 0, 3, 2, 5),
            ],
            ..HotLog::default()
        };
        let v = check(&[&log], Duration::from_millis(0));
        assert_eq!(v["order_ok"], true, "{v}");
        assert_eq!(v["handovers_logged"], 3);
    }

    #[test]
    fn a_barging_newcomer_is_out_of_order() {
        let t0 = Instant::now();
        // Client 1 asked at 0 ms but client 2, asking at 100 ms, got the key first.
        let log = HotLog {
            grants: vec![grant(t0, 2, 1, 100, 101), grant(t0, 1, 2, 0, 103)],
            ..HotLog::default()
        };
        let v = check(&[&log], Duration::from_millis(20));
        assert_eq!(v["order_ok"], false);
        assert_eq!(v["out_of_order_grants"], 1);
    }

    #[test]
    fn overlapping_holders_are_an_exclusion_violation() {
        let t0 = Instant::now();
        // The second grant arrived before the first holder sent its release.
        let mut first = grant(t0, 0, 1, 0, 1);
        first.releasing = t0 + Duration::from_millis(10);
        let log = HotLog {
            grants: vec![first, grant(t0, 1, 2, 0, 5)],
            ..HotLog::default()
        };
        let v = check(&[&log], Duration::from_millis(20));
        assert_eq!(v["exclusion_violations"], 1);
        assert_eq!(v["order_ok"], false);
    }
}
