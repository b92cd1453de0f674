//! The operator commands (acquire, get, list, history, watch, ...): one
//! gRPC call each through the Rust client, and how a refusal is printed.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Value, json};

use leasehold_client::{Client, ClientError};
use leasehold_core::events::Selector;
use leasehold_core::lease::{Fence, Handoff, Key, LeaseId, Ttl};
use leasehold_core::lessor::ListFilter;
use leasehold_wire::{convert, pb};

use super::*;

/// Runs an operator command; a refusal is printed (as JSON too with --json).
pub(super) async fn run(other: Command) -> ExitCode {
    let as_json = wants_json(&other);
    match operate(other).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(refusal) => {
            if as_json {
                println!("{}", refusal.json());
            }
            eprintln!("error: {}", refusal.message);
            ExitCode::FAILURE
        }
    }
}

/// How long `leasehold check` waits for its answer.
pub(super) const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) async fn connect(target: &Target) -> Result<Client, Refusal> {
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    };
    let tls = leasehold_client::Tls {
        ca_pem: target.tls_ca.as_ref().map(read).transpose()?,
        identity: match (&target.tls_cert, &target.tls_key) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            _ => None,
        },
        domain: None,
    };
    let credentials = match &target.token {
        Some(token) => leasehold_client::Credentials::bearer(token).map_err(refused)?,
        None => leasehold_client::Credentials::default(),
    };
    let endpoints = target
        .server
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty());
    Client::connect_any_with(endpoints, tls, credentials)
        .await
        .map_err(|e| Refusal::from(format!("cannot connect to {}: {e}", target.server)))
}

/// Why an operator command failed: printed as a human line on stderr and,
/// under `--json`, also as one JSON object on stdout (`code`, `message`,
/// `reason`, `metadata`), so a script that parses stdout never reads an
/// empty string.
#[derive(Debug)]
pub(super) struct Refusal {
    /// The human line, as printed after `error: `.
    message: String,
    /// The rest, boxed: a `Result` with a `Refusal` stays small.
    detail: Box<RefusalDetail>,
}

#[derive(Debug)]
pub(super) struct RefusalDetail {
    /// The gRPC status name the server (or the client's own check by the
    /// server's rules) gave, e.g. `FAILED_PRECONDITION`; `CLIENT` for a
    /// failure the CLI met without an answer (a file it cannot read, a
    /// server it cannot reach, a watch that ended).
    code: String,
    /// The status's `leasehold-reason` (why a fence is stale, ...), if any.
    reason: Option<String>,
    /// The status's other `leasehold-*` details (holder, fence,
    /// remaining_ms, limit, ...), by name without the prefix.
    metadata: serde_json::Map<String, Value>,
}

impl From<String> for Refusal {
    fn from(message: String) -> Refusal {
        Refusal {
            message,
            detail: Box::new(RefusalDetail {
                code: "CLIENT".to_owned(),
                reason: None,
                metadata: serde_json::Map::new(),
            }),
        }
    }
}

impl Refusal {
    fn json(&self) -> Value {
        json!({
            "code": self.detail.code,
            "message": self.message,
            "reason": self.detail.reason,
            "metadata": self.detail.metadata,
        })
    }
}

/// `FailedPrecondition` -> `FAILED_PRECONDITION`, the name the status has on
/// the wire and in the Python client.
pub(super) fn code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// A refusal as the CLI reports it: the status code, then the message, and
/// the status's details for `--json`.
pub(super) fn refused(err: impl Into<ClientError>) -> Refusal {
    match err.into() {
        ClientError::Server(err) => {
            let status = leasehold_wire::status::to_status(err.clone());
            let mut metadata = serde_json::Map::new();
            let mut reason = None;
            for entry in status.metadata().iter() {
                let (name, value) = match entry {
                    tonic::metadata::KeyAndValueRef::Ascii(k, v) => (
                        k.as_str().to_owned(),
                        v.to_str().unwrap_or_default().to_owned(),
                    ),
                    tonic::metadata::KeyAndValueRef::Binary(k, v) => {
                        let bytes = v.to_bytes().unwrap_or_default();
                        (
                            k.as_str().to_owned(),
                            String::from_utf8_lossy(&bytes).into_owned(),
                        )
                    }
                };
                let Some(name) = name.strip_prefix("leasehold-") else {
                    continue;
                };
                let name = name.strip_suffix("-bin").unwrap_or(name).replace('-', "_");
                if name == "reason" {
                    reason = Some(value);
                } else {
                    // Numbers (fence, remaining_ms, at_ms) as JSON numbers.
                    let value = value
                        .parse::<u64>()
                        .map_or_else(|_| Value::String(value), Value::from);
                    metadata.insert(name, value);
                }
            }
            Refusal {
                message: format!("{:?}: {err}", status.code()),
                detail: Box::new(RefusalDetail {
                    code: code_name(status.code()),
                    reason,
                    metadata,
                }),
            }
        }
        other => Refusal::from(other.to_string()),
    }
}

/// The CLI's arguments, parsed by the same rules the server applies.
pub(super) fn key(text: String) -> Result<Key, Refusal> {
    Key::parse(text).map_err(refused)
}

pub(super) fn lease_id(text: &str) -> Result<LeaseId, Refusal> {
    LeaseId::parse(text).map_err(refused)
}

/// Whether the operator command asked for `--json`.
pub(super) fn wants_json(command: &Command) -> bool {
    match command {
        Command::Acquire { target, .. }
        | Command::Renew { target, .. }
        | Command::Release { target, .. }
        | Command::History { target, .. }
        | Command::Watch { target, .. }
        | Command::Unquarantine { target, .. }
        | Command::Check { target, .. }
        | Command::Get { target, .. }
        | Command::Health { target }
        | Command::List { target, .. } => target.json,
        Command::Serve { .. } | Command::Transcript { .. } => false,
    }
}

pub(super) async fn operate(command: Command) -> Result<(), Refusal> {
    match command {
        Command::Serve { .. } | Command::Transcript { .. } => {
            unreachable!("handled by run")
        }
        Command::Acquire {
            key,
            target,
            owner,
            ttl_ms,
            wait_ms,
            request_id,
            lock_delay_ms,
            max_recoveries,
            force,
        } => {
            let acquire = convert::acquire(pb::AcquireRequest {
                key,
                owner,
                ttl_ms,
                wait_ms,
                request_id,
                lock_delay_ms,
                max_recoveries,
                force,
            })
            .map_err(refused)?;
            let granted = connect(&target)
                .await?
                .grant(&acquire)
                .await
                .map_err(refused)?;
            print(
                target.json,
                json!({
                    "lease": lease_json(&granted.lease),
                    "previous": granted.previous.as_ref().map(ended_json),
                    "replayed": granted.replayed,
                }),
            );
        }
        Command::Renew {
            key: k,
            target,
            fence,
            lease_id: id,
            ttl_ms,
        } => {
            let (k, id) = (key(k)?, lease_id(&id)?);
            let ttl = Ttl::parse_optional(ttl_ms).map_err(refused)?;
            let lease = connect(&target)
                .await?
                .renew_term(&k, Fence(fence), id, ttl)
                .await
                .map_err(refused)?;
            print(target.json, json!({ "lease": lease_json(&lease) }));
        }
        Command::Release {
            key: k,
            target,
            fence,
            lease_id: id,
            suspend,
            successor,
            handoff_ms,
        } => {
            let (k, id) = (key(k)?, lease_id(&id)?);
            let handoff = Handoff::parse_optional(successor, handoff_ms).map_err(refused)?;
            let ended = connect(&target)
                .await?
                .release_term_to(&k, Fence(fence), id, suspend, handoff.as_ref())
                .await
                .map_err(refused)?;
            print(target.json, json!({ "ended": ended_json(&ended) }));
        }
        Command::History {
            key: k,
            target,
            page_size,
        } => {
            let k = key(k)?;
            let page = connect(&target)
                .await?
                .history(&k, page_size, None)
                .await
                .map_err(refused)?;
            let entries: Vec<Value> = page.entries.iter().map(history_json).collect();
            print(target.json, json!({ "entries": entries }));
        }
        Command::Watch {
            target,
            prefix,
            key: watched,
            from_revision,
            count,
        } => {
            use futures_util::StreamExt;
            let selector = match watched {
                Some(k) => Selector::Key(key(k)?),
                None => Selector::Prefix(prefix),
            };
            let mut watch = connect(&target)
                .await?
                .watch(selector, from_revision)
                .await
                .map_err(refused)?;
            let mut printed = 0;
            while count.is_none_or(|n| printed < n) {
                let Some(event) = watch.next().await else {
                    return Err(Refusal::from(format!(
                        "the watch ended; resume with --from-revision {}",
                        watch.next_revision()
                    )));
                };
                let event = event.map_err(|e| {
                    let mut refusal = refused(e);
                    refusal.message = format!(
                        "{}; resume with --from-revision {}",
                        refusal.message,
                        watch.next_revision()
                    );
                    refusal
                })?;
                print(target.json, event_json(&event));
                let _ = std::io::stdout().flush();
                printed += 1;
            }
        }
        Command::Unquarantine { key: k, target } => {
            let k = key(k)?;
            let state = connect(&target)
                .await?
                .unquarantine(&k)
                .await
                .map_err(refused)?;
            print(
                target.json,
                json!({
                    "key": k.as_str(),
                    "quarantined": state.quarantined,
                    "recoverable": state.recoverable,
                }),
            );
        }
        Command::Check {
            key: k,
            target,
            fence,
        } => {
            let k = key(k)?;
            let lease = connect(&target)
                .await?
                .check(&k, Fence(fence), CHECK_TIMEOUT)
                .await
                .map_err(refused)?;
            print(target.json, json!({ "lease": lease_json(&lease) }));
        }
        Command::Health { target } => {
            let client = connect(&target).await?;
            let serving = client.health().await.map_err(refused)?;
            // Health needs no credentials (a probe may have none); ServerInfo
            // does, and a server older than it has none: either way the
            // answer is still whether it serves.
            let info = match client.server_info().await {
                Ok(info) => Some(info),
                Err(ClientError::Server(
                    leasehold_core::Error::Unsupported(_)
                    | leasehold_core::Error::Unauthenticated(_),
                )) => None,
                Err(e) => return Err(refused(e)),
            };
            print(
                target.json,
                json!({
                    "serving": serving,
                    "version": info.as_ref().map(|i| i.version.clone()),
                    "protocol": info.as_ref().map(|i| i.protocol),
                    "backend": info.as_ref().map(|i| i.backend.clone()),
                }),
            );
            if !serving {
                return Err(Refusal::from(format!(
                    "{} is not serving (its storage does not answer, or it is draining)",
                    target.server
                )));
            }
        }
        Command::Get { key: k, target } => {
            let k = key(k)?;
            let state = connect(&target).await?.get(&k).await.map_err(refused)?;
            print(
                target.json,
                json!({
                    "lease": state.lease.as_ref().map(lease_json),
                    "last_ended": state.last_ended.as_ref().map(ended_json),
                    "recoverable": state.recoverable,
                    "quarantined": state.quarantined,
                    "reservation": state.reservation.as_ref().map(reservation_json),
                }),
            );
        }
        Command::List {
            target,
            prefix,
            filter,
            page_size,
            page_token,
            all,
        } => {
            let client = connect(&target).await?;
            let filter = match filter {
                Filter::Live => ListFilter::Live,
                Filter::Recoverable => ListFilter::Recoverable,
                Filter::Quarantined => ListFilter::Quarantined,
                Filter::All => ListFilter::All,
            };
            let mut token = (!page_token.is_empty()).then_some(page_token);
            let mut keys = Vec::new();
            loop {
                let page = client
                    .list(&prefix, filter, page_size, token.as_deref())
                    .await
                    .map_err(refused)?;
                keys.extend(page.keys.iter().map(|k| {
                    json!({
                        "key": k.key.as_str(),
                        "lease": k.lease.as_ref().map(lease_json),
                        "last_ended": k.last_ended.as_ref().map(ended_json),
                        "recoverable": k.recoverable,
                    })
                }));
                token = page.next_page_token;
                if !all || token.is_none() {
                    break;
                }
            }
            let page_token = token.unwrap_or_default();
            if target.json {
                print(true, json!({ "keys": keys, "next_page_token": page_token }));
            } else {
                for key in &keys {
                    println!("{}", one_line(key));
                }
                if !page_token.is_empty() {
                    println!("next_page_token: {page_token}");
                }
            }
        }
    }
    Ok(())
}
