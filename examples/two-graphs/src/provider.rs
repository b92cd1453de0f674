//! The fake model provider, which refuses unmatched tool items as the OpenAI
//! Responses API does, and the tools the graphs run.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::watch;

use crate::{FAST_TOOL, Item, Observer, RequestRecord, SLOW_TOOL, TurnError};

/// The OpenAI Responses API's rules for tool items: every call needs its
/// output later in the input, every output needs an earlier call, and ids
/// are unique.
pub fn validate(input: &[Item]) -> Result<(), String> {
    let mut calls = HashSet::new();
    let mut outputs = HashSet::new();
    for (i, item) in input.iter().enumerate() {
        match item {
            Item::FunctionCall { call_id, .. } => {
                if !calls.insert(call_id) {
                    return Err(format!("Duplicate item found with id {call_id}."));
                }
                let answered = input[i + 1..].iter().any(|later| {
                    matches!(later, Item::FunctionCallOutput { call_id: c, .. } if c == call_id)
                });
                if !answered {
                    return Err(format!("No tool output found for function call {call_id}."));
                }
            }
            Item::FunctionCallOutput { call_id, .. } => {
                if !calls.contains(call_id) {
                    return Err(format!(
                        "No tool call found for function call output with call_id {call_id}."
                    ));
                }
                if !outputs.insert(call_id) {
                    return Err(format!("Duplicate item found with id {call_id}."));
                }
            }
            Item::Message { .. } => {}
        }
    }
    Ok(())
}

/// A model provider that enforces [`validate`] and answers by rote: a user
/// message naming a tool gets a call to it, a tool output gets a summary.
pub struct FakeProvider {
    observer: Arc<Observer>,
}

impl FakeProvider {
    pub fn new(observer: Arc<Observer>) -> FakeProvider {
        FakeProvider { observer }
    }

    pub fn respond(&self, graph: &str, input: Vec<Item>) -> Result<Vec<Item>, TurnError> {
        let unresolved_elsewhere = self.observer.unresolved_elsewhere(graph);
        let outcome = validate(&input).map(|()| self.model(&input));
        self.observer.note(
            graph,
            match &outcome {
                Ok(_) => format!("sent a request of {} items: accepted", input.len()),
                Err(e) => format!("sent a request of {} items: refused: {e}", input.len()),
            },
        );
        self.observer.record(RequestRecord {
            graph: graph.into(),
            input,
            unresolved_elsewhere,
            outcome: outcome.clone(),
        });
        outcome.map_err(TurnError::Provider)
    }

    fn model(&self, input: &[Item]) -> Vec<Item> {
        match input.last() {
            Some(Item::Message { role, content }) if role == "user" => {
                match [SLOW_TOOL, FAST_TOOL]
                    .into_iter()
                    .find(|t| content.contains(t))
                {
                    Some(tool) => vec![Item::FunctionCall {
                        call_id: self.observer.new_call_id(),
                        name: tool.into(),
                    }],
                    None => vec![Item::assistant("Hello.")],
                }
            }
            Some(Item::FunctionCallOutput { call_id, output }) => {
                vec![Item::assistant(format!("{call_id} returned {output:?}."))]
            }
            _ => vec![Item::assistant("Done.")],
        }
    }
}

/// The tools: the slow one runs until the scenario lets it finish.
pub struct Tools {
    observer: Arc<Observer>,
    /// Set when the slow tool may return.
    slow_may_finish: watch::Sender<bool>,
}

impl Tools {
    pub fn new(observer: Arc<Observer>) -> Tools {
        Tools {
            observer,
            slow_may_finish: watch::Sender::new(false),
        }
    }

    pub async fn call(&self, graph: &str, name: &str) -> String {
        if name == SLOW_TOOL {
            self.observer.note(graph, format!("{SLOW_TOOL} started"));
            let mut may_finish = self.slow_may_finish.subscribe();
            let _ = may_finish.wait_for(|finish| *finish).await;
            self.observer.note(graph, format!("{SLOW_TOOL} finished"));
        } else {
            self.observer.note(graph, format!("{name} ran"));
        }
        format!("{name} result")
    }

    pub fn let_slow_finish(&self) {
        self.slow_may_finish.send_replace(true);
    }
}
