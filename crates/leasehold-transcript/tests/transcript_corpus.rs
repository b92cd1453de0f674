//! The transcript corpus: small transcripts under `tests/transcripts/<format>/`
//! with the findings and repair each must produce, written by hand in
//! `<case>.expected.json`.
//!
//! Each test checks one behaviour across every case and lists every case
//! that fails, so one run shows the whole picture.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use leasehold_transcript::{
    Finding, FindingKind, Format, RepairOptions, Repaired, Report, Transcript, detect, diagnose,
    repair,
};
use serde_json::{Value, json};

/// One corpus case: an input transcript and what is expected of it.
struct Case {
    /// `<format>/<case>`, for failure messages.
    name: String,
    format: Format,
    /// The input text, exactly as stored.
    text: String,
    expected: Value,
}

impl Case {
    fn transcript(&self) -> Transcript {
        Transcript::parse(&self.text).unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }

    fn report(&self) -> Report {
        diagnose(&self.transcript(), Some(self.format))
            .unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }

    fn repaired(&self) -> Repaired {
        repair(
            &self.transcript(),
            Some(self.format),
            &RepairOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }

    fn expects_unchanged(&self) -> bool {
        self.expected["repaired"] == json!("unchanged")
    }
}

fn corpus() -> Vec<Case> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/transcripts");
    let mut cases = Vec::new();
    for format in Format::ALL {
        let dir = root.join(format.to_string());
        let mut inputs: Vec<PathBuf> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| {
                let name = path.to_string_lossy();
                !name.ends_with(".expected.json")
                    && (name.ends_with(".json") || name.ends_with(".jsonl"))
            })
            .collect();
        inputs.sort();
        for input in inputs {
            let stem = input
                .file_stem()
                .map(|stem| stem.to_string_lossy().into_owned())
                .unwrap_or_default();
            let expected_path = dir.join(format!("{stem}.expected.json"));
            let expected_text = fs::read_to_string(&expected_path)
                .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
            cases.push(Case {
                name: format!("{format}/{stem}"),
                format,
                text: fs::read_to_string(&input)
                    .unwrap_or_else(|e| panic!("{}: {e}", input.display())),
                expected: serde_json::from_str(&expected_text)
                    .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display())),
            });
        }
    }
    assert!(
        !cases.is_empty(),
        "no corpus cases found under {}",
        root.display()
    );
    cases
}

/// Runs `check` on every case and fails with the list of cases it rejected.
fn check_all(check: impl Fn(&Case) -> Result<(), String>) {
    let failures: Vec<String> = corpus()
        .iter()
        .filter_map(|case| check(case).err().map(|why| format!("{}: {why}", case.name)))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Keeps the fields of each finding that the expected file names: kind,
/// call id, index, and line where given.
fn project(findings: &[Finding], expected: &Value) -> Value {
    let expected = expected.as_array().cloned().unwrap_or_default();
    let projected = findings
        .iter()
        .enumerate()
        .map(|(at, finding)| {
            let mut value = json!({
                "kind": finding.kind,
                "call_id": finding.call_id,
                "index": finding.index,
            });
            if expected.get(at).is_some_and(|e| e.get("line").is_some()) {
                value["line"] = json!(finding.line);
            }
            value
        })
        .collect();
    Value::Array(projected)
}

fn same(what: &str, actual: &Value, expected: &Value) -> Result<(), String> {
    if actual == expected {
        Ok(())
    } else {
        Err(format!(
            "{what}\n  expected {expected}\n  actual   {actual}"
        ))
    }
}

/// Diagnosis reports exactly the expected findings, in message order.
#[test]
fn diagnosis_reports_the_expected_findings() {
    check_all(|case| {
        let expected = &case.expected["findings"];
        same(
            "findings",
            &project(&case.report().findings, expected),
            expected,
        )
    });
}

/// Repair produces exactly the expected transcript.
#[test]
fn repair_produces_the_expected_transcript() {
    check_all(|case| {
        let repaired = case.repaired();
        if case.expects_unchanged() {
            return same(
                "text",
                &json!(repaired.transcript.to_text()),
                &json!(case.text),
            );
        }
        let actual: Vec<Value> = repaired.transcript.messages().cloned().collect();
        same(
            "messages",
            &Value::Array(actual),
            &case.expected["repaired"],
        )
    });
}

/// Repair lists exactly the expected moves, drops and insertions.
#[test]
fn repair_lists_every_action() {
    check_all(|case| {
        let actions = serde_json::to_value(case.repaired().actions).unwrap_or_default();
        same("actions", &actions, &case.expected["actions"])
    });
}

/// Repair reports exactly the expected unrecoverable findings.
#[test]
fn repair_reports_what_it_cannot_fix() {
    check_all(|case| {
        let expected = &case.expected["unrecoverable"];
        same(
            "unrecoverable",
            &project(&case.repaired().unrecoverable, expected),
            expected,
        )
    });
}

/// A repaired transcript diagnoses healthy unless repair said what it left.
#[test]
fn repaired_output_is_healthy_unless_reported_unrecoverable() {
    check_all(|case| {
        let repaired = case.repaired();
        let report =
            diagnose(&repaired.transcript, Some(case.format)).map_err(|e| e.to_string())?;
        if report.findings == repaired.unrecoverable {
            Ok(())
        } else {
            Err(format!(
                "re-diagnosis found {:?}, repair reported {:?}",
                report.findings, repaired.unrecoverable
            ))
        }
    });
}

/// Repairing a repaired transcript changes nothing.
#[test]
fn repair_is_idempotent() {
    check_all(|case| {
        let first = case.repaired();
        let second = repair(
            &first.transcript,
            Some(case.format),
            &RepairOptions::default(),
        )
        .map_err(|e| e.to_string())?;
        if !second.actions.is_empty() {
            return Err(format!("second repair acted: {:?}", second.actions));
        }
        same(
            "second repair text",
            &json!(second.transcript.to_text()),
            &json!(first.transcript.to_text()),
        )
    });
}

/// A healthy transcript comes out of repair byte for byte as it went in.
#[test]
fn healthy_input_comes_out_byte_identical() {
    check_all(|case| {
        if !case.report().is_healthy() {
            return Ok(());
        }
        let repaired = case.repaired();
        if !repaired.actions.is_empty() {
            return Err(format!("healthy input was changed: {:?}", repaired.actions));
        }
        same(
            "text",
            &json!(repaired.transcript.to_text()),
            &json!(case.text),
        )
    });
}

/// The repaired text parses back to the same messages, in the input's layout.
#[test]
fn repaired_text_round_trips() {
    check_all(|case| {
        let repaired = case.repaired().transcript;
        let reparsed = Transcript::parse(&repaired.to_text()).map_err(|e| e.to_string())?;
        if reparsed != repaired || reparsed.is_jsonl() != case.transcript().is_jsonl() {
            return Err("repaired text does not parse back to the repaired messages".into());
        }
        Ok(())
    });
}

/// Every case with tool activity is detected as the format of its folder.
#[test]
fn format_is_detected_from_tool_activity() {
    check_all(|case| {
        let expected = (case.expected["detect"] != json!(false)).then_some(case.format);
        let detected = detect(&case.transcript());
        if detected == expected {
            Ok(())
        } else {
            Err(format!("detected {detected:?}, expected {expected:?}"))
        }
    });
}

/// Every finding explains itself and names the provider error it causes,
/// quoting the call id wherever the provider does.
#[test]
fn every_finding_names_its_provider_error() {
    check_all(|case| {
        for finding in case.report().findings {
            // These provider errors name no call id: Chat's orphan error,
            // Anthropic's and Responses' duplicate-id errors.
            let error = &finding.provider_error;
            let quotes_id = !(error.starts_with("Invalid parameter")
                || error.ends_with("must be unique")
                || error.starts_with("Duplicate item"));
            if finding.detail.is_empty()
                || finding.provider_error.is_empty()
                || (quotes_id && !finding.provider_error.contains(&finding.call_id))
            {
                return Err(format!("incomplete finding {finding:?}"));
            }
        }
        Ok(())
    });
}

/// The corpus shows every finding kind in every format it applies to.
#[test]
fn corpus_covers_every_finding_kind_in_every_format() {
    let cases = corpus();
    let mut missing = Vec::new();
    for format in Format::ALL {
        let seen: BTreeSet<String> = cases
            .iter()
            .filter(|case| case.format == format)
            .flat_map(|case| case.report().findings)
            .map(|finding| finding.kind.to_string())
            .collect();
        let mut kinds = vec![
            FindingKind::Missing,
            FindingKind::DuplicateResult,
            FindingKind::Orphan,
            FindingKind::Misplaced,
            FindingKind::DuplicateCallId,
        ];
        if format == Format::Anthropic {
            kinds.push(FindingKind::TextBeforeToolResult);
            kinds.push(FindingKind::ResultsSplitAcrossMessages);
        }
        for kind in kinds {
            if !seen.contains(&kind.to_string()) {
                missing.push(format!("{format}: {kind}"));
            }
        }
        let healthy = cases
            .iter()
            .filter(|case| case.format == format && case.report().is_healthy())
            .count();
        if healthy < 2 {
            missing.push(format!("{format}: healthy cases"));
        }
    }
    assert!(missing.is_empty(), "not covered: {missing:?}");
}
