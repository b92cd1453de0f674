//! `leasehold transcript check|repair`: the transcript tool, offline.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use serde_json::json;

use leasehold_transcript as transcript;

use super::*;

#[derive(Debug, Subcommand)]
pub(super) enum TranscriptCommand {
    /// Report every unmatched, duplicate, late or orphaned tool result.
    /// Exit status: 0 healthy, 1 findings, 2 unreadable input.
    Check {
        /// The transcript file; `-` reads standard input.
        file: PathBuf,
        /// openai-chat, anthropic or openai-responses (default: detect).
        #[arg(long)]
        format: Option<transcript::Format>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Move genuine results next to their calls, drop duplicates and orphans,
    /// and add unknown-outcome placeholders; list every action on stderr.
    /// Exit status: 0 repaired output is healthy, 1 unrecoverable findings
    /// remain, 2 unreadable input.
    Repair {
        /// The transcript file; `-` reads standard input.
        file: PathBuf,
        /// Where to write the repaired transcript (default: standard output).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// openai-chat, anthropic or openai-responses (default: detect).
        #[arg(long)]
        format: Option<transcript::Format>,
        /// A substring marking another tool's placeholder result (repeatable).
        #[arg(long = "placeholder-marker")]
        placeholder_markers: Vec<String>,
        /// Print the actions as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Reads a transcript from a file, or standard input for `-`.
pub(super) fn read_transcript(file: &Path) -> Result<transcript::Transcript, String> {
    let text = if file == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("cannot read standard input: {e}"))?;
        text
    } else {
        std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?
    };
    transcript::Transcript::parse_owned(text).map_err(|e| format!("{}: {e}", file.display()))
}

pub(super) fn run(command: TranscriptCommand) -> ExitCode {
    const UNREADABLE: u8 = 2;
    let fail = |message: String| {
        eprintln!("error: {message}");
        ExitCode::from(UNREADABLE)
    };
    match command {
        TranscriptCommand::Check { file, format, json } => {
            let parsed = match read_transcript(&file) {
                Ok(parsed) => parsed,
                Err(message) => return fail(message),
            };
            let report = match transcript::check(&parsed, format) {
                Ok(report) => report,
                Err(e) => return fail(e.to_string()),
            };
            let Some(report) = report else {
                if json {
                    println!(
                        "{}",
                        json!({"healthy": true, "format": null, "messages": parsed.len(), "findings": []})
                    );
                } else {
                    println!("healthy: {} messages, no tool calls", parsed.len());
                }
                return ExitCode::SUCCESS;
            };
            if json {
                println!(
                    "{}",
                    leasehold_server::grpc::transcripts::report_json(&report)
                );
            } else {
                print!("{}", transcript::render_human(&report));
            }
            if report.is_healthy() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        TranscriptCommand::Repair {
            file,
            output,
            format,
            placeholder_markers,
            json,
        } => {
            let parsed = match read_transcript(&file) {
                Ok(parsed) => parsed,
                Err(message) => return fail(message),
            };
            let mut options = transcript::RepairOptions::default();
            options
                .extra_placeholder_markers
                .extend(placeholder_markers);
            let repaired = match transcript::repair_checked(&parsed, format, &options) {
                Ok(repaired) => repaired,
                Err(e) => return fail(e.to_string()),
            };
            let (text, actions, unrecoverable) = match &repaired {
                Some(r) => (r.transcript.to_text(), &r.actions[..], &r.unrecoverable[..]),
                None => (parsed.to_text(), &[][..], &[][..]),
            };
            let written = match &output {
                Some(path) => std::fs::write(path, &text)
                    .map_err(|e| format!("cannot write {}: {e}", path.display())),
                None => std::io::stdout()
                    .write_all(text.as_bytes())
                    .map_err(|e| format!("cannot write standard output: {e}")),
            };
            if let Err(message) = written {
                return fail(message);
            }
            if json {
                eprintln!(
                    "{}",
                    json!({"healthy": unrecoverable.is_empty(), "actions": actions, "unrecoverable": unrecoverable})
                );
            } else {
                for action in actions {
                    eprintln!(
                        "{}",
                        one_line(&serde_json::to_value(action).unwrap_or_default())
                    );
                }
                for finding in unrecoverable {
                    eprintln!(
                        "unrecoverable: message {} call {}: {}",
                        finding.index, finding.call_id, finding.detail
                    );
                }
                eprintln!(
                    "{} actions, {} unrecoverable",
                    actions.len(),
                    unrecoverable.len()
                );
            }
            if unrecoverable.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
    }
}
