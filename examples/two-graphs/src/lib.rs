//! Two application graphs, one session: the failure agent servers hit in the
//! field, and how a leasehold guard prevents it.
//!
//! Run it with `cargo run -p leasehold-example-two-graphs`. It starts its own
//! leasehold server on 127.0.0.1 (its database in a temporary directory) and
//! plays one timeline three times: without leasehold, with leasehold where
//! graph B gives up, and with leasehold where graph B waits for the session.
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
//! `src/main.rs` is the demo; `tests/two_graphs.rs` runs this same code and
//! asserts on the outcome.
//!
//! The modules, in dependency order: [`item`] (the transcript), [`observer`]
//! (what the scenario saw), [`error`], [`session_db`] (the session store),
//! [`provider`] (the fake model provider and the tools), [`graph`] (the agent
//! runner), [`scenario`] (the timeline), [`oracle`] (judging the outcome), and
//! [`local_server`] (an in-process leasehold server for the demo and the
//! test).

use std::time::Duration;

pub mod error;
pub mod graph;
pub mod item;
pub mod local_server;
pub mod observer;
pub mod oracle;
pub mod provider;
pub mod scenario;
pub mod session_db;

pub use error::TurnError;
pub use graph::{Graph, OnConflict, TurnInput, World};
pub use item::Item;
pub use local_server::LocalServer;
pub use observer::{Event, Observer, RequestRecord};
pub use oracle::{continuations_of, refusals, sent_during_foreign_tools, transcript_problems};
pub use provider::{FakeProvider, Tools, validate};
pub use scenario::{Outcome, Setup, run_scenario};
pub use session_db::SessionDb;

/// The tool graph A's model calls; it runs until the scenario lets it finish.
pub const SLOW_TOOL: &str = "slow_tool";
/// The tool graph B runs.
pub const FAST_TOOL: &str = "fast_tool";
/// Graph B's lease TTL; its stall outlasts it. (With a real clock, graph A
/// waits this long for the session; a test's manual clock skips the wait.)
pub const B_TTL: Duration = Duration::from_secs(1);
/// Graph A's lease TTL.
pub const A_TTL: Duration = Duration::from_secs(2);
