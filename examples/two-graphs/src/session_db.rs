//! The session database, shared by both graphs, with the writer's fence
//! checked inside each write transaction.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold_client::fence::sqlite as fence_sqlite;
use leasehold_core::Fence;
use rusqlite::{Connection, TransactionBehavior};

use crate::{Item, Observer, TurnError};

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
