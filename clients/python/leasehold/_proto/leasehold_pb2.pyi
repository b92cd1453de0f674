from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TermEnd(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TERM_END_UNSPECIFIED: _ClassVar[TermEnd]
    RELEASED: _ClassVar[TermEnd]
    SUSPENDED: _ClassVar[TermEnd]
    EXPIRED: _ClassVar[TermEnd]

class ListFilter(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIST_FILTER_UNSPECIFIED: _ClassVar[ListFilter]
    LIVE: _ClassVar[ListFilter]
    RECOVERABLE: _ClassVar[ListFilter]
    ALL: _ClassVar[ListFilter]
    QUARANTINED: _ClassVar[ListFilter]

class ToolCallState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_CALL_STATE_UNSPECIFIED: _ClassVar[ToolCallState]
    RUNNING: _ClassVar[ToolCallState]
    SUCCEEDED: _ClassVar[ToolCallState]
    FAILED: _ClassVar[ToolCallState]
    UNKNOWN: _ClassVar[ToolCallState]
TERM_END_UNSPECIFIED: TermEnd
RELEASED: TermEnd
SUSPENDED: TermEnd
EXPIRED: TermEnd
LIST_FILTER_UNSPECIFIED: ListFilter
LIVE: ListFilter
RECOVERABLE: ListFilter
ALL: ListFilter
QUARANTINED: ListFilter
TOOL_CALL_STATE_UNSPECIFIED: ToolCallState
RUNNING: ToolCallState
SUCCEEDED: ToolCallState
FAILED: ToolCallState
UNKNOWN: ToolCallState

class ServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerInfoResponse(_message.Message):
    __slots__ = ("version", "protocol", "backend")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    version: str
    protocol: int
    backend: str
    def __init__(self, version: _Optional[str] = ..., protocol: _Optional[int] = ..., backend: _Optional[str] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("renew", "check", "acquire", "release", "begin_tool_calls", "settle_tool_call", "id")
    RENEW_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    BEGIN_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    SETTLE_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    renew: RenewRequest
    check: CheckRequest
    acquire: AcquireRequest
    release: ReleaseRequest
    begin_tool_calls: BeginToolCallsRequest
    settle_tool_call: SettleToolCallRequest
    id: int
    def __init__(self, renew: _Optional[_Union[RenewRequest, _Mapping]] = ..., check: _Optional[_Union[CheckRequest, _Mapping]] = ..., acquire: _Optional[_Union[AcquireRequest, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequest, _Mapping]] = ..., begin_tool_calls: _Optional[_Union[BeginToolCallsRequest, _Mapping]] = ..., settle_tool_call: _Optional[_Union[SettleToolCallRequest, _Mapping]] = ..., id: _Optional[int] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("code", "message", "reason", "lease", "previous", "replayed", "unsettled_tool_calls", "ended", "id", "details", "begin_tool_calls", "settle_tool_call")
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    UNSETTLED_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    BEGIN_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    SETTLE_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    reason: str
    lease: Lease
    previous: EndedTerm
    replayed: bool
    unsettled_tool_calls: int
    ended: EndedTerm
    id: int
    details: _containers.ScalarMap[str, bytes]
    begin_tool_calls: BeginToolCallsResponse
    settle_tool_call: SettleToolCallResponse
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., previous: _Optional[_Union[EndedTerm, _Mapping]] = ..., replayed: _Optional[bool] = ..., unsettled_tool_calls: _Optional[int] = ..., ended: _Optional[_Union[EndedTerm, _Mapping]] = ..., id: _Optional[int] = ..., details: _Optional[_Mapping[str, bytes]] = ..., begin_tool_calls: _Optional[_Union[BeginToolCallsResponse, _Mapping]] = ..., settle_tool_call: _Optional[_Union[SettleToolCallResponse, _Mapping]] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("key", "fence", "owner", "lease_id", "ttl_ms", "acquired_at_ms", "expires_at_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    key: str
    fence: int
    owner: str
    lease_id: str
    ttl_ms: int
    acquired_at_ms: int
    expires_at_ms: int
    def __init__(self, key: _Optional[str] = ..., fence: _Optional[int] = ..., owner: _Optional[str] = ..., lease_id: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., acquired_at_ms: _Optional[int] = ..., expires_at_ms: _Optional[int] = ...) -> None: ...

class EndedTerm(_message.Message):
    __slots__ = ("fence", "owner", "end", "ended_at_ms", "handed_off")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    HANDED_OFF_FIELD_NUMBER: _ClassVar[int]
    fence: int
    owner: str
    end: TermEnd
    ended_at_ms: int
    handed_off: bool
    def __init__(self, fence: _Optional[int] = ..., owner: _Optional[str] = ..., end: _Optional[_Union[TermEnd, str]] = ..., ended_at_ms: _Optional[int] = ..., handed_off: _Optional[bool] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("key", "owner", "ttl_ms", "wait_ms", "request_id", "lock_delay_ms", "max_recoveries", "force")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_RECOVERIES_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    key: str
    owner: str
    ttl_ms: int
    wait_ms: int
    request_id: str
    lock_delay_ms: int
    max_recoveries: int
    force: bool
    def __init__(self, key: _Optional[str] = ..., owner: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., wait_ms: _Optional[int] = ..., request_id: _Optional[str] = ..., lock_delay_ms: _Optional[int] = ..., max_recoveries: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("lease", "previous", "replayed", "unsettled_tool_calls")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    UNSETTLED_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    previous: EndedTerm
    replayed: bool
    unsettled_tool_calls: int
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., previous: _Optional[_Union[EndedTerm, _Mapping]] = ..., replayed: _Optional[bool] = ..., unsettled_tool_calls: _Optional[int] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("key", "fence", "lease_id", "ttl_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    key: str
    fence: int
    lease_id: str
    ttl_ms: int
    def __init__(self, key: _Optional[str] = ..., fence: _Optional[int] = ..., lease_id: _Optional[str] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("key", "fence", "lease_id", "suspend", "successor", "handoff_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_FIELD_NUMBER: _ClassVar[int]
    SUCCESSOR_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_MS_FIELD_NUMBER: _ClassVar[int]
    key: str
    fence: int
    lease_id: str
    suspend: bool
    successor: str
    handoff_ms: int
    def __init__(self, key: _Optional[str] = ..., fence: _Optional[int] = ..., lease_id: _Optional[str] = ..., suspend: _Optional[bool] = ..., successor: _Optional[str] = ..., handoff_ms: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("ended",)
    ENDED_FIELD_NUMBER: _ClassVar[int]
    ended: EndedTerm
    def __init__(self, ended: _Optional[_Union[EndedTerm, _Mapping]] = ...) -> None: ...

class CheckRequest(_message.Message):
    __slots__ = ("key", "fence")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    key: str
    fence: int
    def __init__(self, key: _Optional[str] = ..., fence: _Optional[int] = ...) -> None: ...

class CheckResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("lease", "last_ended", "recoverable", "quarantined", "reservation")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    LAST_ENDED_FIELD_NUMBER: _ClassVar[int]
    RECOVERABLE_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    last_ended: EndedTerm
    recoverable: bool
    quarantined: bool
    reservation: Reservation
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., last_ended: _Optional[_Union[EndedTerm, _Mapping]] = ..., recoverable: _Optional[bool] = ..., quarantined: _Optional[bool] = ..., reservation: _Optional[_Union[Reservation, _Mapping]] = ...) -> None: ...

class Reservation(_message.Message):
    __slots__ = ("kind", "after_fence", "successor", "until_ms")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Reservation.Kind]
        LOCK_DELAY: _ClassVar[Reservation.Kind]
        HANDOFF: _ClassVar[Reservation.Kind]
    KIND_UNSPECIFIED: Reservation.Kind
    LOCK_DELAY: Reservation.Kind
    HANDOFF: Reservation.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    AFTER_FENCE_FIELD_NUMBER: _ClassVar[int]
    SUCCESSOR_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    kind: Reservation.Kind
    after_fence: int
    successor: str
    until_ms: int
    def __init__(self, kind: _Optional[_Union[Reservation.Kind, str]] = ..., after_fence: _Optional[int] = ..., successor: _Optional[str] = ..., until_ms: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("prefix", "filter", "page_size", "page_token")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    filter: ListFilter
    page_size: int
    page_token: str
    def __init__(self, prefix: _Optional[str] = ..., filter: _Optional[_Union[ListFilter, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class KeyState(_message.Message):
    __slots__ = ("key", "lease", "last_ended", "recoverable", "quarantined", "reservation")
    KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    LAST_ENDED_FIELD_NUMBER: _ClassVar[int]
    RECOVERABLE_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    key: str
    lease: Lease
    last_ended: EndedTerm
    recoverable: bool
    quarantined: bool
    reservation: Reservation
    def __init__(self, key: _Optional[str] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., last_ended: _Optional[_Union[EndedTerm, _Mapping]] = ..., recoverable: _Optional[bool] = ..., quarantined: _Optional[bool] = ..., reservation: _Optional[_Union[Reservation, _Mapping]] = ...) -> None: ...

class HistoryRequest(_message.Message):
    __slots__ = ("key", "page_size", "page_token")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    key: str
    page_size: int
    page_token: str
    def __init__(self, key: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class HistoryEntry(_message.Message):
    __slots__ = ("fence", "owner", "acquired_at_ms", "ended_at_ms", "end", "unsettled_tool_calls", "handed_off")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    UNSETTLED_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    HANDED_OFF_FIELD_NUMBER: _ClassVar[int]
    fence: int
    owner: str
    acquired_at_ms: int
    ended_at_ms: int
    end: TermEnd
    unsettled_tool_calls: int
    handed_off: bool
    def __init__(self, fence: _Optional[int] = ..., owner: _Optional[str] = ..., acquired_at_ms: _Optional[int] = ..., ended_at_ms: _Optional[int] = ..., end: _Optional[_Union[TermEnd, str]] = ..., unsettled_tool_calls: _Optional[int] = ..., handed_off: _Optional[bool] = ...) -> None: ...

class HistoryResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[HistoryEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[HistoryEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("key", "prefix", "start_revision")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    START_REVISION_FIELD_NUMBER: _ClassVar[int]
    key: str
    prefix: str
    start_revision: int
    def __init__(self, key: _Optional[str] = ..., prefix: _Optional[str] = ..., start_revision: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("revision", "key", "kind", "fence", "owner", "at_ms")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Event.Kind]
        GRANTED: _ClassVar[Event.Kind]
        RELEASED: _ClassVar[Event.Kind]
        SUSPENDED: _ClassVar[Event.Kind]
        EXPIRED: _ClassVar[Event.Kind]
        FORGOTTEN: _ClassVar[Event.Kind]
    KIND_UNSPECIFIED: Event.Kind
    GRANTED: Event.Kind
    RELEASED: Event.Kind
    SUSPENDED: Event.Kind
    EXPIRED: Event.Kind
    FORGOTTEN: Event.Kind
    REVISION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    key: str
    kind: Event.Kind
    fence: int
    owner: str
    at_ms: int
    def __init__(self, revision: _Optional[int] = ..., key: _Optional[str] = ..., kind: _Optional[_Union[Event.Kind, str]] = ..., fence: _Optional[int] = ..., owner: _Optional[str] = ..., at_ms: _Optional[int] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ("events", "revision")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    revision: int
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class UnquarantineRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class UnquarantineResponse(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: KeyState
    def __init__(self, key: _Optional[_Union[KeyState, _Mapping]] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("keys", "next_page_token")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[KeyState]
    next_page_token: str
    def __init__(self, keys: _Optional[_Iterable[_Union[KeyState, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("key", "call_id", "name", "input_digest", "fence", "state", "settled_fence", "result_digest", "result", "begun_at_ms", "settled_at_ms", "ordinal", "idempotency_key", "turn")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FENCE_FIELD_NUMBER: _ClassVar[int]
    RESULT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    BEGUN_AT_MS_FIELD_NUMBER: _ClassVar[int]
    SETTLED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ORDINAL_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    key: str
    call_id: str
    name: str
    input_digest: str
    fence: int
    state: ToolCallState
    settled_fence: int
    result_digest: str
    result: bytes
    begun_at_ms: int
    settled_at_ms: int
    ordinal: int
    idempotency_key: str
    turn: str
    def __init__(self, key: _Optional[str] = ..., call_id: _Optional[str] = ..., name: _Optional[str] = ..., input_digest: _Optional[str] = ..., fence: _Optional[int] = ..., state: _Optional[_Union[ToolCallState, str]] = ..., settled_fence: _Optional[int] = ..., result_digest: _Optional[str] = ..., result: _Optional[bytes] = ..., begun_at_ms: _Optional[int] = ..., settled_at_ms: _Optional[int] = ..., ordinal: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., turn: _Optional[str] = ...) -> None: ...

class ToolCallSpec(_message.Message):
    __slots__ = ("call_id", "name", "input_digest")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    input_digest: str
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., input_digest: _Optional[str] = ...) -> None: ...

class BeginToolCallRequest(_message.Message):
    __slots__ = ("key", "fence", "lease_id", "call_id", "name", "input_digest", "turn", "across_turns")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    ACROSS_TURNS_FIELD_NUMBER: _ClassVar[int]
    key: str
    fence: int
    lease_id: str
    call_id: str
    name: str
    input_digest: str
    turn: str
    across_turns: bool
    def __init__(self, key: _Optional[str] = ..., fence: _Optional[int] = ..., lease_id: _Optional[str] = ..., call_id: _Optional[str] = ..., name: _Optional[str] = ..., input_digest: _Optional[str] = ..., turn: _Optional[str] = ..., across_turns: _Optional[bool] = ...) -> None: ...

class BeginToolCallResponse(_message.Message):
    __slots__ = ("call", "duplicate")
    CALL_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    call: ToolCall
    duplicate: bool
    def __init__(self, call: _Optional[_Union[ToolCall, _Mapping]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class BeginToolCallsRequest(_message.Message):
    __slots__ = ("key", "fence", "lease_id", "calls", "turn", "across_turns")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    ACROSS_TURNS_FIELD_NUMBER: _ClassVar[int]
    key: str
    fence: int
    lease_id: str
    calls: _containers.RepeatedCompositeFieldContainer[ToolCallSpec]
    turn: str
    across_turns: bool
    def __init__(self, key: _Optional[str] = ..., fence: _Optional[int] = ..., lease_id: _Optional[str] = ..., calls: _Optional[_Iterable[_Union[ToolCallSpec, _Mapping]]] = ..., turn: _Optional[str] = ..., across_turns: _Optional[bool] = ...) -> None: ...

class BeginToolCallsResponse(_message.Message):
    __slots__ = ("calls", "duplicate", "duplicate_call_ids")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_CALL_IDS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    duplicate: bool
    duplicate_call_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., duplicate: _Optional[bool] = ..., duplicate_call_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SettleToolCallRequest(_message.Message):
    __slots__ = ("key", "fence", "lease_id", "call_id", "outcome", "result_digest", "result", "turn")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RESULT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    key: str
    fence: int
    lease_id: str
    call_id: str
    outcome: ToolCallState
    result_digest: str
    result: bytes
    turn: str
    def __init__(self, key: _Optional[str] = ..., fence: _Optional[int] = ..., lease_id: _Optional[str] = ..., call_id: _Optional[str] = ..., outcome: _Optional[_Union[ToolCallState, str]] = ..., result_digest: _Optional[str] = ..., result: _Optional[bytes] = ..., turn: _Optional[str] = ...) -> None: ...

class SettleToolCallResponse(_message.Message):
    __slots__ = ("call", "already_settled")
    CALL_FIELD_NUMBER: _ClassVar[int]
    ALREADY_SETTLED_FIELD_NUMBER: _ClassVar[int]
    call: ToolCall
    already_settled: bool
    def __init__(self, call: _Optional[_Union[ToolCall, _Mapping]] = ..., already_settled: _Optional[bool] = ...) -> None: ...

class ListToolCallsRequest(_message.Message):
    __slots__ = ("key", "filter")
    class Filter(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        FILTER_UNSPECIFIED: _ClassVar[ListToolCallsRequest.Filter]
        UNSETTLED: _ClassVar[ListToolCallsRequest.Filter]
        ALL: _ClassVar[ListToolCallsRequest.Filter]
    FILTER_UNSPECIFIED: ListToolCallsRequest.Filter
    UNSETTLED: ListToolCallsRequest.Filter
    ALL: ListToolCallsRequest.Filter
    KEY_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    key: str
    filter: ListToolCallsRequest.Filter
    def __init__(self, key: _Optional[str] = ..., filter: _Optional[_Union[ListToolCallsRequest.Filter, str]] = ...) -> None: ...

class ListToolCallsResponse(_message.Message):
    __slots__ = ("calls",)
    CALLS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ...) -> None: ...

class TranscriptCheckRequest(_message.Message):
    __slots__ = ("transcript", "format")
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    transcript: str
    format: str
    def __init__(self, transcript: _Optional[str] = ..., format: _Optional[str] = ...) -> None: ...

class TranscriptFinding(_message.Message):
    __slots__ = ("kind", "call_id", "index", "line", "detail", "provider_error")
    KIND_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_ERROR_FIELD_NUMBER: _ClassVar[int]
    kind: str
    call_id: str
    index: int
    line: int
    detail: str
    provider_error: str
    def __init__(self, kind: _Optional[str] = ..., call_id: _Optional[str] = ..., index: _Optional[int] = ..., line: _Optional[int] = ..., detail: _Optional[str] = ..., provider_error: _Optional[str] = ...) -> None: ...

class TranscriptCheckResponse(_message.Message):
    __slots__ = ("healthy", "format", "messages", "findings", "report_json")
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    healthy: bool
    format: str
    messages: int
    findings: _containers.RepeatedCompositeFieldContainer[TranscriptFinding]
    report_json: str
    def __init__(self, healthy: _Optional[bool] = ..., format: _Optional[str] = ..., messages: _Optional[int] = ..., findings: _Optional[_Iterable[_Union[TranscriptFinding, _Mapping]]] = ..., report_json: _Optional[str] = ...) -> None: ...

class TranscriptRepairRequest(_message.Message):
    __slots__ = ("transcript", "format", "placeholder_markers")
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    PLACEHOLDER_MARKERS_FIELD_NUMBER: _ClassVar[int]
    transcript: str
    format: str
    placeholder_markers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, transcript: _Optional[str] = ..., format: _Optional[str] = ..., placeholder_markers: _Optional[_Iterable[str]] = ...) -> None: ...

class TranscriptRepairResponse(_message.Message):
    __slots__ = ("transcript", "healthy", "actions_json", "unrecoverable")
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    UNRECOVERABLE_FIELD_NUMBER: _ClassVar[int]
    transcript: str
    healthy: bool
    actions_json: str
    unrecoverable: _containers.RepeatedCompositeFieldContainer[TranscriptFinding]
    def __init__(self, transcript: _Optional[str] = ..., healthy: _Optional[bool] = ..., actions_json: _Optional[str] = ..., unrecoverable: _Optional[_Iterable[_Union[TranscriptFinding, _Mapping]]] = ...) -> None: ...
