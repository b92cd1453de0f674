//! The `leasehold.v1.Transcripts` service: the transcript checks over gRPC,
//! for agent servers written in other languages.

use tonic::{Request, Response, Status};

use leasehold_core::error::Error;
use leasehold_transcript::{
    self as transcript, Finding, Format, RepairOptions, Transcript, TranscriptError,
};
use leasehold_wire::pb;
use leasehold_wire::pb::transcripts_server::Transcripts;
use leasehold_wire::status::to_status;

/// Largest transcript accepted by default, in bytes (`serve
/// --max-transcript-bytes`): long sessions are large, and a 200,000-message
/// transcript is 34 to 68 MB depending on its format (see
/// `docs/transcripts.md`). A larger request is refused before it is decoded,
/// as RESOURCE_EXHAUSTED naming the limit `message_bytes`.
pub const DEFAULT_MAX_TRANSCRIPT_BYTES: usize = 128 * 1024 * 1024;

/// The `leasehold.v1.Transcripts` service. Stateless: it needs no lease engine.
#[derive(Debug, Clone, Default)]
pub struct TranscriptsService;

fn invalid(err: TranscriptError) -> Status {
    to_status(Error::InvalidArgument(err.to_string()))
}

/// Parses a request's transcript, taking ownership of its text (no second
/// copy of a large transcript is kept while it is checked).
fn parse(text: String, format: &str) -> Result<(Transcript, Option<Format>), Status> {
    let format = if format.is_empty() {
        None
    } else {
        Some(format.parse::<Format>().map_err(invalid)?)
    };
    Ok((Transcript::parse_owned(text).map_err(invalid)?, format))
}

fn finding(f: &Finding) -> pb::TranscriptFinding {
    pb::TranscriptFinding {
        kind: serde_json::to_value(f.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        call_id: f.call_id.clone(),
        index: f.index as u64,
        line: f.line.unwrap_or(0) as u64,
        detail: f.detail.clone(),
        provider_error: f.provider_error.clone(),
    }
}

#[tonic::async_trait]
impl Transcripts for TranscriptsService {
    async fn check(
        &self,
        request: Request<pb::TranscriptCheckRequest>,
    ) -> Result<Response<pb::TranscriptCheckResponse>, Status> {
        let r = request.into_inner();
        let (parsed, format) = parse(r.transcript, &r.format)?;
        let report = transcript::check(&parsed, format).map_err(invalid)?;
        let reply = match report {
            None => pb::TranscriptCheckResponse {
                healthy: true,
                format: String::new(),
                messages: parsed.len() as u64,
                findings: Vec::new(),
                report_json: serde_json::json!({
                    "healthy": true,
                    "format": null,
                    "messages": parsed.len(),
                    "findings": [],
                })
                .to_string(),
            },
            Some(report) => pb::TranscriptCheckResponse {
                healthy: report.is_healthy(),
                format: report.format.to_string(),
                messages: report.messages as u64,
                findings: report.findings.iter().map(finding).collect(),
                report_json: report_json(&report),
            },
        };
        Ok(Response::new(reply))
    }

    async fn repair(
        &self,
        request: Request<pb::TranscriptRepairRequest>,
    ) -> Result<Response<pb::TranscriptRepairResponse>, Status> {
        let r = request.into_inner();
        // Repair may answer with the text unchanged, so it keeps a copy.
        let (parsed, format) = parse(r.transcript.clone(), &r.format)?;
        let mut options = RepairOptions::default();
        options
            .extra_placeholder_markers
            .extend(r.placeholder_markers);
        let repaired = transcript::repair_checked(&parsed, format, &options).map_err(invalid)?;
        let Some(repaired) = repaired else {
            // No tool activity: nothing to repair.
            return Ok(Response::new(pb::TranscriptRepairResponse {
                transcript: r.transcript,
                healthy: true,
                actions_json: "[]".into(),
                unrecoverable: Vec::new(),
            }));
        };
        Ok(Response::new(pb::TranscriptRepairResponse {
            transcript: repaired.transcript.to_text(),
            healthy: repaired.unrecoverable.is_empty(),
            actions_json: serde_json::to_string(&repaired.actions).unwrap_or_default(),
            unrecoverable: repaired.unrecoverable.iter().map(finding).collect(),
        }))
    }
}

/// The report as JSON, with a `healthy` flag (the CLI's `--json` shape).
pub fn report_json(report: &transcript::Report) -> String {
    let mut value = serde_json::to_value(report).unwrap_or_default();
    value["healthy"] = serde_json::Value::Bool(report.is_healthy());
    value.to_string()
}
