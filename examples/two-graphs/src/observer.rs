//! What the scenario saw: the timeline, the provider's requests and the
//! session's unanswered tool calls.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio::sync::watch;

use crate::Item;

/// One line of the timeline.
#[derive(Debug, Clone)]
pub struct Event {
    pub at_ms: u128,
    pub graph: String,
    pub what: String,
}

/// One request the provider received.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub graph: String,
    pub input: Vec<Item>,
    /// Tool calls another graph had written to the session and not yet
    /// answered when this request was sent.
    pub unresolved_elsewhere: Vec<String>,
    /// The items the provider returned, or its error message.
    pub outcome: Result<Vec<Item>, String>,
}

/// Records the timeline, the provider's requests and the session's
/// unanswered tool calls, for the report and the test's assertions.
pub struct Observer {
    /// When the scenario started.
    start: Instant,
    /// The timeline; a watch so the scenario can wait for an event.
    events: watch::Sender<Vec<Event>>,
    /// Calls written to the session without an output yet: (call id, graph).
    unresolved: Mutex<Vec<(String, String)>>,
    /// Every request the provider received.
    requests: Mutex<Vec<RequestRecord>>,
    /// Numbers tool calls across graphs and the provider.
    next_call: AtomicU64,
}

impl Observer {
    pub fn new() -> Observer {
        Observer {
            start: Instant::now(),
            events: watch::Sender::new(Vec::new()),
            unresolved: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            next_call: AtomicU64::new(1),
        }
    }

    pub fn note(&self, graph: &str, what: impl Into<String>) {
        let event = Event {
            at_ms: self.start.elapsed().as_millis(),
            graph: graph.into(),
            what: what.into(),
        };
        self.events.send_modify(|events| events.push(event));
    }

    /// Waits until `graph` has noted something containing `what`.
    pub async fn wait_for(&self, graph: &str, what: &str) {
        let mut events = self.events.subscribe();
        let _ = events
            .wait_for(|events| {
                events
                    .iter()
                    .any(|e| e.graph == graph && e.what.contains(what))
            })
            .await;
    }

    pub fn timeline(&self) -> Vec<Event> {
        self.events.borrow().clone()
    }

    pub fn requests(&self) -> Vec<RequestRecord> {
        self.requests.lock().unwrap().clone()
    }

    pub(crate) fn record(&self, request: RequestRecord) {
        self.requests.lock().unwrap().push(request);
    }

    pub(crate) fn new_call_id(&self) -> String {
        format!("call_{}", self.next_call.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn appended(&self, graph: &str, items: &[Item]) {
        let mut unresolved = self.unresolved.lock().unwrap();
        for item in items {
            match item {
                Item::FunctionCall { call_id, .. } => {
                    unresolved.push((call_id.clone(), graph.to_owned()));
                }
                Item::FunctionCallOutput { call_id, .. } => {
                    unresolved.retain(|(c, _)| c != call_id)
                }
                Item::Message { .. } => {}
            }
        }
    }

    pub(crate) fn unresolved_elsewhere(&self, graph: &str) -> Vec<String> {
        let unresolved = self.unresolved.lock().unwrap();
        unresolved
            .iter()
            .filter(|(_, owner)| owner != graph)
            .map(|(call, _)| call.clone())
            .collect()
    }
}

impl Default for Observer {
    fn default() -> Self {
        Self::new()
    }
}
