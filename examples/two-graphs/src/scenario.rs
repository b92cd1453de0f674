//! The scenario: one play of the field failure's timeline.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::{
    A_TTL, B_TTL, Event, FAST_TOOL, Item, Observer, OnConflict, RequestRecord, SLOW_TOOL,
    TurnError, TurnInput, World,
};

/// How to play the timeline.
pub struct Setup {
    /// The session both graphs drive.
    pub session: String,
    /// The leasehold server's URL; `None` plays it without leases.
    pub leasehold: Option<String>,
    /// The session database file.
    pub session_db: PathBuf,
    /// What graph B does when it finds the session taken.
    pub b_on_conflict: OnConflict,
    /// Runs while graph B is stalled, to let its term run out on the server:
    /// a test advances the server's manual clock; with a real clock there is
    /// nothing to do, since graph A waits in line until the term expires.
    pub let_b_lapse: Box<dyn FnOnce() + Send>,
}

/// What happened.
pub struct Outcome {
    pub a: Result<(), TurnError>,
    pub b: Result<(), TurnError>,
    pub requests: Vec<RequestRecord>,
    pub transcript: Vec<Item>,
    pub timeline: Vec<Event>,
}

/// Plays the timeline once.
///
/// # Panics
/// When the session database cannot be created or a graph cannot start.
pub async fn run_scenario(setup: Setup) -> Outcome {
    let observer = Arc::new(Observer::new());
    let world = World::new(&setup.session_db, observer.clone()).expect("session database");
    let earlier = [Item::user("Hi."), Item::assistant("Hello.")];
    world
        .db
        .append(&setup.session, "earlier", None, &earlier)
        .expect("seed the session");

    // Graph B runs on its own thread with its own single-threaded runtime,
    // like a separate process: when it stalls, all of it stalls, lease
    // renewal included.
    let (loaded, b_loaded) = oneshot::channel();
    let (resume, b_stalled) = std::sync::mpsc::channel::<()>();
    let (b_reports, mut b_done) = oneshot::channel();
    let b_thread = std::thread::spawn({
        let world = world.clone();
        let leasehold = setup.leasehold.clone();
        let session = setup.session.clone();
        let on_conflict = setup.b_on_conflict;
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("graph B's runtime");
            let result = runtime.block_on(async move {
                let graph = world
                    .graph("graph-b", leasehold.as_deref(), B_TTL, on_conflict)
                    .await?;
                let input = TurnInput::RunTool(FAST_TOOL.into());
                graph
                    .turn(&session, &input, move || {
                        let _ = loaded.send(());
                        // The stall: a blocking wait on graph B's only thread.
                        let _ = b_stalled.recv();
                    })
                    .await
            });
            let _ = b_reports.send(result);
        }
    });

    // 1. Graph B has loaded the history and stalls.
    b_loaded.await.expect("graph B loads the history");
    observer.note("scenario", "graph B stalls");
    (setup.let_b_lapse)();

    // 2. Graph A starts a turn; its model calls the slow tool.
    let graph_a = world
        .graph(
            "graph-a",
            setup.leasehold.as_deref(),
            A_TTL,
            OnConflict::Wait,
        )
        .await
        .expect("graph A");
    let a_turn = tokio::spawn({
        let session = setup.session.clone();
        async move {
            let input = TurnInput::Ask(format!("Please run {SLOW_TOOL}."));
            graph_a.turn(&session, &input, || {}).await
        }
    });
    observer.wait_for("graph-a", "slow_tool started").await;

    // 3. Graph B resumes, calls the fast tool and tries to continue. It gets
    //    every chance to act while A's tool runs: until its turn ends, or
    //    until it waits in line for the session (and a little longer).
    observer.note("scenario", "graph B resumes");
    resume.send(()).expect("graph B is stalled");
    let b_early = tokio::select! {
        result = &mut b_done => Some(result.expect("graph B reports")),
        () = observer.wait_for("graph-b", "(attempt 2)") => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            None
        }
    };

    observer.note("scenario", "the slow tool may finish");
    world.tools.let_slow_finish();
    let a = a_turn.await.expect("graph A's task");
    let b = match b_early {
        Some(result) => result,
        None => b_done.await.expect("graph B reports"),
    };
    b_thread.join().expect("graph B's thread");
    Outcome {
        a,
        b,
        requests: observer.requests(),
        transcript: world.db.load(&setup.session).expect("transcript"),
        timeline: observer.timeline(),
    }
}
