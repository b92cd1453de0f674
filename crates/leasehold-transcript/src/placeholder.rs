//! Placeholder results: the unknown-outcome text this library writes for a
//! call with no result, and how a placeholder (ours or another tool's) is
//! recognised, so a real result wins over it. Diagnosis and repair both use
//! these rules.

use serde_json::Value;

/// The marker every placeholder written by this library starts with, so a
/// later repair recognises it and lets a real result replace it.
pub const PLACEHOLDER_MARKER: &str = "[leasehold: tool result unknown]";

/// The full text of the placeholder result given to a call that has none.
/// It says the outcome is unknown rather than inventing a success, so the
/// model does not assume the tool ran.
pub const PLACEHOLDER_TEXT: &str = "[leasehold: tool result unknown] No result was recorded for this tool call. It may or may not have run; check its effects before relying on it or retrying.";

/// Text that placeholders written by other tools are known to contain.
pub const DEFAULT_PLACEHOLDER_MARKERS: &[&str] = &[
    "Tool execution was interrupted and no result was captured",
    "Tool result missing",
];

/// True when a result's payload contains this library's marker or one of
/// `markers` in any of its strings.
pub(crate) fn is_placeholder<S: AsRef<str>>(payload: &Value, markers: &[S]) -> bool {
    match payload {
        Value::String(text) => {
            text.contains(PLACEHOLDER_MARKER)
                || markers.iter().any(|marker| {
                    let marker = marker.as_ref();
                    !marker.is_empty() && text.contains(marker)
                })
        }
        Value::Array(items) => items.iter().any(|item| is_placeholder(item, markers)),
        Value::Object(fields) => fields.values().any(|item| is_placeholder(item, markers)),
        _ => false,
    }
}
