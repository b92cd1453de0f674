//! Diagnosis: every way a transcript breaks the pairing rule, each with the
//! provider error it would cause.

use std::fmt::{self, Write as _};

use serde::Serialize;

use super::TranscriptError;
use super::format::{self, Format};
use super::pairing::{Pairing, Placement, ResultSite};
use super::placeholder::{DEFAULT_PLACEHOLDER_MARKERS, is_placeholder};
use super::text::Transcript;

/// What is wrong with one call or result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A call has no result anywhere. The provider rejects the call's
    /// message as unanswered.
    Missing,
    /// A call has more than one result, for example a placeholder followed
    /// later by the real result. Reported at each copy after the first; the
    /// provider rejects the extra copy as answering no call.
    DuplicateResult,
    /// A result quotes a call id that no call uses. The provider rejects it
    /// as answering no call.
    Orphan,
    /// A result is not where the provider requires it: after a later model
    /// turn (including one that makes calls itself), after a user or system
    /// message, or before its call. The detail says which.
    Misplaced,
    /// Two calls use the same id, in one turn or across turns. Which result
    /// answers which call cannot be told, so repair leaves these to a person.
    DuplicateCallId,
    /// Anthropic: a `tool_result` block follows a text (or other) block in
    /// its user message; results must come first.
    TextBeforeToolResult,
    /// Anthropic: a turn's results are spread over several user messages
    /// instead of all being in the one message after the turn.
    ResultsSplitAcrossMessages,
}

impl FindingKind {
    /// A short human name.
    pub fn describe(self) -> &'static str {
        match self {
            FindingKind::Missing => "missing result",
            FindingKind::DuplicateResult => "duplicate result",
            FindingKind::Orphan => "orphan result",
            FindingKind::Misplaced => "misplaced result",
            FindingKind::DuplicateCallId => "duplicate call id",
            FindingKind::TextBeforeToolResult => "text before tool_result",
            FindingKind::ResultsSplitAcrossMessages => "results split across messages",
        }
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// One violation of the pairing rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// What is wrong.
    pub kind: FindingKind,
    /// The call id involved, exactly as written (empty when the message has
    /// none).
    pub call_id: String,
    /// 0-based index of the message at fault: the call for `missing` and
    /// `duplicate_call_id`, the result otherwise.
    pub index: usize,
    /// 1-based line of that message, for JSONL input.
    pub line: Option<usize>,
    /// Where the related call and results are, in words.
    pub detail: String,
    /// The error text the provider returns for this, so a finding can be
    /// matched against a failed request.
    pub provider_error: String,
}

/// The outcome of [`diagnose`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The format the transcript was checked against.
    pub format: Format,
    /// How many messages were checked.
    pub messages: usize,
    /// Every finding, in message order; empty when healthy.
    pub findings: Vec<Finding>,
}

impl Report {
    /// True when no finding was made: the provider would accept the pairing.
    pub fn is_healthy(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Checks tool-call pairing in one pass over the messages.
///
/// `format` names the format; `None` detects it with [`detect`](super::detect).
/// A transcript with no tool activity is healthy in any named format.
///
/// # Errors
///
/// - [`TranscriptError::FormatNotDetected`] or
///   [`TranscriptError::FormatAmbiguous`] when `format` is `None` and the
///   messages do not show exactly one format.
/// - [`TranscriptError::NotAnObject`] when a message is not a JSON object.
pub fn diagnose(
    transcript: &Transcript,
    format: Option<Format>,
) -> Result<Report, TranscriptError> {
    let pairing = Pairing::build(transcript, format)?;
    Ok(report_from(transcript, &pairing))
}

/// Turns the pairing of one pass into findings, in message order.
pub(crate) fn report_from(transcript: &Transcript, pairing: &Pairing<'_>) -> Report {
    let format = pairing.format;
    let mut findings = Vec::new();
    let mut push = |kind, call_id: &str, index, detail, provider_error| {
        findings.push(Finding {
            kind,
            call_id: call_id.to_string(),
            index,
            line: transcript.line(index),
            detail,
            provider_error,
        });
    };

    for (position, site) in pairing.calls.iter().enumerate() {
        let id = site.id;
        let entry = pairing.entries[site.entry as usize];
        if entry.calls > 1 {
            let first = entry.first_call.get().unwrap_or(position);
            if first != position {
                let first = &pairing.calls[first];
                let turn = if first.turn == site.turn {
                    "in the same turn"
                } else {
                    "in an earlier turn"
                };
                push(
                    FindingKind::DuplicateCallId,
                    id,
                    site.index(),
                    format!(
                        "call id {id} is already used by the call at message {} ({turn}); {} calls and {} results use it",
                        first.index(),
                        entry.calls,
                        entry.results
                    ),
                    format::duplicate_call_error(format, &pairing.call_ref(position), site.index()),
                );
            }
        } else if entry.results == 0 {
            push(
                FindingKind::Missing,
                id,
                site.index(),
                format!(
                    "the call at message {} has no result anywhere",
                    site.index()
                ),
                format::missing_result_error(format, id, site.index()),
            );
        }
    }

    for (position, site) in pairing.results.iter().enumerate() {
        let id = site.id;
        let entry = pairing.entries[site.entry as usize];
        let unexpected = || format::unexpected_result_error(format, id, site.index(), site.block());
        let Some(call) = entry.first_call.get().map(|call| &pairing.calls[call]) else {
            push(
                FindingKind::Orphan,
                id,
                site.index(),
                format!("no call uses id {id:?}"),
                unexpected(),
            );
            continue;
        };
        if entry.calls > 1 {
            // Reported once, at the reused call; which result belongs to
            // which call cannot be told.
            continue;
        }
        let first_result = entry.first_result.get().unwrap_or(position);
        if first_result != position {
            let first = &pairing.results[first_result];
            push(
                FindingKind::DuplicateResult,
                id,
                site.index(),
                format!(
                    "the call at message {} already has a result at message {}{}",
                    call.index(),
                    first.index(),
                    placeholder_note(transcript, format, first.index(), first.block(), site)
                ),
                unexpected(),
            );
        }
        if site.placement == Placement::InPlace {
            continue;
        }
        // A provider reads in message order: a call left unanswered in its
        // reply fails first, unless this result comes before the call or
        // another copy does answer it, in which case this copy fails. (Built
        // only here: a healthy transcript's results never format an error.)
        let error = if entry.answered_in_place || site.placement == Placement::BeforeCall {
            unexpected()
        } else {
            format::missing_result_error(format, id, call.index())
        };
        let call_at = call.index();
        let (kind, detail) = match site.placement {
            Placement::InPlace => continue,
            Placement::TextBefore => (
                FindingKind::TextBeforeToolResult,
                format!(
                    "the tool_result block comes after another block in its message; tool_result blocks must come first (call at message {call_at})"
                ),
            ),
            Placement::Split => (
                FindingKind::ResultsSplitAcrossMessages,
                format!(
                    "the result is in message {}, but every result for the call at message {call_at} must be in message {}",
                    site.index(),
                    call_at + 1
                ),
            ),
            Placement::BeforeCall => (
                FindingKind::Misplaced,
                format!("the result comes before its call at message {call_at}"),
            ),
            Placement::Late { turn_start } => (
                FindingKind::Misplaced,
                format!(
                    "the result comes after a later assistant turn at message {turn_start} (call at message {call_at})"
                ),
            ),
            Placement::AfterUser { user } => (
                FindingKind::Misplaced,
                format!("the result comes after user message {user} (call at message {call_at})"),
            ),
            Placement::AfterOther { message } => (
                FindingKind::Misplaced,
                format!(
                    "the result is not in the reply to its call at message {call_at}; message {message} ends that reply"
                ),
            ),
        };
        push(kind, id, site.index(), detail, error);
    }

    // Calls and results are each in message order; merge them. The sort is
    // stable, so a message's call findings stay ahead of its result findings.
    findings.sort_by_key(|finding| finding.index);
    Report {
        format,
        messages: transcript.len(),
        findings,
    }
}

/// Says which of two copies is a placeholder, when one is.
fn placeholder_note(
    transcript: &Transcript,
    format: Format,
    first_index: usize,
    first_block: Option<usize>,
    site: &ResultSite<'_>,
) -> String {
    let looks_like_placeholder = |index: usize, block: Option<usize>| {
        transcript
            .message(index)
            .and_then(|message| format::result_payload(format, message, block))
            .is_some_and(|payload| is_placeholder(payload, DEFAULT_PLACEHOLDER_MARKERS))
    };
    match (
        looks_like_placeholder(first_index, first_block),
        looks_like_placeholder(site.index(), site.block()),
    ) {
        (true, false) => {
            format!("; message {first_index} holds a placeholder and this one looks real")
        }
        (false, true) => "; this copy is a placeholder".to_string(),
        (true, true) => "; both are placeholders".to_string(),
        (false, false) => String::new(),
    }
}

/// Renders a report for people: one line per finding, or one line saying
/// the transcript is healthy.
pub fn render_human(report: &Report) -> String {
    if report.is_healthy() {
        return format!(
            "healthy: {} messages, format {}\n",
            report.messages, report.format
        );
    }
    let mut out = format!(
        "{} finding(s) in {} messages, format {}\n",
        report.findings.len(),
        report.messages,
        report.format
    );
    for finding in &report.findings {
        let place = match finding.line {
            Some(line) => format!("message {} (line {line})", finding.index),
            None => format!("message {}", finding.index),
        };
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "{place}: {} {}: {} | provider error: {}",
            finding.kind, finding.call_id, finding.detail, finding.provider_error
        );
    }
    out
}
