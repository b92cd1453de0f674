//! Borrowed views of messages: only the fields pairing reads (roles, item
//! types, call ids, result ids, block types), deserialized straight from the
//! input text without building a [`serde_json::Value`]. Everything else is
//! skipped with [`IgnoredAny`].
//!
//! A view is filled into buffers that are reused from message to message,
//! so a pass over a transcript allocates nothing per message. Strings are
//! borrowed from the input; a string that pairing reads but that contains
//! an escape cannot be borrowed, so the view only records that it met one
//! ([`View::escaped`]) and the caller reads that message from its full tree
//! instead.

use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

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

    /// Reads the message in `text` (one JSON value) into this view.
    ///
    /// # Errors
    /// When `text` is not one JSON value.
    pub(crate) fn read(&mut self, text: &'a str) -> Result<(), serde_json::Error> {
        self.clear();
        let mut deserializer = serde_json::Deserializer::from_str(text);
        MessageSeed(self).deserialize(&mut deserializer)?;
        deserializer.end()
    }
}

/// Accepts any JSON value and keeps nothing of it, like [`IgnoredAny`], but
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

/// Implements the visitor methods for every JSON value other than the ones
/// a visitor cares about, each giving `$value`; arrays and objects are
/// skipped with [`IgnoredAny`].
macro_rules! otherwise {
    ($value:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

macro_rules! otherwise_containers {
    ($value:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok($value)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok($value)
        }
    };
}

macro_rules! otherwise_str {
    ($value:expr) => {
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
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

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    // Keys are compared by content, so an escaped key still counts.
    fn visit_str<E>(self, key: &str) -> Result<Key, E> {
        Ok(match key {
            "role" => Key::Role,
            "type" => Key::Type,
            "content" => Key::Content,
            "tool_calls" => Key::ToolCalls,
            "tool_call_id" => Key::ToolCallId,
            "call_id" => Key::CallId,
            "id" => Key::Id,
            "tool_use_id" => Key::ToolUseId,
            _ => Key::Other,
        })
    }
}

/// Reads a string field, borrowed when it can be.
struct TextSeed;

impl<'de> DeserializeSeed<'de> for TextSeed {
    type Value = Text<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Text<'de>, D::Error> {
        deserializer.deserialize_any(TextVisitor)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Text<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Text<'de>, E> {
        Ok(Text::Str(text))
    }

    fn visit_str<E>(self, _: &str) -> Result<Text<'de>, E> {
        Ok(Text::Escaped)
    }

    otherwise!(Text::Other);
    otherwise_containers!(Text::Other);
}

/// Reads a message into a [`View`].
struct MessageSeed<'v, 'a>(&'v mut View<'a>);

impl<'a> DeserializeSeed<'a> for MessageSeed<'_, 'a> {
    type Value = ();

    fn deserialize<D: Deserializer<'a>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'a> Visitor<'a> for MessageSeed<'_, 'a> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a message")
    }

    otherwise!(());
    otherwise_str!(());

    fn visit_seq<A: SeqAccess<'a>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'a>>(self, mut map: A) -> Result<(), A::Error> {
        let view = self.0;
        view.object = true;
        // A repeated key overwrites, as it does in a `Value`.
        while let Some(key) = map.next_key::<Key>()? {
            let slot = match key {
                Key::Role => &mut view.role,
                Key::Type => &mut view.kind,
                Key::ToolCallId => &mut view.tool_call_id,
                Key::CallId => &mut view.call_id,
                Key::Id => &mut view.id,
                Key::ToolCalls => {
                    view.tool_calls.clear();
                    view.tool_calls_array = map.next_value_seed(ToolCallsSeed(view))?;
                    continue;
                }
                Key::Content => {
                    view.blocks.clear();
                    view.content_array = map.next_value_seed(BlocksSeed(view))?;
                    continue;
                }
                Key::ToolUseId | Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = map.next_value_seed(TextSeed)?;
            view.escaped |= *slot == Text::Escaped;
        }
        Ok(())
    }
}

/// Reads `tool_calls`: true when it is an array, whose elements' `id`s go
/// into the view.
struct ToolCallsSeed<'v, 'a>(&'v mut View<'a>);

impl<'a> DeserializeSeed<'a> for ToolCallsSeed<'_, 'a> {
    type Value = bool;

    fn deserialize<D: Deserializer<'a>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'a> Visitor<'a> for ToolCallsSeed<'_, 'a> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tool calls")
    }

    otherwise!(false);
    otherwise_str!(false);

    fn visit_map<A: MapAccess<'a>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }

    fn visit_seq<A: SeqAccess<'a>>(self, mut seq: A) -> Result<bool, A::Error> {
        let view = self.0;
        while let Some(id) = seq.next_element_seed(FieldSeed(Key::Id))? {
            view.escaped |= id.0 == Text::Escaped;
            view.tool_calls.push(id.0);
        }
        Ok(true)
    }
}

/// Reads one field of an object (`Text::Absent` when the value is not an
/// object): a tool call's `id`.
struct FieldSeed(Key);

/// The field read by [`FieldSeed`].
struct Field<'a>(Text<'a>);

impl<'a> DeserializeSeed<'a> for FieldSeed {
    type Value = Field<'a>;

    fn deserialize<D: Deserializer<'a>>(self, deserializer: D) -> Result<Field<'a>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'a> Visitor<'a> for FieldSeed {
    type Value = Field<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tool call")
    }

    otherwise!(Field(Text::Absent));
    otherwise_str!(Field(Text::Absent));

    fn visit_seq<A: SeqAccess<'a>>(self, mut seq: A) -> Result<Field<'a>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Field(Text::Absent))
    }

    fn visit_map<A: MapAccess<'a>>(self, mut map: A) -> Result<Field<'a>, A::Error> {
        let mut found = Text::Absent;
        while let Some(key) = map.next_key::<Key>()? {
            if std::mem::discriminant(&key) == std::mem::discriminant(&self.0) {
                found = map.next_value_seed(TextSeed)?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Field(found))
    }
}

/// Reads `content`: true when it is an array, whose blocks go into the view.
struct BlocksSeed<'v, 'a>(&'v mut View<'a>);

impl<'a> DeserializeSeed<'a> for BlocksSeed<'_, 'a> {
    type Value = bool;

    fn deserialize<D: Deserializer<'a>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'a> Visitor<'a> for BlocksSeed<'_, 'a> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("message content")
    }

    otherwise!(false);
    otherwise_str!(false);

    fn visit_map<A: MapAccess<'a>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }

    fn visit_seq<A: SeqAccess<'a>>(self, mut seq: A) -> Result<bool, A::Error> {
        let view = self.0;
        while let Some(block) = seq.next_element_seed(BlockSeed)? {
            view.escaped |= [block.kind, block.id, block.tool_use_id].contains(&Text::Escaped);
            view.blocks.push(block);
        }
        Ok(true)
    }
}

/// Reads one content block.
struct BlockSeed;

impl<'a> DeserializeSeed<'a> for BlockSeed {
    type Value = Block<'a>;

    fn deserialize<D: Deserializer<'a>>(self, deserializer: D) -> Result<Block<'a>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'a> Visitor<'a> for BlockSeed {
    type Value = Block<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a content block")
    }

    otherwise!(Block::default());
    otherwise_str!(Block::default());

    fn visit_seq<A: SeqAccess<'a>>(self, mut seq: A) -> Result<Block<'a>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Block::default())
    }

    fn visit_map<A: MapAccess<'a>>(self, mut map: A) -> Result<Block<'a>, A::Error> {
        let mut block = Block::default();
        while let Some(key) = map.next_key::<Key>()? {
            let slot = match key {
                Key::Type => &mut block.kind,
                Key::Id => &mut block.id,
                Key::ToolUseId => &mut block.tool_use_id,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = map.next_value_seed(TextSeed)?;
        }
        Ok(block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> View<'_> {
        let mut view = View::default();
        view.read(text).unwrap_or_else(|e| panic!("{e}"));
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
