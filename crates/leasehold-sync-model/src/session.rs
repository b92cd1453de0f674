//! The Session stream's window: operations read while fewer than the window
//! are in flight, answers yielded as they complete.
//!
//! Mirrors `grpc::SessionPipe::poll_next` (in `leasehold-server/src/grpc`),
//! with a window of 1 instead of 1024. Its parts are stand-ins with the
//! contracts the pipe relies on: the inbound stream (tonic's `Streaming`)
//! registers the task before it answers `Pending`; an operation's future
//! (the engine's reply) does the same and is completed by another thread;
//! the set of pending operations (`FuturesUnordered`) polls each of them,
//! answers `None` when empty, and `Pending` otherwise.
//!
//! Checked: every operation sent is answered and the stream ends, whatever
//! the interleaving of the client, the engine and the task polling the pipe.
//! A lost wake-up leaves the polling task parked for good: loom reports a
//! deadlock.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::task::{Context, Poll};

use loom::future::AtomicWaker;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

/// The window of the model (`SESSION_WINDOW` is 1024).
pub const WINDOW: usize = 1;

/// Which bug to plant in the model (`None`: the pipe as it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    None,
    /// A full window answers `Pending` at once, without polling the pending
    /// operations: nothing registers the task with them, so their
    /// completion wakes nobody.
    FullWindowPendsAtOnce,
}

/// The client's half of the stream (tonic's `Streaming`).
#[derive(Default)]
struct Inbound {
    /// Messages sent and not yet read, and whether the client half-closed.
    queue: Mutex<(VecDeque<u32>, bool)>,
    reader: AtomicWaker,
}

impl Inbound {
    fn send(&self, id: u32) {
        self.queue.lock().unwrap().0.push_back(id);
        self.reader.wake();
    }

    fn close(&self) {
        self.queue.lock().unwrap().1 = true;
        self.reader.wake();
    }

    fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Option<u32>> {
        self.reader.register_by_ref(cx.waker());
        let mut queue = self.queue.lock().unwrap();
        match queue.0.pop_front() {
            Some(id) => Poll::Ready(Some(id)),
            None if queue.1 => Poll::Ready(None),
            None => Poll::Pending,
        }
    }
}

/// One operation's reply, completed by the engine thread.
struct Operation {
    id: u32,
    done: AtomicBool,
    waiter: AtomicWaker,
}

impl Operation {
    fn poll(&self, cx: &mut Context<'_>) -> Poll<u32> {
        self.waiter.register_by_ref(cx.waker());
        if self.done.load(Ordering::Acquire) {
            Poll::Ready(self.id)
        } else {
            Poll::Pending
        }
    }

    fn complete(&self) {
        self.done.store(true, Ordering::Release);
        self.waiter.wake();
    }
}

/// The engine: operations are applied when started and completed later by
/// its own thread (the writer's commit).
#[derive(Default)]
struct Engine {
    started: Mutex<VecDeque<Arc<Operation>>>,
    work: Condvar,
}

impl Engine {
    fn start(&self, id: u32) -> Arc<Operation> {
        let operation = Arc::new(Operation {
            id,
            done: AtomicBool::new(false),
            waiter: AtomicWaker::new(),
        });
        self.started.lock().unwrap().push_back(operation.clone());
        self.work.notify_one();
        operation
    }

    /// Completes `count` operations, in the order they were started.
    fn run(&self, count: usize) {
        for _ in 0..count {
            let mut started = self.started.lock().unwrap();
            while started.is_empty() {
                started = self.work.wait(started).unwrap();
            }
            let operation = started.pop_front().unwrap();
            drop(started);
            operation.complete();
        }
    }
}

/// `SessionPipe`, the parts its window uses.
struct Pipe {
    plant: Plant,
    engine: Arc<Engine>,
    /// `None` once the client half-closed.
    inbound: Option<Arc<Inbound>>,
    /// The stand-in for `FuturesUnordered`.
    pending: Vec<Arc<Operation>>,
}

impl Pipe {
    /// `FuturesUnordered::poll_next`.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<Option<u32>> {
        if self.pending.is_empty() {
            return Poll::Ready(None);
        }
        for index in 0..self.pending.len() {
            if let Poll::Ready(id) = self.pending[index].poll(cx) {
                self.pending.remove(index);
                return Poll::Ready(Some(id));
            }
        }
        Poll::Pending
    }

    /// `SessionPipe::poll_next`.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<u32>> {
        while self.pending.len() < WINDOW {
            let Some(inbound) = self.inbound.as_ref() else {
                break;
            };
            match inbound.poll_next(cx) {
                Poll::Ready(Some(id)) => self.pending.push(self.engine.start(id)),
                Poll::Ready(None) => self.inbound = None,
                Poll::Pending => break,
            }
        }
        if self.plant == Plant::FullWindowPendsAtOnce && self.pending.len() >= WINDOW {
            return Poll::Pending;
        }
        match self.poll_pending(cx) {
            Poll::Ready(Some(id)) => Poll::Ready(Some(id)),
            Poll::Ready(None) if self.inbound.is_none() => Poll::Ready(None),
            _ => Poll::Pending,
        }
    }
}

/// A client sends `count` operations and half-closes; the engine completes
/// them; the main thread polls the pipe as tonic's encoder does (until
/// `Pending`, then waits to be woken). Every operation must be answered,
/// and the stream must end.
pub fn stream(plant: Plant, count: u32) {
    let inbound = Arc::new(Inbound::default());
    let engine = Arc::new(Engine::default());
    let client = {
        let inbound = inbound.clone();
        thread::spawn(move || {
            for id in 1..=count {
                inbound.send(id);
            }
            inbound.close();
        })
    };
    let completing = {
        let engine = engine.clone();
        thread::spawn(move || engine.run(count as usize))
    };
    let mut pipe = Pipe {
        plant,
        engine,
        inbound: Some(inbound),
        pending: Vec::new(),
    };
    let mut answered = Vec::new();
    loom::future::block_on(poll_fn(|cx| {
        loop {
            match pipe.poll_next(cx) {
                Poll::Ready(Some(id)) => answered.push(id),
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    }));
    client.join().unwrap();
    completing.join().unwrap();
    answered.sort_unstable();
    assert_eq!(
        answered,
        (1..=count).collect::<Vec<_>>(),
        "every operation answered once"
    );
}
