//! The two timers of the lease table: term deadlines and retention checks.
//!
//! Both hold at most one entry per key, so the timer's work follows the
//! number of keys, never their history: a key handed over a million times
//! costs what a fresh key does.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use crate::clock::Millis;
use crate::lease::Key;

#[derive(Debug, Default)]
pub(super) struct Timers {
    /// Term deadlines, earliest first: at most one entry per key, at the
    /// deadline its `KeyState::deadline_entry` records. A renewal leaves the
    /// entry where it is (renewals are hot); the timer re-files an entry it
    /// pops early. A grant moves the entry only to an earlier deadline.
    deadlines: BTreeSet<(Millis, Key)>,
    /// When to look at cleanly released keys again, to prune their settled
    /// calls and forget them, earliest first; at most one entry per key
    /// (`KeyState::prune_scheduled`).
    prunes: BinaryHeap<Reverse<(Millis, Key)>>,
    /// Set when the earliest deadline moved earlier, so a sleeping timer
    /// must re-arm.
    earliest_changed: bool,
}

impl Timers {
    pub fn new() -> Self {
        Timers {
            earliest_changed: true,
            ..Timers::default()
        }
    }

    /// Makes `key`'s one deadline entry due no later than `at`. `entry` is
    /// the key's record of where its entry sits.
    pub fn file_deadline(&mut self, key: &Key, at: Millis, entry: &mut Option<Millis>) {
        match *entry {
            // An earlier (or equal) entry stays: when it comes due early, the
            // timer finds the term still live and re-files it.
            Some(filed) if filed <= at => {}
            filed => {
                if let Some(filed) = filed {
                    self.deadlines.remove(&(filed, key.clone()));
                }
                self.note_earliest(at);
                self.deadlines.insert((at, key.clone()));
                *entry = Some(at);
            }
        }
    }

    /// Removes `key`'s deadline entry filed at `at`.
    pub fn remove_deadline(&mut self, key: &Key, at: Millis) {
        self.deadlines.remove(&(at, key.clone()));
    }

    /// The earliest deadline entry if it is due at `now`, taken out.
    pub fn pop_due_deadline(&mut self, now: Millis) -> Option<Key> {
        match self.deadlines.first() {
            Some((at, _)) if *at <= now => self.deadlines.pop_first().map(|(_, key)| key),
            _ => None,
        }
    }

    /// The keys whose deadline entry is due at `now`, earliest first.
    pub fn due_deadlines(&self, now: Millis) -> impl Iterator<Item = &Key> {
        self.deadlines
            .iter()
            .take_while(move |(at, _)| *at <= now)
            .map(|(_, key)| key)
    }

    /// Whether a deadline entry is due at `now`.
    pub fn deadline_due(&self, now: Millis) -> bool {
        self.deadlines.first().is_some_and(|(at, _)| *at <= now)
    }

    /// Schedules a retention check of `key` at `at`.
    pub fn schedule_prune(&mut self, key: &Key, at: Millis) {
        self.note_earliest(at);
        self.prunes.push(Reverse((at, key.clone())));
    }

    /// The earliest retention check if it is due at `now`, taken out.
    pub fn pop_due_prune(&mut self, now: Millis) -> Option<Key> {
        match self.prunes.peek() {
            Some(Reverse((at, _))) if *at <= now => self.prunes.pop().map(|Reverse((_, key))| key),
            _ => None,
        }
    }

    /// The earliest instant the timer must wake for.
    pub fn next(&self) -> Option<Millis> {
        let expiry = self.deadlines.first().map(|(at, _)| *at);
        let prune = self.prunes.peek().map(|Reverse((at, _))| *at);
        match (expiry, prune) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the earliest instant moved earlier since the last call.
    pub fn take_earliest_changed(&mut self) -> bool {
        std::mem::take(&mut self.earliest_changed)
    }

    pub fn deadline_entries(&self) -> usize {
        self.deadlines.len()
    }

    pub fn prune_entries(&self) -> usize {
        self.prunes.len()
    }

    fn note_earliest(&mut self, at: Millis) {
        if self.next().is_none_or(|next| at < next) {
            self.earliest_changed = true;
        }
    }
}
