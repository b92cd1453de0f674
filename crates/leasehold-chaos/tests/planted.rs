//! The checker against synthetic histories: a clean one passes, and each
//! planted bug is reported as the property it breaks (and only histories
//! that really break it are reported).

use leasehold_chaos::check::{Config, Kind, check};
use leasehold_chaos::history::{Call, History, MS, Op, Outcome, Refusal, Reply};
use tonic::Code;

/// A history written by hand, times in milliseconds.
#[derive(Default)]
struct Script {
    history: History,
    seq: u64,
}

impl Script {
    fn push(
        &mut self,
        worker: u32,
        key: &str,
        call: Call,
        at: (u64, u64),
        outcome: Outcome,
    ) -> &mut Self {
        self.history.ops.push(Op {
            worker,
            key: key.into(),
            call,
            invoked: at.0 * MS,
            completed: at.1 * MS,
            outcome,
        });
        self
    }

    fn acquire_call(worker: u32, rid: &str) -> Call {
        Call::Acquire {
            owner: format!("w{worker}"),
            request_id: rid.into(),
            ttl_ms: 1000,
            wait_ms: 0,
        }
    }

    /// An acknowledged grant of `fence` with a TTL of 1000 ms.
    fn grant(
        &mut self,
        worker: u32,
        key: &str,
        rid: &str,
        at: (u64, u64),
        fence: u64,
    ) -> &mut Self {
        let reply = Reply::Granted {
            fence,
            ttl_ms: 1000,
            replayed: false,
        };
        self.push(
            worker,
            key,
            Self::acquire_call(worker, rid),
            at,
            Outcome::Ok(reply),
        )
    }

    fn busy(
        &mut self,
        worker: u32,
        key: &str,
        rid: &str,
        at: (u64, u64),
        holder: u64,
    ) -> &mut Self {
        let outcome = refused(Code::Aborted, None, Some(holder));
        self.push(worker, key, Self::acquire_call(worker, rid), at, outcome)
    }

    fn renew(
        &mut self,
        worker: u32,
        key: &str,
        fence: u64,
        at: (u64, u64),
        outcome: Outcome,
    ) -> &mut Self {
        self.push(
            worker,
            key,
            Call::Renew {
                fence,
                ttl_ms: 1000,
            },
            at,
            outcome,
        )
    }

    fn release(
        &mut self,
        worker: u32,
        key: &str,
        fence: u64,
        at: (u64, u64),
        outcome: Outcome,
    ) -> &mut Self {
        let call = Call::Release {
            fence,
            suspend: false,
        };
        self.push(worker, key, call, at, outcome)
    }

    fn check(
        &mut self,
        worker: u32,
        key: &str,
        fence: u64,
        at: (u64, u64),
        outcome: Outcome,
    ) -> &mut Self {
        self.push(worker, key, Call::Check { fence }, at, outcome)
    }

    fn get(
        &mut self,
        key: &str,
        at: (u64, u64),
        live: Option<u64>,
        last_ended: Option<u64>,
    ) -> &mut Self {
        self.push(
            99,
            key,
            Call::Get,
            at,
            Outcome::Ok(Reply::State { live, last_ended }),
        )
    }

    /// A write to the fenced store, as the store answered it.
    fn write(
        &mut self,
        worker: u32,
        key: &str,
        fence: u64,
        at: u64,
        accepted: Option<u64>,
    ) -> &mut Self {
        let reply = match accepted {
            Some(highest) if highest > fence => Reply::Rejected { highest },
            _ => {
                self.seq += 1;
                Reply::Accepted { seq: self.seq }
            }
        };
        self.push(
            worker,
            key,
            Call::Write { fence },
            (at, at),
            Outcome::Ok(reply),
        )
    }

    fn kinds(&self) -> Vec<Kind> {
        let report = check(&self.history, &Config::default());
        let mut kinds: Vec<Kind> = report.violations.iter().map(|v| v.kind).collect();
        kinds.dedup();
        kinds
    }
}

fn ok_renewed() -> Outcome {
    Outcome::Ok(Reply::Renewed { ttl_ms: 1000 })
}

fn refused(code: Code, reason: Option<&str>, fence: Option<u64>) -> Outcome {
    Outcome::Err(Refusal {
        code: code as i32,
        reason: reason.map(str::to_owned),
        fence,
        message: String::new(),
    })
}

fn stale(reason: &str) -> Outcome {
    refused(Code::FailedPrecondition, Some(reason), None)
}

/// Two workers taking turns on a key with everything a real run has: a
/// busy refusal, renewals, a lost reply, a replayed grant, a takeover after
/// expiry, a late write the store refuses, a restart's full TTL.
fn clean() -> Script {
    let mut s = Script::default();
    s.grant(1, "k", "a", (0, 10), 1)
        .busy(2, "k", "b", (20, 25), 1)
        .write(1, "k", 1, 30, None)
        .renew(1, "k", 1, (300, 305), ok_renewed())
        .check(1, "k", 1, (310, 312), Outcome::Ok(Reply::Live))
        .get("k", (320, 322), Some(1), None)
        .write(1, "k", 1, 330, None)
        // A release whose reply is lost, retried: the retry succeeds again.
        .release(1, "k", 1, (400, 1900), Outcome::Unknown("timeout".into()))
        .release(1, "k", 1, (1900, 1910), Outcome::Ok(Reply::Released))
        .check(2, "k", 1, (1920, 1925), stale("released"))
        // Worker 2: the reply to its Acquire is lost; the retry is replayed.
        .push(
            2,
            "k",
            Script::acquire_call(2, "c"),
            (2000, 3500),
            Outcome::Unknown("timeout".into()),
        )
        .push(
            2,
            "k",
            Script::acquire_call(2, "c"),
            (3500, 3510),
            Outcome::Ok(Reply::Granted {
                fence: 2,
                ttl_ms: 1000,
                replayed: true,
            }),
        )
        // The server restarted: worker 2's term got a full TTL again, so it
        // is still live here, past its first send plus the TTL.
        .renew(2, "k", 2, (3600, 3610), ok_renewed())
        .write(2, "k", 2, 3620, None)
        // Worker 2 stalls past its TTL; worker 1 takes over after expiry.
        .grant(1, "k", "d", (4700, 4710), 3)
        .write(1, "k", 3, 4720, None)
        .write(2, "k", 2, 4730, Some(3))
        .renew(2, "k", 2, (4740, 4745), stale("superseded"))
        .get("k", (4750, 4760), Some(3), Some(2))
        .release(1, "k", 3, (4800, 4810), Outcome::Ok(Reply::Released))
        // Another key: the one counter goes on.
        .grant(3, "other", "e", (4900, 4910), 4)
        .get("other", (4920, 4930), Some(4), None);
    s
}

/// A history with all of the above breaks no property.
#[test]
fn a_clean_history_passes() {
    let s = clean();
    let report = check(&s.history, &Config::default());
    assert!(report.is_clean(), "{}", report.explain(&s.history, 10));
    assert_eq!(report.stats.terms, 4);
    assert_eq!(report.stats.writes_rejected, 1);
    assert_eq!(report.stats.replayed_grants, 1);
}

/// One fence granted to two terms is reported.
#[test]
fn a_duplicated_fence_is_caught() {
    let mut s = clean();
    s.grant(4, "third", "f", (6000, 6010), 4);
    assert!(s.kinds().contains(&Kind::DuplicateFence), "{:?}", s.kinds());
}

/// A grant acknowledged and then lost in a restart: a Get that does not
/// show it, and a later grant that repeats a lower fence.
#[test]
fn a_lost_grant_is_caught() {
    let mut s = clean();
    s.grant(1, "k", "g", (6000, 6010), 5)
        .get("k", (7000, 7010), None, Some(3));
    assert_eq!(s.kinds(), vec![Kind::LostGrant]);
    s.grant(2, "k", "h", (8000, 8010), 5);
    assert!(s.kinds().contains(&Kind::FenceRegressed), "{:?}", s.kinds());
    // A Check of the acknowledged fence refused as never granted.
    let mut t = clean();
    t.grant(1, "k", "g", (6000, 6010), 5)
        .check(1, "k", 5, (6100, 6110), stale("unknown"));
    assert!(t.kinds().contains(&Kind::LostGrant), "{:?}", t.kinds());
}

/// A release acknowledged and then undone: the term is found live again.
#[test]
fn a_lost_release_is_caught() {
    let mut s = clean();
    s.check(1, "k", 3, (4900, 4905), Outcome::Ok(Reply::Live));
    assert_eq!(s.kinds(), vec![Kind::LostRelease]);
}

/// A grant acknowledged while another term must still be live.
#[test]
fn an_overlapping_grant_is_caught() {
    let mut s = clean();
    s.grant(1, "n", "i", (6000, 6010), 5)
        .grant(2, "n", "j", (6500, 6510), 6);
    assert_eq!(s.kinds(), vec![Kind::Overlap]);
}

/// An acknowledged renewal extends the term from its send time, so a grant
/// after the first TTL but before the renewal's is an overlap; a renewal
/// with an unknown outcome does not extend it, and an unacknowledged
/// release ends it at its send.
#[test]
fn renewals_and_unacknowledged_releases_bound_a_term() {
    let mut renewed = Script::default();
    renewed
        .grant(1, "n", "i", (0, 10), 1)
        .renew(1, "n", 1, (800, 810), ok_renewed())
        .grant(2, "n", "j", (1500, 1510), 2);
    assert_eq!(renewed.kinds(), vec![Kind::Overlap]);

    let mut unknown = Script::default();
    unknown
        .grant(1, "n", "i", (0, 10), 1)
        .renew(1, "n", 1, (800, 2000), Outcome::Unknown("timeout".into()))
        .grant(2, "n", "j", (1500, 1510), 2);
    assert_eq!(unknown.kinds(), vec![]);

    let mut released = Script::default();
    released
        .grant(1, "n", "i", (0, 10), 1)
        .release(1, "n", 1, (300, 2000), Outcome::Unknown("timeout".into()))
        .grant(2, "n", "j", (400, 410), 2);
    assert_eq!(released.kinds(), vec![]);
}

/// A Check that finds an old fence live while the new term must be live.
#[test]
fn a_stale_fence_found_live_is_caught() {
    let mut s = clean();
    s.grant(1, "n", "i", (6000, 6010), 5)
        .release(1, "n", 5, (6100, 6110), Outcome::Unknown("timeout".into()))
        .grant(2, "n", "j", (6200, 6210), 6)
        .check(1, "n", 5, (6300, 6310), Outcome::Ok(Reply::Live));
    assert_eq!(s.kinds(), vec![Kind::StaleLive]);
}

/// A renewal refused as expired well before the TTL ran out.
#[test]
fn a_term_ended_early_is_caught() {
    let mut s = clean();
    s.grant(1, "n", "i", (6000, 6010), 5)
        .renew(1, "n", 5, (6500, 6510), stale("expired"));
    assert_eq!(s.kinds(), vec![Kind::EndedEarly]);
}

/// The fenced store accepting a lower fence after a higher one.
#[test]
fn an_out_of_order_accepted_write_is_caught() {
    let mut s = clean();
    // The store "forgot" fence 3 and accepted fence 2 after it.
    s.write(2, "k", 2, 5000, None);
    assert_eq!(s.kinds(), vec![Kind::StoreOrder]);
}

/// Errors outside the status table are reported.
#[test]
fn an_undocumented_error_is_caught() {
    let mut s = clean();
    s.renew(1, "k", 3, (5000, 5010), refused(Code::Internal, None, None));
    assert_eq!(s.kinds(), vec![Kind::UndocumentedStatus]);
    let mut t = clean();
    t.check(1, "k", 3, (5000, 5010), stale("vanished"));
    assert_eq!(t.kinds(), vec![Kind::UndocumentedStatus]);
    let mut u = clean();
    u.busy(2, "k", "z", (5000, 5010), 0);
    u.history.ops.last_mut().unwrap().outcome = refused(Code::Aborted, None, None);
    assert_eq!(u.kinds(), vec![Kind::UndocumentedStatus]);
}
