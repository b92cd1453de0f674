//! The transcript API around the corpus: reading and writing text, errors,
//! configurable placeholder markers, and the report's human and JSON forms;
//! and the size limit of the gRPC `Transcripts` service.

mod common;

use common::{TestServer, spawn_serve, test_options};
use leasehold_server::server::ServeOptions;
use leasehold_transcript::{
    Format, Layout, PLACEHOLDER_MARKER, RepairOptions, Transcript, TranscriptError, detect,
    diagnose, render_human, repair,
};
use leasehold_wire::pb;
use leasehold_wire::pb::transcripts_client::TranscriptsClient;
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

fn parse(text: &str) -> Transcript {
    Transcript::parse(text).unwrap_or_else(|e| panic!("{e}"))
}

fn chat_call(id: &str) -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": id, "type": "function", "function": {"name": "shell", "arguments": "{}"}}]})
}

fn chat_tool(id: &str, content: &str) -> Value {
    json!({"role": "tool", "tool_call_id": id, "content": content})
}

fn jsonl(messages: &[Value]) -> String {
    messages
        .iter()
        .map(|message| format!("{message}\n"))
        .collect()
}

/// A JSON array is read as an array, one message per element.
#[test]
fn parse_reads_a_json_array() {
    let transcript =
        parse(r#"  [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]"#);
    assert_eq!(transcript.layout(), Layout::JsonArray);
    assert_eq!(transcript.len(), 2);
    assert_eq!(transcript.line(0), None);
}

/// JSONL skips blank lines and CRLF endings and remembers each line number.
#[test]
fn parse_reads_jsonl_with_line_numbers() {
    let transcript = parse(
        "{\"role\":\"user\",\"content\":\"a\"}\r\n\r\n{\"role\":\"assistant\",\"content\":\"b\"}\r\n",
    );
    assert!(transcript.is_jsonl());
    assert_eq!(transcript.len(), 2);
    assert_eq!((transcript.line(0), transcript.line(1)), (Some(1), Some(3)));
}

/// Invalid JSONL is reported with the line it is on.
#[test]
fn invalid_jsonl_names_its_line() {
    let error = Transcript::parse("{\"role\":\"user\"}\n{oops\n").err();
    assert!(
        matches!(error, Some(TranscriptError::InvalidJson { line: 2, .. })),
        "{error:?}"
    );
}

/// A message that is not an object cannot be checked and is reported.
#[test]
fn a_message_that_is_not_an_object_is_an_error() {
    let transcript = parse("{\"role\":\"tool\",\"tool_call_id\":\"x\"}\n[1,2]\n");
    let error = diagnose(&transcript, Some(Format::OpenAiChat)).err();
    assert!(
        matches!(
            error,
            Some(TranscriptError::NotAnObject {
                index: 1,
                line: Some(2)
            })
        ),
        "{error:?}"
    );
}

/// Without tool activity the format cannot be detected, and diagnosis says so.
#[test]
fn an_undetectable_format_is_an_error() {
    let transcript = parse(r#"[{"role": "user", "content": "hi"}]"#);
    assert_eq!(detect(&transcript), None);
    assert!(matches!(
        diagnose(&transcript, None),
        Err(TranscriptError::FormatNotDetected)
    ));
}

/// Tool activity of two formats in one transcript is refused, not guessed.
#[test]
fn mixed_formats_are_an_error() {
    let transcript = Transcript::from_messages(
        vec![
            chat_tool("call_a", "ok"),
            json!({"type": "function_call_output", "call_id": "call_b", "output": "ok"}),
        ],
        Layout::JsonArray,
    );
    assert_eq!(detect(&transcript), None);
    assert!(matches!(
        diagnose(&transcript, None),
        Err(TranscriptError::FormatAmbiguous(formats)) if formats == [Format::OpenAiChat, Format::OpenAiResponses]
    ));
}

/// A named format is used even where detection would fail.
#[test]
fn a_named_format_needs_no_detection() {
    let transcript = parse(r#"[{"role": "user", "content": "hi"}]"#);
    let report = diagnose(&transcript, Some(Format::Anthropic)).map_err(|e| e.to_string());
    assert_eq!(report.map(|report| report.is_healthy()), Ok(true));
}

/// Messages a repair did not touch keep their exact bytes, unknown fields
/// and number formatting included.
#[test]
fn untouched_messages_keep_their_exact_text() {
    let kept = r#"{"role":"user","content":"hi","meta":{"score":1.50,"big":12345678901234567890123,"esc":"\u00e9"}}"#;
    let text = format!(
        "{kept}\n{}\n{}\n",
        chat_call("call_a"),
        json!({"role": "assistant", "content": "done"})
    );
    let repaired =
        repair(&parse(&text), None, &RepairOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(repaired.actions.len(), 1);
    let output = repaired.transcript.to_text();
    assert_eq!(output.lines().next(), Some(kept));
}

/// Another tool's placeholder is recognised by a configured marker, so the
/// real result wins over it.
#[test]
fn placeholder_markers_of_other_tools_are_configurable() {
    let messages = vec![
        json!({"role": "user", "content": "run"}),
        chat_call("call_a"),
        chat_tool("call_a", "<<pending: no result yet>>"),
        chat_tool("call_a", "real output"),
    ];
    let transcript = Transcript::from_messages(messages, Layout::Jsonl);
    let kept = |options: &RepairOptions| {
        let repaired = repair(&transcript, None, options).unwrap_or_else(|e| panic!("{e}"));
        repaired.transcript.message(2).map(|m| m["content"].clone())
    };
    assert_eq!(
        kept(&RepairOptions::default()),
        Some(json!("<<pending: no result yet>>"))
    );
    let options = RepairOptions {
        extra_placeholder_markers: vec!["<<pending".to_string()],
    };
    assert_eq!(kept(&options), Some(json!("real output")));
}

/// An inserted Anthropic placeholder is an error result carrying the marker.
#[test]
fn the_anthropic_placeholder_is_an_error_with_the_marker() {
    let transcript = Transcript::from_messages(
        vec![
            json!({"role": "user", "content": "run"}),
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "x", "input": {}}]}),
        ],
        Layout::JsonArray,
    );
    let repaired =
        repair(&transcript, None, &RepairOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let block = repaired
        .transcript
        .message(2)
        .map(|m| m["content"][0].clone())
        .unwrap_or_default();
    assert_eq!(block["is_error"], json!(true));
    assert!(
        block["content"]
            .as_str()
            .is_some_and(|text| text.starts_with(PLACEHOLDER_MARKER))
    );
}

/// A healthy report renders as one line with the message count and format.
#[test]
fn render_human_says_healthy() {
    let transcript = parse(&jsonl(&[chat_call("call_a"), chat_tool("call_a", "ok")]));
    let report = diagnose(&transcript, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        render_human(&report),
        "healthy: 2 messages, format openai-chat\n"
    );
}

/// Each finding renders on its own line, citing line, call id, kind and the
/// provider error.
#[test]
fn render_human_lists_each_finding() {
    let transcript = parse(&jsonl(&[
        json!({"role": "user", "content": "go"}),
        chat_call("call_a"),
    ]));
    let report = diagnose(&transcript, None).unwrap_or_else(|e| panic!("{e}"));
    let text = render_human(&report);
    let finding = text.lines().nth(1).unwrap_or_default();
    assert!(
        finding.starts_with("message 1 (line 2): missing result call_a:"),
        "{text}"
    );
    assert!(
        finding.contains("did not have response messages: call_a"),
        "{text}"
    );
}

/// The JSON report uses snake_case kinds and the format's wire name.
#[test]
fn the_report_serializes_for_other_languages() {
    let transcript = parse(&jsonl(&[chat_tool("call_zzz", "stray")]));
    let report = diagnose(&transcript, Some(Format::OpenAiChat)).unwrap_or_else(|e| panic!("{e}"));
    let value = serde_json::to_value(&report).unwrap_or_default();
    assert_eq!(value["format"], json!("openai-chat"));
    assert_eq!(value["messages"], json!(1));
    assert_eq!(value["findings"][0]["kind"], json!("orphan"));
    assert_eq!(value["findings"][0]["line"], json!(1));
}

/// Repair actions serialize with an `action` tag.
#[test]
fn repair_actions_serialize_with_a_tag() {
    let transcript = parse(&jsonl(&[
        chat_call("call_a"),
        chat_tool("call_zzz", "stray"),
    ]));
    let repaired =
        repair(&transcript, None, &RepairOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let value = serde_json::to_value(&repaired.actions).unwrap_or_default();
    assert_eq!(
        value,
        json!([
            {"action": "dropped", "call_id": "call_zzz", "index": 1, "reason": "orphan"},
            {"action": "inserted", "call_id": "call_a", "index": 1},
        ])
    );
}

/// Format names parse, print and serialize as the CLI spells them.
#[test]
fn format_names_match_the_cli() {
    for (format, name) in [
        (Format::OpenAiChat, "openai-chat"),
        (Format::Anthropic, "anthropic"),
        (Format::OpenAiResponses, "openai-responses"),
    ] {
        assert_eq!(name.parse::<Format>().ok(), Some(format));
        assert_eq!(format.to_string(), name);
        assert_eq!(serde_json::to_value(format).ok(), Some(json!(name)));
    }
}

/// A healthy Chat transcript of about `bytes` bytes: call and result pairs.
fn chat_of_size(bytes: usize) -> String {
    let mut messages = Vec::new();
    let mut size = 0;
    while size < bytes {
        let id = format!("call_{}", messages.len());
        for message in [chat_call(&id), chat_tool(&id, &"x".repeat(200))] {
            size += message.to_string().len() + 1;
            messages.push(message);
        }
    }
    jsonl(&messages)
}

/// Checks `transcript` (and repairs it) over gRPC: the check's verdict, or
/// the refusal, which must be the same for both calls.
async fn check_over_grpc(
    client: &mut TranscriptsClient<Channel>,
    transcript: &str,
) -> Result<bool, tonic::Status> {
    let repaired = client
        .repair(pb::TranscriptRepairRequest {
            transcript: transcript.to_string(),
            format: String::new(),
            placeholder_markers: vec![],
        })
        .await;
    let checked = client
        .check(pb::TranscriptCheckRequest {
            transcript: transcript.to_string(),
            format: String::new(),
        })
        .await;
    match (checked, repaired) {
        (Ok(checked), Ok(repaired)) => {
            assert_eq!(checked.get_ref().healthy, repaired.get_ref().healthy);
            Ok(checked.into_inner().healthy)
        }
        (Err(checked), Err(repaired)) => {
            assert_eq!(checked.code(), repaired.code(), "{repaired:?}");
            Err(checked)
        }
        (checked, repaired) => panic!("check {checked:?} but repair {repaired:?}"),
    }
}

/// The refusal of a request over a size limit.
fn assert_message_limit(refusal: &tonic::Status) {
    assert_eq!(refusal.code(), Code::ResourceExhausted, "{refusal:?}");
    assert_eq!(
        refusal
            .metadata()
            .get("leasehold-limit")
            .and_then(|limit| limit.to_str().ok()),
        Some("message_bytes")
    );
}

/// A transcript over the service's own limit is refused before it is
/// decoded, as RESOURCE_EXHAUSTED naming `message_bytes` like every other
/// oversized request; one under it is checked, even when it is larger than
/// the lease requests' limit.
#[tokio::test]
async fn the_transcripts_service_has_its_own_size_limit() {
    const LIMIT: usize = 256 * 1024;
    let mut options = test_options();
    options.limits.max_message_bytes = 64 * 1024;
    options.max_transcript_bytes = LIMIT;
    let server = TestServer::builder().options(options).start().await;
    let mut client = TranscriptsClient::connect(format!("http://{}", server.addr))
        .await
        .unwrap();
    let under = chat_of_size(LIMIT - 16 * 1024);
    assert!(under.len() > 64 * 1024 && under.len() < LIMIT);
    assert!(check_over_grpc(&mut client, &under).await.unwrap());
    let over = chat_of_size(LIMIT + 1024);
    assert_message_limit(&check_over_grpc(&mut client, &over).await.unwrap_err());
    // The connection and the service are still fine.
    assert!(check_over_grpc(&mut client, &under).await.unwrap());
}

/// By default a transcript may be 128 MiB: a 200,000-message transcript in
/// any of the three formats (34 to 68 MB) fits.
#[test]
fn the_default_transcript_limit_fits_long_sessions() {
    assert_eq!(
        ServeOptions::default().max_transcript_bytes,
        128 * 1024 * 1024
    );
}

/// `leasehold serve --max-transcript-bytes` sets the limit.
#[tokio::test]
async fn serve_takes_the_transcript_limit_as_a_flag() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("leasehold.db");
    let (mut child, addr) = spawn_serve(&[
        "--max-transcript-bytes",
        "65536",
        "--db",
        db.to_str().unwrap(),
    ]);
    let mut client = TranscriptsClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let under = chat_of_size(32 * 1024);
    let over = chat_of_size(80 * 1024);
    let results = (
        check_over_grpc(&mut client, &under).await,
        check_over_grpc(&mut client, &over).await,
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(results.0.unwrap());
    assert_message_limit(&results.1.unwrap_err());
}
