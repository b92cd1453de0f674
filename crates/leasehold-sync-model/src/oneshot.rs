//! A loom stand-in for `tokio::sync::oneshot` with the semantics the engine
//! relies on: `send` fails once the receiver is gone, `is_closed` tells the
//! sender so, and a value sent before the receiver goes is lost with it.

use loom::sync::{Arc, Condvar, Mutex};

#[derive(Debug, Default)]
struct Slot<T> {
    value: Option<T>,
    receiver_gone: bool,
    sender_gone: bool,
}

#[derive(Debug)]
struct Channel<T> {
    slot: Mutex<Slot<T>>,
    changed: Condvar,
}

/// The sending half (`Waiter(oneshot::Sender<Delivery>)`).
#[derive(Debug)]
pub struct Sender<T>(Arc<Channel<T>>);

/// The receiving half, held by the waiting request.
#[derive(Debug)]
pub struct Receiver<T>(Arc<Channel<T>>);

pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let channel = Arc::new(Channel {
        slot: Mutex::new(Slot {
            value: None,
            receiver_gone: false,
            sender_gone: false,
        }),
        changed: Condvar::new(),
    });
    (Sender(channel.clone()), Receiver(channel))
}

impl<T> Sender<T> {
    /// # Errors
    /// Gives `value` back when the receiver is gone.
    pub fn send(self, value: T) -> Result<(), T> {
        let mut slot = self.0.slot.lock().unwrap();
        if slot.receiver_gone {
            return Err(value);
        }
        slot.value = Some(value);
        self.0.changed.notify_all();
        Ok(())
    }

    pub fn is_closed(&self) -> bool {
        self.0.slot.lock().unwrap().receiver_gone
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut slot = self.0.slot.lock().unwrap();
        slot.sender_gone = true;
        self.0.changed.notify_all();
    }
}

impl<T> Receiver<T> {
    /// Waits for the value; `None` when the sender went without sending.
    pub fn recv(self) -> Option<T> {
        let mut slot = self.0.slot.lock().unwrap();
        loop {
            if let Some(value) = slot.value.take() {
                return Some(value);
            }
            if slot.sender_gone {
                return None;
            }
            slot = self.0.changed.wait(slot).unwrap();
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut slot = self.0.slot.lock().unwrap();
        slot.receiver_gone = true;
        // A value sent but never received is lost with the receiver.
        slot.value = None;
    }
}
