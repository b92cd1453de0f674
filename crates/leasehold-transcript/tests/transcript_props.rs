//! Property tests: random healthy transcripts in all three formats stay
//! healthy and unchanged, and random corruptions are always reported and
//! always repaired (or reported unrecoverable).
//!
//! Transcripts are generated as a format-neutral list of entries, corrupted
//! at that level, and only then rendered in a wire format, so one corruption
//! is exercised in every format.

use leasehold_transcript::{
    FindingKind, Format, PLACEHOLDER_MARKER, RepairOptions, Transcript, detect, diagnose, repair,
};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Another tool's placeholder, as written by real repair tools.
const FOREIGN_PLACEHOLDER: &str = r#"{"error":"unknown_error","message":"Tool execution was interrupted and no result was captured."}"#;

/// One step of a conversation, before it is given a wire format.
#[derive(Debug, Clone, PartialEq)]
enum Entry {
    User(String),
    /// A model turn: optional text, then calls by id.
    Assistant {
        text: Option<String>,
        calls: Vec<String>,
        /// Responses: precede the turn with a reasoning item.
        reasoning: bool,
    },
    /// A result for a call id, with its payload.
    Result {
        id: String,
        output: String,
    },
}

/// The shape of one generated turn.
#[derive(Debug, Clone)]
struct TurnShape {
    user_first: bool,
    calls: usize,
    /// Seeds the order the results come back in.
    result_order: u64,
    text: bool,
    reasoning: bool,
    /// Anthropic: a text block after the results, which is allowed.
    trailing_text: bool,
}

/// A healthy conversation: every call answered in its turn's reply.
fn healthy_entries(turns: &[TurnShape]) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut next_id = 0;
    for (number, turn) in turns.iter().enumerate() {
        if turn.user_first || number == 0 {
            entries.push(Entry::User(format!("request {number}")));
        }
        let calls: Vec<String> = (0..turn.calls)
            .map(|_| {
                next_id += 1;
                format!("id{next_id}")
            })
            .collect();
        entries.push(Entry::Assistant {
            text: (turn.text || calls.is_empty()).then(|| format!("turn {number}")),
            calls: calls.clone(),
            reasoning: turn.reasoning,
        });
        let mut order = calls;
        shuffle(&mut order, turn.result_order);
        for id in order {
            entries.push(Entry::Result {
                output: format!("output of {id}"),
                id,
            });
        }
    }
    entries
}

/// A deterministic shuffle, so the generated case is fully described by its
/// seed.
fn shuffle<T>(items: &mut [T], mut seed: u64) {
    for at in (1..items.len()).rev() {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let other = (seed >> 33) as usize % (at + 1);
        items.swap(at, other);
    }
}

fn prefix(format: Format) -> &'static str {
    match format {
        Format::Anthropic => "toolu_",
        Format::OpenAiChat | Format::OpenAiResponses => "call_",
    }
}

/// Renders entries as wire messages.
fn render(entries: &[Entry], format: Format, trailing_text: &[bool]) -> Vec<Value> {
    let id = |raw: &str| format!("{}{raw}", prefix(format));
    let mut messages: Vec<Value> = Vec::new();
    let mut turn = 0;
    let mut at = 0;
    while at < entries.len() {
        match &entries[at] {
            Entry::User(text) => messages.push(match format {
                Format::OpenAiResponses => json!({
                    "type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": text}],
                }),
                _ => json!({"role": "user", "content": text}),
            }),
            Entry::Assistant {
                text,
                calls,
                reasoning,
            } => {
                turn += 1;
                match format {
                    Format::OpenAiChat => {
                        let mut message = json!({"role": "assistant", "content": text});
                        if !calls.is_empty() {
                            message["tool_calls"] = calls
                                .iter()
                                .map(|call| {
                                    json!({
                                        "id": id(call), "type": "function",
                                        "function": {"name": "shell", "arguments": "{}"},
                                    })
                                })
                                .collect();
                        }
                        messages.push(message);
                    }
                    Format::Anthropic => {
                        let mut content: Vec<Value> = text
                            .iter()
                            .map(|text| json!({"type": "text", "text": text}))
                            .collect();
                        content.extend(calls.iter().map(|call| {
                            json!({"type": "tool_use", "id": id(call), "name": "shell", "input": {}})
                        }));
                        messages.push(json!({"role": "assistant", "content": content}));
                    }
                    Format::OpenAiResponses => {
                        if *reasoning {
                            messages.push(json!({"type": "reasoning", "id": format!("rs_{turn}"), "summary": []}));
                        }
                        if let Some(text) = text {
                            messages.push(json!({
                                "type": "message", "role": "assistant",
                                "content": [{"type": "output_text", "text": text}],
                            }));
                        }
                        for call in calls {
                            messages.push(json!({
                                "type": "function_call", "id": format!("fc_{call}"),
                                "call_id": id(call), "name": "shell", "arguments": "{}",
                            }));
                        }
                    }
                }
            }
            Entry::Result { .. } if format == Format::Anthropic => {
                // Consecutive results share one user message.
                let mut content = Vec::new();
                while let Some(Entry::Result { id: call, output }) = entries.get(at) {
                    content.push(
                        json!({"type": "tool_result", "tool_use_id": id(call), "content": output}),
                    );
                    at += 1;
                }
                if trailing_text.get(turn).copied().unwrap_or(false) {
                    content.push(json!({"type": "text", "text": "and then"}));
                }
                messages.push(json!({"role": "user", "content": content}));
                continue;
            }
            Entry::Result { id: call, output } => messages.push(match format {
                Format::OpenAiResponses => {
                    json!({"type": "function_call_output", "call_id": id(call), "output": output})
                }
                _ => json!({"role": "tool", "tool_call_id": id(call), "content": output}),
            }),
        }
        at += 1;
    }
    messages
}

/// Writes messages as a pretty array, a compact array, or JSONL.
fn to_text(messages: &[Value], layout: u8) -> String {
    match layout % 3 {
        0 => serde_json::to_string_pretty(messages).unwrap_or_default(),
        1 => serde_json::to_string(messages).unwrap_or_default(),
        _ => messages
            .iter()
            .map(|message| serde_json::to_string(message).unwrap_or_default() + "\n")
            .collect(),
    }
}

/// Every result in a wire transcript, as (call id, payload), read
/// independently of the library.
fn results_in(transcript: &Transcript, format: Format) -> Vec<(String, Value)> {
    let mut found = Vec::new();
    for message in transcript.messages() {
        let text = |value: &Value, key: &str| value[key].as_str().unwrap_or_default().to_string();
        match format {
            Format::OpenAiChat if message["role"] == "tool" => {
                found.push((text(message, "tool_call_id"), message["content"].clone()));
            }
            Format::Anthropic => {
                for block in message["content"].as_array().into_iter().flatten() {
                    if block["type"] == "tool_result" {
                        found.push((text(block, "tool_use_id"), block["content"].clone()));
                    }
                }
            }
            Format::OpenAiResponses
                if message["type"]
                    .as_str()
                    .is_some_and(|kind| kind.ends_with("_call_output")) =>
            {
                found.push((text(message, "call_id"), message["output"].clone()));
            }
            _ => {}
        }
    }
    found
}

/// A corruption seen in the field, applied to a healthy conversation.
#[derive(Debug, Clone)]
enum Corruption {
    /// A call's result is lost.
    DropResult(usize),
    /// A result is written twice.
    DuplicateResult(usize),
    /// A result lands after a later user or assistant message.
    MoveLater(usize, usize),
    /// A result lands before its call.
    MoveBeforeCall(usize),
    /// A result with no call appears.
    Orphan(usize),
    /// A placeholder stands in for a result and the real one arrives later.
    PlaceholderThenReal(usize, usize),
    /// A call reuses another call's id (its results follow).
    ReuseId(usize, usize),
}

fn corruption() -> impl Strategy<Value = Corruption> {
    prop_oneof![
        any::<usize>().prop_map(Corruption::DropResult),
        any::<usize>().prop_map(Corruption::DuplicateResult),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Corruption::MoveLater(a, b)),
        any::<usize>().prop_map(Corruption::MoveBeforeCall),
        any::<usize>().prop_map(Corruption::Orphan),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Corruption::PlaceholderThenReal(a, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Corruption::ReuseId(a, b)),
    ]
}

fn result_positions(entries: &[Entry]) -> Vec<usize> {
    (0..entries.len())
        .filter(|&at| matches!(entries[at], Entry::Result { .. }))
        .collect()
}

fn call_position(entries: &[Entry], id: &str) -> usize {
    entries
        .iter()
        .position(|entry| matches!(entry, Entry::Assistant { calls, .. } if calls.iter().any(|call| call == id)))
        .unwrap_or(0)
}

/// Positions after which a moved result is outside its call's reply: after
/// any later user message, or after a later model turn that starts after
/// input (Responses merges adjacent model output into one turn).
fn later_boundaries(entries: &[Entry], after: usize, format: Format) -> Vec<usize> {
    (after + 1..entries.len())
        .filter(|&at| match &entries[at] {
            Entry::User(_) => true,
            Entry::Assistant { .. } => {
                format != Format::OpenAiResponses
                    || !matches!(entries[at - 1], Entry::Assistant { .. })
            }
            Entry::Result { .. } => false,
        })
        .collect()
}

/// Applies a corruption; every corruption leaves a trace a provider rejects.
fn corrupt(entries: &mut Vec<Entry>, corruption: &Corruption, format: Format, fresh: usize) {
    let results = result_positions(entries);
    if results.is_empty() {
        entries.push(Entry::Result {
            id: format!("orphan{fresh}"),
            output: "stray".into(),
        });
        return;
    }
    let pick = |n: usize| results[n % results.len()];
    match *corruption {
        Corruption::DropResult(n) => {
            entries.remove(pick(n));
        }
        Corruption::DuplicateResult(n) => {
            let at = pick(n);
            let copy = entries[at].clone();
            entries.insert(at + 1, copy);
        }
        Corruption::MoveLater(n, target) => {
            let result = entries.remove(pick(n));
            let Entry::Result { id, .. } = &result else {
                return;
            };
            let call = call_position(entries, id);
            let targets = later_boundaries(entries, call, format);
            let at = match targets.as_slice() {
                [] => call,
                targets => targets[target % targets.len()] + 1,
            };
            entries.insert(at, result);
        }
        Corruption::MoveBeforeCall(n) => {
            let result = entries.remove(pick(n));
            let Entry::Result { id, .. } = &result else {
                return;
            };
            let call = call_position(entries, id);
            entries.insert(call, result);
        }
        Corruption::Orphan(n) => {
            let at = n % (entries.len() + 1);
            entries.insert(
                at,
                Entry::Result {
                    id: format!("orphan{fresh}"),
                    output: "stray".into(),
                },
            );
        }
        Corruption::PlaceholderThenReal(n, target) => {
            let at = pick(n);
            let real = entries[at].clone();
            if let Entry::Result { output, .. } = &mut entries[at] {
                *output = FOREIGN_PLACEHOLDER.to_string();
            }
            let Entry::Result { id, .. } = &real else {
                return;
            };
            let targets = later_boundaries(entries, call_position(entries, id), format);
            let after = match targets.as_slice() {
                [] => at,
                targets => targets[target % targets.len()],
            };
            entries.insert(after + 1, real);
        }
        Corruption::ReuseId(a, b) => {
            let ids: Vec<String> = entries
                .iter()
                .flat_map(|entry| match entry {
                    Entry::Assistant { calls, .. } => calls.clone(),
                    _ => Vec::new(),
                })
                .collect();
            let (keep, reuse) = (ids[a % ids.len()].clone(), ids[b % ids.len()].clone());
            let reuse = if keep == reuse {
                // Reuse within the same turn: add a second call with the id.
                let call = call_position(entries, &keep);
                if let Entry::Assistant { calls, .. } = &mut entries[call] {
                    calls.push(keep.clone());
                }
                return;
            } else {
                reuse
            };
            for entry in entries.iter_mut() {
                match entry {
                    Entry::Assistant { calls, .. } => {
                        for call in calls.iter_mut().filter(|call| **call == reuse) {
                            *call = keep.clone();
                        }
                    }
                    Entry::Result { id, .. } if *id == reuse => *id = keep.clone(),
                    _ => {}
                }
            }
        }
    }
}

fn turn_shape() -> impl Strategy<Value = TurnShape> {
    (
        any::<bool>(),
        0usize..=3,
        any::<u64>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(user_first, calls, result_order, text, reasoning, trailing_text)| TurnShape {
                user_first,
                calls,
                result_order,
                text,
                reasoning,
                trailing_text,
            },
        )
}

/// A conversation whose first turn makes at least one call.
fn conversation() -> impl Strategy<Value = Vec<TurnShape>> {
    prop::collection::vec(turn_shape(), 1..7).prop_map(|mut turns| {
        turns[0].calls = turns[0].calls.max(1);
        turns
    })
}

fn format() -> impl Strategy<Value = Format> {
    prop::sample::select(Format::ALL.to_vec())
}

fn trailing(turns: &[TurnShape]) -> Vec<bool> {
    // Index by turn number as `render` counts them (from 1).
    std::iter::once(false)
        .chain(turns.iter().map(|turn| turn.trailing_text))
        .collect()
}

fn parse(
    entries: &[Entry],
    format: Format,
    turns: &[TurnShape],
    layout: u8,
) -> (String, Transcript) {
    let text = to_text(&render(entries, format, &trailing(turns)), layout);
    let transcript = Transcript::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    (text, transcript)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A healthy transcript diagnoses healthy and its format is detected.
    #[test]
    fn healthy_transcripts_diagnose_healthy(turns in conversation(), format in format(), layout in any::<u8>()) {
        let (_, transcript) = parse(&healthy_entries(&turns), format, &turns, layout);
        prop_assert_eq!(detect(&transcript), Some(format));
        let report = diagnose(&transcript, None).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(report.is_healthy(), "{:?}", report.findings);
    }

    /// Repair leaves a healthy transcript byte for byte as it was.
    #[test]
    fn healthy_transcripts_repair_unchanged(turns in conversation(), format in format(), layout in any::<u8>()) {
        let (text, transcript) = parse(&healthy_entries(&turns), format, &turns, layout);
        let repaired = repair(&transcript, Some(format), &RepairOptions::default())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(repaired.actions.is_empty(), "{:?}", repaired.actions);
        prop_assert!(repaired.unrecoverable.is_empty());
        prop_assert_eq!(repaired.transcript.to_text(), text);
    }

    /// One corruption is never reported healthy.
    #[test]
    fn a_corrupted_transcript_is_never_healthy(
        turns in conversation(), format in format(), layout in any::<u8>(), damage in corruption(),
    ) {
        let mut entries = healthy_entries(&turns);
        corrupt(&mut entries, &damage, format, 0);
        let (text, transcript) = parse(&entries, format, &turns, layout);
        let report = diagnose(&transcript, Some(format)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(!report.is_healthy(), "{:?} reported healthy:\n{}", damage, text);
    }

    /// Repairing one corruption keeps every genuine result exactly once,
    /// gives lost results an unknown-outcome placeholder, drops orphans, and
    /// yields a healthy transcript; only a reused id is left for a person.
    #[test]
    fn repair_keeps_genuine_results_and_heals(
        turns in conversation(), format in format(), layout in any::<u8>(), damage in corruption(),
    ) {
        let healthy = healthy_entries(&turns);
        let mut entries = healthy.clone();
        corrupt(&mut entries, &damage, format, 0);
        let (text, transcript) = parse(&entries, format, &turns, layout);
        let repaired = repair(&transcript, Some(format), &RepairOptions::default())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let report = diagnose(&repaired.transcript, Some(format)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&report.findings, &repaired.unrecoverable);
        if let Corruption::ReuseId(..) = damage {
            prop_assert!(repaired.unrecoverable.iter().all(|f| f.kind == FindingKind::DuplicateCallId));
            prop_assert!(!repaired.unrecoverable.is_empty());
            return Ok(());
        }
        prop_assert!(report.is_healthy(), "{:?} left {:?}\n{}", damage, report.findings, text);

        let results = results_in(&repaired.transcript, format);
        let survivors: Vec<&String> = entries.iter().filter_map(|entry| match entry {
            Entry::Result { id, output } if output != FOREIGN_PLACEHOLDER => Some(id),
            _ => None,
        }).collect();
        for entry in &healthy {
            let Entry::Result { id, output } = entry else { continue };
            let wire_id = format!("{}{id}", prefix(format));
            let copies: Vec<&Value> = results.iter().filter(|(found, _)| *found == wire_id).map(|(_, payload)| payload).collect();
            prop_assert_eq!(copies.len(), 1, "{} has {} results", wire_id, copies.len());
            if survivors.contains(&id) {
                prop_assert_eq!(copies[0], &json!(output));
            } else {
                prop_assert!(copies[0].as_str().is_some_and(|text| text.contains(PLACEHOLDER_MARKER)));
            }
        }
        prop_assert!(results.iter().all(|(id, _)| !id.contains("orphan")));
    }

    /// Several corruptions at once: repair output is healthy or reported
    /// unrecoverable, and repairing it again changes nothing.
    #[test]
    fn repair_is_healthy_or_unrecoverable_and_idempotent(
        turns in conversation(), format in format(), layout in any::<u8>(),
        damage in prop::collection::vec(corruption(), 1..4),
    ) {
        let mut entries = healthy_entries(&turns);
        for (fresh, corruption) in damage.iter().enumerate() {
            corrupt(&mut entries, corruption, format, fresh);
        }
        let (text, transcript) = parse(&entries, format, &turns, layout);
        let repaired = repair(&transcript, Some(format), &RepairOptions::default())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let report = diagnose(&repaired.transcript, Some(format)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&report.findings, &repaired.unrecoverable);
        let reused = damage.iter().any(|c| matches!(c, Corruption::ReuseId(..)));
        prop_assert!(reused || report.is_healthy(), "{:?} left {:?}\n{}", damage, report.findings, text);

        let again = repair(&repaired.transcript, Some(format), &RepairOptions::default())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(again.actions.is_empty(), "second repair acted: {:?}", again.actions);
        prop_assert_eq!(again.transcript.to_text(), repaired.transcript.to_text());
    }
}

/// Anthropic-only damage to the layout of a results message.
#[derive(Debug, Clone)]
enum BlockDamage {
    /// A text block put ahead of the results.
    TextFirst,
    /// The results spread over two consecutive user messages (split after
    /// the first of at least two results).
    Split,
}

/// Applies `damage` to the `pick`-th user message that holds results and
/// returns whether anything changed.
fn damage_blocks(messages: &mut Vec<Value>, damage: &BlockDamage, pick: usize) -> bool {
    let holders: Vec<usize> = (0..messages.len())
        .filter(|&at| {
            messages[at]["content"]
                .as_array()
                .is_some_and(|blocks| blocks.iter().any(|block| block["type"] == "tool_result"))
        })
        .collect();
    let candidates: Vec<usize> = match damage {
        BlockDamage::TextFirst => holders,
        BlockDamage::Split => holders
            .into_iter()
            .filter(|&at| {
                let blocks = messages[at]["content"].as_array().into_iter().flatten();
                blocks
                    .filter(|block| block["type"] == "tool_result")
                    .count()
                    > 1
            })
            .collect(),
    };
    let Some(&at) = candidates.get(pick % candidates.len().max(1)) else {
        return false;
    };
    let mut blocks = messages[at]["content"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    match damage {
        BlockDamage::TextFirst => {
            blocks.insert(0, json!({"type": "text", "text": "here are the results"}));
            messages[at]["content"] = Value::Array(blocks);
        }
        BlockDamage::Split => {
            let tail = blocks.split_off(1);
            messages[at]["content"] = Value::Array(blocks);
            messages.insert(at + 1, json!({"role": "user", "content": tail}));
        }
    }
    true
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Text ahead of Anthropic results, or results split over two user
    /// messages, is reported, and repair puts the results back in order in
    /// one message.
    #[test]
    fn anthropic_block_layout_damage_is_found_and_healed(
        turns in conversation().prop_map(|mut turns| { turns[0].calls = 2; turns }),
        layout in any::<u8>(), pick in any::<usize>(),
        damage in prop_oneof![Just(BlockDamage::TextFirst), Just(BlockDamage::Split)],
    ) {
        let format = Format::Anthropic;
        let mut messages = render(&healthy_entries(&turns), format, &trailing(&turns));
        // The first turn makes two calls, so there is always a reply to damage.
        prop_assert!(damage_blocks(&mut messages, &damage, pick));
        let text = to_text(&messages, layout);
        let transcript = Transcript::parse(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let report = diagnose(&transcript, Some(format)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let expected = match damage {
            BlockDamage::TextFirst => FindingKind::TextBeforeToolResult,
            BlockDamage::Split => FindingKind::ResultsSplitAcrossMessages,
        };
        prop_assert!(report.findings.iter().any(|f| f.kind == expected), "{:?}", report.findings);

        let repaired = repair(&transcript, Some(format), &RepairOptions::default())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(repaired.unrecoverable.is_empty(), "{:?}\n{}", repaired.unrecoverable, text);
        prop_assert_eq!(
            results_in(&repaired.transcript, format).len(),
            results_in(&transcript, format).len()
        );
    }
}

/// The same messages, held as trees only, as a transcript built in memory
/// holds them: diagnosis then reads every message from its tree.
fn full_tree(text: &str, transcript: &Transcript) -> Transcript {
    let values: Vec<Value> = if transcript.is_jsonl() {
        text.lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}")))
            .collect()
    } else {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}"))
    };
    Transcript::from_messages(values, transcript.layout())
}

/// Writes some keys and ids with `\u` escapes, which a borrowed view cannot
/// borrow (ids) or must still recognise (keys).
fn escape_some(text: &str) -> String {
    text.replace("\"id", "\"\\u0069d")
        .replace("\"role\"", "\"\\u0072ole\"")
        .replace("\"type\"", "\"typ\\u0065\"")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Diagnosis through borrowed views of the parsed text (the fast path)
    /// and through full trees make the same findings, detect the same
    /// format, fail the same way, and repair the same way, on healthy and
    /// corrupted transcripts, with and without escapes, named format or not.
    #[test]
    fn fast_path_and_full_tree_agree(
        turns in conversation(), format in format(), layout in any::<u8>(),
        damage in prop::collection::vec(corruption(), 0..4),
        blocks in prop::option::of((prop_oneof![Just(BlockDamage::TextFirst), Just(BlockDamage::Split)], any::<usize>())),
        escape in any::<bool>(), named in any::<bool>(),
    ) {
        let mut entries = healthy_entries(&turns);
        for (fresh, corruption) in damage.iter().enumerate() {
            corrupt(&mut entries, corruption, format, fresh);
        }
        let mut messages = render(&entries, format, &trailing(&turns));
        if let (Format::Anthropic, Some((damage, pick))) = (format, &blocks) {
            damage_blocks(&mut messages, damage, *pick);
        }
        let mut text = to_text(&messages, layout);
        if escape {
            text = escape_some(&text);
        }
        let fast = Transcript::parse(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let tree = full_tree(&text, &fast);
        let named = named.then_some(format);
        prop_assert_eq!(detect(&fast), detect(&tree));
        let (from_fast, from_tree) = (diagnose(&fast, named), diagnose(&tree, named));
        match (&from_fast, &from_tree) {
            (Ok(fast), Ok(tree)) => prop_assert_eq!(fast, tree),
            _ => prop_assert_eq!(
                from_fast.map_err(|e| e.to_string()).err(),
                from_tree.map_err(|e| e.to_string()).err()
            ),
        }
        let options = RepairOptions::default();
        if let (Ok(fast), Ok(tree)) = (repair(&fast, named, &options), repair(&tree, named, &options)) {
            prop_assert_eq!(&fast.actions, &tree.actions);
            prop_assert_eq!(&fast.unrecoverable, &tree.unrecoverable);
            prop_assert_eq!(&fast.transcript, &tree.transcript);
        }
    }

    /// Messages that are not what any format expects (not objects, odd
    /// field types, repeated keys, escapes) read the same through views and
    /// trees.
    #[test]
    fn fast_path_and_full_tree_agree_on_odd_messages(
        group in 0usize..4,
        picks in prop::collection::vec(any::<prop::sample::Index>(), 1..16),
        jsonl in any::<bool>(), named in prop::option::of(format()),
    ) {
        // Mostly one format's messages plus format-neutral ones, so that
        // detection succeeds and pairing runs; group 3 mixes everything,
        // non-objects included.
        let pool: Vec<&str> = match group {
            3 => ODD_MESSAGES.into_iter().flatten().copied().collect(),
            _ => ODD_MESSAGES[group].iter().chain(ODD_MESSAGES[3]).copied().collect(),
        };
        let messages: Vec<&str> = picks.iter().map(|pick| *pick.get(&pool)).collect();
        // JSON lines that start with `[` read as an array.
        let text = if jsonl && !messages[0].starts_with('[') {
            messages.join("\n") + "\n"
        } else {
            format!("[{}]", messages.join(",\n"))
        };
        let fast = Transcript::parse(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let tree = full_tree(&text, &fast);
        prop_assert_eq!(detect(&fast), detect(&tree));
        let (from_fast, from_tree) = (diagnose(&fast, named), diagnose(&tree, named));
        match (&from_fast, &from_tree) {
            (Ok(fast), Ok(tree)) => prop_assert_eq!(fast, tree),
            _ => prop_assert_eq!(
                from_fast.map_err(|e| e.to_string()).err(),
                from_tree.map_err(|e| e.to_string()).err()
            ),
        }
        let options = RepairOptions::default();
        if let (Ok(fast), Ok(tree)) = (repair(&fast, named, &options), repair(&tree, named, &options)) {
            prop_assert_eq!(&fast.actions, &tree.actions);
            prop_assert_eq!(&fast.unrecoverable, &tree.unrecoverable);
            prop_assert_eq!(&fast.transcript, &tree.transcript);
        }
    }
}

/// Messages using the formats' fields in unusual ways: Chat, Anthropic,
/// Responses, then format-neutral messages, then values that are not
/// messages at all.
const ODD_MESSAGES: [&[&str]; 5] = [
    &[
        r#"{"role":"assistant","tool_calls":[{"id":"a"},{"id":7},3,{"function":{}}]}"#,
        r#"{"role":"assistant","content":"x","tool_calls":[{"id":"b"},{"id":"a"}]}"#,
        r#"{"role":"assistant","tool_calls":{"id":"a"}}"#,
        r#"{"role":"assistant","tool_calls":[{"id":"a"}],"tool_calls":[]}"#,
        r#"{"role":"tool","tool_call_id":"a","content":"ok"}"#,
        r#"{"role":"tool","tool_call_id":null}"#,
        r#"{"role":"tool","role":"user","tool_call_id":"a"}"#,
        r#"{"role":"tool","tool_call_id":"b","content":"\u005bleasehold: tool result unknown]"}"#,
        r#"{"role":"tool","tool_call_id":"b","content":"ok"}"#,
        r#"{"role":"\u0061ssistant","tool_calls":[{"id":"g\u0021"}]}"#,
        r#"{"role":"tool","tool_call_id":"g\u0021"}"#,
    ],
    &[
        r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"b"},{"type":"text","text":"x"}]}"#,
        r#"{"role":"user","content":[{"type":"text","text":"x"},{"type":"tool_result","tool_use_id":"b"}]}"#,
        r#"{"role":"assistant","content":[{"type":"tool_use","id":"b","input":{}},"text",null]}"#,
        r#"{"role":"assistant","content":[{"type":"tool_use","id":"b"},{"type":"tool_use","id":"c"}]}"#,
        r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"c"},{"type":"tool_result","tool_use_id":"b"}]}"#,
        r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"c","content":[{"type":"text","text":"Tool result missing"}]}]}"#,
        r#"{"role":"user","content":[{"typ\u0065":"tool_result","tool_use_id":"c"}]}"#,
        r#"{"role":"assistant","content":[{"type":"tool_use","type":"text","id":"c"}]}"#,
        r#"{"role":"user","content":[{"type":"tool_use","id":"d"}]}"#,
        r#"{"role":"system","content":[{"type":"tool_result","tool_use_id":"b"}]}"#,
        r#"{"content":[{"type":"tool_result","tool_use_id":"b"}],"content":"plain"}"#,
    ],
    &[
        r#"{"type":"function_call","call_id":"e","id":"fc_e"}"#,
        r#"{"type":"function_call","call_id":null}"#,
        r#"{"type":"custom_tool_call","call_id":"f"}"#,
        r#"{"type":"web_search_call","id":"ws"}"#,
        r#"{"type":"function_call_output","call_id":"e","output":"ok"}"#,
        r#"{"type":"custom_tool_call_output","call_id":"f"}"#,
        r#"{"type":"function_call_output"}"#,
        r#"{"type":"reasoning","summary":[]}"#,
        r#"{"t\u0079pe":"function_call","call_id":"h"}"#,
        r#"{"type":"function_call_output","call_id":"h","output":{"n":1e300,"s":"\ud83d\ude00"}}"#,
        r#"{"type":"function_call_output","call_id":"h","output":"Tool execution was interrupted and no result was captured"}"#,
    ],
    &[
        r#"{"type":"message","role":"assistant","content":[]}"#,
        r#"{"type":"message","role":7}"#,
        r#"{"type":5,"role":"user"}"#,
        r#"{"type":"item_reference","id":"x"}"#,
        r#"{"role":"developer","content":"rules"}"#,
        r#"{"role":["assistant"]}"#,
        r#"{}"#,
        r#"{"role":"user","content":"next"}"#,
        r#"{"role":"assistant","content":"sure"}"#,
    ],
    &[r#"[]"#, r#""just text""#, r#"42"#, r#"null"#],
];
