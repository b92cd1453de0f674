//! The three wire formats: how to recognise them, what each message means
//! for pairing, the placeholder result each accepts, and the error text each
//! provider returns.

use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value, json};

use super::TranscriptError;
use super::text::Transcript;
use super::view::{Text, View};

/// A provider's chat history format.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Format {
    /// OpenAI Chat Completions `messages`.
    #[serde(rename = "openai-chat")]
    OpenAiChat,
    /// Anthropic Messages `messages`.
    #[serde(rename = "anthropic")]
    Anthropic,
    /// OpenAI Responses `input` items.
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
}

impl Format {
    /// Every format, in a fixed order.
    pub const ALL: [Format; 3] = [
        Format::OpenAiChat,
        Format::Anthropic,
        Format::OpenAiResponses,
    ];

    /// The name used on the command line and in JSON output.
    pub fn name(self) -> &'static str {
        match self {
            Format::OpenAiChat => "openai-chat",
            Format::Anthropic => "anthropic",
            Format::OpenAiResponses => "openai-responses",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = TranscriptError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Format::ALL
            .into_iter()
            .find(|format| format.name() == name)
            .ok_or_else(|| TranscriptError::UnknownFormat(name.to_string()))
    }
}

/// Detects the format from the tool activity in the messages.
///
/// Returns `None` when no message carries a tool call or result (a plain
/// conversation looks the same in every format) or when messages carry tool
/// activity of more than one format. Messages that are not objects are
/// skipped here; [`diagnose`](fn@super::diagnose) reports them.
pub fn detect(transcript: &Transcript) -> Option<Format> {
    match detect_all(transcript).as_slice() {
        [format] => Some(*format),
        _ => None,
    }
}

/// Every format whose tool activity appears in the transcript.
pub(crate) fn detect_all(transcript: &Transcript) -> Vec<Format> {
    let mut seen = Seen::default();
    let mut view = View::default();
    for message in transcript.raw_messages() {
        match read_message(transcript, message, &mut view) {
            Read::View => seen.note_view(&view),
            Read::Tree(object) => seen.note_tree(object),
            Read::NotObject => {}
        }
    }
    seen.formats()
}

/// How one message was read by [`read_message`].
pub(crate) enum Read<'a> {
    /// Into the view.
    View,
    /// As its full tree: it was built already, has no text of its own, or
    /// holds an escaped string pairing reads.
    Tree(&'a Map<String, Value>),
    /// It is not a JSON object.
    NotObject,
}

/// Reads a message for pairing: through a borrowed view of its text when
/// its tree is not built, otherwise (or when the view cannot borrow every
/// string it needs) from the tree.
pub(crate) fn read_message<'a>(
    transcript: &'a Transcript,
    message: &'a super::text::Message,
    view: &mut View<'a>,
) -> Read<'a> {
    if let Some(text) = transcript.unbuilt_text(message) {
        if view.read(text).is_ok() && !view.escaped {
            return if view.object {
                Read::View
            } else {
                Read::NotObject
            };
        }
    }
    match transcript.value_of(message).as_object() {
        Some(object) => Read::Tree(object),
        None => Read::NotObject,
    }
}

/// Which formats' tool activity a pass has seen.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Seen([bool; 3]);

impl Seen {
    pub(crate) fn note_tree(&mut self, message: &Map<String, Value>) {
        for (slot, format) in Format::ALL.into_iter().enumerate() {
            self.0[slot] = self.0[slot] || has_tool_activity(format, message);
        }
    }

    pub(crate) fn note_view(&mut self, view: &View<'_>) {
        for (slot, format) in Format::ALL.into_iter().enumerate() {
            self.0[slot] = self.0[slot] || view_has_tool_activity(format, view);
        }
    }

    pub(crate) fn formats(self) -> Vec<Format> {
        Format::ALL
            .into_iter()
            .zip(self.0)
            .filter_map(|(format, seen)| seen.then_some(format))
            .collect()
    }

    /// The one format seen, or why there is not one.
    pub(crate) fn resolve(self) -> Result<Format, TranscriptError> {
        let found = self.formats();
        match found.as_slice() {
            [format] => Ok(*format),
            [] => Err(TranscriptError::FormatNotDetected),
            _ => Err(TranscriptError::FormatAmbiguous(found)),
        }
    }
}

/// [`has_tool_activity`] on a view.
fn view_has_tool_activity(format: Format, view: &View<'_>) -> bool {
    match format {
        Format::OpenAiChat => match view.role.as_str() {
            Some("tool") => true,
            Some("assistant") => view.tool_calls_array && !view.tool_calls.is_empty(),
            _ => false,
        },
        Format::Anthropic => {
            view.content_array
                && view
                    .blocks
                    .iter()
                    .any(|block| matches!(block.kind.as_str(), Some("tool_use" | "tool_result")))
        }
        Format::OpenAiResponses => match view.kind.as_str() {
            Some(kind) if kind.ends_with("_call_output") => true,
            Some(kind) if kind.ends_with("_call") => view.call_id.is_present(),
            _ => false,
        },
    }
}

fn has_tool_activity(format: Format, message: &Map<String, Value>) -> bool {
    match format {
        Format::OpenAiChat => match role(message) {
            Some("tool") => true,
            Some("assistant") => field(message, "tool_calls")
                .and_then(Value::as_array)
                .is_some_and(|calls| !calls.is_empty()),
            _ => false,
        },
        Format::Anthropic => blocks(message).is_some_and(|blocks| {
            blocks
                .iter()
                .any(|block| matches!(block_type(block), Some("tool_use" | "tool_result")))
        }),
        Format::OpenAiResponses => match item_type(message) {
            Some(kind) if kind.ends_with("_call_output") => true,
            Some(kind) if kind.ends_with("_call") => field(message, "call_id").is_some(),
            _ => false,
        },
    }
}

/// What a message is, as far as turns are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Model output: an assistant message, a reasoning item, a call item.
    Model,
    /// A user message (which may also carry Anthropic tool results).
    User,
    /// Any other input the model did not write: system, developer, unknown
    /// roles. It ends a reply just as a user message does.
    Other,
    /// A message that is only a result: a Chat tool message, a Responses
    /// `*_call_output` item.
    Result,
    /// A Responses item of a type this module does not know; it neither
    /// starts a turn nor ends a reply.
    Neutral,
}

/// A tool call found in a message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallRef<'a> {
    /// The call id results must quote.
    pub(crate) id: &'a str,
    /// Index of the content block holding the call (Anthropic), for the
    /// provider's `messages.N.content.K` error path.
    pub(crate) block: Option<usize>,
    /// The item type (Responses), so a placeholder output has the matching
    /// `*_call_output` type.
    pub(crate) item_type: Option<&'a str>,
    /// The item's own `id` (Responses), which the provider quotes when it
    /// rejects a duplicate.
    pub(crate) item_id: Option<&'a str>,
}

/// A tool result found in a message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResultRef<'a> {
    /// The call id the result answers.
    pub(crate) id: &'a str,
    /// Index of the content block holding the result (Anthropic).
    pub(crate) block: Option<usize>,
    /// True when a block that is not a `tool_result` comes earlier in the
    /// same message, which Anthropic rejects.
    pub(crate) after_other_block: bool,
}

/// The pairing-relevant content of one message; buffers are reused across
/// messages so a pass allocates nothing per message.
#[derive(Debug, Default)]
pub(crate) struct Scan<'a> {
    /// What the message is; `None` only before the first scan.
    pub(crate) role: Option<Role>,
    /// Calls the message makes, in order.
    pub(crate) calls: Vec<CallRef<'a>>,
    /// Results the message carries, in order.
    pub(crate) results: Vec<ResultRef<'a>>,
}

impl Scan<'_> {
    /// What the scanned message is.
    pub(crate) fn role(&self) -> Role {
        self.role.unwrap_or(Role::Other)
    }
}

impl Format {
    /// Reads what `message` means for pairing into `scan`.
    pub(crate) fn scan<'a>(self, message: &'a Map<String, Value>, scan: &mut Scan<'a>) {
        scan.calls.clear();
        scan.results.clear();
        scan.role = Some(match self {
            Format::OpenAiChat => scan_chat(message, scan),
            Format::Anthropic => scan_anthropic(message, scan),
            Format::OpenAiResponses => scan_responses(message, scan),
        });
    }
}

impl Format {
    /// [`Format::scan`] on a borrowed view; the two agree on every message
    /// the view could read without escapes.
    pub(crate) fn scan_view<'a>(self, view: &View<'a>, scan: &mut Scan<'a>) {
        scan.calls.clear();
        scan.results.clear();
        scan.role = Some(match self {
            Format::OpenAiChat => scan_chat_view(view, scan),
            Format::Anthropic => scan_anthropic_view(view, scan),
            Format::OpenAiResponses => scan_responses_view(view, scan),
        });
    }
}

fn scan_chat_view<'a>(view: &View<'a>, scan: &mut Scan<'a>) -> Role {
    match view.role.as_str() {
        Some("assistant") => {
            for id in &view.tool_calls {
                scan.calls.push(CallRef {
                    id: id.as_str().unwrap_or(""),
                    block: None,
                    item_type: None,
                    item_id: None,
                });
            }
            Role::Model
        }
        Some("tool") => {
            scan.results.push(ResultRef {
                id: view.tool_call_id.as_str().unwrap_or(""),
                block: None,
                after_other_block: false,
            });
            Role::Result
        }
        Some("user") => Role::User,
        _ => Role::Other,
    }
}

fn scan_anthropic_view<'a>(view: &View<'a>, scan: &mut Scan<'a>) -> Role {
    let role = match view.role.as_str() {
        Some("assistant") => Role::Model,
        Some("user") => Role::User,
        _ => Role::Other,
    };
    let mut seen_other_block = false;
    for (index, block) in view.blocks.iter().enumerate() {
        match block.kind.as_str() {
            // Calls count only where the model wrote them.
            Some("tool_use") if role == Role::Model => scan.calls.push(CallRef {
                id: block.id.as_str().unwrap_or(""),
                block: Some(index),
                item_type: None,
                item_id: None,
            }),
            Some("tool_use") => {}
            Some("tool_result") => scan.results.push(ResultRef {
                id: block.tool_use_id.as_str().unwrap_or(""),
                block: Some(index),
                after_other_block: seen_other_block,
            }),
            _ => seen_other_block = true,
        }
    }
    role
}

fn scan_responses_view<'a>(view: &View<'a>, scan: &mut Scan<'a>) -> Role {
    match view.kind.as_str() {
        Some(kind) if kind.ends_with("_call_output") => {
            scan.results.push(ResultRef {
                id: view.call_id.as_str().unwrap_or(""),
                block: None,
                after_other_block: false,
            });
            Role::Result
        }
        Some(kind) if kind.ends_with("_call") => {
            // Only client-side calls carry a `call_id` and wait for an output.
            if view.call_id.is_present() {
                scan.calls.push(CallRef {
                    id: view.call_id.as_str().unwrap_or(""),
                    block: None,
                    item_type: Some(kind),
                    item_id: view.id.as_str(),
                });
            }
            Role::Model
        }
        Some("reasoning") => Role::Model,
        Some("message") | None => match view.role {
            Text::Str("assistant") => Role::Model,
            Text::Str("user") => Role::User,
            Text::Str(_) | Text::Escaped => Role::Other,
            Text::Absent | Text::Other => Role::Neutral,
        },
        Some(_) => Role::Neutral,
    }
}

fn scan_chat<'a>(message: &'a Map<String, Value>, scan: &mut Scan<'a>) -> Role {
    match role(message) {
        Some("assistant") => {
            let calls = field(message, "tool_calls").and_then(Value::as_array);
            for call in calls.into_iter().flatten() {
                scan.calls.push(CallRef {
                    id: str_field(call, "id"),
                    block: None,
                    item_type: None,
                    item_id: None,
                });
            }
            Role::Model
        }
        Some("tool") => {
            scan.results.push(ResultRef {
                id: field(message, "tool_call_id")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
                block: None,
                after_other_block: false,
            });
            Role::Result
        }
        Some("user") => Role::User,
        _ => Role::Other,
    }
}

fn scan_anthropic<'a>(message: &'a Map<String, Value>, scan: &mut Scan<'a>) -> Role {
    let mut seen_other_block = false;
    for (index, block) in blocks(message).into_iter().flatten().enumerate() {
        match block_type(block) {
            Some("tool_use") => scan.calls.push(CallRef {
                id: str_field(block, "id"),
                block: Some(index),
                item_type: None,
                item_id: None,
            }),
            Some("tool_result") => scan.results.push(ResultRef {
                id: str_field(block, "tool_use_id"),
                block: Some(index),
                after_other_block: seen_other_block,
            }),
            _ => seen_other_block = true,
        }
    }
    match role(message) {
        // Calls count only where the model wrote them.
        Some("assistant") => Role::Model,
        Some("user") => {
            scan.calls.clear();
            Role::User
        }
        _ => {
            scan.calls.clear();
            Role::Other
        }
    }
}

fn scan_responses<'a>(message: &'a Map<String, Value>, scan: &mut Scan<'a>) -> Role {
    match item_type(message) {
        Some(kind) if kind.ends_with("_call_output") => {
            scan.results.push(ResultRef {
                id: field(message, "call_id")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
                block: None,
                after_other_block: false,
            });
            Role::Result
        }
        Some(kind) if kind.ends_with("_call") => {
            // Only client-side calls carry a `call_id` and wait for an output.
            if let Some(id) = field(message, "call_id") {
                scan.calls.push(CallRef {
                    id: id.as_str().unwrap_or(""),
                    block: None,
                    item_type: Some(kind),
                    item_id: field(message, "id").and_then(Value::as_str),
                });
            }
            Role::Model
        }
        Some("reasoning") => Role::Model,
        Some("message") | None => match role(message) {
            Some("assistant") => Role::Model,
            Some("user") => Role::User,
            Some(_) => Role::Other,
            None => Role::Neutral,
        },
        Some(_) => Role::Neutral,
    }
}

/// Looks a field up by scanning the object's entries. Messages and blocks
/// have a handful of keys, and a scan reads only the entry list, where a hash
/// lookup must also hash the key and probe a separate table: on a
/// million-message transcript that difference is a large share of diagnosis.
fn field<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object
        .iter()
        .find_map(|(name, value)| (name == key).then_some(value))
}

fn value_field<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    value.as_object().and_then(|object| field(object, key))
}

fn role(message: &Map<String, Value>) -> Option<&str> {
    field(message, "role").and_then(Value::as_str)
}

fn item_type(message: &Map<String, Value>) -> Option<&str> {
    field(message, "type").and_then(Value::as_str)
}

pub(crate) fn blocks(message: &Map<String, Value>) -> Option<&Vec<Value>> {
    field(message, "content").and_then(Value::as_array)
}

/// The content blocks of a message, or none when its content is a string.
pub(crate) fn blocks_of(message: &Value) -> &[Value] {
    message
        .get("content")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

pub(crate) fn block_type(block: &Value) -> Option<&str> {
    value_field(block, "type").and_then(Value::as_str)
}

fn str_field<'a>(value: &'a Value, key: &str) -> &'a str {
    value_field(value, key)
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Where to find the text of a result, to recognise placeholders.
pub(crate) fn result_payload(
    format: Format,
    message: &Value,
    block: Option<usize>,
) -> Option<&Value> {
    match format {
        Format::OpenAiChat => message.get("content"),
        Format::Anthropic => message
            .get("content")
            .and_then(|content| content.get(block?))
            .and_then(|block| block.get("content")),
        Format::OpenAiResponses => message.get("output"),
    }
}

/// The unknown-outcome result for a call that has none.
pub(crate) fn placeholder(format: Format, call: &CallRef<'_>, text: &str) -> Value {
    match format {
        Format::OpenAiChat => json!({
            "role": "tool",
            "tool_call_id": call.id,
            "content": text,
        }),
        Format::Anthropic => json!({
            "type": "tool_result",
            "tool_use_id": call.id,
            "is_error": true,
            "content": text,
        }),
        Format::OpenAiResponses => json!({
            "type": format!("{}_output", call.item_type.unwrap_or("function_call")),
            "call_id": call.id,
            "output": text,
        }),
    }
}

/// The error a provider returns for a call whose result is not where it
/// must be. `message` is the index of the message holding the call.
pub(crate) fn missing_result_error(format: Format, id: &str, message: usize) -> String {
    match format {
        Format::OpenAiChat => format!(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {id}"
        ),
        Format::Anthropic => format!(
            "messages.{message}: tool_use ids were found without tool_result blocks immediately after: {id}. Each tool_use block must have a corresponding tool_result block in the next message."
        ),
        Format::OpenAiResponses => format!("No tool output found for function call {id}."),
    }
}

/// The error a provider returns for a result that answers no call where it
/// stands. `message` and `block` locate the result.
pub(crate) fn unexpected_result_error(
    format: Format,
    id: &str,
    message: usize,
    block: Option<usize>,
) -> String {
    match format {
        Format::OpenAiChat => "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.".to_string(),
        Format::Anthropic => format!(
            "messages.{message}.content.{}: unexpected tool_use_id found in tool_result blocks: {id}. Each tool_result block must have a corresponding tool_use block in the previous message.",
            block.unwrap_or(0)
        ),
        Format::OpenAiResponses => {
            format!("No tool call found for function call output with call_id {id}.")
        }
    }
}

/// The error a provider returns for a call id used twice. Chat Completions
/// documents no error of its own for this; one tool message can answer only
/// one of the calls, so the other is reported as unanswered.
pub(crate) fn duplicate_call_error(format: Format, call: &CallRef<'_>, message: usize) -> String {
    match format {
        Format::OpenAiChat => missing_result_error(format, call.id, message),
        Format::Anthropic => format!(
            "messages.{message}.content.{}: tool_use ids must be unique",
            call.block.unwrap_or(0)
        ),
        Format::OpenAiResponses => format!(
            "Duplicate item found with id {}",
            call.item_id.unwrap_or(call.id)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every format name parses back to its format.
    #[test]
    fn names_round_trip() {
        for format in Format::ALL {
            assert_eq!(format.to_string().parse::<Format>().ok(), Some(format));
            let json = serde_json::to_string(&format).unwrap_or_default();
            assert_eq!(json, format!("\"{format}\""));
        }
    }

    /// An unknown name is an error that names it.
    #[test]
    fn unknown_name_is_rejected() {
        let error = "gemini".parse::<Format>().err().map(|e| e.to_string());
        assert!(error.is_some_and(|text| text.contains("gemini")));
    }
}
