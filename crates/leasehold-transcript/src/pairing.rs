//! The single pass shared by diagnosis and repair: it walks the messages once,
//! groups calls into turns, and records where every result stands relative to
//! the turn of its call.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use super::TranscriptError;
use super::format::{CallRef, Format, Read, Role, Scan, Seen, read_message};
use super::text::Transcript;
use super::view::View;

/// Where a result stands relative to the reply its call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// In its turn's reply, where the provider accepts it.
    InPlace,
    /// Anthropic: in the right user message, but after a block that is not
    /// a `tool_result`.
    TextBefore,
    /// Anthropic: in a later user message, with only result-carrying user
    /// messages since the reply.
    Split,
    /// No call with this id had been seen yet. It is an orphan when no call
    /// ever appears, and misplaced (before its call) when one does.
    BeforeCall,
    /// After a later model turn started, at the given message.
    Late { turn_start: u32 },
    /// After a user message ended the reply, at the given message.
    AfterUser { user: u32 },
    /// After some other message ended the reply (a system or developer
    /// message), or in a message that cannot hold results.
    AfterOther { message: u32 },
}

impl Placement {
    /// How good a home this is for a result we keep; lower is better.
    pub(crate) fn rank(self) -> u8 {
        match self {
            Placement::InPlace => 0,
            Placement::TextBefore => 1,
            Placement::Split => 2,
            _ => 3,
        }
    }
}

/// One call, as found. Kept small (32 bytes): a check holds one per call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallSite<'a> {
    /// The call id results must quote.
    pub(crate) id: &'a str,
    /// Content block holding the call (Anthropic); read with
    /// [`CallSite::block`].
    block: Ix,
    /// Index into [`Pairing::entries`] for the call's id, so later stages
    /// never hash the id again.
    pub(crate) entry: u32,
    /// Message holding the call; read with [`CallSite::index`].
    at: u32,
    /// Index into [`Pairing::turns`].
    pub(crate) turn: u32,
}

impl CallSite<'_> {
    /// Message holding the call.
    pub(crate) fn index(&self) -> usize {
        self.at as usize
    }

    /// Content block holding the call (Anthropic).
    pub(crate) fn block(&self) -> Option<usize> {
        self.block.get()
    }
}

/// One result, as found. Kept small (40 bytes): a check holds one per
/// result.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResultSite<'a> {
    pub(crate) id: &'a str,
    /// Index into [`Pairing::entries`] for the result's id.
    pub(crate) entry: u32,
    /// Message holding the result; read with [`ResultSite::index`].
    at: u32,
    /// Content block holding the result (Anthropic); read with
    /// [`ResultSite::block`].
    block: Ix,
    pub(crate) placement: Placement,
    /// The next result with the same id, as an index into
    /// [`Pairing::results`]; a linked list keeps every copy without an
    /// allocation per id.
    pub(crate) next_same_id: Ix,
}

impl ResultSite<'_> {
    /// Message holding the result.
    pub(crate) fn index(&self) -> usize {
        self.at as usize
    }

    /// Content block holding the result (Anthropic).
    pub(crate) fn block(&self) -> Option<usize> {
        self.block.get()
    }
}

/// An optional index into one of the pairing's lists, in four bytes rather
/// than the sixteen of an `Option<usize>`: the pairing keeps several per
/// call, and its size per message is what a check's memory grows with.
/// Lists are far shorter than `u32::MAX` (a transcript that long would be
/// hundreds of gigabytes), but an index that does not fit is stored as none
/// rather than wrapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ix(u32);

impl Ix {
    pub(crate) const NONE: Ix = Ix(u32::MAX);

    pub(crate) fn new(index: usize) -> Ix {
        u32::try_from(index).map_or(Ix::NONE, Ix)
    }

    pub(crate) fn get(self) -> Option<usize> {
        (self != Ix::NONE).then_some(self.0 as usize)
    }
}

impl Default for Ix {
    fn default() -> Self {
        Ix::NONE
    }
}

/// Everything known about one call id.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IdEntry {
    /// How many calls use the id; more than one is a reused id.
    pub(crate) calls: u32,
    /// The first call with the id, as an index into [`Pairing::calls`].
    pub(crate) first_call: Ix,
    /// The latest call with the id; a result answers the latest call.
    pub(crate) last_call: Ix,
    /// How many results quote the id; counted, never overwritten.
    pub(crate) results: u32,
    /// Head of the linked list of results with the id.
    pub(crate) first_result: Ix,
    /// Tail of that list, for appending.
    pub(crate) last_result: Ix,
    /// True when at least one result sits in its reply.
    pub(crate) answered_in_place: bool,
}

/// The calls one model turn made, and what ended its reply. Message indices
/// are `u32` here and in [`Placement`], [`CallSite`] and [`ResultSite`]
/// where they are lists' indices, to keep the pairing small; see [`Ix`].
#[derive(Debug, Clone)]
pub(crate) struct Turn {
    /// Message holding the turn's first call.
    pub(crate) message: u32,
    /// Where the next model turn started, if one did.
    pub(crate) next_turn_start: Option<u32>,
    /// The first user or other input message after the reply.
    pub(crate) first_closer: Option<(u32, Role)>,
    /// The last message of the turn or its reply (Chat, Responses): repair
    /// puts moved results right after it.
    pub(crate) reply_end: u32,
}

/// A message or list index as stored in the pairing. Transcripts do not
/// reach four billion messages (they would be hundreds of gigabytes); an
/// index that did saturates rather than wraps.
pub(crate) fn small(index: usize) -> u32 {
    u32::try_from(index).unwrap_or(u32::MAX)
}

/// Which messages may still hold results for the current turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    /// No turn is waiting for results.
    Closed,
    /// Results messages directly after the turn (Chat, Responses).
    Open,
    /// Anthropic: the very next message must hold the results.
    NextMessage,
    /// Anthropic: the next message held results and only result-carrying
    /// user messages followed; results here are split across messages.
    SplitTail,
}

/// The outcome of the pass.
#[derive(Debug)]
pub(crate) struct Pairing<'a> {
    pub(crate) format: Format,
    /// Call id to its index in `entries`: the only place an id is hashed.
    ids: HashMap<&'a str, usize, IdHashState>,
    /// Everything known about each call id, in order of first sight.
    pub(crate) entries: Vec<IdEntry>,
    /// Every call, in message order.
    pub(crate) calls: Vec<CallSite<'a>>,
    /// Responses only (empty otherwise): each call's item type and item
    /// `id`, indexed like `calls`, which then need not carry two more
    /// strings for the formats that have neither.
    items: Vec<(Option<&'a str>, Option<&'a str>)>,
    /// Every result, in message order.
    pub(crate) results: Vec<ResultSite<'a>>,
    pub(crate) turns: Vec<Turn>,
    /// How many ids to make room for at the first one: three per four
    /// messages, what an Anthropic transcript of three parallel calls a
    /// turn holds (Chat's holds three per five, Responses' one per three),
    /// so the table is not rebuilt (briefly holding two copies) as it grows.
    /// Room that is never used is only address space; the hash table's
    /// size is a power of two, so at a million messages this is the same
    /// table as one id per two messages.
    expected_ids: usize,
}

/// The state of the walk between messages.
struct Walk {
    /// The latest turn that made calls.
    current_turn: Option<usize>,
    reply: Reply,
    /// Responses: the previous item was model output, so another model item
    /// continues the same turn rather than starting one.
    in_model_run: bool,
    /// Responses: the current run already has a turn for its calls.
    run_has_turn: bool,
}

/// Once the first tool activity is seen, keeps only the builder of its
/// format: with no format named, the pass succeeds only when exactly one
/// format shows tool activity, and then it is that one; a message showing
/// two formats at once keeps none (the transcript is ambiguous whatever
/// follows, and the pass goes on only to name every format it holds).
fn narrow(builders: &mut Vec<Builder<'_>>, narrowed: &mut bool, seen: Seen) {
    if *narrowed {
        return;
    }
    let found = seen.formats();
    if found.is_empty() {
        return;
    }
    *narrowed = true;
    builders.retain(|builder| found == [builder.pairing.format]);
}

/// One format's pairing while the pass is under way.
struct Builder<'a> {
    pairing: Pairing<'a>,
    walk: Walk,
    scan: Scan<'a>,
}

impl<'a> Builder<'a> {
    fn new(format: Format, messages: usize) -> Self {
        Builder {
            pairing: Pairing {
                format,
                ids: HashMap::with_hasher(IdHashState::new()),
                entries: Vec::new(),
                calls: Vec::new(),
                items: Vec::new(),
                results: Vec::new(),
                turns: Vec::new(),
                expected_ids: messages / 4 * 3,
            },
            walk: Walk {
                current_turn: None,
                reply: Reply::Closed,
                in_model_run: false,
                run_has_turn: false,
            },
            scan: Scan::default(),
        }
    }
}

impl<'a> Pairing<'a> {
    /// Walks the transcript once, pairing it in the named format, or, when
    /// `format` is `None`, detecting the format in the same pass: the three
    /// formats are paired alongside until the first message with tool
    /// activity, and from there only that message's format (see [`narrow`]).
    ///
    /// Parsed messages whose tree was never built are read through borrowed
    /// views of their text ([`View`]); the others from their tree.
    ///
    /// # Errors
    ///
    /// - [`TranscriptError::FormatNotDetected`] or
    ///   [`TranscriptError::FormatAmbiguous`] when `format` is `None` and
    ///   the messages do not show exactly one format.
    /// - [`TranscriptError::NotAnObject`] for the first message that is not
    ///   a JSON object.
    pub(crate) fn build(
        transcript: &'a Transcript,
        format: Option<Format>,
    ) -> Result<Pairing<'a>, TranscriptError> {
        let mut builders: Vec<Builder<'a>> = match format {
            Some(format) => vec![Builder::new(format, transcript.len())],
            None => Format::ALL
                .into_iter()
                .map(|format| Builder::new(format, transcript.len()))
                .collect(),
        };
        let mut seen = Seen::default();
        let mut narrowed = format.is_some();
        let mut non_object = None;
        let mut view = View::default();
        for (index, message) in transcript.raw_messages().iter().enumerate() {
            match read_message(transcript, message, &mut view) {
                Read::View => {
                    if format.is_none() {
                        seen.note_view(&view);
                        narrow(&mut builders, &mut narrowed, seen);
                    }
                    if non_object.is_none() {
                        for builder in &mut builders {
                            builder.pairing.format.scan_view(&view, &mut builder.scan);
                            builder
                                .pairing
                                .step(&mut builder.walk, index, &builder.scan);
                        }
                    }
                }
                Read::Tree(object) => {
                    if format.is_none() {
                        seen.note_tree(object);
                        narrow(&mut builders, &mut narrowed, seen);
                    }
                    if non_object.is_none() {
                        for builder in &mut builders {
                            builder.pairing.format.scan(object, &mut builder.scan);
                            builder
                                .pairing
                                .step(&mut builder.walk, index, &builder.scan);
                        }
                    }
                }
                Read::NotObject => {
                    non_object.get_or_insert(index);
                    if format.is_some() {
                        break;
                    }
                }
            }
        }
        let format = match format {
            Some(format) => format,
            None => seen.resolve()?,
        };
        if let Some(index) = non_object {
            return Err(TranscriptError::NotAnObject {
                index,
                line: transcript.line(index),
            });
        }
        builders
            .into_iter()
            .find(|builder| builder.pairing.format == format)
            .map(|builder| builder.pairing)
            .ok_or(TranscriptError::FormatNotDetected)
    }

    fn step(&mut self, walk: &mut Walk, index: usize, scan: &Scan<'a>) {
        let role = scan.role();
        if role == Role::Model {
            let starts_turn = match self.format {
                Format::OpenAiResponses => !walk.in_model_run,
                // Every assistant message is a turn, including one that makes
                // calls of its own.
                Format::OpenAiChat | Format::Anthropic => true,
            };
            if starts_turn {
                if let Some(turn) = walk.current_turn {
                    self.turns[turn].next_turn_start.get_or_insert(small(index));
                }
                walk.reply = Reply::Closed;
                walk.run_has_turn = false;
            }
            walk.in_model_run = true;
        } else if role != Role::Neutral {
            walk.in_model_run = false;
        }

        for result in &scan.results {
            let entry = match self.recent_call_entry(walk, result.id) {
                Some(entry) => entry,
                None => self.entry_for(result.id),
            };
            let placement = self.place(walk, index, role, result.after_other_block, entry);
            self.push_result(ResultSite {
                id: result.id,
                entry: small(entry),
                at: small(index),
                block: result.block.map_or(Ix::NONE, Ix::new),
                placement,
                next_same_id: Ix::NONE,
            });
        }

        if role == Role::Model {
            for call in &scan.calls {
                if !walk.run_has_turn {
                    self.turns.push(Turn {
                        message: small(index),
                        next_turn_start: None,
                        first_closer: None,
                        reply_end: small(index),
                    });
                    walk.current_turn = Some(self.turns.len() - 1);
                    walk.run_has_turn = true;
                    walk.reply = match self.format {
                        Format::Anthropic => Reply::NextMessage,
                        Format::OpenAiChat | Format::OpenAiResponses => Reply::Open,
                    };
                }
                let turn = self.turns.len() - 1;
                let entry = self.entry_for(call.id);
                if self.format == Format::OpenAiResponses {
                    self.items.push((call.item_type, call.item_id));
                }
                self.push_call(CallSite {
                    id: call.id,
                    block: call.block.map_or(Ix::NONE, Ix::new),
                    entry: small(entry),
                    at: small(index),
                    turn: small(turn),
                });
            }
            if let (true, Some(turn)) = (walk.run_has_turn, self.turns.last_mut()) {
                turn.reply_end = small(index);
            }
            return;
        }

        let Some(turn) = walk.current_turn else {
            return;
        };
        let keeps_reply = match (self.format, walk.reply) {
            (_, Reply::Closed) => false,
            (Format::Anthropic, _) => role == Role::User && !scan.results.is_empty(),
            (_, _) => matches!(role, Role::Result | Role::Neutral),
        };
        if keeps_reply {
            if self.format == Format::Anthropic {
                walk.reply = Reply::SplitTail;
            } else if role == Role::Result {
                self.turns[turn].reply_end = small(index);
            }
        } else if matches!(role, Role::User | Role::Other) {
            walk.reply = Reply::Closed;
            self.turns[turn]
                .first_closer
                .get_or_insert((small(index), role));
        }
    }

    /// Decides where a result at `index` stands, given the walk so far.
    fn place(
        &self,
        walk: &Walk,
        index: usize,
        role: Role,
        after_other_block: bool,
        entry: usize,
    ) -> Placement {
        let Some(call) = self.entries[entry].last_call.get() else {
            return Placement::BeforeCall;
        };
        let turn = self.calls[call].turn as usize;
        if walk.current_turn == Some(turn) {
            match walk.reply {
                Reply::Open => return Placement::InPlace,
                Reply::NextMessage if role == Role::User && after_other_block => {
                    return Placement::TextBefore;
                }
                Reply::NextMessage if role == Role::User => return Placement::InPlace,
                Reply::SplitTail if role == Role::User => return Placement::Split,
                _ => {}
            }
        }
        let turn = &self.turns[turn];
        if let Some(turn_start) = turn.next_turn_start {
            return Placement::Late { turn_start };
        }
        match turn.first_closer {
            Some((user, Role::User)) => Placement::AfterUser { user },
            Some((message, _)) => Placement::AfterOther { message },
            None => Placement::AfterOther {
                message: small(index),
            },
        }
    }

    fn push_call(&mut self, site: CallSite<'a>) {
        let position = self.calls.len();
        let entry = &mut self.entries[site.entry as usize];
        entry.calls += 1;
        if entry.first_call.get().is_none() {
            entry.first_call = Ix::new(position);
        }
        entry.last_call = Ix::new(position);
        self.calls.push(site);
    }

    fn push_result(&mut self, site: ResultSite<'a>) {
        let position = self.results.len();
        let entry = &mut self.entries[site.entry as usize];
        entry.results += 1;
        entry.answered_in_place |= site.placement == Placement::InPlace;
        let tail = std::mem::replace(&mut entry.last_result, Ix::new(position));
        if entry.first_result.get().is_none() {
            entry.first_result = Ix::new(position);
        }
        if let Some(tail) = tail.get() {
            self.results[tail].next_same_id = Ix::new(position);
        }
        self.results.push(site);
    }

    /// The entry for `id` when one of the current turn's last few calls
    /// uses it: where a result usually finds its call, read without hashing
    /// the id or touching the (large, randomly accessed) id table. The same
    /// entry [`Pairing::entry_for`] would return, as an entry is per id.
    fn recent_call_entry(&self, walk: &Walk, id: &str) -> Option<usize> {
        /// Calls looked at; a turn with more falls back to the table.
        const RECENT: usize = 8;
        let turn = small(walk.current_turn?);
        self.calls
            .iter()
            .rev()
            .take(RECENT)
            .take_while(|call| call.turn == turn)
            .find(|call| call.id == id)
            .map(|call| call.entry as usize)
    }

    /// The index of the entry for `id`, created on first sight.
    fn entry_for(&mut self, id: &'a str) -> usize {
        let next = self.entries.len();
        if next == 0 {
            // Room up front also keeps the site lists from being copied as
            // they grow; room never used is only address space.
            self.ids.reserve(self.expected_ids);
            self.entries.reserve(self.expected_ids);
            self.calls.reserve(self.expected_ids);
            self.results.reserve(self.expected_ids);
        }
        let entry = *self.ids.entry(id).or_insert(next);
        if entry == next {
            self.entries.push(IdEntry::default());
        }
        entry
    }

    /// The call at `position` in [`Pairing::calls`], as the scan found it.
    pub(crate) fn call_ref(&self, position: usize) -> CallRef<'a> {
        let site = &self.calls[position];
        let (item_type, item_id) = self.items.get(position).copied().unwrap_or_default();
        CallRef {
            id: site.id,
            block: site.block(),
            item_type,
            item_id,
        }
    }

    /// Every result quoting the id of `entry`, in message order.
    pub(crate) fn results_of(&self, entry: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(self.entries[entry].first_result.get(), |&at| {
            self.results[at].next_same_id.get()
        })
    }
}

/// Hashes call ids for [`Pairing::ids`]. The standard SipHash was about a
/// tenth of a check's time; ids are short, so this folds eight bytes at a
/// time with a multiply, from a seed drawn per pass (from the standard
/// library's random keys) so ids cannot be chosen to collide in advance.
#[derive(Debug, Clone, Copy)]
struct IdHashState {
    seed: u64,
}

impl IdHashState {
    fn new() -> Self {
        IdHashState {
            seed: std::collections::hash_map::RandomState::new().hash_one(0u64) | 1,
        }
    }
}

impl BuildHasher for IdHashState {
    type Hasher = IdHasher;

    fn build_hasher(&self) -> IdHasher {
        IdHasher { hash: self.seed }
    }
}

/// See [`IdHashState`].
#[derive(Debug, Clone, Copy)]
struct IdHasher {
    hash: u64,
}

impl IdHasher {
    const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

    /// Mixes one word in: a full 64 × 64 → 128-bit multiply, folded.
    fn mix(&mut self, word: u64) {
        let product = u128::from(self.hash ^ word) * u128::from(Self::MULTIPLIER);
        self.hash = (product as u64) ^ ((product >> 64) as u64);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        // The length keeps "ab" and "ab\0" apart.
        self.mix(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 59));
    }

    fn write_u8(&mut self, byte: u8) {
        self.mix(u64::from(byte));
    }

    fn finish(&self) -> u64 {
        // One more round, so the top bits (which hashbrown uses for its
        // control bytes) depend on every input bit.
        let product = u128::from(self.hash) * u128::from(Self::MULTIPLIER);
        (product as u64) ^ ((product >> 64) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a check holds per call and per result stays small: a check's
    /// memory grows with these (see `docs/benchmarks.md`).
    #[test]
    fn sites_stay_small() {
        assert!(size_of::<CallSite<'_>>() <= 32);
        assert!(size_of::<ResultSite<'_>>() <= 40);
        assert!(size_of::<IdEntry>() <= 28);
    }
}
