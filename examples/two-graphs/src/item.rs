//! The transcript: items shaped like the OpenAI Responses API's input.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A transcript item, shaped like an OpenAI Responses API input item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Item {
    Message { role: String, content: String },
    FunctionCall { call_id: String, name: String },
    FunctionCallOutput { call_id: String, output: String },
}

impl Item {
    pub(crate) fn user(text: impl Into<String>) -> Item {
        Item::Message {
            role: "user".into(),
            content: text.into(),
        }
    }

    pub(crate) fn assistant(text: impl Into<String>) -> Item {
        Item::Message {
            role: "assistant".into(),
            content: text.into(),
        }
    }
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Item::Message { role, content } => write!(f, "{role}: {content}"),
            Item::FunctionCall { call_id, name } => write!(f, "function_call {call_id} {name}"),
            Item::FunctionCallOutput { call_id, output } => {
                write!(f, "function_call_output {call_id} {output:?}")
            }
        }
    }
}
