//! The integer each enumerated value is stored as, by every backend: one
//! table. [`stored!`](macro@crate::stored) gives a code as an integer literal, so
//! that SQL built with `concat!` names it (`concat!("ended_end = ",
//! stored!(TermEnd::Expired))`) rather than writing `3`; [`Stored`] reads and
//! writes the same codes in Rust. A code, once written, is in users'
//! databases: changing one is a migration.

use crate::events::EventKind;
use crate::lease::{Reservation, TermEnd};
use crate::ledger::CallState;

/// The stored code of a value, as an integer literal (usable in `concat!`).
#[macro_export]
macro_rules! stored {
    (TermEnd::Released) => {
        1
    };
    (TermEnd::Suspended) => {
        2
    };
    (TermEnd::Expired) => {
        3
    };
    (CallState::Running) => {
        1
    };
    (CallState::Succeeded) => {
        2
    };
    (CallState::Failed) => {
        3
    };
    (CallState::Unknown) => {
        4
    };
    (ReservationKind::LockDelay) => {
        1
    };
    (ReservationKind::Handoff) => {
        2
    };
    // An event of a term's end is that end's code + 1 (the PostgreSQL
    // statements derive one from the other; a test below holds them to it).
    (EventKind::Granted) => {
        1
    };
    (EventKind::Released) => {
        2
    };
    (EventKind::Suspended) => {
        3
    };
    (EventKind::Expired) => {
        4
    };
    (EventKind::Forgotten) => {
        5
    };
}

/// A value stored as a small integer (see [`stored!`](macro@crate::stored)).
pub trait Stored: Copy + Eq + 'static {
    /// Every value, for decoding.
    const ALL: &'static [Self];
    /// What the value is stored as.
    fn code(self) -> i16;
    /// The value stored as `code`, or `None` for a code this build does not
    /// know (a fault of the store: callers report it, never guess).
    fn from_code(code: i64) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|v| i64::from(v.code()) == code)
    }
}

impl Stored for TermEnd {
    const ALL: &'static [Self] = &[TermEnd::Released, TermEnd::Suspended, TermEnd::Expired];
    fn code(self) -> i16 {
        match self {
            TermEnd::Released => stored!(TermEnd::Released),
            TermEnd::Suspended => stored!(TermEnd::Suspended),
            TermEnd::Expired => stored!(TermEnd::Expired),
        }
    }
}

impl Stored for CallState {
    const ALL: &'static [Self] = &[
        CallState::Running,
        CallState::Succeeded,
        CallState::Failed,
        CallState::Unknown,
    ];
    fn code(self) -> i16 {
        match self {
            CallState::Running => stored!(CallState::Running),
            CallState::Succeeded => stored!(CallState::Succeeded),
            CallState::Failed => stored!(CallState::Failed),
            CallState::Unknown => stored!(CallState::Unknown),
        }
    }
}

impl Stored for EventKind {
    const ALL: &'static [Self] = &[
        EventKind::Granted,
        EventKind::Released,
        EventKind::Suspended,
        EventKind::Expired,
        EventKind::Forgotten,
    ];
    fn code(self) -> i16 {
        match self {
            EventKind::Granted => stored!(EventKind::Granted),
            EventKind::Released => stored!(EventKind::Released),
            EventKind::Suspended => stored!(EventKind::Suspended),
            EventKind::Expired => stored!(EventKind::Expired),
            EventKind::Forgotten => stored!(EventKind::Forgotten),
        }
    }
}

/// Which kind of [`Reservation`] a key holds (its data lives in columns of
/// its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservationKind {
    LockDelay,
    Handoff,
}

impl Reservation {
    pub fn kind(&self) -> ReservationKind {
        match self {
            Reservation::LockDelay { .. } => ReservationKind::LockDelay,
            Reservation::Handoff { .. } => ReservationKind::Handoff,
        }
    }
}

impl Stored for ReservationKind {
    const ALL: &'static [Self] = &[ReservationKind::LockDelay, ReservationKind::Handoff];
    fn code(self) -> i16 {
        match self {
            ReservationKind::LockDelay => stored!(ReservationKind::LockDelay),
            ReservationKind::Handoff => stored!(ReservationKind::Handoff),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T: Stored + std::fmt::Debug>() {
        let mut codes: Vec<i16> = T::ALL.iter().map(|v| v.code()).collect();
        for v in T::ALL {
            assert_eq!(T::from_code(i64::from(v.code())), Some(*v));
        }
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), T::ALL.len(), "two values share a code");
        assert_eq!(T::from_code(0), None);
        assert_eq!(T::from_code(99), None);
    }

    #[test]
    fn every_code_is_distinct_and_reads_back() {
        round_trips::<TermEnd>();
        round_trips::<CallState>();
        round_trips::<EventKind>();
        round_trips::<ReservationKind>();
    }

    #[test]
    fn an_end_s_event_is_its_code_plus_one() {
        for end in TermEnd::ALL {
            assert_eq!(EventKind::of_end(*end).code(), end.code() + 1);
        }
    }

    #[test]
    fn the_macro_is_a_literal_for_sql() {
        assert_eq!(
            concat!("ended_end = ", stored!(TermEnd::Expired)),
            "ended_end = 3"
        );
    }
}
