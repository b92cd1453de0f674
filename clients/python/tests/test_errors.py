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
