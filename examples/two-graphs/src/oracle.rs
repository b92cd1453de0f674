//! Judging the outcome: what the test asserts and the demo reports.

use crate::{Item, Outcome, RequestRecord};

/// Requests sent while another graph's tool call was unanswered.
pub fn sent_during_foreign_tools(outcome: &Outcome) -> Vec<&RequestRecord> {
    outcome
        .requests
        .iter()
        .filter(|r| !r.unresolved_elsewhere.is_empty())
        .collect()
}

/// The provider's refusals.
pub fn refusals(outcome: &Outcome) -> Vec<&str> {
    outcome
        .requests
        .iter()
        .filter_map(|r| r.outcome.as_ref().err().map(String::as_str))
        .collect()
}

/// Accepted requests that continue after `call_id`'s output (end with it).
pub fn continuations_of(outcome: &Outcome, call_id: &str) -> usize {
    outcome
        .requests
        .iter()
        .filter(|r| r.outcome.is_ok())
        .filter(|r| {
            matches!(r.input.last(), Some(Item::FunctionCallOutput { call_id: c, .. }) if c == call_id)
        })
        .count()
}

/// What is wrong with a transcript: a call not answered exactly once, or
/// not answered by the very next item; an output without its call.
/// Independent of `leasehold-transcript` on purpose: it is stricter (two graphs' interleaved calls read as one healthy parallel-call turn there).
pub fn transcript_problems(transcript: &[Item]) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, item) in transcript.iter().enumerate() {
        match item {
            Item::FunctionCall { call_id, .. } => {
                let outputs = transcript
                    .iter()
                    .filter(|o| matches!(o, Item::FunctionCallOutput { call_id: c, .. } if c == call_id))
                    .count();
                if outputs != 1 {
                    problems.push(format!("{call_id} has {outputs} outputs"));
                }
                let answered_next = matches!(
                    transcript.get(i + 1),
                    Some(Item::FunctionCallOutput { call_id: c, .. }) if c == call_id
                );
                if outputs == 1 && !answered_next {
                    problems.push(format!("{call_id} is not answered right after it"));
                }
            }
            Item::FunctionCallOutput { call_id, .. } => {
                let called = transcript[..i]
                    .iter()
                    .any(|c| matches!(c, Item::FunctionCall { call_id: id, .. } if id == call_id));
                if !called {
                    problems.push(format!("output for {call_id} has no call before it"));
                }
            }
            Item::Message { .. } => {}
        }
    }
    problems
}
