//! The agent runner: a graph runs turns against the shared session, guarded
//! by a leasehold lease or, as agent servers do today, unguarded.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use leasehold_client::{Client, ClientError, SessionGuard};

use crate::{FakeProvider, Item, Observer, SessionDb, Tools, TurnError};

/// How long a graph told to wait queues for a held session.
const WAIT: Duration = Duration::from_secs(10);

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
            provider: Arc::new(FakeProvider::new(observer.clone())),
            tools: Arc::new(Tools::new(observer.clone())),
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
