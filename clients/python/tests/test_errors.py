"""The one table from refusals to exceptions, without a server."""

from __future__ import annotations

import pytest

import leasehold
from leasehold._errors import from_refusal


def test_a_busy_refusal_keeps_holder_fence_and_remaining() -> None:
    """ABORTED with its details becomes Busy with typed fields."""
    err = from_refusal(
        10,
        'key "s" is held by owner "graph-ä"',
        {
            "leasehold-key-bin": b"s",
            "leasehold-holder-bin": "graph-ä".encode(),
            "leasehold-fence": b"7",
            "leasehold-remaining-ms": b"1234",
        },
    )
    assert isinstance(err, leasehold.Busy)
    assert (err.key, err.holder, err.fence, err.remaining) == ("s", "graph-ä", 7, 1.234)


@pytest.mark.parametrize(
    ("reason", "extra", "superseded_by", "at_ms"),
    [
        ("expired", {"leasehold-at-ms": b"99"}, 0, 99),
        ("superseded", {"leasehold-superseded-by": b"9"}, 9, 0),
        ("released", {"leasehold-at-ms": b"5"}, 0, 5),
    ],
)
def test_a_stale_fence_becomes_lease_lost_with_its_reason(
    reason: str, extra: dict[str, bytes], superseded_by: int, at_ms: int
) -> None:
    """FAILED_PRECONDITION carries why the fence is stale."""
    details = {"leasehold-fence": b"3", "leasehold-reason": reason.encode(), **extra}
    err = from_refusal(9, "stale", details)
    assert isinstance(err, leasehold.LeaseLost)
    assert (err.fence, err.reason, err.superseded_by, err.at_ms) == (
        3,
        reason,
        superseded_by,
        at_ms,
    )
    assert err.final


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (3, leasehold.InvalidArgument),
        (7, leasehold.PermissionDenied),
        (5, leasehold.NotFound),
        (14, leasehold.Unavailable),
        (4, leasehold.Unavailable),
    ],
)
def test_codes_map_to_the_hierarchy(code: int, kind: type[leasehold.Error]) -> None:
    """Each status code has its exception, all under leasehold.Error."""
    err = from_refusal(code, "msg", {})
    assert type(err) is kind
    assert isinstance(err, leasehold.Error)


def test_a_limit_refusal_names_its_limit() -> None:
    """RESOURCE_EXHAUSTED is ResourceExhausted, with the limit's name."""
    err = from_refusal(
        8, "limit keys_per_principal reached", {"leasehold-limit": b"keys_per_principal"}
    )
    assert type(err) is leasehold.ResourceExhausted
    assert (err.code, err.limit) == ("RESOURCE_EXHAUSTED", "keys_per_principal")


def test_an_unknown_code_is_a_plain_error() -> None:
    """INTERNAL (storage failed) is the base Error with its code."""
    err = from_refusal(13, "storage error: disk", {})
    assert type(err) is leasehold.Error and err.code == "INTERNAL"


def test_errors_survive_pickling_between_processes() -> None:
    """Errors cross multiprocessing queues with their fields intact."""
    import pickle

    from leasehold.fence import StaleFence

    busy = pickle.loads(pickle.dumps(leasehold.Busy("held", holder="a", fence=3, remaining=1.5)))
    assert (busy.holder, busy.fence, busy.remaining) == ("a", 3, 1.5)
    stale = pickle.loads(pickle.dumps(StaleFence("k", 1, 2)))
    assert (stale.key, stale.fence, stale.highest) == ("k", 1, 2)
    lost = pickle.loads(pickle.dumps(leasehold.LeaseLost("gone", reason="expired", fence=4)))
    assert (lost.reason, lost.fence, lost.final) == ("expired", 4, True)


def test_a_lock_delay_refusal_is_reserved_not_a_holderless_busy() -> None:
    """ABORTED reason lock_delay becomes Reserved (still a Busy) with the
    expired term's fence and the time left."""
    err = from_refusal(
        10,
        'key "s" is in its lock-delay',
        {
            "leasehold-key-bin": b"s",
            "leasehold-reason": b"lock_delay",
            "leasehold-fence": b"4",
            "leasehold-remaining-ms": b"250",
        },
    )
    assert isinstance(err, leasehold.Reserved) and isinstance(err, leasehold.Busy)
    assert (err.reason, err.fence, err.remaining, err.successor, err.key) == (
        "lock_delay",
        4,
        0.25,
        "",
        "s",
    )


def test_a_handoff_refusal_is_reserved_for_the_successor() -> None:
    """ABORTED reason handoff names the successor (a -bin value)."""
    err = from_refusal(
        10,
        'key "s" is kept for "ui-ü"',
        {
            "leasehold-key-bin": b"s",
            "leasehold-reason": b"handoff",
            "leasehold-successor-bin": "ui-ü".encode(),
            "leasehold-remaining-ms": b"9",
        },
    )
    assert isinstance(err, leasehold.Reserved)
    assert (err.reason, err.successor, err.remaining) == ("handoff", "ui-ü", 0.009)


def test_a_quarantined_acquire_is_quarantined_not_lease_lost() -> None:
    """FAILED_PRECONDITION reason quarantined becomes Quarantined with the count."""
    err = from_refusal(
        9,
        "quarantined",
        {"leasehold-key-bin": b"q", "leasehold-reason": b"quarantined", "leasehold-failures": b"3"},
    )
    assert isinstance(err, leasehold.Quarantined)
    assert not isinstance(err, leasehold.LeaseLost)
    assert (err.key, err.failures, err.code) == ("q", 3, "FAILED_PRECONDITION")


def test_a_compacted_revision_is_compacted_and_an_oversized_message_is_not() -> None:
    """OUT_OF_RANGE with leasehold-oldest-revision is Compacted; without it
    (gRPC's own message-size refusal) it stays a plain Error."""
    err = from_refusal(11, "revision 3 is compacted", {"leasehold-oldest-revision": b"40"})
    assert isinstance(err, leasehold.Compacted)
    assert err.oldest_revision == 40
    other = from_refusal(11, "message too large", {})
    assert type(other) is leasehold.Error


def test_unimplemented_is_unsupported() -> None:
    """UNIMPLEMENTED (a backend without the feature) is Unsupported."""
    err = from_refusal(12, "unsupported: handoff on the postgres backend", {})
    assert isinstance(err, leasehold.Unsupported)
    assert err.message == "handoff on the postgres backend"
