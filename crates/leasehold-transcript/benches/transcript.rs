//! Throughput of diagnosis and repair on a generated million-message
//! transcript per format.
//!
//! Run with `cargo bench --bench transcript`. It checks its own results (the
//! healthy transcript is healthy, the repaired one is healthy) but is never
//! part of the test suite's pass/fail: timing on a shared machine is noise
//! for a test. Under `cargo test --benches` (no `--bench` argument) it runs
//! on a small transcript so it stays a quick smoke check.

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use leasehold_transcript::{Format, RepairOptions, Transcript, diagnose, repair};

/// Messages per generated transcript in a real benchmark run.
const MESSAGES: usize = 1_000_000;
/// Messages per transcript for the smoke run under `cargo test`.
const SMOKE_MESSAGES: usize = 10_000;

fn main() {
    let benchmarking = std::env::args().any(|arg| arg == "--bench");
    let size = if benchmarking {
        MESSAGES
    } else {
        SMOKE_MESSAGES
    };
    for format in Format::ALL {
        bench_format(format, size);
    }
}

fn bench_format(format: Format, size: usize) {
    let healthy = generate(format, size, false);
    let corrupted = generate(format, size, true);
    println!(
        "{format}: {} messages, {:.0} MB of JSONL",
        healthy.messages,
        healthy.text.len() as f64 / 1e6
    );

    let (transcript, parse_time) = timed(|| parse(&healthy.text));
    let (report, diagnose_time) = timed(|| diagnose(&transcript, None));
    let report = report.unwrap_or_else(|e| panic!("{format}: {e}"));
    assert!(
        report.is_healthy(),
        "{format}: generated transcript is not healthy"
    );
    line("parse", healthy.messages, parse_time);
    line("diagnose", healthy.messages, diagnose_time);
    line(
        "parse + diagnose",
        healthy.messages,
        parse_time + diagnose_time,
    );
    drop(transcript);

    let (transcript, parse_time) = timed(|| parse(&corrupted.text));
    let (repaired, repair_time) =
        timed(|| repair(&transcript, Some(format), &RepairOptions::default()));
    let repaired = repaired.unwrap_or_else(|e| panic!("{format}: {e}"));
    assert!(
        repaired.unrecoverable.is_empty(),
        "{format}: repair left {} findings",
        repaired.unrecoverable.len()
    );
    let (text, write_time) = timed(|| repaired.transcript.to_text());
    black_box(text);
    line(
        &format!("repair ({} actions)", repaired.actions.len()),
        corrupted.messages,
        repair_time,
    );
    line(
        "parse + repair + write",
        corrupted.messages,
        parse_time + repair_time + write_time,
    );
    println!();
}

fn parse(text: &str) -> Transcript {
    Transcript::parse(text).unwrap_or_else(|e| panic!("{e}"))
}

fn timed<T>(work: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let value = black_box(work());
    (value, start.elapsed())
}

fn line(what: &str, messages: usize, took: Duration) {
    let rate = messages as f64 / took.as_secs_f64();
    println!(
        "  {what:<28} {:>8.3} s  {:>12.0} messages/s",
        took.as_secs_f64(),
        rate
    );
}

/// A generated transcript as JSONL text.
struct Generated {
    text: String,
    messages: usize,
}

impl Generated {
    fn push(&mut self, line: &str) {
        self.text.push_str(line);
        self.text.push('\n');
        self.messages += 1;
    }
}

/// Builds turns of a user message, an assistant turn with two parallel calls
/// (with text), their results, and an assistant reply, until `size` messages.
/// With `corrupt`, every 50th turn loses a result, every 70th duplicates
/// one, and every 90th carries an orphan result.
fn generate(format: Format, size: usize, corrupt: bool) -> Generated {
    let mut out = Generated {
        text: String::with_capacity(size * 200),
        messages: 0,
    };
    let mut turn = 0usize;
    while out.messages < size {
        let (a, b) = (format!("call_{turn}a"), format!("call_{turn}b"));
        let lose = corrupt && turn % 50 == 49;
        let duplicate = corrupt && turn % 70 == 69;
        let orphan = corrupt && turn % 90 == 89;
        let mut results = vec![result(format, &a)];
        if !lose {
            results.push(result(format, &b));
        }
        if duplicate {
            results.push(result(format, &a));
        }
        if orphan {
            results.push(result(format, &format!("call_{turn}z")));
        }
        out.push(&user(format, turn));
        match format {
            Format::OpenAiChat => {
                out.push(
                    &format!(
                        r#"{{"role":"assistant","content":"Checking both.","tool_calls":[{{"id":"{a}","type":"function","function":{{"name":"shell","arguments":"{{\"cmd\":\"ls -la /srv/{turn}\"}}"}}}},{{"id":"{b}","type":"function","function":{{"name":"shell","arguments":"{{\"cmd\":\"cat /srv/{turn}/README\"}}"}}}}]}}"#
                    ),
                );
                for result in &results {
                    out.push(result);
                }
            }
            Format::Anthropic => {
                out.push(
                    &format!(
                        r#"{{"role":"assistant","content":[{{"type":"text","text":"Checking both."}},{{"type":"tool_use","id":"{a}","name":"bash","input":{{"command":"ls -la /srv/{turn}"}}}},{{"type":"tool_use","id":"{b}","name":"bash","input":{{"command":"cat /srv/{turn}/README"}}}}]}}"#
                    ),
                );
                let blocks = results.join(",");
                out.push(&format!(r#"{{"role":"user","content":[{blocks}]}}"#));
            }
            Format::OpenAiResponses => {
                out.push(&format!(
                    r#"{{"type":"reasoning","id":"rs_{turn}","summary":[]}}"#
                ));
                for (id, command) in [(&a, "ls -la"), (&b, "cat")] {
                    out.push(
                        &format!(
                            r#"{{"type":"function_call","id":"fc_{id}","call_id":"{id}","name":"shell","arguments":"{{\"cmd\":\"{command} /srv/{turn}\"}}"}}"#
                        ),
                    );
                }
                for result in &results {
                    out.push(result);
                }
            }
        }
        out.push(&reply(format, turn));
        turn += 1;
    }
    out
}

fn user(format: Format, turn: usize) -> String {
    match format {
        Format::OpenAiResponses => format!(
            r#"{{"type":"message","role":"user","content":[{{"type":"input_text","text":"Please look at server {turn}."}}]}}"#
        ),
        _ => format!(r#"{{"role":"user","content":"Please look at server {turn}."}}"#),
    }
}

fn reply(format: Format, turn: usize) -> String {
    match format {
        Format::OpenAiChat => {
            format!(r#"{{"role":"assistant","content":"Server {turn} looks fine."}}"#)
        }
        Format::Anthropic => format!(
            r#"{{"role":"assistant","content":[{{"type":"text","text":"Server {turn} looks fine."}}]}}"#
        ),
        Format::OpenAiResponses => format!(
            r#"{{"type":"message","role":"assistant","content":[{{"type":"output_text","text":"Server {turn} looks fine."}}]}}"#
        ),
    }
}

fn result(format: Format, id: &str) -> String {
    let mut output = String::new();
    // Writing to a String cannot fail.
    let _ = write!(output, "total 12\\ndrwxr-xr-x 2 root root 4096 {id}");
    match format {
        Format::OpenAiChat => {
            format!(r#"{{"role":"tool","tool_call_id":"{id}","content":"{output}"}}"#)
        }
        Format::Anthropic => {
            format!(r#"{{"type":"tool_result","tool_use_id":"{id}","content":"{output}"}}"#)
        }
        Format::OpenAiResponses => {
            format!(r#"{{"type":"function_call_output","call_id":"{id}","output":"{output}"}}"#)
        }
    }
}
