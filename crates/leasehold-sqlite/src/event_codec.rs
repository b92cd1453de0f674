//! The stored form of Watch events: a compact binary record per event,
//! many events per row (one row per commit), so the event log costs one
//! small insert per group commit rather than one per change.
//!
//! Each event: revision (u64), kind (u8), fence (u64), at (u64), key and
//! owner (u32 length + UTF-8), integers little-endian. Decoding checks every
//! value as the gRPC edge would: a stored event this build cannot read stops
//! start-up rather than being skipped.

use leasehold_core::events::{Event, EventKind};
use leasehold_core::lease::{Fence, Key, Owner};
use leasehold_core::stored::Stored;

fn kind_code(kind: EventKind) -> u8 {
    // Every code fits a byte (leasehold_core::stored).
    kind.code() as u8
}

fn kind_of(code: u8) -> Option<EventKind> {
    EventKind::from_code(i64::from(code))
}

/// Encodes `events` into one record.
pub fn encode(events: &[Event]) -> Vec<u8> {
    let mut out = Vec::with_capacity(events.len() * 64);
    for e in events {
        out.extend_from_slice(&e.revision.to_le_bytes());
        out.push(kind_code(e.kind));
        out.extend_from_slice(&e.fence.0.to_le_bytes());
        out.extend_from_slice(&e.at.to_le_bytes());
        for text in [e.key.as_str(), e.owner.as_str()] {
            out.extend_from_slice(&(text.len() as u32).to_le_bytes());
            out.extend_from_slice(text.as_bytes());
        }
    }
    out
}

/// Decodes a record made by [`encode`].
///
/// # Errors
/// A description of the first malformed value.
pub fn decode(mut bytes: &[u8]) -> Result<Vec<Event>, String> {
    let mut events = Vec::new();
    while !bytes.is_empty() {
        let revision = u64_of(&mut bytes)?;
        let kind = take(&mut bytes, 1)?[0];
        let kind = kind_of(kind).ok_or_else(|| format!("unknown event kind {kind}"))?;
        let fence = Fence(u64_of(&mut bytes)?);
        let at = u64_of(&mut bytes)?;
        let key = Key::parse(text_of(&mut bytes)?).map_err(|e| e.to_string())?;
        let owner = Owner::parse(text_of(&mut bytes)?).map_err(|e| e.to_string())?;
        events.push(Event {
            revision,
            key,
            kind,
            fence,
            owner,
            at,
        });
    }
    Ok(events)
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if bytes.len() < n {
        return Err("truncated event record".into());
    }
    let (head, rest) = bytes.split_at(n);
    *bytes = rest;
    Ok(head)
}

fn u64_of(bytes: &mut &[u8]) -> Result<u64, String> {
    let raw = take(bytes, 8)?;
    Ok(u64::from_le_bytes(raw.try_into().expect("8 bytes")))
}

fn text_of(bytes: &mut &[u8]) -> Result<String, String> {
    let len = take(bytes, 4)?;
    let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
    let raw = take(bytes, len)?;
    String::from_utf8(raw.to_vec()).map_err(|_| "event text is not UTF-8".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_and_garbage_is_an_error() {
        let events = vec![
            Event {
                revision: 7,
                key: Key::parse("session:ü").unwrap(),
                kind: EventKind::Granted,
                fence: Fence(u64::MAX),
                owner: Owner::parse("w1").unwrap(),
                at: 1_700_000_000_000,
            },
            Event {
                revision: 8,
                key: Key::parse("k").unwrap(),
                kind: EventKind::Forgotten,
                fence: Fence(3),
                owner: Owner::parse("o").unwrap(),
                at: 5,
            },
        ];
        let bytes = encode(&events);
        assert_eq!(decode(&bytes).unwrap(), events);
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        let mut bad = bytes.clone();
        bad[8] = 9;
        assert!(decode(&bad).is_err());
    }
}
