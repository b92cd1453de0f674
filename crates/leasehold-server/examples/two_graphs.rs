//! Two application graphs, one session: the failure agent servers hit in the
//! field, and how a leasehold guard prevents it.
//!
//! Run it with `cargo run --example two_graphs`. It starts its own leasehold
//! server on 127.0.0.1 (its database in a temporary directory) and plays one
//! timeline three times: without leasehold, with leasehold where graph B
//! gives up, and with leasehold where graph B waits for the session.
//!
//! The timeline, after a field report:
//! 1. Graph B starts a turn and loads the session's history; then its
//!    process stalls (a long GC pause, a blocked event loop).
//! 2. Graph A starts a turn for the same session; its model calls a
//!    deliberately slow tool.
//! 3. Graph B resumes, calls a fast tool and tries to continue.
//!
//! Without a lease, B's continuation carries A's tool call without its result,
//! and the fake provider refuses it as the OpenAI Responses API does ("No tool
//! output found for function call ..."). With a guard, B's stall outlasted its
//! lease, so A could take the session; when B resumes, its guard knows the
//! session is lost (by its local deadline, or by the gate's `Check`), so B
//! never sends a request while A's tool runs. It either fails with a clear
//! "lost" error or waits for the session and continues after A's turn, from
//! the whole history. Every write also carries the writer's fence into the
//! session database (`leasehold_client::fence::sqlite`), so a write that slipped
//! past the gate would be refused there.
//!
//! `tests/two_graphs.rs` runs this same code and asserts on the outcome.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_client::fence::sqlite::{self as fence_sqlite, FenceError};
use leasehold_client::{Client, ClientError, SessionGuard};
use leasehold_core::{Clock, Fence, SystemClock};
use leasehold_server::sqlite::SyncMode;
use leasehold_server::{EngineConfig, server};
use rusqlite::{Connection, TransactionBehavior};
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};

/// The tool graph A's model calls; it runs until the scenario lets it finish.
pub const SLOW_TOOL: &str = "slow_tool";
/// The tool graph B runs.
pub const FAST_TOOL: &str = "fast_tool";
/// Graph B's lease TTL; its stall outlasts it. (With a real clock, graph A
/// waits this long for the session; a test's manual clock skips the wait.)
pub const B_TTL: Duration = Duration::from_secs(1);
/// Graph A's lease TTL.
pub const A_TTL: Duration = Duration::from_secs(2);
/// How long a graph told to wait queues for a held session.
const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// The transcript
// ---------------------------------------------------------------------------

/// A transcript item, shaped like an OpenAI Responses API input item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Item {
    Message { role: String, content: String },
    FunctionCall { call_id: String, name: String },
    FunctionCallOutput { call_id: String, output: String },
}

impl Item {
    fn user(text: impl Into<String>) -> Item {
        Item::Message {
            role: "user".into(),
            content: text.into(),
        }
    }

    fn assistant(text: impl Into<String>) -> Item {
        Item::Message {
            role: "assistant".into(),
            content: text.into(),
        }
    }
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Item::Message { role, content } => write!(f, "{role}: {content}"),
            Item::FunctionCall { call_id, name } => write!(f, "function_call {call_id} {name}"),
            Item::FunctionCallOutput { call_id, output } => {
                write!(f, "function_call_output {call_id} {output:?}")
            }
        }
    }
}

// ---------------------------------------------------------------------------
// What the scenario saw
// ---------------------------------------------------------------------------

/// One line of the timeline.
#[derive(Debug, Clone)]
pub struct Event {
    pub at_ms: u128,
    pub graph: String,
    pub what: String,
}

/// One request the provider received.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub graph: String,
    pub input: Vec<Item>,
    /// Tool calls another graph had written to the session and not yet
    /// answered when this request was sent.
    pub unresolved_elsewhere: Vec<String>,
    /// The items the provider returned, or its error message.
    pub outcome: Result<Vec<Item>, String>,
}

/// Records the timeline, the provider's requests and the session's
/// unanswered tool calls, for the report and the test's assertions.
pub struct Observer {
    /// When the scenario started.
    start: Instant,
    /// The timeline; a watch so the scenario can wait for an event.
    events: watch::Sender<Vec<Event>>,
    /// Calls written to the session without an output yet: (call id, graph).
    unresolved: Mutex<Vec<(String, String)>>,
    /// Every request the provider received.
    requests: Mutex<Vec<RequestRecord>>,
    /// Numbers tool calls across graphs and the provider.
    next_call: AtomicU64,
}

impl Observer {
    pub fn new() -> Observer {
        Observer {
            start: Instant::now(),
            events: watch::Sender::new(Vec::new()),
            unresolved: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            next_call: AtomicU64::new(1),
        }
    }

    pub fn note(&self, graph: &str, what: impl Into<String>) {
        let event = Event {
            at_ms: self.start.elapsed().as_millis(),
            graph: graph.into(),
            what: what.into(),
        };
        self.events.send_modify(|events| events.push(event));
    }

    /// Waits until `graph` has noted something containing `what`.
    pub async fn wait_for(&self, graph: &str, what: &str) {
        let mut events = self.events.subscribe();
        let _ = events
            .wait_for(|events| {
                events
                    .iter()
                    .any(|e| e.graph == graph && e.what.contains(what))
            })
            .await;
    }

    pub fn timeline(&self) -> Vec<Event> {
        self.events.borrow().clone()
    }

    pub fn requests(&self) -> Vec<RequestRecord> {
        self.requests.lock().unwrap().clone()
    }

    fn new_call_id(&self) -> String {
        format!("call_{}", self.next_call.fetch_add(1, Ordering::Relaxed))
    }

    fn appended(&self, graph: &str, items: &[Item]) {
        let mut unresolved = self.unresolved.lock().unwrap();
        for item in items {
            match item {
                Item::FunctionCall { call_id, .. } => {
                    unresolved.push((call_id.clone(), graph.to_owned()));
                }
                Item::FunctionCallOutput { call_id, .. } => {
                    unresolved.retain(|(c, _)| c != call_id)
                }
                Item::Message { .. } => {}
            }
        }
    }

    fn unresolved_elsewhere(&self, graph: &str) -> Vec<String> {
        let unresolved = self.unresolved.lock().unwrap();
        unresolved
            .iter()
            .filter(|(_, owner)| owner != graph)
            .map(|(call, _)| call.clone())
            .collect()
    }
}

impl Default for Observer {
    fn default() -> Self {
        Self::new()
    }
}

// ---------------------------------------------------------------------------
// The session database, shared by both graphs
// ---------------------------------------------------------------------------

/// Why a turn failed.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    /// The lease said no: busy, lost, unreachable.
    #[error(transparent)]
    Lease(#[from] ClientError),
    /// The session database refused a write with a stale fence.
    #[error("the session database refused the write: {0}")]
    Fence(#[from] FenceError),
    /// The model provider refused the request.
    #[error("the provider refused the request: {0}")]
    Provider(String),
    #[error("session database: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("malformed item: {0}")]
    Json(#[from] serde_json::Error),
}

/// The sessions of both graphs, in one SQLite file. SQLite calls here are
/// short and local, so they run inline; a real server would move them off
/// the async threads.
#[derive(Clone)]
pub struct SessionDb {
    path: PathBuf,
    observer: Arc<Observer>,
}

impl SessionDb {
    pub fn create(path: &Path, observer: Arc<Observer>) -> Result<SessionDb, TurnError> {
        let conn = Connection::open(path)?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE IF NOT EXISTS items (
                 session TEXT NOT NULL,
                 seq     INTEGER NOT NULL,
                 graph   TEXT NOT NULL,
                 fence   INTEGER,
                 item    TEXT NOT NULL,
                 PRIMARY KEY (session, seq)
             );",
        )?;
        fence_sqlite::install(&conn)?;
        Ok(SessionDb {
            path: path.to_owned(),
            observer,
        })
    }

    fn connect(&self) -> Result<Connection, TurnError> {
        let conn = Connection::open(&self.path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        Ok(conn)
    }

    /// The session's items in order.
    pub fn load(&self, session: &str) -> Result<Vec<Item>, TurnError> {
        let conn = self.connect()?;
        let mut stmt = conn.prepare("SELECT item FROM items WHERE session = ?1 ORDER BY seq")?;
        let rows = stmt.query_map([session], |row| row.get::<_, String>(0))?;
        let mut items = Vec::new();
        for row in rows {
            items.push(serde_json::from_str(&row?)?);
        }
        Ok(items)
    }

    /// Appends `items` in one transaction; with a fence, the transaction is
    /// refused if a higher fence has written the session.
    pub fn append(
        &self,
        session: &str,
        graph: &str,
        fence: Option<Fence>,
        items: &[Item],
    ) -> Result<(), TurnError> {
        let insert = |tx: &Connection| -> Result<(), TurnError> {
            for item in items {
                tx.execute(
                    "INSERT INTO items (session, seq, graph, fence, item)
                     VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM items WHERE session = ?1),
                             ?2, ?3, ?4)",
                    (
                        session,
                        graph,
                        fence.map(|f| f.0 as i64),
                        serde_json::to_string(item)?,
                    ),
                )?;
            }
            Ok(())
        };
        let mut conn = self.connect()?;
        match fence {
            Some(fence) => fence_sqlite::write(&mut conn, session, fence, |tx| insert(tx))?,
            None => {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                insert(&tx)?;
                tx.commit()?;
            }
        }
        self.observer.appended(graph, items);
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The fake model provider and the tools
// ---------------------------------------------------------------------------

/// The OpenAI Responses API's rules for tool items: every call needs its
/// output later in the input, every output needs an earlier call, and ids
/// are unique.
pub fn validate(input: &[Item]) -> Result<(), String> {
    let mut calls = HashSet::new();
    let mut outputs = HashSet::new();
    for (i, item) in input.iter().enumerate() {
        match item {
            Item::FunctionCall { call_id, .. } => {
                if !calls.insert(call_id) {
                    return Err(format!("Duplicate item found with id {call_id}."));
                }
                let answered = input[i + 1..].iter().any(|later| {
                    matches!(later, Item::FunctionCallOutput { call_id: c, .. } if c == call_id)
                });
                if !answered {
                    return Err(format!("No tool output found for function call {call_id}."));
                }
            }
            Item::FunctionCallOutput { call_id, .. } => {
                if !calls.contains(call_id) {
                    return Err(format!(
                        "No tool call found for function call output with call_id {call_id}."
                    ));
                }
                if !outputs.insert(call_id) {
                    return Err(format!("Duplicate item found with id {call_id}."));
                }
            }
            Item::Message { .. } => {}
        }
    }
    Ok(())
}

/// A model provider that enforces [`validate`] and answers by rote: a user
/// message naming a tool gets a call to it, a tool output gets a summary.
pub struct FakeProvider {
    observer: Arc<Observer>,
}

impl FakeProvider {
    pub fn respond(&self, graph: &str, input: Vec<Item>) -> Result<Vec<Item>, TurnError> {
        let unresolved_elsewhere = self.observer.unresolved_elsewhere(graph);
        let outcome = validate(&input).map(|()| self.model(&input));
        self.observer.note(
            graph,
            match &outcome {
                Ok(_) => format!("sent a request of {} items: accepted", input.len()),
                Err(e) => format!("sent a request of {} items: refused: {e}", input.len()),
            },
        );
        self.observer.requests.lock().unwrap().push(RequestRecord {
            graph: graph.into(),
            input,
            unresolved_elsewhere,
            outcome: outcome.clone(),
        });
        outcome.map_err(TurnError::Provider)
    }

    fn model(&self, input: &[Item]) -> Vec<Item> {
        match input.last() {
            Some(Item::Message { role, content }) if role == "user" => {
                match [SLOW_TOOL, FAST_TOOL]
                    .into_iter()
                    .find(|t| content.contains(t))
                {
                    Some(tool) => vec![Item::FunctionCall {
                        call_id: self.observer.new_call_id(),
                        name: tool.into(),
                    }],
                    None => vec![Item::assistant("Hello.")],
                }
            }
            Some(Item::FunctionCallOutput { call_id, output }) => {
                vec![Item::assistant(format!("{call_id} returned {output:?}."))]
            }
            _ => vec![Item::assistant("Done.")],
        }
    }
}

/// The tools: the slow one runs until the scenario lets it finish.
pub struct Tools {
    observer: Arc<Observer>,
    /// Set when the slow tool may return.
    slow_may_finish: watch::Sender<bool>,
}

impl Tools {
    pub async fn call(&self, graph: &str, name: &str) -> String {
        if name == SLOW_TOOL {
            self.observer.note(graph, format!("{SLOW_TOOL} started"));
            let mut may_finish = self.slow_may_finish.subscribe();
            let _ = may_finish.wait_for(|finish| *finish).await;
            self.observer.note(graph, format!("{SLOW_TOOL} finished"));
        } else {
            self.observer.note(graph, format!("{name} ran"));
        }
        format!("{name} result")
    }

    pub fn let_slow_finish(&self) {
        self.slow_may_finish.send_replace(true);
    }
}

// ---------------------------------------------------------------------------
// The agent runner
// ---------------------------------------------------------------------------

/// What a graph does when the session is held by another graph, or lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnConflict {
    /// Fail the turn with the busy or lost error.
    Fail,
    /// Wait in line for the session and start the turn over.
    Wait,
}

/// What starts a turn.
#[derive(Debug, Clone)]
pub enum TurnInput {
    /// A user message; the model decides what to do.
    Ask(String),
    /// The user runs a tool directly (like a shell command typed into the
    /// chat); the model then continues.
    RunTool(String),
}

/// What both graphs share: the session database, the provider, the tools.
#[derive(Clone)]
pub struct World {
    pub db: SessionDb,
    pub provider: Arc<FakeProvider>,
    pub tools: Arc<Tools>,
    pub observer: Arc<Observer>,
}

impl World {
    pub fn new(session_db: &Path, observer: Arc<Observer>) -> Result<World, TurnError> {
        Ok(World {
            db: SessionDb::create(session_db, observer.clone())?,
            provider: Arc::new(FakeProvider {
                observer: observer.clone(),
            }),
            tools: Arc::new(Tools {
                observer: observer.clone(),
                slow_may_finish: watch::Sender::new(false),
            }),
            observer,
        })
    }

    /// A graph named `name`; with a leasehold URL it guards its turns, without
    /// one it runs unguarded, as agent servers do today.
    pub async fn graph(
        &self,
        name: &str,
        leasehold: Option<&str>,
        ttl: Duration,
        on_conflict: OnConflict,
    ) -> Result<Graph, TurnError> {
        let leasehold = match leasehold {
            Some(url) => Some(Client::connect(url).await?),
            None => None,
        };
        Ok(Graph {
            name: name.into(),
            world: self.clone(),
            leasehold,
            ttl,
            on_conflict,
        })
    }
}

/// One application graph: runs turns against the shared session.
pub struct Graph {
    pub name: String,
    world: World,
    /// The leasehold client; `None` runs unguarded.
    leasehold: Option<Client>,
    /// The TTL of this graph's session leases.
    ttl: Duration,
    on_conflict: OnConflict,
}

impl Graph {
    /// Runs one turn on `session`. `after_load` runs once the history is
    /// loaded (the scenario stalls graph B there).
    pub async fn turn(
        &self,
        session: &str,
        input: &TurnInput,
        after_load: impl FnOnce(),
    ) -> Result<(), TurnError> {
        let result = self.try_turn(session, input, after_load).await;
        if let Err(err) = &result {
            self.note(format!("turn failed: {err}"));
        }
        result
    }

    async fn try_turn(
        &self,
        session: &str,
        input: &TurnInput,
        after_load: impl FnOnce(),
    ) -> Result<(), TurnError> {
        let Some(leasehold) = &self.leasehold else {
            let history = self.world.db.load(session)?;
            self.note(format!("loaded {} items (no lease)", history.len()));
            after_load();
            return self.drive(None, session, input, &mut false).await;
        };
        let mut after_load = Some(after_load);
        let mut attempt = 1;
        loop {
            let wait = match self.on_conflict {
                OnConflict::Fail => Duration::ZERO,
                OnConflict::Wait => WAIT,
            };
            self.note(format!("acquiring the session (attempt {attempt})"));
            let guard = leasehold
                .acquire(session)
                .owner(&self.name)
                .ttl(self.ttl)
                .wait(wait)
                .await?;
            self.note(describe_grant(&guard));
            let history = self.world.db.load(session)?;
            self.note(format!("loaded {} items", history.len()));
            if let Some(hold) = after_load.take() {
                hold();
            }
            let mut wrote = false;
            match self.drive(Some(&guard), session, input, &mut wrote).await {
                Ok(()) => {
                    guard.release().await?;
                    self.note("released the session");
                    return Ok(());
                }
                // Lost before this turn wrote anything: safe to start over,
                // from the history as it is by then.
                Err(TurnError::Lease(err @ ClientError::Lost { .. }))
                    if !wrote && self.on_conflict == OnConflict::Wait =>
                {
                    self.note(format!("{err}; starting over"));
                    attempt += 1;
                }
                // Dropping the guard suspends the term if it is still held.
                Err(err) => return Err(err),
            }
        }
    }

    /// The turn's work. With a guard, every model request and every write
    /// passes the gate first, tools run under `guard.run`, and writes carry
    /// the fence into the session database.
    async fn drive(
        &self,
        guard: Option<&SessionGuard>,
        session: &str,
        input: &TurnInput,
        wrote: &mut bool,
    ) -> Result<(), TurnError> {
        let mut calls = Vec::new();
        match input {
            TurnInput::Ask(text) => {
                self.write(guard, session, vec![Item::user(text)], wrote)
                    .await?
            }
            TurnInput::RunTool(name) => calls.push(Item::FunctionCall {
                call_id: self.world.observer.new_call_id(),
                name: name.clone(),
            }),
        }
        loop {
            for call in calls.drain(..) {
                let Item::FunctionCall { call_id, name } = &call else {
                    continue;
                };
                self.write(guard, session, vec![call.clone()], wrote)
                    .await?;
                let output = match guard {
                    Some(guard) => {
                        guard
                            .run(|_| self.world.tools.call(&self.name, name))
                            .await?
                    }
                    None => self.world.tools.call(&self.name, name).await,
                };
                let output = Item::FunctionCallOutput {
                    call_id: call_id.clone(),
                    output,
                };
                self.write(guard, session, vec![output], wrote).await?;
            }
            // The continuation gate: one call before every model request.
            if let Some(guard) = guard {
                guard.gate().await?;
            }
            let history = self.world.db.load(session)?;
            let reply = self.world.provider.respond(&self.name, history)?;
            calls = reply
                .iter()
                .filter(|item| matches!(item, Item::FunctionCall { .. }))
                .cloned()
                .collect();
            let answer: Vec<Item> = reply
                .into_iter()
                .filter(|item| !matches!(item, Item::FunctionCall { .. }))
                .collect();
            if !answer.is_empty() {
                self.write(guard, session, answer, wrote).await?;
            }
            if calls.is_empty() {
                return Ok(());
            }
        }
    }

    /// One write to the session: gated and fenced when guarded.
    async fn write(
        &self,
        guard: Option<&SessionGuard>,
        session: &str,
        items: Vec<Item>,
        wrote: &mut bool,
    ) -> Result<(), TurnError> {
        let fence = match guard {
            Some(guard) => Some(guard.gate().await?),
            None => None,
        };
        self.world.db.append(session, &self.name, fence, &items)?;
        *wrote = true;
        for item in &items {
            self.note(format!("wrote {item}"));
        }
        Ok(())
    }

    fn note(&self, what: impl Into<String>) {
        self.world.observer.note(&self.name, what);
    }
}

fn describe_grant(guard: &SessionGuard) -> String {
    match guard.previous() {
        Some(previous) => format!(
            "holds the session with fence {} (the previous term, fence {} of {}, ended {:?})",
            guard.fence(),
            previous.fence,
            previous.owner,
            previous.end
        ),
        None => format!("holds the session with fence {}", guard.fence()),
    }
}

// ---------------------------------------------------------------------------
// The scenario
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Judging the outcome
// ---------------------------------------------------------------------------

/// Requests sent while another graph's tool call was unanswered.
pub fn sent_during_foreign_tools(outcome: &Outcome) -> Vec<&RequestRecord> {
    outcome
        .requests
        .iter()
        .filter(|r| !r.unresolved_elsewhere.is_empty())
        .collect()
}

/// The provider's refusals.
pub fn refusals(outcome: &Outcome) -> Vec<&str> {
    outcome
        .requests
        .iter()
        .filter_map(|r| r.outcome.as_ref().err().map(String::as_str))
        .collect()
}

/// Accepted requests that continue after `call_id`'s output (end with it).
pub fn continuations_of(outcome: &Outcome, call_id: &str) -> usize {
    outcome
        .requests
        .iter()
        .filter(|r| r.outcome.is_ok())
        .filter(|r| {
            matches!(r.input.last(), Some(Item::FunctionCallOutput { call_id: c, .. }) if c == call_id)
        })
        .count()
}

/// What is wrong with a transcript: a call not answered exactly once, or
/// not answered by the very next item; an output without its call.
pub fn transcript_problems(transcript: &[Item]) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, item) in transcript.iter().enumerate() {
        match item {
            Item::FunctionCall { call_id, .. } => {
                let outputs = transcript
                    .iter()
                    .filter(|o| matches!(o, Item::FunctionCallOutput { call_id: c, .. } if c == call_id))
                    .count();
                if outputs != 1 {
                    problems.push(format!("{call_id} has {outputs} outputs"));
                }
                let answered_next = matches!(
                    transcript.get(i + 1),
                    Some(Item::FunctionCallOutput { call_id: c, .. }) if c == call_id
                );
                if outputs == 1 && !answered_next {
                    problems.push(format!("{call_id} is not answered right after it"));
                }
            }
            Item::FunctionCallOutput { call_id, .. } => {
                let called = transcript[..i]
                    .iter()
                    .any(|c| matches!(c, Item::FunctionCall { call_id: id, .. } if id == call_id));
                if !called {
                    problems.push(format!("output for {call_id} has no call before it"));
                }
            }
            Item::Message { .. } => {}
        }
    }
    problems
}

// ---------------------------------------------------------------------------
// The example program
// ---------------------------------------------------------------------------

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let engine = server::open_engine(
        &dir.path().join("leasehold.db"),
        SyncMode::Full,
        Arc::new(SystemClock::new()) as Arc<dyn Clock>,
        EngineConfig::default(),
    )?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(server::serve(listener, engine, async {
        let _ = stopped.await;
    }));
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

    let _ = stop.send(());
    serving.await??;
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
