//! The writer's sleep and wake-up, and replies that wait for durability.
//!
//! Mirrors `engine/writer.rs` (`write_loop`) and, in `engine/mod.rs`,
//! `Shared::with_lessor` (which wakes the writer), `Shared::wait_durable`
//! (which holds a reply back) and `Shared::stop_writer`.
//!
//! What the model keeps of the lessor: a sequence number per change, the
//! urgent flag (a reply waits for the change) and one key's holder with its
//! visible sequence. The store is a cell the writer "commits" a batch into;
//! the durable watch is a mutex and a condvar with the semantics of tokio's
//! `watch` (`wait_for` checks the current value first, then every change).
//!
//! One deliberate difference: the real writer sleeps with `wait_timeout`
//! (`lazy_flush`, 1 s by default); the model sleeps without a timeout. A lost
//! wake-up in the engine "only" holds urgent replies up to `lazy_flush`; in
//! the model it leaves the writer asleep for good, which loom reports as a
//! deadlock. Lazy changes (renewals, expiries) are not modelled.

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

/// Which bug to plant in the model (`None`: the engine as it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    None,
    /// The writer sets `writer_idle` after it has let go of the lessor lock
    /// (and takes it again to sleep): a change made in between sees the flag
    /// clear, does not notify, and the writer sleeps on it.
    IdleSetAfterUnlock,
    /// A request reads `writer_idle` before it makes its change: the writer
    /// may decide to sleep in between, and is never woken for the change.
    IdleReadBeforeChange,
    /// The writer publishes the durable sequence before the store has
    /// committed the batch: a reply may go out for a change a crash undoes.
    PublishBeforeCommit,
    /// A read (Check, Get) answers at once instead of waiting for the
    /// visible sequence of the key it describes.
    ReadAnswersAtOnce,
}

/// The part of `Lessor` the writer protocol sees.
#[derive(Debug, Default)]
struct Lessor {
    /// The sequence of the last change.
    seq: u64,
    /// Changes not yet taken into a batch (`has_dirty`).
    dirty: bool,
    /// A reply waits for one of them (`has_urgent`).
    urgent: bool,
    /// The key's holder, and the sequence of the change that made it so
    /// (`visible_seq`).
    holder: Option<u32>,
    visible_seq: u64,
}

/// What the store holds: the last committed batch.
#[derive(Debug, Default)]
struct Disk {
    seq: u64,
    holder: Option<u32>,
}

/// `engine::Durable`, behind a stand-in for `watch::Sender<Durable>`.
#[derive(Debug, Default)]
struct Durable {
    seq: u64,
}

/// `engine::Shared`, the parts this protocol uses.
struct Shared {
    plant: Plant,
    lessor: Mutex<Lessor>,
    writer_wake: Condvar,
    writer_idle: AtomicBool,
    durable: Mutex<Durable>,
    durable_changed: Condvar,
    disk: Mutex<Disk>,
    stopping: AtomicBool,
}

impl Shared {
    /// `Shared::with_lessor`: apply `f` locked; wake the writer after
    /// unlocking if the change is urgent and the writer sleeps.
    fn with_lessor<T>(&self, f: impl FnOnce(&mut Lessor) -> T) -> T {
        let early_idle = self.writer_idle.load(Ordering::Relaxed);
        let (out, wake_writer) = {
            let mut lessor = self.lessor.lock().unwrap();
            let out = f(&mut lessor);
            let idle = match self.plant {
                Plant::IdleReadBeforeChange => early_idle,
                _ => self.writer_idle.load(Ordering::Relaxed),
            };
            (out, lessor.urgent && idle)
        };
        if wake_writer {
            self.writer_wake.notify_one();
        }
        out
    }

    /// A grant: an urgent change whose reply reveals its sequence.
    fn grant(&self, owner: u32) -> u64 {
        self.with_lessor(|l| {
            l.seq += 1;
            l.dirty = true;
            l.urgent = true;
            l.holder = Some(owner);
            l.visible_seq = l.seq;
            l.seq
        })
    }

    /// A read: no change, but its reply reveals the key's visible sequence.
    fn read(&self) -> (Option<u32>, u64) {
        self.with_lessor(|l| (l.holder, l.visible_seq))
    }

    /// `Shared::wait_durable`.
    fn wait_durable(&self, seq: u64) {
        let mut durable = self.durable.lock().unwrap();
        while durable.seq < seq {
            durable = self.durable_changed.wait(durable).unwrap();
        }
    }

    /// The reply goes out: everything it reveals must be in the store.
    fn reply(&self, seq: u64) {
        let disk = self.disk.lock().unwrap();
        assert!(
            disk.seq >= seq,
            "reply before its commit: reveals sequence {seq}, the store has {}",
            disk.seq
        );
    }

    /// `store.commit(&batch)`.
    fn commit(&self, seq: u64, holder: Option<u32>) {
        let mut disk = self.disk.lock().unwrap();
        disk.seq = disk.seq.max(seq);
        disk.holder = holder;
    }

    /// `durable.send_modify(|d| d.seq = d.seq.max(batch.seq))`.
    fn publish(&self, seq: u64) {
        let mut durable = self.durable.lock().unwrap();
        durable.seq = durable.seq.max(seq);
        self.durable_changed.notify_all();
    }

    /// `Shared::write_loop`, without the lazy flush and the failure path.
    fn write_loop(&self) {
        let mut lessor = self.lessor.lock().unwrap();
        loop {
            let stopping = self.stopping.load(Ordering::Acquire);
            let due = lessor.urgent || (lessor.dirty && stopping);
            if due {
                // `take_batch_up_to`: everything changed so far.
                let batch = (lessor.seq, lessor.holder);
                lessor.urgent = false;
                lessor.dirty = false;
                drop(lessor);
                if self.plant == Plant::PublishBeforeCommit {
                    self.publish(batch.0);
                    self.commit(batch.0, batch.1);
                } else {
                    self.commit(batch.0, batch.1);
                    self.publish(batch.0);
                }
                lessor = self.lessor.lock().unwrap();
                continue;
            }
            if stopping {
                return;
            }
            if self.plant == Plant::IdleSetAfterUnlock {
                drop(lessor);
                self.writer_idle.store(true, Ordering::Relaxed);
                lessor = self.lessor.lock().unwrap();
            } else {
                self.writer_idle.store(true, Ordering::Relaxed);
            }
            lessor = self.writer_wake.wait(lessor).unwrap();
            self.writer_idle.store(false, Ordering::Relaxed);
        }
    }

    /// `Shared::stop_writer`.
    fn stop_writer(&self) {
        self.stopping.store(true, Ordering::Release);
        let _guard = self.lessor.lock().unwrap();
        self.writer_wake.notify_all();
    }
}

fn start(plant: Plant) -> (Arc<Shared>, thread::JoinHandle<()>) {
    let shared = Arc::new(Shared {
        plant,
        lessor: Mutex::new(Lessor::default()),
        writer_wake: Condvar::new(),
        writer_idle: AtomicBool::new(false),
        durable: Mutex::new(Durable::default()),
        durable_changed: Condvar::new(),
        disk: Mutex::new(Disk::default()),
        stopping: AtomicBool::new(false),
    });
    let writer = {
        let shared = shared.clone();
        thread::spawn(move || shared.write_loop())
    };
    (shared, writer)
}

/// Two grants from two request threads race the writer's sleep; each reply
/// waits for its sequence. Checks: no reply before its commit, and no
/// change left behind by a sleeping writer (else loom reports a deadlock:
/// a reply waits for a commit that never comes).
pub fn two_grants(plant: Plant) {
    let (shared, writer) = start(plant);
    let requests: Vec<_> = (1..=2)
        .map(|owner| {
            let shared = shared.clone();
            thread::spawn(move || {
                let seq = shared.grant(owner);
                shared.wait_durable(seq);
                shared.reply(seq);
            })
        })
        .collect();
    for request in requests {
        request.join().unwrap();
    }
    shared.stop_writer();
    writer.join().unwrap();
    assert_eq!(shared.disk.lock().unwrap().seq, 2, "every change committed");
}

/// A grant races a read of the same key: the read reveals the holder, so it
/// waits for the key's visible sequence, and is never answered with a holder
/// the store does not have yet.
pub fn grant_and_read(plant: Plant) {
    let (shared, writer) = start(plant);
    let granting = {
        let shared = shared.clone();
        thread::spawn(move || {
            let seq = shared.grant(1);
            shared.wait_durable(seq);
            shared.reply(seq);
        })
    };
    let (holder, visible) = shared.read();
    let wait_for = if plant == Plant::ReadAnswersAtOnce {
        0
    } else {
        visible
    };
    shared.wait_durable(wait_for);
    if holder.is_some() {
        assert_eq!(
            shared.disk.lock().unwrap().holder,
            holder,
            "read reveals a holder before its commit"
        );
    }
    granting.join().unwrap();
    shared.stop_writer();
    writer.join().unwrap();
}
