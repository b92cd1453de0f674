//! The two-graph demo: plays the field failure without leasehold and with
//! it, against a leasehold server of its own, and prints what happened. See
//! the library's docs for the timeline.

use std::sync::Arc;

use leasehold_core::{Clock, SystemClock};
use leasehold_example_two_graphs::{
    LocalServer, OnConflict, Outcome, Setup, TurnError, refusals, run_scenario,
    sent_during_foreign_tools, transcript_problems,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let leasehold = LocalServer::start(
        &dir.path().join("leasehold.db"),
        Arc::new(SystemClock::new()) as Arc<dyn Clock>,
    )
    .await?;
    let url = leasehold.url().to_owned();
    println!("leasehold server on {url}");

    let runs = [
        ("without leasehold", None, OnConflict::Fail),
        (
            "with leasehold; graph B gives up",
            Some(url.clone()),
            OnConflict::Fail,
        ),
        (
            "with leasehold; graph B waits",
            Some(url.clone()),
            OnConflict::Wait,
        ),
    ];
    for (i, (title, leasehold, b_on_conflict)) in runs.into_iter().enumerate() {
        let outcome = run_scenario(Setup {
            session: format!("session:{}", i + 1),
            leasehold,
            session_db: dir.path().join(format!("sessions-{}.db", i + 1)),
            b_on_conflict,
            let_b_lapse: Box::new(|| {}),
        })
        .await;
        report(title, &outcome);
    }

    leasehold.stop().await?;
    Ok(())
}

fn report(title: &str, outcome: &Outcome) {
    println!("\n=== {title} ===");
    for event in &outcome.timeline {
        println!("{:>6} ms  {:<9} {}", event.at_ms, event.graph, event.what);
    }
    println!("\ntranscript:");
    for item in &outcome.transcript {
        println!("  {item}");
    }
    let show = |result: &Result<(), TurnError>| match result {
        Ok(()) => "finished".to_owned(),
        Err(err) => format!("failed: {err}"),
    };
    println!("\ngraph A: {}", show(&outcome.a));
    println!("graph B: {}", show(&outcome.b));
    let during = sent_during_foreign_tools(outcome);
    println!(
        "requests sent while another graph's tool call was unanswered: {}",
        during.len()
    );
    for refusal in refusals(outcome) {
        println!("provider refused: {refusal}");
    }
    let problems = transcript_problems(&outcome.transcript);
    if problems.is_empty() {
        println!("transcript: every call answered exactly once, right after it");
    } else {
        println!("transcript problems: {}", problems.join("; "));
    }
}
