//! Throughput of diagnosis and repair per format: first on the transcript
//! shape of issue 18 (200,000 messages as one JSON array, three parallel
//! tool calls per turn, 200-byte results), side by side with a plain
//! `serde_json::from_slice::<serde_json::Value>` of the same bytes; then on a
//! generated million-message JSONL transcript.
//!
//! Run with `cargo bench --bench transcript`. `TRANSCRIPT_BENCH=issue` runs
//! only the first part, `TRANSCRIPT_BENCH=million` only the second. It checks its own results (the
//! healthy transcript is healthy, the repaired one is healthy) but is never
//! part of the test suite's pass/fail: timing on a shared machine is noise
//! for a test. Under `cargo test --benches` (no `--bench` argument) it runs
//! on a small transcript so it stays a quick smoke check.

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use leasehold_transcript::{Format, RepairOptions, Transcript, check, diagnose, repair};

#[path = "support/shape.rs"]
mod shape;

/// Messages in the issue-18 shape, as the issue measured.
const ISSUE_MESSAGES: usize = 200_000;
/// Timed rounds per row of the issue-18 part; the best one is printed.
const ROUNDS: usize = 5;

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
    let part = std::env::var("TRANSCRIPT_BENCH").unwrap_or_default();
    if part != "million" {
        let size = if benchmarking {
            ISSUE_MESSAGES
        } else {
            SMOKE_MESSAGES
        };
        for format in Format::ALL {
            bench_issue_shape(format, size);
        }
    }
    if part != "issue" {
        for format in Format::ALL {
            bench_format(format, size);
        }
    }
}

/// The issue-18 rows: the `serde_json::Value` floor, then parse, check and
/// repair through the public API, each the best of [`ROUNDS`], in wall time
/// and in time on a CPU.
fn bench_issue_shape(format: Format, size: usize) {
    let healthy = shape::issue_shape(format, size, false);
    let corrupted = shape::issue_shape(format, size, true);
    let messages = healthy.messages;
    println!(
        "{format}, issue-18 shape: {messages} messages, {:.1} MB JSON array ({:.0} bytes/message), best of {ROUNDS}",
        healthy.text.len() as f64 / 1e6,
        healthy.text.len() as f64 / messages as f64
    );
    let bytes = healthy.text.as_bytes();
    let floor = best(|| {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{e}"));
        black_box(value);
    });
    line_mb(
        "serde_json::from_slice::<Value>",
        messages,
        bytes.len(),
        floor,
    );
    let parse_time = best(|| drop(black_box(parse(&healthy.text))));
    line_mb("Transcript::parse", messages, bytes.len(), parse_time);
    let transcript = parse(&healthy.text);
    let check_time = best(|| {
        let report = check(&transcript, None).unwrap_or_else(|e| panic!("{format}: {e}"));
        assert!(report.is_some_and(|report| report.is_healthy()));
    });
    line_mb("check", messages, bytes.len(), check_time);
    drop(transcript);
    let both = best(|| {
        let transcript = parse(&healthy.text);
        let report = check(&transcript, None).unwrap_or_else(|e| panic!("{format}: {e}"));
        assert!(report.is_some_and(|report| report.is_healthy()));
    });
    line_mb("parse + check", messages, bytes.len(), both);
    // What a caller that reads the text only to check it can do: hand the
    // text over instead of having it copied (the copy is made untimed).
    let owned = best_with(
        || healthy.text.clone(),
        |text| {
            let transcript = Transcript::parse_owned(text).unwrap_or_else(|e| panic!("{e}"));
            let report = check(&transcript, None).unwrap_or_else(|e| panic!("{format}: {e}"));
            assert!(report.is_some_and(|report| report.is_healthy()));
        },
    );
    line_mb("parse_owned + check", messages, bytes.len(), owned);
    let repair_all = best(|| {
        let transcript = parse(&corrupted.text);
        let repaired = repair(&transcript, Some(format), &RepairOptions::default())
            .unwrap_or_else(|e| panic!("{format}: {e}"));
        assert!(repaired.unrecoverable.is_empty());
        black_box(repaired.transcript.to_text());
    });
    line_mb(
        "parse + repair + write",
        corrupted.messages,
        corrupted.text.len(),
        repair_all,
    );
    println!();
}

/// The fastest of [`ROUNDS`] runs of `work`: wall time, and the time the
/// thread spent on a CPU when the system reports it.
fn best(mut work: impl FnMut()) -> Timing {
    best_with(|| (), |()| work())
}

/// [`best`] with an untimed `setup` before each run.
fn best_with<T>(mut setup: impl FnMut() -> T, mut work: impl FnMut(T)) -> Timing {
    let mut fastest = Timing {
        wall: Duration::MAX,
        cpu: None,
    };
    for _ in 0..ROUNDS {
        let input = setup();
        let cpu_before = cpu_time();
        let wall = timed(|| work(input)).1;
        let cpu = cpu_time()
            .zip(cpu_before)
            .map(|(after, before)| after.saturating_sub(before));
        fastest.wall = fastest.wall.min(wall);
        fastest.cpu = match (fastest.cpu, cpu) {
            (Some(best), Some(cpu)) => Some(best.min(cpu)),
            (best, cpu) => best.or(cpu),
        };
    }
    fastest
}

struct Timing {
    wall: Duration,
    /// On-CPU time of this thread, which other processes on a shared
    /// machine disturb far less than wall time.
    cpu: Option<Duration>,
}

/// This thread's time on a CPU so far (Linux: `/proc/thread-self/schedstat`,
/// in nanoseconds).
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

fn line_mb(what: &str, messages: usize, bytes: usize, took: Timing) {
    let seconds = took.wall.as_secs_f64();
    let cpu = took.cpu.map_or(String::new(), |cpu| {
        let cpu = cpu.as_secs_f64();
        format!(
            "  | on CPU {cpu:>6.3} s {:>12.0} messages/s {:>6.0} MB/s",
            messages as f64 / cpu,
            bytes as f64 / 1e6 / cpu
        )
    });
    println!(
        "  {what:<32} {seconds:>6.3} s {:>12.0} messages/s {:>6.0} MB/s{cpu}",
        messages as f64 / seconds,
        bytes as f64 / 1e6 / seconds
    );
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
    // Repair alone again, on a freshly parsed transcript each round (a
    // transcript keeps the trees a repair built), best of 5 with CPU time.
    let repair_only = best_with(
        || parse(&corrupted.text),
        |transcript| {
            let repaired = repair(&transcript, Some(format), &RepairOptions::default())
                .unwrap_or_else(|e| panic!("{format}: {e}"));
            black_box(repaired);
        },
    );
    line_mb(
        "repair alone, best of 5",
        corrupted.messages,
        corrupted.text.len(),
        repair_only,
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
