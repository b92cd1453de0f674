"""Plain values the client hands out, and their conversion from protobuf."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from ._proto import leasehold_pb2 as pb

TermEndName = Literal["released", "suspended", "expired"]
ToolCallStateName = Literal["running", "succeeded", "failed", "unknown"]
Outcome = Literal["succeeded", "failed", "unknown"]

_TERM_ENDS: dict[int, TermEndName] = {
    pb.RELEASED: "released",
    pb.SUSPENDED: "suspended",
    pb.EXPIRED: "expired",
}
_STATES: dict[int, ToolCallStateName] = {
    pb.RUNNING: "running",
    pb.SUCCEEDED: "succeeded",
    pb.FAILED: "failed",
    pb.UNKNOWN: "unknown",
}
OUTCOMES: dict[str, int] = {
    "succeeded": pb.SUCCEEDED,
    "failed": pb.FAILED,
    "unknown": pb.UNKNOWN,
}


@dataclass(frozen=True)
class EndedTerm:
    """How a term of a key ended."""

    fence: int
    owner: str
    #: ``"released"`` (work finished), ``"suspended"`` (released unfinished)
    #: or ``"expired"`` (its TTL ran out); the last two leave work to recover.
    end: TermEndName
    #: Server wall-clock milliseconds since the Unix epoch.
    ended_at: int
    #: In a lease's ``previous``: that term's holder handed the key to this
    #: lease's owner (``hand_off``), rather than it being taken in a race.
    handed_off: bool = False

    @staticmethod
    def from_pb(ended: pb.EndedTerm) -> EndedTerm:
        # The server sends nothing else; reading an unknown end as "expired"
        # errs towards treating the key as recoverable, as the Rust client does.
        return EndedTerm(
            fence=ended.fence,
            owner=ended.owner,
            end=_TERM_ENDS.get(ended.end, "expired"),
            ended_at=ended.ended_at_ms,
            handed_off=ended.handed_off,
        )


ReservationKind = Literal["lock_delay", "handoff"]
ListFilterName = Literal["all", "live", "recoverable", "quarantined"]
EventKind = Literal["granted", "released", "suspended", "expired", "forgotten"]

LIST_FILTERS: dict[str, int] = {
    "all": pb.ALL,
    "live": pb.LIVE,
    "recoverable": pb.RECOVERABLE,
    "quarantined": pb.QUARANTINED,
}
_EVENT_KINDS: dict[int, EventKind] = {
    pb.Event.GRANTED: "granted",
    pb.Event.RELEASED: "released",
    pb.Event.SUSPENDED: "suspended",
    pb.Event.EXPIRED: "expired",
    pb.Event.FORGOTTEN: "forgotten",
}


@dataclass(frozen=True)
class Reservation:
    """Who alone may take a free key, and until when."""

    #: ``"lock_delay"`` (after an expiry: nobody) or ``"handoff"`` (only
    #: ``successor``).
    kind: ReservationKind
    #: The term whose end made the reservation.
    after_fence: int
    #: For a handoff: the owner the key is kept for.
    successor: str
    #: Server wall-clock milliseconds since the Unix epoch.
    until_ms: int

    @staticmethod
    def from_pb(r: pb.Reservation) -> Reservation:
        kind: ReservationKind = "handoff" if r.kind == pb.Reservation.HANDOFF else "lock_delay"
        return Reservation(
            kind=kind, after_fence=r.after_fence, successor=r.successor, until_ms=r.until_ms
        )


@dataclass(frozen=True)
class LiveTerm:
    """A key's live term as ``get``/``list_keys`` show it (never its lease id)."""

    fence: int
    owner: str
    ttl_ms: int
    acquired_at_ms: int
    expires_at_ms: int


@dataclass(frozen=True)
class KeyState:
    """What the server knows about a key (``get``, ``list_keys``, ``unquarantine``)."""

    key: str
    #: The live term, if the key is held.
    lease: LiveTerm | None
    #: The last ended term, if any.
    last_ended: EndedTerm | None
    #: No live term, the last one expired or was suspended, not quarantined.
    recoverable: bool
    #: Acquires are refused (``Quarantined``) until ``unquarantine``.
    quarantined: bool
    #: Set while the key is free but reserved (lock-delay or handoff).
    reservation: Reservation | None

    @staticmethod
    def from_pb(
        key: str,
        lease: pb.Lease | None,
        last_ended: pb.EndedTerm | None,
        recoverable: bool,
        quarantined: bool,
        reservation: pb.Reservation | None,
    ) -> KeyState:
        return KeyState(
            key=key,
            lease=None
            if lease is None
            else LiveTerm(
                fence=lease.fence,
                owner=lease.owner,
                ttl_ms=lease.ttl_ms,
                acquired_at_ms=lease.acquired_at_ms,
                expires_at_ms=lease.expires_at_ms,
            ),
            last_ended=None if last_ended is None else EndedTerm.from_pb(last_ended),
            recoverable=recoverable,
            quarantined=quarantined,
            reservation=None if reservation is None else Reservation.from_pb(reservation),
        )

    @staticmethod
    def from_key_state(s: pb.KeyState) -> KeyState:
        return KeyState.from_pb(
            s.key,
            s.lease if s.HasField("lease") else None,
            s.last_ended if s.HasField("last_ended") else None,
            s.recoverable,
            s.quarantined,
            s.reservation if s.HasField("reservation") else None,
        )


#: The revision of ``leasehold.v1`` this client speaks (the server's
#: ``ServerInfo.protocol`` must be at least this).
PROTOCOL = 1


@dataclass(frozen=True)
class ServerInfo:
    """What ``server_info()`` tells of the server."""

    #: Its release, as ``leasehold --version`` prints it.
    version: str
    #: The revision of ``leasehold.v1`` it speaks.
    protocol: int
    #: Its storage backend: ``"sqlite"`` or ``"postgres"``.
    backend: str

    @property
    def compatible(self) -> bool:
        """Whether this client can speak to it: it speaks at least the
        revision this client was built for (:data:`PROTOCOL`)."""
        return self.protocol >= PROTOCOL


@dataclass(frozen=True)
class KeyPage:
    """One page of ``list_keys``."""

    keys: list[KeyState]
    #: Pass as ``page_token`` for the next page; empty at the end.
    next_page_token: str


@dataclass(frozen=True)
class HistoryEntry:
    """One ended term of a key."""

    fence: int
    owner: str
    acquired_at_ms: int
    ended_at_ms: int
    end: TermEndName
    #: Tool calls still running when the term ended.
    unsettled_tool_calls: int
    #: The term was granted to the successor its predecessor named.
    handed_off: bool

    @staticmethod
    def from_pb(h: pb.HistoryEntry) -> HistoryEntry:
        return HistoryEntry(
            fence=h.fence,
            owner=h.owner,
            acquired_at_ms=h.acquired_at_ms,
            ended_at_ms=h.ended_at_ms,
            end=_TERM_ENDS.get(h.end, "expired"),
            unsettled_tool_calls=h.unsettled_tool_calls,
            handed_off=h.handed_off,
        )


@dataclass(frozen=True)
class HistoryPage:
    """One page of ``history``, newest first."""

    entries: list[HistoryEntry]
    #: Pass as ``before`` for older entries; None at the end.
    next_before: int | None

    @staticmethod
    def from_pb(reply: pb.HistoryResponse) -> HistoryPage:
        token = reply.next_page_token
        return HistoryPage(
            entries=[HistoryEntry.from_pb(e) for e in reply.entries],
            next_before=int(token) if token.isdigit() else None,
        )


@dataclass(frozen=True)
class WatchEvent:
    """One change of a key's ownership, as a watch reports it."""

    #: Server-wide, rising in commit order; resume from ``revision + 1``.
    revision: int
    key: str
    kind: EventKind
    #: The new holder's fence (granted), or the ended term's.
    fence: int
    owner: str
    #: Server wall-clock milliseconds (for expired: when the TTL ran out).
    at_ms: int

    @staticmethod
    def from_pb(e: pb.Event) -> WatchEvent:
        return WatchEvent(
            revision=e.revision,
            key=e.key,
            kind=_EVENT_KINDS.get(e.kind, "expired"),
            fence=e.fence,
            owner=e.owner,
            at_ms=e.at_ms,
        )


@dataclass(frozen=True)
class ToolCallRequest:
    """One tool call of a turn, as the model provider asked for it."""

    call_id: str
    name: str
    #: Optional digest of the call's input, stored with the call for audits.
    input_digest: str = ""


@dataclass(frozen=True)
class ToolCallRecord:
    """One entry of a key's tool-call ledger, as the server stores it."""

    key: str
    call_id: str
    name: str
    input_digest: str
    #: The fence of the term that began the call.
    fence: int
    state: ToolCallStateName
    #: The fence of the term that settled it (0 while running).
    settled_fence: int
    result_digest: str
    result: bytes
    begun_at_ms: int
    settled_at_ms: int
    #: Registration order within the key.
    ordinal: int
    #: Stable id for downstream deduplication (UUIDv5 of key + NUL + call id;
    #: with a turn, of key + NUL + turn + NUL + call id).
    idempotency_key: str
    #: The turn the call was begun in ("" when none was named).
    turn: str = ""

    @staticmethod
    def from_pb(call: pb.ToolCall) -> ToolCallRecord:
        return ToolCallRecord(
            key=call.key,
            call_id=call.call_id,
            name=call.name,
            input_digest=call.input_digest,
            fence=call.fence,
            state=_STATES.get(call.state, "running"),
            settled_fence=call.settled_fence,
            result_digest=call.result_digest,
            result=call.result,
            begun_at_ms=call.begun_at_ms,
            settled_at_ms=call.settled_at_ms,
            ordinal=call.ordinal,
            idempotency_key=call.idempotency_key,
            turn=call.turn,
        )


@dataclass(frozen=True)
class BeginResult:
    """The answer to registering a turn's calls (all new, or none recorded)."""

    #: All new: the new records in request order. Otherwise the existing
    #: record of each duplicate id, in request order.
    calls: list[ToolCallRecord]
    #: True when any id was already recorded (or repeated); nothing was recorded.
    duplicate: bool
    duplicate_call_ids: list[str]


@dataclass(frozen=True)
class ToolInvocation:
    """What a tool runner is given to run one call."""

    call: ToolCallRequest
    #: The fence the call was registered under; pass it to fenced storage.
    fence: int
    #: Stable across retries and duplicates: give it to downstream services
    #: that deduplicate. It includes the turn, so an id reused in a new turn
    #: gets a new key.
    idempotency_key: str
    #: The turn the call was registered in ("" when none was named).
    turn: str = ""


@dataclass(frozen=True)
class ToolOutcome:
    """What a runner may return to choose the outcome itself (returning
    ``bytes`` or ``str`` means succeeded with that result)."""

    outcome: Outcome
    result: bytes = b""


@dataclass(frozen=True)
class ToolResult:
    """One call's result, in the provider's call order."""

    call_id: str
    #: ``"succeeded"``, ``"failed"``, ``"unknown"``, or ``"running"`` when an
    #: earlier turn or term began the call and never settled it (its outcome
    #: is still owed; the runner was not run).
    state: ToolCallStateName
    result: bytes
    #: True when the outcome came from the ledger (a duplicate call id), so
    #: the runner did not run for this entry.
    reused: bool


@dataclass(frozen=True)
class TranscriptFinding:
    """One problem a provider would reject (or mishandle) in a transcript."""

    #: missing, duplicate_result, orphan, misplaced, duplicate_call_id,
    #: text_before_tool_result, results_split_across_messages
    kind: str
    call_id: str
    #: 0-based message index.
    index: int
    #: 1-based line for JSON-lines input, else 0.
    line: int
    detail: str
    #: The provider error this would cause.
    provider_error: str

    @staticmethod
    def from_pb(finding: pb.TranscriptFinding) -> TranscriptFinding:
        return TranscriptFinding(
            kind=finding.kind,
            call_id=finding.call_id,
            index=finding.index,
            line=finding.line,
            detail=finding.detail,
            provider_error=finding.provider_error,
        )


@dataclass(frozen=True)
class TranscriptReport:
    """What ``check_transcript`` found."""

    healthy: bool
    #: The format checked against; empty when there is no tool activity.
    format: str
    messages: int
    findings: list[TranscriptFinding]
    #: The same report as ``leasehold transcript check --json``, parsed.
    report: Any = field(repr=False)

    @staticmethod
    def from_pb(reply: pb.TranscriptCheckResponse) -> TranscriptReport:
        return TranscriptReport(
            healthy=reply.healthy,
            format=reply.format,
            messages=reply.messages,
            findings=[TranscriptFinding.from_pb(f) for f in reply.findings],
            report=json.loads(reply.report_json) if reply.report_json else None,
        )


@dataclass(frozen=True)
class TranscriptRepair:
    """What ``repair_transcript`` did."""

    #: The repaired messages (a list, whichever layout the input had).
    messages: list[Any]
    #: The repaired transcript as text, in the input's layout.
    transcript: str
    #: True when the repaired transcript is healthy.
    healthy: bool
    #: Every action taken (moved, dropped, inserted).
    actions: list[Any]
    #: What repair could not fix, left for a person (indices into the output).
    unrecoverable: list[TranscriptFinding]

    @staticmethod
    def from_pb(reply: pb.TranscriptRepairResponse) -> TranscriptRepair:
        return TranscriptRepair(
            messages=parse_transcript(reply.transcript),
            transcript=reply.transcript,
            healthy=reply.healthy,
            actions=json.loads(reply.actions_json) if reply.actions_json else [],
            unrecoverable=[TranscriptFinding.from_pb(f) for f in reply.unrecoverable],
        )


def transcript_text(messages: str | bytes | list[Any]) -> str:
    """The transcript as the server reads it: JSON text (an array or JSON lines)."""
    if isinstance(messages, bytes):
        return messages.decode("utf-8")
    if isinstance(messages, str):
        return messages
    return json.dumps(messages)


def parse_transcript(text: str) -> list[Any]:
    """Messages from a JSON array or JSON lines."""
    stripped = text.strip()
    if not stripped:
        return []
    if stripped.startswith("["):
        parsed = json.loads(stripped)
        return list(parsed) if isinstance(parsed, list) else [parsed]
    return [json.loads(line) for line in stripped.splitlines() if line.strip()]
