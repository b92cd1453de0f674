//! The fenced store: the storage a worker writes its results to, which
//! accepts a write for a key only when its fence is at least the highest it
//! has accepted for that key (as `leasehold_client::fence::sqlite` does in
//! an application's own database). Every write, accepted or refused, goes
//! into the history with the store's own order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::history::{Call, Line, Op, Outcome, Recorder, Reply};

/// A cheap-to-clone handle on one in-memory fenced store.
#[derive(Debug, Clone, Default)]
pub struct FencedStore {
    /// Highest accepted fence per key, and the count of accepted writes
    /// (the order the checker verifies). A std mutex: nothing awaits under it.
    state: Arc<Mutex<(HashMap<String, u64>, u64)>>,
}

impl FencedStore {
    pub fn new() -> FencedStore {
        FencedStore::default()
    }

    /// Writes on behalf of `worker` with `fence`; true when accepted. The
    /// write is recorded while the store's lock is held, so the history's
    /// sequence numbers are the store's order.
    ///
    /// In a worker process (a recorder writing to stdout) the write is sent
    /// to the harness's store instead, which decides and records it when
    /// it reads the line (it arrives a little later: a late write is what
    /// the store is for); the worker does not learn the verdict (true).
    pub fn write(&self, recorder: &Recorder, worker: u32, key: &str, fence: u64) -> bool {
        let line = Line::Write {
            worker,
            key: key.to_owned(),
            fence,
        };
        if recorder.emit(&line) {
            return true;
        }
        let mut state = self.state.lock().expect("store lock");
        let (highest, accepted) = &mut *state;
        let top = highest.get(key).copied().unwrap_or(0);
        let reply = if fence >= top {
            highest.insert(key.to_owned(), fence);
            *accepted += 1;
            Reply::Accepted { seq: *accepted }
        } else {
            Reply::Rejected { highest: top }
        };
        let ok = matches!(reply, Reply::Accepted { .. });
        let at = recorder.now();
        recorder.op(Op {
            worker,
            key: key.to_owned(),
            call: Call::Write { fence },
            invoked: at,
            completed: at,
            outcome: Outcome::Ok(reply),
        });
        ok
    }
}
