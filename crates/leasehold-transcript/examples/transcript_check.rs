//! A small driver for measuring peak memory with `/usr/bin/time -v`; see
//! `docs/benchmarks.md` and `bench/transcript-rss.sh`.
//!
//! - `transcript_check generate FORMAT MESSAGES FILE` writes the issue-18
//!   shape (see `benches/support/shape.rs`).
//! - `transcript_check check FILE` does what `leasehold transcript check`
//!   does: read the file in one go, parse (`Transcript::parse`, which copies
//!   the text), check, print the verdict.
//! - `transcript_check check-owned FILE` the same with
//!   `Transcript::parse_owned`, which keeps the text read instead of a copy.
//!   `FORMAT=openai-chat` (or another name) in the environment names the
//!   format instead of detecting it.
//! - `transcript_check repair FILE` parses, repairs and writes the result to
//!   a sink.
//! - `transcript_check value FILE` only parses the file into a
//!   `serde_json::Value`, the floor of a full-tree approach.

use std::process::ExitCode;

use leasehold_transcript::{Format, RepairOptions, Transcript, check, repair_checked};

#[path = "../benches/support/shape.rs"]
mod shape;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["generate", format, messages, file] => {
            let format: Format = format.parse().unwrap_or_else(|e| panic!("{e}"));
            let messages: usize = messages.parse().unwrap_or_else(|e| panic!("{e}"));
            let shaped = shape::issue_shape(format, messages, false);
            std::fs::write(file, &shaped.text).unwrap_or_else(|e| panic!("{file}: {e}"));
            println!("{} messages, {} bytes", shaped.messages, shaped.text.len());
        }
        [mode @ ("check" | "check-owned"), file] => {
            let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
            let transcript = if *mode == "check" {
                Transcript::parse(&text)
            } else {
                Transcript::parse_owned(text)
            }
            .unwrap_or_else(|e| panic!("{e}"));
            let named = std::env::var("FORMAT")
                .ok()
                .and_then(|name| name.parse().ok());
            match check(&transcript, named) {
                Ok(Some(report)) => println!(
                    "{} messages, format {}, {} finding(s)",
                    report.messages,
                    report.format,
                    report.findings.len()
                ),
                Ok(None) => println!("{} messages, no tool calls", transcript.len()),
                Err(e) => panic!("{e}"),
            }
        }
        ["repair", file] => {
            let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
            let transcript = Transcript::parse(&text).unwrap_or_else(|e| panic!("{e}"));
            let repaired = repair_checked(&transcript, None, &RepairOptions::default())
                .unwrap_or_else(|e| panic!("{e}"));
            let written = repaired.map_or(0, |r| r.transcript.to_text().len());
            println!("{written} bytes written");
        }
        ["value", file] => {
            let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{file}: {e}"));
            let value: serde_json::Value =
                serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}"));
            println!("{} messages", value.as_array().map_or(0, Vec::len));
        }
        _ => {
            eprintln!(
                "usage: transcript_check generate FORMAT MESSAGES FILE | check FILE | check-owned FILE | repair FILE | value FILE"
            );
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
