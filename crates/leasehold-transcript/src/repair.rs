//! Repair: keep the genuine result of each call, put it where the provider
//! wants it, and list every change.

use serde::Serialize;
use serde_json::Value;

use super::TranscriptError;
use super::diagnose::{Finding, report_from};
use super::format::{self, Format};
use super::pairing::{Pairing, Placement};
use super::placeholder::{DEFAULT_PLACEHOLDER_MARKERS, PLACEHOLDER_TEXT, is_placeholder};
use super::text::{Message, Transcript};

/// How [`repair`] recognises placeholder results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairOptions {
    /// Substrings that mark a result as another tool's placeholder, so a real
    /// result for the same call wins over it. Results holding
    /// [`PLACEHOLDER_MARKER`](super::PLACEHOLDER_MARKER) are always
    /// placeholders. Empty strings are ignored.
    pub extra_placeholder_markers: Vec<String>,
}

impl Default for RepairOptions {
    fn default() -> Self {
        RepairOptions {
            extra_placeholder_markers: DEFAULT_PLACEHOLDER_MARKERS
                .iter()
                .map(|marker| marker.to_string())
                .collect(),
        }
    }
}

/// Why a result was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// Another copy of the result for the same call was kept.
    Duplicate,
    /// A placeholder, dropped because the real result was found.
    SupersededPlaceholder,
    /// No call uses the result's id.
    Orphan,
}

/// One change made by [`repair`], for audit. Message indices before the
/// change refer to the input, indices after it to the repaired transcript.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum RepairAction {
    /// A result was moved into the reply to its call, unchanged.
    Moved {
        /// The call the result answers.
        call_id: String,
        /// Input message the result was in.
        from: usize,
        /// Repaired message it is in now.
        to: usize,
    },
    /// A result was removed.
    Dropped {
        /// The id the result quotes.
        call_id: String,
        /// Input message the result was in.
        index: usize,
        /// Why it went.
        reason: DropReason,
    },
    /// An unknown-outcome placeholder was added for a call with no result.
    Inserted {
        /// The call it answers.
        call_id: String,
        /// Repaired message it is in.
        index: usize,
    },
}

/// The outcome of [`repair`].
#[derive(Debug, Clone)]
pub struct Repaired {
    /// The repaired transcript, in the input's layout. Identical to the
    /// input when nothing needed repair.
    pub transcript: Transcript,
    /// Every change, in the order the output was written.
    pub actions: Vec<RepairAction>,
    /// What is still wrong after repair (findings on the repaired
    /// transcript, so indices point into it): calls whose id is reused, left
    /// for a person rather than guessed. Empty when the output is healthy.
    pub unrecoverable: Vec<Finding>,
}

/// Repairs tool-call pairing; see the module docs for the rules.
///
/// Payloads, ids and the order of all other messages are kept. Repair is
/// idempotent, and a healthy transcript comes back unchanged.
///
/// # Errors
///
/// The same as [`diagnose`](fn@super::diagnose): the format cannot be detected,
/// or a message is not a JSON object.
pub fn repair(
    transcript: &Transcript,
    format: Option<Format>,
    options: &RepairOptions,
) -> Result<Repaired, TranscriptError> {
    let pairing = Pairing::build(transcript, format)?;
    let format = pairing.format;
    let plan = Plan::new(transcript, &pairing, options);
    if !plan.changes_anything {
        // Whatever is still wrong concerns reused ids only, which repair
        // leaves alone.
        return Ok(Repaired {
            transcript: transcript.clone(),
            actions: Vec::new(),
            unrecoverable: report_from(transcript, &pairing).findings,
        });
    }
    let mut writer = Writer {
        transcript,
        pairing: &pairing,
        plan: &plan,
        out: Vec::with_capacity(transcript.len() + 16),
        actions: Vec::new(),
    };
    match format {
        Format::Anthropic => writer.write_anthropic(),
        Format::OpenAiChat | Format::OpenAiResponses => writer.write_result_messages(),
    }
    let Writer { out, actions, .. } = writer;
    let repaired = Transcript::rebuilt(out, transcript.layout(), transcript.source().clone());
    let unrecoverable = report_from(&repaired, &Pairing::build(&repaired, Some(format))?).findings;
    Ok(Repaired {
        transcript: repaired,
        actions,
        unrecoverable,
    })
}

/// What happens to one result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Stays where it is.
    Keep,
    /// Anthropic: stays in its message but moves ahead of text blocks.
    Front,
    /// Goes into the reply to its call.
    Move,
    /// Removed.
    Drop(DropReason),
    /// Its id is reused: left exactly where it is.
    Leave,
}

/// A result to write into a turn's reply.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// An existing result, by index into [`Pairing::results`].
    Moved(usize),
    /// A placeholder for a call, by index into [`Pairing::calls`].
    Inserted(usize),
}

/// Every decision, made before any output is written.
struct Plan {
    /// One fate per result, indexed like [`Pairing::results`].
    fates: Vec<Fate>,
    /// Results to add to each turn's reply, in the turn's call order.
    additions: Vec<Vec<Source>>,
    /// Turns whose reply must be rewritten.
    touched: Vec<bool>,
    /// False when the transcript can be returned as it is.
    changes_anything: bool,
}

impl Plan {
    fn new(transcript: &Transcript, pairing: &Pairing<'_>, options: &RepairOptions) -> Plan {
        let mut plan = Plan {
            fates: vec![Fate::Keep; pairing.results.len()],
            additions: vec![Vec::new(); pairing.turns.len()],
            touched: vec![false; pairing.turns.len()],
            changes_anything: false,
        };
        for (position, site) in pairing.results.iter().enumerate() {
            let entry = pairing.entries[site.entry as usize];
            if entry.calls == 0 {
                plan.fates[position] = Fate::Drop(DropReason::Orphan);
            } else if entry.calls > 1 {
                plan.fates[position] = Fate::Leave;
            }
        }
        let is_placeholder_at = |position: usize| {
            let site = &pairing.results[position];
            transcript
                .message(site.index())
                .and_then(|message| format::result_payload(pairing.format, message, site.block()))
                .is_some_and(|payload| is_placeholder(payload, &options.extra_placeholder_markers))
        };
        for (position, site) in pairing.calls.iter().enumerate() {
            let entry = pairing.entries[site.entry as usize];
            if entry.calls != 1 {
                continue;
            }
            let keeper = if entry.results > 1 {
                pairing
                    .results_of(site.entry as usize)
                    .min_by_key(|&result| {
                        (
                            is_placeholder_at(result),
                            pairing.results[result].placement.rank(),
                            result,
                        )
                    })
            } else {
                entry.first_result.get()
            };
            let Some(keeper) = keeper else {
                plan.additions[site.turn as usize].push(Source::Inserted(position));
                plan.touched[site.turn as usize] = true;
                continue;
            };
            if entry.results > 1 {
                let keeper_is_real = !is_placeholder_at(keeper);
                for result in pairing.results_of(site.entry as usize) {
                    if result != keeper {
                        plan.fates[result] =
                            Fate::Drop(if keeper_is_real && is_placeholder_at(result) {
                                DropReason::SupersededPlaceholder
                            } else {
                                DropReason::Duplicate
                            });
                    }
                }
            }
            match pairing.results[keeper].placement {
                Placement::InPlace => {}
                Placement::TextBefore => {
                    plan.fates[keeper] = Fate::Front;
                    plan.touched[site.turn as usize] = true;
                }
                _ => {
                    plan.fates[keeper] = Fate::Move;
                    plan.additions[site.turn as usize].push(Source::Moved(keeper));
                    plan.touched[site.turn as usize] = true;
                }
            }
        }
        plan.changes_anything = plan.touched.contains(&true)
            || plan
                .fates
                .iter()
                .any(|fate| !matches!(fate, Fate::Keep | Fate::Leave));
        plan
    }
}

/// Writes the repaired messages from the plan.
struct Writer<'a, 'l> {
    transcript: &'a Transcript,
    pairing: &'l Pairing<'a>,
    plan: &'l Plan,
    out: Vec<Message>,
    actions: Vec<RepairAction>,
}

impl Writer<'_, '_> {
    /// Chat and Responses: each result is a message of its own, so a result
    /// is kept, skipped, or copied to right after its turn's reply.
    fn write_result_messages(&mut self) {
        let messages = self.transcript.raw_messages();
        let mut result_at = 0;
        let mut turn_at = 0;
        for (index, message) in messages.iter().enumerate() {
            let mut keep = true;
            while let Some(site) = self.pairing.results.get(result_at) {
                if site.index() != index {
                    break;
                }
                match self.plan.fates[result_at] {
                    Fate::Keep | Fate::Leave | Fate::Front => {}
                    Fate::Move => keep = false,
                    Fate::Drop(reason) => {
                        keep = false;
                        self.dropped(result_at, reason);
                    }
                }
                result_at += 1;
            }
            if keep {
                self.out.push(message.clone());
            }
            while let Some(turn) = self.pairing.turns.get(turn_at) {
                if turn.reply_end as usize != index {
                    break;
                }
                for &source in &self.plan.additions[turn_at] {
                    let to = self.out.len();
                    let added = match source {
                        Source::Moved(result) => {
                            let site = &self.pairing.results[result];
                            self.moved(site.id, site.index(), to);
                            messages[site.index()].clone()
                        }
                        Source::Inserted(call) => Message::new(self.placeholder(call, to)),
                    };
                    self.out.push(added);
                }
                turn_at += 1;
            }
        }
    }

    /// Anthropic: results are blocks inside user messages. The user message
    /// right after a turn is rebuilt with the turn's results first; when that
    /// message holds no results, a new user message is put in front of it so
    /// the user's own message stays exactly as it was.
    fn write_anthropic(&mut self) {
        let messages = self.transcript.raw_messages();
        let mut result_at = 0;
        let mut turn_at = 0;
        let mut rebuild_for: Option<usize> = None;
        for (index, message) in messages.iter().enumerate() {
            let first_result = result_at;
            while self
                .pairing
                .results
                .get(result_at)
                .is_some_and(|site| site.index() == index)
            {
                result_at += 1;
            }
            let results = first_result..result_at;
            match rebuild_for.take() {
                Some(turn) => self.write_reply(message, results, turn),
                None => self.write_without_moved(message, results),
            }
            if let Some(turn) = self.pairing.turns.get(turn_at) {
                if turn.message as usize == index {
                    if self.plan.touched[turn_at] {
                        let next_holds_results = messages
                            .get(index + 1)
                            .is_some_and(|next| holds_tool_results(self.transcript.value_of(next)));
                        if next_holds_results {
                            rebuild_for = Some(turn_at);
                        } else {
                            let to = self.out.len();
                            let content = self.additions(turn_at, to);
                            self.out.push(Message::new(
                                serde_json::json!({ "role": "user", "content": content }),
                            ));
                        }
                    }
                    turn_at += 1;
                }
            }
        }
    }

    /// Writes a message minus its moved and dropped result blocks; a message
    /// left with no content is removed.
    fn write_without_moved(&mut self, message: &Message, results: std::ops::Range<usize>) {
        let mut removed = Vec::new();
        for result in results {
            match self.plan.fates[result] {
                Fate::Keep | Fate::Leave | Fate::Front => {}
                Fate::Move => removed.push(self.pairing.results[result].block()),
                Fate::Drop(reason) => {
                    self.dropped(result, reason);
                    removed.push(self.pairing.results[result].block());
                }
            }
        }
        if removed.is_empty() {
            self.out.push(message.clone());
            return;
        }
        let value = self.transcript.value_of(message);
        let blocks = format::blocks_of(value);
        let kept: Vec<Value> = blocks
            .iter()
            .enumerate()
            .filter(|(block, _)| !removed.contains(&Some(*block)))
            .map(|(_, value)| value.clone())
            .collect();
        if !kept.is_empty() {
            self.out.push(Message::new(with_content(value, kept)));
        }
    }

    /// Rebuilds the user message that answers `turn`: kept results, then
    /// moved and inserted ones in call order, then every other block.
    fn write_reply(&mut self, message: &Message, results: std::ops::Range<usize>, turn: usize) {
        let to = self.out.len();
        let value = self.transcript.value_of(message);
        let blocks = format::blocks_of(value);
        let mut content = Vec::with_capacity(blocks.len() + self.plan.additions[turn].len());
        let mut handled = vec![false; blocks.len()];
        for result in results {
            let site = self.pairing.results[result];
            let block = site.block().unwrap_or(usize::MAX);
            match self.plan.fates[result] {
                Fate::Keep | Fate::Front => {
                    if self.plan.fates[result] == Fate::Front {
                        self.moved(site.id, site.index(), to);
                    }
                    if let Some(value) = blocks.get(block) {
                        content.push(value.clone());
                    }
                }
                Fate::Move => {}
                Fate::Drop(reason) => self.dropped(result, reason),
                // Left in its original place among the other blocks.
                Fate::Leave => continue,
            }
            if let Some(handled) = handled.get_mut(block) {
                *handled = true;
            }
        }
        content.extend(self.additions(turn, to));
        content.extend(
            blocks
                .iter()
                .zip(&handled)
                .filter(|(_, handled)| !**handled)
                .map(|(value, _)| value.clone()),
        );
        self.out.push(Message::new(with_content(value, content)));
    }

    /// The blocks added to a turn's reply, recording each action.
    fn additions(&mut self, turn: usize, to: usize) -> Vec<Value> {
        let mut added = Vec::with_capacity(self.plan.additions[turn].len());
        for &source in &self.plan.additions[turn] {
            match source {
                Source::Moved(result) => {
                    let site = &self.pairing.results[result];
                    self.moved(site.id, site.index(), to);
                    let block = self
                        .transcript
                        .message(site.index())
                        .and_then(|message| message.get("content"))
                        .and_then(|content| content.get(site.block()?))
                        .cloned()
                        .unwrap_or(Value::Null);
                    added.push(block);
                }
                Source::Inserted(call) => added.push(self.placeholder(call, to)),
            }
        }
        added
    }

    fn placeholder(&mut self, call: usize, to: usize) -> Value {
        let call = self.pairing.call_ref(call);
        self.actions.push(RepairAction::Inserted {
            call_id: call.id.to_string(),
            index: to,
        });
        format::placeholder(self.pairing.format, &call, PLACEHOLDER_TEXT)
    }

    fn moved(&mut self, id: &str, from: usize, to: usize) {
        self.actions.push(RepairAction::Moved {
            call_id: id.to_string(),
            from,
            to,
        });
    }

    fn dropped(&mut self, result: usize, reason: DropReason) {
        let site = &self.pairing.results[result];
        self.actions.push(RepairAction::Dropped {
            call_id: site.id.to_string(),
            index: site.index(),
            reason,
        });
    }
}

/// True for a user message whose content holds at least one `tool_result`.
fn holds_tool_results(message: &Value) -> bool {
    message.get("role").and_then(Value::as_str) == Some("user")
        && format::blocks_of(message)
            .iter()
            .any(|block| format::block_type(block) == Some("tool_result"))
}

/// A copy of `message` with its content replaced, every other field and the
/// key order kept.
fn with_content(message: &Value, content: Vec<Value>) -> Value {
    let mut message = message.clone();
    if let Some(fields) = message.as_object_mut() {
        fields.insert("content".to_string(), Value::Array(content));
    }
    message
}
