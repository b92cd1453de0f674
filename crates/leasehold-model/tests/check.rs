//! The bounded checks that run with `cargo test` (and so in CI), and the
//! planted bugs the checker must find. See `docs/reliability.md`.

use std::time::Instant;

use leasehold_model::{
    BELIEF_IN_LIVE_TERM, EX_HANDOVER_WRITE, EX_STALE_WRITE_REFUSED, EX_TERM_SURVIVES_RESTART,
    FENCES_UNIQUE, LeaseModel, NO_OLD_WRITE_AFTER_NEWER, ONE_BELIEVER, Rules, SAFETY,
    STORE_FENCE_MONOTONE,
};
use stateright::{Checker, HasDiscoveries, Model};

/// Stateright's `target_max_depth(d)` evaluates the properties on the
/// states at depths below `d`, and the initial state has depth 1: so every
/// state reachable in at most `steps` steps is checked with `d = steps + 2`.
/// (Its unique-state count also includes the states one step further,
/// generated but not checked.)
///
/// Every check runs on one thread: with several, stateright's breadth-first
/// search is not level by level (each thread has its own queue), so a state
/// can first be reached by a longer path, get too deep a depth and be left
/// unchecked although a path within the bound reaches it. One thread keeps
/// one FIFO queue and the bound exact; the test harness runs the tests in
/// parallel anyway.
fn depth_for(steps: usize) -> usize {
    steps + 2
}

/// Checks every state reachable in at most `steps` steps, breadth-first,
/// and asserts that no safety property fails; returns the names of the
/// examples (`sometimes` properties) it reached.
fn check_safe(model: LeaseModel, steps: usize) -> Vec<&'static str> {
    let start = Instant::now();
    let checker = model
        .checker()
        .threads(1)
        .target_max_depth(depth_for(steps))
        .spawn_bfs()
        .join();
    eprintln!(
        "{steps} steps: {} states generated, {} unique, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        start.elapsed().as_secs_f64()
    );
    assert!(checker.is_done());
    for name in SAFETY {
        checker.assert_no_discovery(name);
    }
    checker
        .model()
        .properties()
        .into_iter()
        .map(|p| p.name)
        .filter(|name| !SAFETY.contains(name) && checker.discovery(name).is_some())
        .collect()
}

/// Checks every state reachable in at most `steps` steps, breadth-first, and
/// returns the names of the safety properties that failed. (The path printed
/// for each is one stateright kept, not necessarily a shortest one.)
fn counterexamples(model: LeaseModel, steps: usize) -> Vec<&'static str> {
    let start = Instant::now();
    let checker = model
        .checker()
        .threads(1)
        .target_max_depth(depth_for(steps))
        .finish_when(HasDiscoveries::AllFailures)
        .spawn_bfs()
        .join();
    let found: Vec<_> = SAFETY
        .into_iter()
        .filter(|name| checker.discovery(name).is_some())
        .collect();
    for name in &found {
        let path = checker.discovery(name).expect("found");
        eprintln!(
            "counterexample for {name:?} ({} steps):",
            path.clone().into_actions().len()
        );
        for action in path.clone().into_actions() {
            eprintln!("  {action:?}");
        }
    }
    eprintln!(
        "{} unique states, {:.1} s",
        checker.unique_state_count(),
        start.elapsed().as_secs_f64()
    );
    found
}

/// Two clients, TTL 4, margin 2, drift ±1, one crash, time up to 8.
#[test]
fn two_clients_are_safe_within_10_steps() {
    let examples = check_safe(LeaseModel::default(), 10);
    assert!(examples.contains(&EX_TERM_SURVIVES_RESTART), "{examples:?}");
}

/// Three clients, the same bounds otherwise, to a smaller depth.
#[test]
fn three_clients_are_safe_within_8_steps() {
    let model = LeaseModel {
        clients: 3,
        ..LeaseModel::default()
    };
    check_safe(model, 8);
}

/// Two clients that check, acquire twice each and renew once per term.
#[test]
fn reacquiring_and_checking_clients_are_safe_within_9_steps() {
    let model = LeaseModel {
        acquires: 2,
        renewals: 1,
        checks: true,
        ..LeaseModel::default()
    };
    check_safe(model, 9);
}

/// The smallest setting that shows the restart rule is needed: one
/// renewal, one crash, no drift, time up to 5.
fn restart_setting(rules: Rules) -> LeaseModel {
    LeaseModel {
        renewals: 1,
        max_drift: 0,
        max_time: 5,
        rules,
        ..LeaseModel::default()
    }
}

/// Without the full TTL on restart, a renewal that was acknowledged but not
/// yet written is lost by a crash: the restored term expires at its old
/// deadline and the key goes to another client while the holder, whose
/// deadline counts from that renewal, still believes it holds it.
#[test]
fn restart_without_full_ttl_is_caught() {
    let rules = Rules {
        full_ttl_on_restart: false,
        ..Rules::REAL
    };
    let found = counterexamples(restart_setting(rules), 15);
    assert!(found.contains(&BELIEF_IN_LIVE_TERM), "{found:?}");
    assert!(found.contains(&ONE_BELIEVER), "{found:?}");
    // The control: the same setting with the rule finds nothing.
    let examples = check_safe(restart_setting(Rules::REAL), 15);
    assert!(examples.contains(&EX_TERM_SURVIVES_RESTART), "{examples:?}");
}

/// No renewals and no crashes: the store and the deadline on their own.
fn small_setting(rules: Rules) -> LeaseModel {
    LeaseModel {
        renewals: 0,
        crashes: 0,
        rules,
        ..LeaseModel::default()
    }
}

/// Without the store's fence check, a write sent while the holder was
/// valid and delivered after a newer holder's write is accepted.
#[test]
fn store_without_fence_check_is_caught() {
    let rules = Rules {
        store_checks_fence: false,
        ..Rules::REAL
    };
    let found = counterexamples(small_setting(rules), 12);
    assert!(found.contains(&STORE_FENCE_MONOTONE), "{found:?}");
    assert!(found.contains(&NO_OLD_WRITE_AFTER_NEWER), "{found:?}");
}

/// With the deadline counted from the reply's receipt, a reply that arrives
/// late makes the client believe past the server's expiry, while the key
/// is already another client's.
#[test]
fn deadline_from_receipt_is_caught() {
    let rules = Rules {
        deadline_from_send: false,
        ..Rules::REAL
    };
    let found = counterexamples(small_setting(rules), 11);
    assert!(found.contains(&ONE_BELIEVER), "{found:?}");
    assert!(found.contains(&BELIEF_IN_LIVE_TERM), "{found:?}");
}

/// The control for the two tests above: the same setting with every rule
/// finds nothing, and does reach a stale write refused by the store after
/// a newer holder wrote.
#[test]
fn small_setting_with_every_rule_is_safe_within_12_steps() {
    let examples = check_safe(small_setting(Rules::REAL), 12);
    assert!(examples.contains(&EX_HANDOVER_WRITE), "{examples:?}");
    assert!(examples.contains(&EX_STALE_WRITE_REFUSED), "{examples:?}");
}

/// Without a durable fence counter, a restart hands out fence 1 again.
#[test]
fn fence_counter_not_durable_is_caught() {
    let rules = Rules {
        durable_fence_counter: false,
        ..Rules::REAL
    };
    let model = LeaseModel {
        renewals: 0,
        ..LeaseModel::default()
    };
    let found = counterexamples(LeaseModel { rules, ..model }, 9);
    assert!(found.contains(&FENCES_UNIQUE), "{found:?}");
}

/// A safety margin below twice the drift bound: a client whose clock ran
/// fast when it sent and slow afterwards believes past the server's expiry.
/// (Not one of leasehold's rules to switch off, but the bound the model's
/// margin must keep: the client's default margin, a tenth of the TTL, is
/// what covers real drift.)
#[test]
fn margin_below_twice_the_drift_is_caught() {
    let model = LeaseModel {
        margin: 1,
        ..small_setting(Rules::REAL)
    };
    let found = counterexamples(model, 11);
    assert!(found.contains(&ONE_BELIEVER), "{found:?}");
    assert!(found.contains(&BELIEF_IN_LIVE_TERM), "{found:?}");
}
