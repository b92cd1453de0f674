//! Borrowed views of messages: only the fields pairing reads (roles, item
//! types, call ids, result ids, block types), read straight from the input
//! text without building a [`serde_json::Value`].
//!
//! A view is read by a small scanner that relies on the text having been
//! validated already ([`Validated`], when the transcript was parsed): it
//! only finds where strings, objects and arrays end, and never decodes
//! or range-checks what it skips. That is most of a check's work, so it is
//! kept to a byte loop that skips a string's body eight bytes at a time.
//!
//! A view is filled into buffers that are reused from message to message,
//! so a pass over a transcript allocates nothing per message. Strings are
//! borrowed from the input; a string that pairing reads but that contains
//! an escape cannot be borrowed, so the view only records that it met one
//! ([`View::escaped`]) and the caller reads that message from its full tree
//! instead.

use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// A field that pairing reads as a string.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Text<'a> {
    /// The field is not there.
    #[default]
    Absent,
    /// The field holds something other than a string.
    Other,
    /// The field holds this string, borrowed from the input.
    Str(&'a str),
    /// The field holds a string with an escape in it, so not borrowable.
    Escaped,
}

impl<'a> Text<'a> {
    /// The string, as `Value::as_str` would give it.
    pub(crate) fn as_str(self) -> Option<&'a str> {
        match self {
            Text::Str(text) => Some(text),
            _ => None,
        }
    }

    /// True when the field is there, whatever it holds.
    pub(crate) fn is_present(self) -> bool {
        self != Text::Absent
    }
}

/// One content block of a message whose `content` is an array; a block that
/// is not an object has every field absent.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Block<'a> {
    pub(crate) kind: Text<'a>,
    pub(crate) id: Text<'a>,
    pub(crate) tool_use_id: Text<'a>,
}

/// What pairing reads of one message. Reused across messages.
#[derive(Debug, Default)]
pub(crate) struct View<'a> {
    /// False when the message is not a JSON object (every other field is
    /// then empty).
    pub(crate) object: bool,
    /// True when a field below holds a string with an escape: the view is
    /// then incomplete and the message must be read from its full tree.
    pub(crate) escaped: bool,
    pub(crate) role: Text<'a>,
    /// The `type` field (Responses items, and present on some Chat messages).
    pub(crate) kind: Text<'a>,
    pub(crate) tool_call_id: Text<'a>,
    pub(crate) call_id: Text<'a>,
    pub(crate) id: Text<'a>,
    /// True when `tool_calls` is an array; its elements' `id`s are then in
    /// `tool_calls`.
    pub(crate) tool_calls_array: bool,
    pub(crate) tool_calls: Vec<Text<'a>>,
    /// True when `content` is an array; its blocks are then in `blocks`.
    pub(crate) content_array: bool,
    pub(crate) blocks: Vec<Block<'a>>,
}

impl<'a> View<'a> {
    fn clear(&mut self) {
        self.object = false;
        self.escaped = false;
        self.role = Text::Absent;
        self.kind = Text::Absent;
        self.tool_call_id = Text::Absent;
        self.call_id = Text::Absent;
        self.id = Text::Absent;
        self.tool_calls_array = false;
        self.tool_calls.clear();
        self.content_array = false;
        self.blocks.clear();
    }

    /// Reads the message in `text` into this view. `text` must be one JSON
    /// value that [`Validated`] accepted: the scanner checks only enough
    /// structure to find its way, so on other text it may read nonsense
    /// (never panic, never read out of bounds).
    ///
    /// # Errors
    /// When the scanner loses its way (`text` is not one JSON value).
    pub(crate) fn read(&mut self, text: &'a str) -> Result<(), Malformed> {
        self.clear();
        let mut cursor = Cursor { text, at: 0 };
        cursor.space();
        if cursor.peek() == Some(b'{') {
            self.object = true;
            cursor.object(|cursor, key| self.field(cursor, key))?;
        } else {
            cursor.skip_value()?;
        }
        cursor.space();
        if cursor.at == text.len() {
            Ok(())
        } else {
            Err(Malformed)
        }
    }

    /// Reads the value of one of the message's fields.
    fn field(&mut self, cursor: &mut Cursor<'a>, key: Key) -> Result<(), Malformed> {
        // A repeated key overwrites, as it does in a `Value`.
        let slot = match key {
            Key::Role => &mut self.role,
            Key::Type => &mut self.kind,
            Key::ToolCallId => &mut self.tool_call_id,
            Key::CallId => &mut self.call_id,
            Key::Id => &mut self.id,
            Key::ToolCalls => {
                self.tool_calls.clear();
                self.tool_calls_array = cursor.peek() == Some(b'[');
                if !self.tool_calls_array {
                    return cursor.skip_value();
                }
                let (calls, escaped) = (&mut self.tool_calls, &mut self.escaped);
                return cursor.array(|cursor| {
                    let mut id = Text::Absent;
                    if cursor.peek() == Some(b'{') {
                        cursor.object(|cursor, key| match key {
                            Key::Id => {
                                id = cursor.text()?;
                                Ok(())
                            }
                            _ => cursor.skip_value(),
                        })?;
                    } else {
                        cursor.skip_value()?;
                    }
                    *escaped |= id == Text::Escaped;
                    calls.push(id);
                    Ok(())
                });
            }
            Key::Content => {
                self.blocks.clear();
                self.content_array = cursor.peek() == Some(b'[');
                if !self.content_array {
                    return cursor.skip_value();
                }
                let (blocks, escaped) = (&mut self.blocks, &mut self.escaped);
                return cursor.array(|cursor| {
                    let mut block = Block::default();
                    if cursor.peek() == Some(b'{') {
                        cursor.object(|cursor, key| {
                            let slot = match key {
                                Key::Type => &mut block.kind,
                                Key::Id => &mut block.id,
                                Key::ToolUseId => &mut block.tool_use_id,
                                _ => return cursor.skip_value(),
                            };
                            *slot = cursor.text()?;
                            Ok(())
                        })?;
                    } else {
                        cursor.skip_value()?;
                    }
                    *escaped |= [block.kind, block.id, block.tool_use_id].contains(&Text::Escaped);
                    blocks.push(block);
                    Ok(())
                });
            }
            Key::ToolUseId | Key::Other => return cursor.skip_value(),
        };
        *slot = cursor.text()?;
        self.escaped |= *slot == Text::Escaped;
        Ok(())
    }
}

/// The scanner lost its way: the text was not one JSON value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed;

/// A position in a message's text, for [`View::read`].
struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// Consumes `byte` (after any space), or fails.
    fn expect(&mut self, byte: u8) -> Result<(), Malformed> {
        self.space();
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(Malformed)
        }
    }

    /// Reads the string that starts here: its raw body (between the quotes,
    /// escapes undecoded) and whether it holds an escape.
    fn string(&mut self) -> Result<(&'a str, bool), Malformed> {
        let bytes = self.text.as_bytes();
        let start = self.at + 1;
        let mut at = start;
        let mut escaped = false;
        loop {
            at = quote_or_backslash(bytes, at);
            match bytes.get(at) {
                Some(b'"') => {
                    self.at = at + 1;
                    return self
                        .text
                        .get(start..at)
                        .map(|body| (body, escaped))
                        .ok_or(Malformed);
                }
                Some(_) => {
                    // A backslash: the next byte is escaped, whatever it is.
                    escaped = true;
                    at += 2;
                }
                None => return Err(Malformed),
            }
        }
    }

    /// Skips the string that starts here, without slicing it out.
    fn skip_string(&mut self) -> Result<(), Malformed> {
        let bytes = self.text.as_bytes();
        let mut at = self.at + 1;
        loop {
            at = quote_or_backslash(bytes, at);
            match bytes.get(at) {
                Some(b'"') => {
                    self.at = at + 1;
                    return Ok(());
                }
                Some(_) => at += 2,
                None => return Err(Malformed),
            }
        }
    }

    /// Reads a field pairing reads as a string.
    fn text(&mut self) -> Result<Text<'a>, Malformed> {
        if self.peek() != Some(b'"') {
            self.skip_value()?;
            return Ok(Text::Other);
        }
        Ok(match self.string()? {
            (body, false) => Text::Str(body),
            (_, true) => Text::Escaped,
        })
    }

    /// Skips the value that starts here.
    fn skip_value(&mut self) -> Result<(), Malformed> {
        match self.peek() {
            Some(b'"') => self.skip_string(),
            Some(b'{' | b'[') => self.skip_container(),
            Some(_) => {
                // A number, `true`, `false` or `null`: up to the next
                // delimiter.
                let rest = &self.text.as_bytes()[self.at..];
                let length = rest
                    .iter()
                    .position(|byte| {
                        matches!(byte, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                    })
                    .unwrap_or(rest.len());
                self.at += length;
                Ok(())
            }
            None => Err(Malformed),
        }
    }

    /// Skips the object or array that starts here, by counting brackets
    /// outside strings.
    fn skip_container(&mut self) -> Result<(), Malformed> {
        let bytes = self.text.as_bytes();
        let mut depth = 0usize;
        while let Some(&byte) = bytes.get(self.at) {
            match byte {
                b'"' => {
                    self.skip_string()?;
                    continue;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth = depth.checked_sub(1).ok_or(Malformed)?;
                    if depth == 0 {
                        self.at += 1;
                        return Ok(());
                    }
                }
                _ => {}
            }
            self.at += 1;
        }
        Err(Malformed)
    }

    /// Walks the object that starts here, handing each field's key to
    /// `field`, which must consume the field's value (the cursor is at its
    /// first byte).
    fn object(
        &mut self,
        mut field: impl FnMut(&mut Cursor<'a>, Key) -> Result<(), Malformed>,
    ) -> Result<(), Malformed> {
        self.expect(b'{')?;
        self.space();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.space();
            if self.peek() != Some(b'"') {
                return Err(Malformed);
            }
            let key_start = self.at;
            let key = match self.string()? {
                (body, false) => Key::of(body),
                // Keys are compared by content, so an escaped key still
                // counts; decoding one is rare, so serde_json does it.
                (_, true) => self
                    .text
                    .get(key_start..self.at)
                    .and_then(|quoted| serde_json::from_str::<String>(quoted).ok())
                    .map_or(Key::Other, |key| Key::of(&key)),
            };
            self.expect(b':')?;
            self.space();
            field(self, key)?;
            self.space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(Malformed),
            }
        }
    }

    /// Walks the array that starts here, handing each element to `element`,
    /// which must consume it (the cursor is at its first byte).
    fn array(
        &mut self,
        mut element: impl FnMut(&mut Cursor<'a>) -> Result<(), Malformed>,
    ) -> Result<(), Malformed> {
        self.expect(b'[')?;
        self.space();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.space();
            element(self)?;
            self.space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(Malformed),
            }
        }
    }
}

/// The index of the first `"` or `\\` at or after `at` in `bytes` (or
/// `bytes.len()`), eight bytes at a time: the bodies of the strings a check
/// skips are most of a transcript's bytes.
fn quote_or_backslash(bytes: &[u8], mut at: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = ONES * b'"' as u64;
    const BACKSLASHES: u64 = ONES * b'\\' as u64;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        // A byte of `x` is zero where the byte matched; `(x - ONES) & !x`
        // sets the high bit of the first zero byte (bytes above it may be
        // set spuriously, which the lowest set bit ignores).
        let quotes = word ^ QUOTES;
        let backslashes = word ^ BACKSLASHES;
        let found = ((quotes.wrapping_sub(ONES) & !quotes)
            | (backslashes.wrapping_sub(ONES) & !backslashes))
            & HIGHS;
        if found != 0 {
            return at + (found.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while let Some(&byte) = bytes.get(at) {
        if byte == b'"' || byte == b'\\' {
            return at;
        }
        at += 1;
    }
    at
}

/// Accepts any JSON value and keeps nothing of it, like [`IgnoredAny`](serde::de::IgnoredAny), but
/// reads it the way a [`serde_json::Value`] would: numbers are range-checked,
/// escapes in strings are decoded (so a lone surrogate is an error), and
/// nesting counts toward the recursion limit. A transcript accepted with
/// this is therefore one that parses into `Value`s, which the lazy full tree
/// relies on.
///
/// One difference is on the safe side: a `Value` parse of a whole array
/// counts the array itself toward serde_json's limit of 128 levels, and a
/// parse of one element does not, so an element nested 127 deep is refused
/// here ([`MAX_NESTING`]), and the caller's full parse decides.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Validated;

/// Deepest nesting of arrays and objects [`Validated`] accepts in one value.
pub(crate) const MAX_NESTING: u32 = 126;

impl<'de> Deserialize<'de> for Validated {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValidatedVisitor { depth: 0 })
    }
}

/// Reads one value for [`Validated`]; `depth` counts the arrays and objects
/// around it.
#[derive(Clone, Copy)]
struct ValidatedVisitor {
    depth: u32,
}

impl ValidatedVisitor {
    fn inner<E: serde::de::Error>(self) -> Result<ValidatedVisitor, E> {
        if self.depth >= MAX_NESTING {
            return Err(E::custom("nested too deeply"));
        }
        Ok(ValidatedVisitor {
            depth: self.depth + 1,
        })
    }
}

impl<'de> DeserializeSeed<'de> for ValidatedVisitor {
    type Value = Validated;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Validated, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValidatedVisitor {
    type Value = Validated;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Validated, E> {
        Ok(Validated)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Validated, E> {
        Ok(Validated)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Validated, E> {
        Ok(Validated)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Validated, E> {
        Ok(Validated)
    }
    fn visit_str<E>(self, _: &str) -> Result<Validated, E> {
        Ok(Validated)
    }
    fn visit_unit<E>(self) -> Result<Validated, E> {
        Ok(Validated)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Validated, A::Error> {
        let inner = self.inner()?;
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(Validated)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Validated, A::Error> {
        let inner = self.inner()?;
        while map.next_key::<Validated>()?.is_some() {
            map.next_value_seed(inner)?;
        }
        Ok(Validated)
    }
}

/// The keys pairing reads, in any of the three formats.
#[derive(Debug, Clone, Copy)]
enum Key {
    Role,
    Type,
    Content,
    ToolCalls,
    ToolCallId,
    CallId,
    Id,
    ToolUseId,
    Other,
}

impl Key {
    fn of(key: &str) -> Key {
        match key {
            "role" => Key::Role,
            "type" => Key::Type,
            "content" => Key::Content,
            "tool_calls" => Key::ToolCalls,
            "tool_call_id" => Key::ToolCallId,
            "call_id" => Key::CallId,
            "id" => Key::Id,
            "tool_use_id" => Key::ToolUseId,
            _ => Key::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> View<'_> {
        let mut view = View::default();
        view.read(text).unwrap_or_else(|e| panic!("{e:?}"));
        view
    }

    /// The fields pairing reads are kept, the rest skipped, and a repeated
    /// key overwrites as in a `Value`.
    #[test]
    fn reads_what_pairing_needs() {
        let view = read(
            r#"{"role":"x","role":"assistant","content":[{"type":"tool_use","id":"a","input":{"k":[1]}},7],"tool_calls":[{"id":"c"},3,{"function":{}}],"extra":{"id":"no"}}"#,
        );
        assert!(view.object && !view.escaped);
        assert_eq!(view.role, Text::Str("assistant"));
        assert!(view.content_array && view.tool_calls_array);
        assert_eq!(view.blocks.len(), 2);
        assert_eq!(view.blocks[0].kind, Text::Str("tool_use"));
        assert_eq!(view.blocks[0].id, Text::Str("a"));
        assert_eq!(view.blocks[1].kind, Text::Absent);
        assert_eq!(
            view.tool_calls,
            [Text::Str("c"), Text::Absent, Text::Absent]
        );
        assert_eq!(view.id, Text::Absent);
    }

    /// An escaped string pairing reads marks the view incomplete; an escaped
    /// key is still recognised.
    #[test]
    fn escapes() {
        let view = read(r#"{"\u0072ole":"tool","tool_call_id":"a\"b","content":"x\ny"}"#);
        assert_eq!(view.role, Text::Str("tool"));
        assert!(view.escaped);
        let view = read(r#"{"role":"tool","content":"x\ny"}"#);
        assert!(!view.escaped);
    }

    /// The word-at-a-time search finds the first quote or backslash at
    /// every position and alignment, and the end when there is none.
    #[test]
    fn quote_or_backslash_finds_the_first() {
        for length in 0..24 {
            for at in 0..length {
                for special in [b'"', b'\\'] {
                    let mut bytes = vec![b'a'; length];
                    bytes[at] = special;
                    if at + 1 < length {
                        bytes[at + 1] = b'"';
                    }
                    for from in 0..=at {
                        assert_eq!(quote_or_backslash(&bytes, from), at, "{length} {at} {from}");
                    }
                }
            }
            let plain = "é".repeat(length);
            assert_eq!(quote_or_backslash(plain.as_bytes(), 0), plain.len());
        }
    }

    /// Space anywhere JSON allows it, nested containers in skipped fields,
    /// and escaped quotes inside strings are all walked past.
    #[test]
    fn reads_spaced_and_nested_text() {
        let view = read(
            " {\n \"x\" : [ {\"id\":\"no\"}, [\"]\", {}], -1.5e3 ] ,\t\"content\" : [ { \"type\" : \"tool_result\" , \"content\" : \"a\\\"}]\\\\\" , \"tool_use_id\" : \"t\" } , true ] , \"role\" :\"user\" } \n",
        );
        assert!(view.object && !view.escaped && view.content_array);
        assert_eq!(view.role, Text::Str("user"));
        assert_eq!(view.blocks.len(), 2);
        assert_eq!(view.blocks[0].kind, Text::Str("tool_result"));
        assert_eq!(view.blocks[0].tool_use_id, Text::Str("t"));
        assert_eq!(view.id, Text::Absent);
    }

    /// Text that is not one JSON value is an error, never a panic.
    #[test]
    fn malformed_text_is_an_error() {
        for text in [
            "",
            "{",
            "{\"a\"",
            "{\"a\":",
            "[1,",
            "\"abc",
            "{} {}",
            "{\"a\":1,}x",
            "]",
        ] {
            assert!(View::default().read(text).is_err(), "{text:?}");
        }
    }

    /// Non-objects are seen as such.
    #[test]
    fn non_objects() {
        assert!(!read("[1,{}]").object);
        assert!(!read(r#""text""#).object);
        assert!(!read("null").object);
    }

    /// `Validated` rejects what `Value` rejects.
    #[test]
    fn validated_matches_value() {
        for text in [r#"{"a":1e400}"#, r#"["\ud800"]"#, "[1,]", "{} x"] {
            assert!(serde_json::from_str::<serde_json::Value>(text).is_err());
            assert!(serde_json::from_str::<Validated>(text).is_err(), "{text}");
        }
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(serde_json::from_str::<Validated>(&deep).is_err());
        let nest = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert!(serde_json::from_str::<Validated>(&nest(MAX_NESTING as usize)).is_ok());
        assert!(serde_json::from_str::<Validated>(&nest(MAX_NESTING as usize + 1)).is_err());
    }
}
