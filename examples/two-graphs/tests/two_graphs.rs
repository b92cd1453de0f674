//! The regression from the field: two application graphs drive one session,
//! one stalls after loading history while the other's model calls a slow
//! tool. The runner, fake provider and timeline are those of the demo
//! (`src/main.rs`); here the leasehold server runs on a manual clock, so
//! graph B's term runs out on the server without waiting for it.

use std::sync::Arc;
use std::time::Duration;

use leasehold_client::{ClientError, LossReason};
use leasehold_core::{Clock, Error, ManualClock};
use leasehold_example_two_graphs::{
    self as two_graphs, B_TTL, Item, LocalServer, OnConflict, Outcome, Setup, TurnError, TurnInput,
    World, continuations_of, refusals, run_scenario, sent_during_foreign_tools,
    transcript_problems,
};

/// Bounds every scenario, so a regression fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(20);

/// A start time far from zero, so "ms since epoch" arithmetic looks real.
const T0: u64 = 1_700_000_000_000;

/// An in-process leasehold server on a manual clock at [`T0`], over a
/// database in a temp dir.
struct TestServer {
    server: LocalServer,
    clock: ManualClock,
    _dir: tempfile::TempDir,
}

impl TestServer {
    async fn start() -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = ManualClock::new(T0);
        let server = LocalServer::start(
            &dir.path().join("leasehold.db"),
            Arc::new(clock.clone()) as Arc<dyn Clock>,
        )
        .await
        .expect("leasehold server");
        TestServer {
            server,
            clock,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        self.server.url().to_owned()
    }
}

async fn play(server: Option<&TestServer>, b_on_conflict: OnConflict) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let let_b_lapse: Box<dyn FnOnce() + Send> = match server {
        Some(server) => {
            let clock = server.clock.clone();
            Box::new(move || clock.advance(B_TTL.as_millis() as u64))
        }
        None => Box::new(|| {}),
    };
    let setup = Setup {
        session: "session:1".into(),
        leasehold: server.map(TestServer::url),
        session_db: dir.path().join("sessions.db"),
        b_on_conflict,
        let_b_lapse,
    };
    tokio::time::timeout(PATIENCE, run_scenario(setup))
        .await
        .expect("the scenario finishes")
}

/// The call id of the tool named `name` in the transcript.
fn call_of(outcome: &Outcome, name: &str) -> String {
    outcome
        .transcript
        .iter()
        .find_map(|item| match item {
            Item::FunctionCall { call_id, name: n } if n == name => Some(call_id.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no call to {name} in {:#?}", outcome.transcript))
}

fn requests_by<'a>(outcome: &'a Outcome, graph: &str) -> Vec<&'a two_graphs::RequestRecord> {
    outcome
        .requests
        .iter()
        .filter(|r| r.graph == graph)
        .collect()
}

/// What must hold whenever the graphs use the guard.
fn assert_guarded_invariants(outcome: &Outcome) {
    assert!(outcome.a.is_ok(), "graph A: {:?}", outcome.a);
    let during = sent_during_foreign_tools(outcome);
    assert!(
        during.is_empty(),
        "requests sent while another graph's tool was unanswered: {during:#?}"
    );
    assert!(refusals(outcome).is_empty(), "{:?}", refusals(outcome));
    let problems = transcript_problems(&outcome.transcript);
    assert!(
        problems.is_empty(),
        "{problems:?} in {:#?}",
        outcome.transcript
    );
    let slow = call_of(outcome, two_graphs::SLOW_TOOL);
    assert_eq!(
        continuations_of(outcome, &slow),
        1,
        "exactly one continuation after the slow tool"
    );
}

/// Without a lease, graph B sends its continuation while graph A's slow tool
/// is unanswered, and the provider refuses the unmatched call: the harness
/// reproduces the field failure.
#[tokio::test]
async fn without_a_lease_graph_b_sends_an_unmatched_tool_call() {
    let outcome = play(None, OnConflict::Fail).await;
    let slow = call_of(&outcome, two_graphs::SLOW_TOOL);
    let from_b = requests_by(&outcome, "graph-b");
    assert!(
        from_b
            .iter()
            .any(|r| r.unresolved_elsewhere.contains(&slow)),
        "{from_b:#?}"
    );
    let expected = format!("No tool output found for function call {slow}.");
    assert_eq!(refusals(&outcome), [expected.as_str()]);
    assert!(
        matches!(&outcome.b, Err(TurnError::Provider(m)) if *m == expected),
        "{:?}",
        outcome.b
    );
    // And the transcript is interleaved: A's call is not followed by its output.
    assert!(!transcript_problems(&outcome.transcript).is_empty());
}

/// With the guard, graph B's stall cost it the session; when it resumes it
/// fails with a clear "lost" error, sends nothing and writes nothing.
#[tokio::test]
async fn with_the_guard_graph_b_fails_as_lost_and_sends_nothing() {
    let server = TestServer::start().await;
    let outcome = play(Some(&server), OnConflict::Fail).await;
    assert_guarded_invariants(&outcome);
    assert!(requests_by(&outcome, "graph-b").is_empty());
    match &outcome.b {
        Err(TurnError::Lease(ClientError::Lost { reason, .. })) => {
            // The server's clock ran past B's term while B's own clock barely
            // moved: the gate's round trip is what tells B.
            assert!(
                matches!(
                    reason,
                    LossReason::Refused(Error::StaleFence { .. }) | LossReason::DeadlinePassed
                ),
                "{reason:?}"
            );
        }
        other => panic!("expected a lost lease, got {other:?}"),
    }
    assert!(
        !outcome
            .transcript
            .iter()
            .any(|i| matches!(i, Item::FunctionCall { name, .. } if name == two_graphs::FAST_TOOL)),
        "{:#?}",
        outcome.transcript
    );
}

/// With the guard and waiting, graph B sends nothing while A's tool runs and
/// continues after A's turn, from the whole history: one valid continuation
/// per call, one result per call.
#[tokio::test]
async fn with_the_guard_graph_b_waits_and_continues_after_a() {
    let server = TestServer::start().await;
    let outcome = play(Some(&server), OnConflict::Wait).await;
    assert_guarded_invariants(&outcome);
    assert!(outcome.b.is_ok(), "graph B: {:?}", outcome.b);
    let fast = call_of(&outcome, two_graphs::FAST_TOOL);
    assert_eq!(continuations_of(&outcome, &fast), 1);
    // B's requests came after A's turn and carried A's answered call.
    let slow = call_of(&outcome, two_graphs::SLOW_TOOL);
    let from_b = requests_by(&outcome, "graph-b");
    assert_eq!(from_b.len(), 1, "{from_b:#?}");
    assert!(
        from_b[0]
            .input
            .iter()
            .any(|i| matches!(i, Item::FunctionCallOutput { call_id, .. } if *call_id == slow))
    );
    // A's whole turn precedes B's in the transcript.
    let position = |wanted: &str| {
        outcome
            .transcript
            .iter()
            .position(|i| matches!(i, Item::FunctionCall { call_id, .. } if call_id == wanted))
            .unwrap()
    };
    assert!(position(&slow) < position(&fast));
}

/// A graph that starts a turn while another graph's tool runs is told the
/// session is busy, with the holder named, and sends nothing.
#[tokio::test]
async fn a_turn_started_during_a_tool_is_busy() {
    let server = TestServer::start().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let observer = std::sync::Arc::new(two_graphs::Observer::new());
    let world = World::new(&dir.path().join("sessions.db"), observer.clone()).unwrap();
    let graph_a = world
        .graph("graph-a", Some(&url), two_graphs::A_TTL, OnConflict::Fail)
        .await
        .unwrap();
    let a_turn = tokio::spawn(async move {
        let input = TurnInput::Ask(format!("Please run {}.", two_graphs::SLOW_TOOL));
        graph_a.turn("session:1", &input, || {}).await
    });
    tokio::time::timeout(PATIENCE, observer.wait_for("graph-a", "slow_tool started"))
        .await
        .expect("A's tool starts");

    let graph_b = world
        .graph("graph-b", Some(&url), B_TTL, OnConflict::Fail)
        .await
        .unwrap();
    let input = TurnInput::RunTool(two_graphs::FAST_TOOL.into());
    let err = graph_b.turn("session:1", &input, || {}).await.unwrap_err();
    match &err {
        TurnError::Lease(err) => assert_eq!(err.busy_holder(), Some("graph-a"), "{err:?}"),
        other => panic!("expected busy, got {other:?}"),
    }
    assert!(err.to_string().contains("graph-a"), "{err}");

    world.tools.let_slow_finish();
    tokio::time::timeout(PATIENCE, a_turn)
        .await
        .expect("A finishes")
        .unwrap()
        .unwrap();
    assert!(observer.requests().iter().all(|r| r.graph == "graph-a"));
    assert!(transcript_problems(&world.db.load("session:1").unwrap()).is_empty());
}
