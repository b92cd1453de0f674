//! The transcript checks where agent servers use them: the CLI, the gRPC
//! `Transcripts` service, and the client guard's gate.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{TestServer, binary};
use leasehold_client::{Client, ClientError};
use leasehold_transcript::Transcript;
use leasehold_wire::pb;
use leasehold_wire::pb::transcripts_client::TranscriptsClient;
use tonic::Code;

fn corpus(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../leasehold-transcript/tests/transcripts")
        .join(path)
}

fn leasehold(args: &[&str]) -> std::process::Output {
    Command::new(binary())
        .args(args)
        .output()
        .expect("run leasehold")
}

/// `transcript check` exits 0 healthy, 1 with findings, 2 on unreadable input.
#[test]
fn check_exit_codes_follow_the_contract() {
    let healthy = corpus("openai-chat/healthy_parallel_multi_turn.json");
    let out = leasehold(&["transcript", "check", healthy.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("healthy"));

    let missing = corpus("openai-chat/missing.json");
    let out = leasehold(&["transcript", "check", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("call_a"), "{stdout}");
    assert!(
        stdout.contains("did not have response messages"),
        "{stdout}"
    );

    let out = leasehold(&["transcript", "check", "--json", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["healthy"], false);
    assert_eq!(report["findings"][0]["kind"], "missing");
    assert_eq!(report["findings"][0]["call_id"], "call_a");

    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "[{\"role\": \"user\"").unwrap();
    let out = leasehold(&["transcript", "check", garbage.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let out = leasehold(&["transcript", "check", "/no/such/file.json"]);
    assert_eq!(out.status.code(), Some(2));

    let no_tools = dir.path().join("chat.json");
    std::fs::write(
        &no_tools,
        r#"[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]"#,
    )
    .unwrap();
    let out = leasehold(&["transcript", "check", no_tools.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
}

/// `transcript repair -o` writes a healthy transcript and lists its actions.
#[test]
fn repair_writes_a_healthy_transcript() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("fixed.json");
    let input = corpus("openai-chat/missing.json");
    let out = leasehold(&[
        "transcript",
        "repair",
        input.to_str().unwrap(),
        "-o",
        out_path.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("inserted"));
    let check = leasehold(&["transcript", "check", out_path.to_str().unwrap()]);
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );

    // A healthy transcript comes out byte for byte.
    let healthy = corpus("anthropic/healthy_parallel_multi_turn.json");
    let out = leasehold(&["transcript", "repair", healthy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, std::fs::read(&healthy).unwrap());
}

/// The gRPC service checks and repairs JSON text; bad input is INVALID_ARGUMENT.
#[tokio::test]
async fn the_transcripts_service_checks_and_repairs() {
    let server = TestServer::start().await;
    let mut client = TranscriptsClient::connect(format!("http://{}", server.addr))
        .await
        .unwrap();
    let text = std::fs::read_to_string(corpus("openai-chat/missing.json")).unwrap();
    let checked = client
        .check(pb::TranscriptCheckRequest {
            transcript: text.clone(),
            format: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!checked.healthy);
    assert_eq!(checked.format, "openai-chat");
    assert_eq!(checked.findings[0].kind, "missing");
    assert_eq!(checked.findings[0].call_id, "call_a");
    assert_eq!(checked.findings[0].index, 1);

    let repaired = client
        .repair(pb::TranscriptRepairRequest {
            transcript: text,
            format: "openai-chat".into(),
            placeholder_markers: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(repaired.healthy);
    assert!(repaired.actions_json.contains("inserted"));
    let again = client
        .check(pb::TranscriptCheckRequest {
            transcript: repaired.transcript,
            format: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(again.healthy, "{:?}", again.findings);

    for (transcript, format) in [("[{", ""), ("[1]", ""), ("[]", "gemini")] {
        let status = client
            .check(pb::TranscriptCheckRequest {
                transcript: transcript.into(),
                format: format.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{transcript:?}");
    }
}

/// The guard's gate refuses a transcript the provider would reject, and
/// passes a healthy one with the fence.
#[tokio::test]
async fn the_gate_refuses_an_unhealthy_transcript() {
    let server = TestServer::start().await;
    let client = Client::connect(format!("http://{}", server.addr))
        .await
        .unwrap();
    let guard = client
        .acquire("session:t")
        .owner("graph-a")
        .ttl(Duration::from_secs(60))
        .await
        .unwrap();
    let broken =
        Transcript::parse(&std::fs::read_to_string(corpus("openai-chat/missing.json")).unwrap())
            .unwrap();
    match guard.gate_transcript(&broken, None).await {
        Err(ClientError::UnhealthyTranscript(report)) => {
            assert_eq!(report.findings[0].call_id, "call_a");
        }
        other => panic!("expected an unhealthy transcript, got {other:?}"),
    }
    let healthy = Transcript::parse(
        &std::fs::read_to_string(corpus("openai-chat/healthy_single.json")).unwrap(),
    )
    .unwrap();
    let fence = guard.gate_transcript(&healthy, None).await.unwrap();
    assert_eq!(fence, guard.fence());
    guard.release().await.unwrap();
}
