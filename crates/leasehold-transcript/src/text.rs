//! Reading and writing transcripts as text, keeping every byte that a repair
//! did not need to change.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use serde_json::Value;

use super::TranscriptError;
use super::validate;
use super::view::Validated;

/// How a transcript is laid out as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// One JSON array of messages.
    JsonArray,
    /// JSON lines: one message per line.
    Jsonl,
}

/// A chat history: an ordered list of JSON messages and the text they came
/// from.
///
/// Messages are seen as [`serde_json::Value`]s (with key order preserved), so
/// fields this module does not know survive a round trip. Each parsed
/// message also remembers its exact source text: a repair that changes one
/// message writes every other message back byte for byte, so numbers and
/// string escapes in payloads are never reformatted.
///
/// [`Transcript::parse`] validates the text and records where each message
/// is, but builds a message's `Value` only when something asks for it
/// ([`Transcript::messages`], [`Transcript::message`], or a repair that
/// rewrites the message). Diagnosis reads parsed messages through borrowed
/// views of their text instead, so checking a transcript never builds the
/// full tree.
#[derive(Debug, Clone)]
pub struct Transcript {
    /// The messages, in order.
    messages: Vec<Message>,
    /// Array or JSONL, so output keeps the shape of the input.
    layout: Layout,
    /// The text the messages were parsed from; message spans point into it.
    /// Shared so a repaired transcript can reuse it without a copy.
    source: Arc<String>,
    /// True while the messages are exactly those parsed from `source`, so
    /// [`Transcript::to_text`] can return the source unchanged.
    pristine: bool,
}

/// One message and where it came from.
#[derive(Debug, Clone)]
pub(crate) struct Message {
    /// The parsed message, built from `span` on first use, and shared: a
    /// repaired transcript holds the same untouched messages as its input
    /// without copying them. Read it with [`Transcript::value_of`].
    value: OnceLock<Arc<Value>>,
    /// Where the message's own text starts in the transcript's source;
    /// `NO_SPAN` for a message built or changed in memory. Read it with
    /// [`Message::span`].
    start: usize,
    /// The length of that text. A start and a 32-bit length (where an
    /// `Option<Range>` takes three words) keep a `Message` at 32 bytes, as
    /// a parsed transcript holds one per message; a longer message is kept
    /// as its tree instead (see [`Message::parsed`]).
    len: u32,
    /// 1-based line of the message, for JSONL, or 0; findings cite it. Read
    /// with [`Message::line`].
    line: u32,
}

/// `Message::start` of a message with no source text.
const NO_SPAN: usize = usize::MAX;

impl Message {
    /// A message created in memory (a placeholder, a rebuilt reply).
    pub(crate) fn new(value: Value) -> Self {
        Message {
            value: OnceLock::from(Arc::new(value)),
            start: NO_SPAN,
            len: 0,
            line: 0,
        }
    }

    /// A parsed message: its text, where that starts in the source, and its
    /// line. A message of 4 GiB or more (which no provider accepts) has its
    /// tree built at once and keeps no span, so it is written back
    /// compactly.
    fn parsed(text: &str, start: usize, line: Option<usize>) -> Self {
        let line = line.and_then(|line| u32::try_from(line).ok()).unwrap_or(0);
        let Ok(len) = u32::try_from(text.len()) else {
            let value = serde_json::from_str(text).unwrap_or(Value::Null);
            return Message {
                line,
                ..Message::new(value)
            };
        };
        Message {
            value: OnceLock::new(),
            start,
            len,
            line,
        }
    }

    /// Byte range of the message's own text in the transcript's source, or
    /// `None` for a message built or changed in memory.
    pub(crate) fn span(&self) -> Option<Range<usize>> {
        (self.start != NO_SPAN).then_some(self.start..self.start + self.len as usize)
    }

    /// 1-based line of the message, for JSONL.
    pub(crate) fn line(&self) -> Option<usize> {
        (self.line != 0).then_some(self.line as usize)
    }
}

impl Transcript {
    /// Parses a JSON array of messages, or JSON lines when the text does not
    /// start with `[`. Blank JSONL lines are skipped.
    ///
    /// Messages may be any JSON value here; [`diagnose`](fn@super::diagnose)
    /// rejects non-objects, so a caller can still inspect what was read.
    ///
    /// # Errors
    ///
    /// [`TranscriptError::InvalidJson`] with the 1-based line where the text
    /// stops being valid JSON.
    pub fn parse(text: &str) -> Result<Transcript, TranscriptError> {
        Transcript::parse_owned(text.to_string())
    }

    /// [`Transcript::parse`] on text the caller hands over, which the
    /// transcript keeps as its source instead of copying it: for a caller
    /// that read the text only to parse it (a file, a request body), this
    /// halves the memory a large transcript needs.
    ///
    /// # Errors
    ///
    /// As for [`Transcript::parse`].
    pub fn parse_owned(text: String) -> Result<Transcript, TranscriptError> {
        let source = Arc::new(text);
        let text = source.as_str();
        let body = text.trim_start_matches('\u{feff}');
        let offset = text.len() - body.len();
        let (messages, layout) = if body.trim_start().starts_with('[') {
            let messages = match scan_array(body, offset) {
                Some(messages) => messages,
                // Not valid JSON (or a shape the scan does not follow): the
                // full parse gives the error, and its line, as it always has.
                None => parse_array(body, offset)?,
            };
            (messages, Layout::JsonArray)
        } else {
            (parse_lines(body, offset)?, Layout::Jsonl)
        };
        Ok(Transcript {
            messages,
            layout,
            source,
            pristine: true,
        })
    }

    /// Builds a transcript from messages held in memory.
    ///
    /// JSONL messages are numbered as [`Transcript::to_text`] will write
    /// them: message `i` on line `i + 1`.
    pub fn from_messages(messages: Vec<Value>, layout: Layout) -> Transcript {
        let messages = messages.into_iter().map(Message::new).collect();
        Transcript::rebuilt(messages, layout, Arc::default())
    }

    /// A transcript whose messages no longer match its source as a whole;
    /// messages that kept a span still write their original bytes.
    pub(crate) fn rebuilt(mut messages: Vec<Message>, layout: Layout, source: Arc<String>) -> Self {
        for (index, message) in messages.iter_mut().enumerate() {
            message.line = match layout {
                Layout::Jsonl => u32::try_from(index + 1).unwrap_or(0),
                Layout::JsonArray => 0,
            };
        }
        Transcript {
            messages,
            layout,
            source,
            pristine: false,
        }
    }

    pub(crate) fn source(&self) -> &Arc<String> {
        &self.source
    }

    pub(crate) fn raw_messages(&self) -> &[Message] {
        &self.messages
    }

    /// The text of a parsed message whose tree has not been built, for a
    /// borrowed view of it.
    pub(crate) fn unbuilt_text(&self, message: &Message) -> Option<&str> {
        match (message.value.get(), message.span()) {
            (None, Some(span)) => self.source.get(span),
            _ => None,
        }
    }

    /// The tree of a message, built from its text on first use.
    pub(crate) fn value_of<'t>(&'t self, message: &'t Message) -> &'t Value {
        message.value.get_or_init(|| {
            let text = message
                .span()
                .and_then(|span| self.source.get(span))
                .unwrap_or("null");
            // The text was validated as one JSON value that a `Value` accepts
            // (see `view::Validated`), so this cannot fail.
            Arc::new(serde_json::from_str(text).unwrap_or(Value::Null))
        })
    }

    /// The index of the first message that is not a JSON object, read from
    /// the message's text when its tree is not built.
    pub(crate) fn first_non_object(&self) -> Option<usize> {
        self.messages
            .iter()
            .position(|message| match self.unbuilt_text(message) {
                Some(text) => !text.trim_start().starts_with('{'),
                None => !self.value_of(message).is_object(),
            })
    }

    /// Whether the input was an array or JSONL.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// True when the input was JSON lines.
    pub fn is_jsonl(&self) -> bool {
        self.layout == Layout::Jsonl
    }

    /// Number of messages.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// True when there are no messages.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The messages, in order.
    pub fn messages(&self) -> impl ExactSizeIterator<Item = &Value> {
        self.messages.iter().map(|message| self.value_of(message))
    }

    /// The message at a 0-based index.
    pub fn message(&self, index: usize) -> Option<&Value> {
        self.messages
            .get(index)
            .map(|message| self.value_of(message))
    }

    /// The 1-based line of a message, for JSONL transcripts.
    pub fn line(&self, index: usize) -> Option<usize> {
        self.messages.get(index).and_then(Message::line)
    }

    /// Writes the transcript in the layout it was read in.
    ///
    /// An unchanged parsed transcript comes back byte for byte. After a
    /// change, messages that were not touched keep their original text;
    /// changed and new messages are written compactly by `serde_json` with
    /// their key order kept. Arrays are then written one message per line.
    pub fn to_text(&self) -> String {
        if self.pristine {
            return self.source.as_str().to_string();
        }
        let mut out = String::with_capacity(self.source.len() + 64 * self.messages.len());
        match self.layout {
            Layout::Jsonl => {
                for message in &self.messages {
                    self.write_message(message, &mut out);
                    out.push('\n');
                }
            }
            Layout::JsonArray => {
                if self.messages.is_empty() {
                    out.push_str("[]\n");
                    return out;
                }
                // Match the input: if its messages spanned lines, indent
                // rewritten messages the same way rather than cramming them
                // onto one line.
                let pretty = self.messages.iter().any(|message| {
                    message
                        .span()
                        .is_some_and(|span| self.source[span].contains('\n'))
                });
                out.push_str("[\n");
                for (index, message) in self.messages.iter().enumerate() {
                    if index > 0 {
                        out.push_str(",\n");
                    }
                    out.push_str("  ");
                    match message.span() {
                        Some(_) => self.write_message(message, &mut out),
                        // JSON strings never hold a raw newline, so every
                        // newline here is layout and can take the indent.
                        None if pretty => out.push_str(
                            &serde_json::to_string_pretty(self.value_of(message))
                                .unwrap_or_default()
                                .replace('\n', "\n  "),
                        ),
                        None => self.write_message(message, &mut out),
                    }
                }
                out.push_str("\n]\n");
            }
        }
        out
    }

    fn write_message(&self, message: &Message, out: &mut String) {
        match message.span() {
            Some(span) => out.push_str(&self.source[span]),
            // Serialising a `Value` cannot fail: its map keys are strings.
            None => {
                out.push_str(&serde_json::to_string(self.value_of(message)).unwrap_or_default())
            }
        }
    }
}

/// Two transcripts are equal when they hold equal messages in the same
/// layout; how they were written does not matter.
impl PartialEq for Transcript {
    fn eq(&self, other: &Self) -> bool {
        self.layout == other.layout
            && self.messages.len() == other.messages.len()
            && self
                .messages
                .iter()
                .zip(&other.messages)
                .all(|(left, right)| self.value_of(left) == other.value_of(right))
    }
}

fn parse_lines(body: &str, offset: usize) -> Result<Vec<Message>, TranscriptError> {
    let mut messages = Vec::new();
    let mut start = 0;
    for (number, line) in body.split('\n').enumerate() {
        let line_start = start;
        start += line.len() + 1;
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        if !validate::is_one_value(line) && serde_json::from_str::<Validated>(line).is_err() {
            // The error `Value` parsing gives, as it always has.
            let error = serde_json::from_str::<Value>(line).err();
            if let Some(source) = error {
                return Err(TranscriptError::InvalidJson {
                    line: number + 1,
                    source,
                });
            }
        }
        messages.push(Message::parsed(line, offset + line_start, Some(number + 1)));
    }
    Ok(messages)
}

fn parse_array(body: &str, offset: usize) -> Result<Vec<Message>, TranscriptError> {
    let values: Vec<Value> =
        serde_json::from_str(body).map_err(|source| TranscriptError::InvalidJson {
            line: source.line(),
            source,
        })?;
    let spans = element_spans(body);
    // The scanner only runs on text serde_json accepted, so the counts agree;
    // if they ever did not, dropping the spans only costs byte-exact output.
    let spans: Vec<Option<Range<usize>>> = if spans.len() == values.len() {
        spans
            .into_iter()
            .map(|span| Some(offset + span.start..offset + span.end))
            .collect()
    } else {
        vec![None; values.len()]
    };
    Ok(values
        .into_iter()
        .zip(spans)
        .map(|(value, span)| {
            let mut message = Message::new(value);
            if let Some(span) = span {
                if let Ok(len) = u32::try_from(span.len()) {
                    message.start = span.start;
                    message.len = len;
                }
            }
            message
        })
        .collect())
}

/// Validates a JSON array of messages element by element, recording where
/// each is without building its tree. `None` when the text is not a valid
/// array; the caller then parses it fully for the error.
fn scan_array(body: &str, offset: usize) -> Option<Vec<Message>> {
    let bytes = body.as_bytes();
    let skip_space = |mut at: usize| {
        while bytes
            .get(at)
            .is_some_and(|byte| matches!(byte, b' ' | b'\t' | b'\n' | b'\r'))
        {
            at += 1;
        }
        at
    };
    let mut at = skip_space(0);
    if bytes.get(at) != Some(&b'[') {
        return None;
    }
    at = skip_space(at + 1);
    let mut messages = Vec::new();
    if bytes.get(at) != Some(&b']') {
        loop {
            let end = match validate::value_end(body, at) {
                Some(end) => end,
                // Not certainly valid: serde_json decides.
                None => {
                    let rest = body.get(at..)?;
                    let mut stream =
                        serde_json::Deserializer::from_str(rest).into_iter::<Validated>();
                    stream.next()?.ok()?;
                    at + stream.byte_offset()
                }
            };
            messages.push(Message::parsed(&body[at..end], offset + at, None));
            at = skip_space(end);
            match bytes.get(at) {
                Some(b',') => at = skip_space(at + 1),
                Some(b']') => break,
                _ => return None,
            }
        }
    }
    (skip_space(at + 1) == bytes.len()).then_some(messages)
}

/// Byte ranges of the top-level elements of a JSON array already known to be
/// valid, found by tracking nesting depth and skipping strings.
fn element_spans(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let Some(open) = bytes.iter().position(|&byte| byte == b'[') else {
        return spans;
    };
    let mut at = open + 1;
    let mut depth = 0usize;
    let mut start: Option<usize> = None;
    while at < bytes.len() {
        let byte = bytes[at];
        match byte {
            b'"' => {
                start.get_or_insert(at);
                at += 1;
                while at < bytes.len() && bytes[at] != b'"' {
                    at += if bytes[at] == b'\\' { 2 } else { 1 };
                }
            }
            b'{' | b'[' => {
                start.get_or_insert(at);
                depth += 1;
            }
            b'}' | b']' if depth > 0 => depth -= 1,
            b',' | b']' if depth == 0 => {
                if let Some(begin) = start.take() {
                    let end = begin + text[begin..at].trim_end().len();
                    spans.push(begin..end);
                }
                if byte == b']' {
                    break;
                }
            }
            b' ' | b'\t' | b'\n' | b'\r' => {}
            _ => {
                start.get_or_insert(at);
            }
        }
        at += 1;
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Element spans cover each top-level element exactly, strings included.
    #[test]
    fn element_spans_skip_strings_and_nesting() {
        let text = r#" [ {"a": "x,]}\"y"} , [1,[2]] ,3, "s" ] "#;
        let spans = element_spans(text);
        let pieces: Vec<&str> = spans.iter().map(|span| &text[span.clone()]).collect();
        assert_eq!(pieces, [r#"{"a": "x,]}\"y"}"#, "[1,[2]]", "3", r#""s""#]);
    }

    /// Deep nesting is accepted exactly when a `Value` parse accepts it,
    /// in an array and in JSON lines.
    #[test]
    fn nesting_limit_matches_value() {
        for depth in 120..132 {
            let inner = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let array = format!("[{inner}]");
            assert_eq!(
                Transcript::parse(&array).is_ok(),
                serde_json::from_str::<Vec<Value>>(&array).is_ok(),
                "array, depth {depth}"
            );
            let jsonl = format!("{{}}\n{inner}\n");
            assert_eq!(
                Transcript::parse(&jsonl).is_ok(),
                serde_json::from_str::<Value>(&inner).is_ok(),
                "jsonl, depth {depth}"
            );
        }
    }

    /// A transcript is still shared across threads and tasks as before
    /// (the gRPC service and the client's guard rely on it), now that its
    /// trees are built lazily.
    #[test]
    fn transcript_stays_send_sync() {
        fn shareable<T: Send + Sync + Clone + std::fmt::Debug + std::panic::RefUnwindSafe>() {}
        shareable::<Transcript>();
    }

    /// A parsed transcript holds one `Message` per message: 32 bytes.
    #[test]
    fn a_message_record_stays_small() {
        assert!(size_of::<Message>() <= 32);
    }

    /// An empty array has no elements.
    #[test]
    fn element_spans_of_empty_array() {
        assert!(element_spans("[ ]").is_empty());
    }
}
