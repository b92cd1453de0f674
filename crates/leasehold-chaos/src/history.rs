//! What happened: every operation with its invocation and completion time
//! and its outcome, as the workers saw it.
//!
//! Times are nanoseconds on the monotonic clock since the history's origin
//! (`CLOCK_MONOTONIC`, read with `clock_gettime`: the clock the server
//! advances its own time by, one that keeps running while a process is
//! stopped, and the same in every process, so worker processes record on
//! the harness's time axis). An operation took effect, if at all, at some
//! instant between its `invoked` and `completed` times; the checker never
//! assumes more.

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tonic::Code;

/// Nanoseconds since the history's origin, on the monotonic clock.
pub type Nanos = u64;

/// One millisecond in [`Nanos`].
pub const MS: Nanos = 1_000_000;

/// What a worker asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Call {
    /// An Acquire; a retry after an unknown outcome reuses `request_id`.
    Acquire {
        owner: String,
        request_id: String,
        ttl_ms: u64,
        wait_ms: u64,
    },
    /// A Renew of the term `fence` (with its lease id).
    Renew { fence: u64, ttl_ms: u64 },
    /// A Release of the term `fence` (with its lease id).
    Release { fence: u64, suspend: bool },
    /// A Check of `fence`.
    Check { fence: u64 },
    /// A Get of the key.
    Get,
    /// A write to the harness's fenced store, carrying `fence`.
    Write { fence: u64 },
}

/// A successful reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// Acquire: the term granted (`replayed`: an earlier grant repeated for
    /// the same request id) and the TTL the server applied.
    Granted {
        fence: u64,
        ttl_ms: u64,
        replayed: bool,
    },
    /// Renew: the TTL the server applied.
    Renewed { ttl_ms: u64 },
    /// Release: the term ended.
    Released,
    /// Check: the fence is the live term.
    Live,
    /// Get: the live term's fence and the last ended term's fence.
    State {
        live: Option<u64>,
        last_ended: Option<u64>,
    },
    /// Write: the store accepted it, as its `seq`-th accepted write.
    Accepted { seq: u64 },
    /// Write: the store refused it, having accepted `highest` before.
    Rejected { highest: u64 },
}

/// A status other than OK, as it came back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// The gRPC status code, as a number (`tonic::Code`).
    pub code: i32,
    /// `leasehold-reason` of a FAILED_PRECONDITION (expired, released, ...).
    pub reason: Option<String>,
    /// The fence a refusal names: the holder's (ABORTED) or the superseding
    /// term's (FAILED_PRECONDITION, reason superseded).
    pub fence: Option<u64>,
    /// The status message, for people reading a violation.
    pub message: String,
}

impl Refusal {
    /// The code as `tonic::Code`.
    pub fn code(&self) -> Code {
        Code::from(self.code)
    }

    /// Whether the request certainly took no effect: a refusal by the
    /// lease rules. UNAVAILABLE, INTERNAL and the transport's codes
    /// (UNKNOWN, CANCELLED, DEADLINE_EXCEEDED) leave the effect unknown:
    /// the request may have been applied (and even committed) before the
    /// reply was lost or the storage failed.
    pub fn is_definite(&self) -> bool {
        matches!(
            self.code(),
            Code::Aborted
                | Code::FailedPrecondition
                | Code::PermissionDenied
                | Code::NotFound
                | Code::InvalidArgument
                | Code::ResourceExhausted
                | Code::Unauthenticated
                | Code::OutOfRange
        )
    }
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Ok(Reply),
    Err(Refusal),
    /// No reply (the worker's timeout, a connection that could not be
    /// made): the request may or may not have taken effect.
    Unknown(String),
}

/// One operation of one worker on one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Who did it: a worker number (the fenced store's writes count as the
    /// writing worker's).
    pub worker: u32,
    pub key: String,
    pub call: Call,
    /// When the request was sent (before the first byte left).
    pub invoked: Nanos,
    /// When the outcome was known (the reply arrived, or the worker gave up).
    pub completed: Nanos,
    pub outcome: Outcome,
}

impl Op {
    /// The fence the call names (Renew, Release, Check, Write).
    pub fn fence(&self) -> Option<u64> {
        match self.call {
            Call::Renew { fence, .. }
            | Call::Release { fence, .. }
            | Call::Check { fence }
            | Call::Write { fence } => Some(fence),
            Call::Acquire { .. } | Call::Get => None,
        }
    }

    /// The fence granted, for an acknowledged Acquire.
    pub fn granted(&self) -> Option<(u64, u64, bool)> {
        match self.outcome {
            Outcome::Ok(Reply::Granted {
                fence,
                ttl_ms,
                replayed,
            }) => Some((fence, ttl_ms, replayed)),
            _ => None,
        }
    }

    /// Whether the reply was OK.
    pub fn is_ok(&self) -> bool {
        matches!(self.outcome, Outcome::Ok(_))
    }

    /// The refusal, if the outcome was one.
    pub fn refusal(&self) -> Option<&Refusal> {
        match &self.outcome {
            Outcome::Err(refusal) => Some(refusal),
            _ => None,
        }
    }
}

/// Something the harness did to the system (a fault), for the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub at: Nanos,
    pub what: String,
}

/// A whole run: the operations (in the order they were recorded, which is
/// completion order per worker) and the faults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub ops: Vec<Op>,
    pub events: Vec<Event>,
}

impl History {
    /// The operations and events between `from` and `to` (ns), for a
    /// violation's context.
    pub fn excerpt(&self, key: &str, from: Nanos, to: Nanos) -> String {
        let mut lines: Vec<(Nanos, String)> = self
            .ops
            .iter()
            .enumerate()
            .filter(|(_, op)| op.key == key && op.completed >= from && op.invoked <= to)
            .map(|(i, op)| (op.invoked, describe(i, op)))
            .collect();
        lines.extend(
            self.events
                .iter()
                .filter(|e| e.at >= from && e.at <= to)
                .map(|e| (e.at, format!("{:>10.3} ms  fault: {}", ms(e.at), e.what))),
        );
        lines.sort_by_key(|(at, _)| *at);
        lines
            .into_iter()
            .map(|(_, line)| line)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Nanos as fractional milliseconds, for messages.
pub fn ms(at: Nanos) -> f64 {
    at as f64 / MS as f64
}

/// One line describing operation `index`.
pub fn describe(index: usize, op: &Op) -> String {
    let outcome = match &op.outcome {
        Outcome::Ok(reply) => format!("ok {reply:?}"),
        Outcome::Err(r) => format!(
            "{:?} reason={} fence={} ({})",
            r.code(),
            r.reason.as_deref().unwrap_or("-"),
            r.fence.map_or("-".into(), |f| f.to_string()),
            r.message
        ),
        Outcome::Unknown(why) => format!("unknown ({why})"),
    };
    format!(
        "{:>10.3} ms .. {:>10.3} ms  #{index} w{} {} {:?} -> {outcome}",
        ms(op.invoked),
        ms(op.completed),
        op.worker,
        op.key,
        op.call
    )
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the same clock in every process
/// of the machine (std's `Instant` reads it too, but does not show it).
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer;
    // CLOCK_MONOTONIC exists on every Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// One line a worker process writes on its stdout for the harness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Line {
    /// An operation, timed on the shared origin.
    Op(Op),
    /// A write for the harness's fenced store.
    Write {
        worker: u32,
        key: String,
        fence: u64,
    },
}

/// A shared, cheap-to-clone recorder: every worker appends to one history.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// Time zero of the history, as [`monotonic_ns`].
    origin: u64,
    /// The history so far; a std mutex, never held across an await.
    history: Arc<Mutex<History>>,
    /// In a worker process: where operations go instead (stdout, one JSON
    /// [`Line`] each), for the harness to record.
    sink: Option<Arc<Mutex<std::io::Stdout>>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// A recorder whose time zero is now.
    pub fn new() -> Recorder {
        Recorder {
            origin: monotonic_ns(),
            history: Arc::default(),
            sink: None,
        }
    }

    /// A worker process's recorder: time zero is the harness's `origin`,
    /// and every operation is written to stdout as a [`Line`].
    pub fn to_stdout(origin: u64) -> Recorder {
        Recorder {
            origin,
            history: Arc::default(),
            sink: Some(Arc::new(Mutex::new(std::io::stdout()))),
        }
    }

    /// Time zero, as [`monotonic_ns`] (for worker processes).
    pub fn origin(&self) -> u64 {
        self.origin
    }

    /// Now, in history time.
    pub fn now(&self) -> Nanos {
        monotonic_ns().saturating_sub(self.origin)
    }

    /// Writes `line` to the sink; false when this recorder has none.
    pub fn emit(&self, line: &Line) -> bool {
        let Some(sink) = &self.sink else { return false };
        let json = serde_json::to_string(line).expect("a line serializes");
        let mut out = sink.lock().expect("stdout lock");
        // A harness that went away: nothing to tell it any more.
        let _ = writeln!(out, "{json}").and_then(|()| out.flush());
        true
    }

    /// Appends an operation.
    pub fn op(&self, op: Op) {
        if !self.emit(&Line::Op(op.clone())) {
            self.history.lock().expect("history lock").ops.push(op);
        }
    }

    /// Appends a fault, timed now.
    pub fn event(&self, what: impl Into<String>) {
        let at = self.now();
        self.history
            .lock()
            .expect("history lock")
            .events
            .push(Event {
                at,
                what: what.into(),
            });
    }

    /// A copy of everything recorded so far.
    pub fn snapshot(&self) -> History {
        self.history.lock().expect("history lock").clone()
    }
}
