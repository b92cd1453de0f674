//! Wake-ups across servers: one dedicated connection (not from the pool,
//! and never behind a transaction pooler) LISTENs on the schema's channel
//! and fans each notified key out to this server's waiters.
//!
//! Notifications are only a shortcut: a waiter also wakes at its holder's
//! deadline and at least every poll interval, so a lost connection (or a
//! notification sent while it was down) delays a handoff, never loses it.

use std::time::Duration;

use futures_util::{StreamExt, stream};
use tokio::sync::broadcast;
use tokio_postgres::{AsyncMessage, NoTls};

/// The key a notification names; [`WAKE_ALL`] wakes every waiter.
pub type Wake = String;

/// Sent after (re)connecting, since notifications may have been missed.
pub const WAKE_ALL: &str = "";

/// Listens on `channel` until the task is aborted, reconnecting after a
/// failure, and sends each notified key on `wakes`.
pub async fn run(config: tokio_postgres::Config, channel: String, wakes: broadcast::Sender<Wake>) {
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut connection)) => {
                let forward = {
                    let wakes = wakes.clone();
                    tokio::spawn(async move {
                        let mut messages = stream::poll_fn(move |cx| connection.poll_message(cx));
                        while let Some(Ok(message)) = messages.next().await {
                            if let AsyncMessage::Notification(note) = message {
                                let _ = wakes.send(note.payload().to_owned());
                            }
                        }
                    })
                };
                let listen = format!("LISTEN \"{channel}\"");
                match client.batch_execute(&listen).await {
                    Ok(()) => {
                        let _ = wakes.send(WAKE_ALL.to_owned());
                        let _ = forward.await;
                        tracing::warn!("PostgreSQL notification connection lost; reconnecting");
                    }
                    Err(e) => {
                        forward.abort();
                        tracing::warn!(error = %e, "cannot LISTEN for handoffs");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot open the notification connection"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
