//! Transcript integrity: find and repair broken tool-call pairing in LLM chat
//! histories before they are sent to a model provider.
//!
//! Ownership of a session stops new corruption, but it does not heal a
//! session that is already corrupted, nor catch a malformed history built by
//! a bug. Providers reject such a history with a 400 on every resume, so an
//! agent server needs one trustworthy check right before it sends history,
//! and a repair that keeps every genuine result.
//!
//! # Formats
//!
//! Three wire formats are understood (see [`Format`]); the format is detected
//! from the tool calls and results in the messages, or named by the caller:
//!
//! - **OpenAI Chat Completions**: an assistant message lists calls in
//!   `tool_calls[].id`; each result is its own `{"role": "tool",
//!   "tool_call_id": ...}` message.
//! - **Anthropic Messages**: an assistant message holds `{"type": "tool_use",
//!   "id": ...}` content blocks; results are `{"type": "tool_result",
//!   "tool_use_id": ...}` blocks in the next user message, before any text.
//! - **OpenAI Responses**: items `{"type": "function_call", "call_id": ...}`
//!   answered by `{"type": "function_call_output", "call_id": ...}`, and the
//!   same for every other client-side `*_call` / `*_call_output` pair.
//!   Server-side calls (`web_search_call` and friends) carry no `call_id` and
//!   need no output, so they are not tracked.
//!
//! Input is a JSON array of messages or JSONL (one message per line). Fields
//! this module does not know are kept untouched; see [`Transcript`].
//!
//! # The pairing rule
//!
//! A *turn* is one assistant message (Chat, Anthropic) or one run of model
//! output items between two input items (Responses). Every call a turn makes
//! needs exactly one result, and that result must sit in the turn's *reply*:
//! the tool messages or output items that directly follow the turn (Chat,
//! Responses), or the one user message right after it, with every
//! `tool_result` block ahead of any other block (Anthropic). Results within a
//! reply may come in any order. Anything else is a [`Finding`]; see
//! [`FindingKind`] for the list and the provider error each one causes.
//!
//! An assistant message counts as a turn boundary even when it makes tool
//! calls itself, a dictionary keyed by call id counts duplicates instead of
//! overwriting them, and results whose call never appears are looked for:
//! these are the three blind spots that let corrupted sessions look healthy.
//!
//! # Repair
//!
//! [`repair`](fn@repair) keeps the genuine result of each call (a real result beats a
//! placeholder, a result already in place beats a moved one, then the
//! earliest wins), moves it into its turn's reply, drops the other copies and
//! any result without a call, and gives a call with no result an explicit
//! unknown-outcome placeholder (see [`PLACEHOLDER_MARKER`]), never an invented
//! success. A call id used by more than one call is left alone and reported,
//! because nothing says which result belongs to which call. Every change is
//! listed as a [`RepairAction`].
//!
//! # Performance
//!
//! [`Transcript::parse`] validates the text (exactly as parsing into
//! `serde_json::Value`s would) and records where each message is, without
//! building the messages' trees: a byte-level validator accepts the common
//! case, and serde_json itself decides anything it is not sure of (numbers
//! with an exponent, surrogate escapes, deep nesting). Diagnosis reads each
//! message through a borrowed view that keeps only what pairing needs (role
//! or item type, call ids, result ids, block types), found by a scanner
//! that relies on that validation and only looks for where things end;
//! format detection happens in the same pass. It is one pass over the
//! messages, with a hash map keyed by call id whose entries count calls and
//! results, and small fixed-size records per message, call and result. A
//! message's `Value` is built only when asked for
//! ([`Transcript::messages`], [`Transcript::message`]) or when a repair
//! rewrites it; untouched messages are written back from their text.
//! Use [`Transcript::parse_owned`] when the text is no longer needed, so the
//! transcript keeps it instead of a copy. `benches/transcript.rs` measures
//! all of this; `docs/benchmarks.md` has numbers.

// Module order, each importing only modules before it (and the crate
// root's `TranscriptError`): view, validate, text, format, pairing,
// placeholder, diagnose, repair.
mod diagnose;
mod format;
mod pairing;
mod placeholder;
mod repair;
mod text;
mod validate;
mod view;

pub use diagnose::{Finding, FindingKind, Report, diagnose, render_human};
pub use format::{Format, detect};
pub use placeholder::{DEFAULT_PLACEHOLDER_MARKERS, PLACEHOLDER_MARKER, PLACEHOLDER_TEXT};
pub use repair::{DropReason, RepairAction, RepairOptions, Repaired, repair};
pub use text::{Layout, Transcript};

/// Diagnoses `transcript` for sending: `Ok(None)` when it has no tool calls
/// or results at all (nothing to pair, so nothing can be wrong), otherwise
/// the report. The CLI, the gRPC service and the client's gate all use this.
///
/// # Errors
/// What [`diagnose`](fn@diagnose) returns, except [`TranscriptError::FormatNotDetected`]
/// when no format was named.
pub fn check(
    transcript: &Transcript,
    format: Option<Format>,
) -> Result<Option<Report>, TranscriptError> {
    tool_free_as_none(transcript, format, diagnose(transcript, format))
}

/// Repairs `transcript` for sending: `Ok(None)` when it has no tool calls or
/// results at all (it is sent unchanged), otherwise what [`repair`](fn@repair) made.
///
/// # Errors
/// As for [`check`].
pub fn repair_checked(
    transcript: &Transcript,
    format: Option<Format>,
    options: &RepairOptions,
) -> Result<Option<Repaired>, TranscriptError> {
    tool_free_as_none(transcript, format, repair(transcript, format, options))
}

/// Turns "no format detected" into `None` (nothing to pair), unless a
/// message is not an object, which is unreadable whatever the format.
fn tool_free_as_none<T>(
    transcript: &Transcript,
    format: Option<Format>,
    result: Result<T, TranscriptError>,
) -> Result<Option<T>, TranscriptError> {
    match result {
        Err(TranscriptError::FormatNotDetected) if format.is_none() => {
            match transcript.first_non_object() {
                Some(index) => Err(TranscriptError::NotAnObject {
                    index,
                    line: transcript.line(index),
                }),
                None => Ok(None),
            }
        }
        other => other.map(Some),
    }
}

/// Why a transcript could not be read or checked.
#[derive(Debug, thiserror::Error)]
pub enum TranscriptError {
    /// The input is neither a JSON array nor JSON lines.
    #[error("invalid JSON at line {line}: {source}")]
    InvalidJson {
        /// 1-based line of the input where parsing failed.
        line: usize,
        /// What the JSON parser said.
        source: serde_json::Error,
    },
    /// A message is a JSON value other than an object, so it has no role.
    #[error("message {index}{} is not a JSON object", line_suffix(*.line))]
    NotAnObject {
        /// 0-based index of the message.
        index: usize,
        /// 1-based line of the message, for JSONL input.
        line: Option<usize>,
    },
    /// No message carries a tool call or result, so nothing tells the formats
    /// apart.
    #[error(
        "cannot detect the transcript format: no tool calls or results found; name it as openai-chat, anthropic or openai-responses"
    )]
    FormatNotDetected,
    /// Messages carry tool activity of more than one format; checking against
    /// either would miss the other's calls.
    #[error("the transcript mixes formats ({}); name the one to check against", list_formats(.0))]
    FormatAmbiguous(Vec<Format>),
    /// A format name that is not one of the three known names.
    #[error("unknown transcript format {0:?}; expected openai-chat, anthropic or openai-responses")]
    UnknownFormat(String),
}

fn line_suffix(line: Option<usize>) -> String {
    line.map(|line| format!(" (line {line})"))
        .unwrap_or_default()
}

fn list_formats(formats: &[Format]) -> String {
    formats
        .iter()
        .map(Format::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
