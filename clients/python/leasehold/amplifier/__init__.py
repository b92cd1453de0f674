"""One owner per Amplifier session (``pip install 'leasehold[amplifier]'``).

An Amplifier hook module on ``amplifier-core``; adoption is one entry in the
mount plan (the module id is ``hooks-leasehold``, its package
``amplifier_module_hooks_leasehold``, found through the
``amplifier.modules`` entry point)::

    hooks:
      - module: hooks-leasehold
        config:
          address: 127.0.0.1:7420      # or $LEASEHOLD_ADDRESS

What it does, from the session's first use (its first prompt, model
request or context write) until ``session:end``:

- **Owns the session.** It takes the lease ``amplifier:<session_id>`` and
  keeps it renewed. While another process holds it, ``prompt:submit`` and
  ``provider:request`` are denied with a reason that says so (the
  orchestrator answers ``Operation denied: leasehold: ...`` before it writes
  the prompt or calls a model) and the context refuses writes with
  ``leasehold.Busy``; ``wait`` seconds of queueing first, if configured.
  Each model request is gated (``lease.gate()``, a round trip); a lease lost
  mid-run denies every later request, tool call and write, for good.
- **Fences the context manager's writes.** The mounted context is wrapped:
  ``add_message``, ``set_messages`` and ``clear`` run only while the lease
  holds (``gate()`` before each; a context that fences in its own storage
  with the ``leasehold.session`` capability says so with
  ``leasehold_fenced_writes = True`` and gets the local check only).
- **Repairs before the first turn.** Right after it takes the lease, it runs
  the server's transcript repair over the context's messages (a takeover
  after ``kill -9`` finds the lost owner's tool call with no result): calls
  without a result get an explicit unknown-outcome result, misplaced
  results move into place, duplicates go. It re-reads and checks what the
  context then holds; a transcript that is still malformed denies the turn
  instead of reaching the provider.
- **Ends the term.** ``session:end`` releases the lease, or suspends it
  (recoverable) when the last turn never completed.

See ``docs/amplifier.md``, which also lists what the hook API cannot reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from amplifier_core import HookResult

from .._async import AsyncClient, AsyncLease
from .._errors import Busy, Error, LeaseLost
from .._ownership import NotOwned
from .._types import TranscriptRepair

__all__ = [
    "CAPABILITY",
    "NotOwned",
    "OwnedContext",
    "SessionOwner",
    "Settings",
    "TranscriptUnrepairable",
    "mount",
]

#: The coordinator capability under which the :class:`SessionOwner` is
#: registered, for modules that fence their own storage with its fence.
CAPABILITY = "leasehold.session"

#: Ahead of every usual hook (the contract suggests 10 to 90, lower runs
#: first): ownership is settled before another hook injects or approves.
_PRIORITY = -100


class TranscriptUnrepairable(Error):
    """The session's transcript is still malformed after the repair (the
    repair could not fix it, or the context did not take the repaired
    messages): the turn is refused rather than sent to the provider."""


@dataclass(frozen=True)
class Settings:
    """The module's ``config`` in the mount plan."""

    #: leasehold server(s): ``host:port``, a URL, or several (a list or
    #: comma-separated) on one PostgreSQL database. Default: $LEASEHOLD_ADDRESS.
    address: str | list[str]
    #: Lease TTL in seconds; renewed about every third of it.
    ttl: float = 30.0
    #: Seconds to queue for a session another process holds, then refuse.
    wait: float = 0.0
    #: The holder's name in busy errors (default ``host:pid``).
    owner: str | None = None
    #: Bearer token for a server run with ``--auth`` (or $LEASEHOLD_TOKEN).
    token: str | None = None
    #: The lease key is this prefix and the session id.
    key_prefix: str = "amplifier:"
    #: The transcript format of the context's messages.
    transcript_format: str = "openai-chat"

    @staticmethod
    def from_config(config: Mapping[str, Any] | None) -> Settings:
        """Reads the mount plan's ``config``. Raises ``ValueError`` saying
        what is missing or wrong."""
        config = dict(config or {})
        address = config.pop("address", None) or os.environ.get("LEASEHOLD_ADDRESS")
        if not address:
            raise ValueError(
                "hooks-leasehold needs the leasehold server's address: set config.address "
                "in the mount plan or $LEASEHOLD_ADDRESS"
            )
        token = config.pop("token", None) or os.environ.get("LEASEHOLD_TOKEN")
        known = {"ttl", "wait", "owner", "key_prefix", "transcript_format"}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"hooks-leasehold: unknown config key(s): {', '.join(unknown)}")
        try:
            return Settings(
                address=address,
                ttl=float(config.get("ttl", 30.0)),
                wait=float(config.get("wait", 0.0)),
                owner=config.get("owner"),
                token=token,
                key_prefix=str(config.get("key_prefix", "amplifier:")),
                transcript_format=str(config.get("transcript_format", "openai-chat")),
            )
        except (TypeError, ValueError) as err:
            raise ValueError(f"hooks-leasehold: bad config: {err}") from err


class SessionOwner:
    """The lease one process holds on one Amplifier session: taken on the
    session's first use, held until ``session:end``, never taken again once
    lost (the process's view of the session may be stale by then)."""

    def __init__(
        self,
        client: AsyncClient,
        settings: Settings,
        session_id: str,
        context: Any,
    ) -> None:
        self.client = client
        self.settings = settings
        #: ``amplifier:<session_id>``.
        self.key = f"{settings.key_prefix}{session_id}"
        #: The session's own context manager (unwrapped), read by the repair.
        self.context = context
        #: The lease, once taken; kept after a loss so the loss is final.
        self.lease: AsyncLease | None = None
        #: What the pre-turn repair changed when the lease was taken (None:
        #: nothing needed changing).
        self.repair: TranscriptRepair | None = None
        #: A turn began and has not completed: the term ends suspended.
        self.turn_open = False
        # Two callers (a prompt and a parallel write) must not both acquire,
        # and neither may go on before the repair is done.
        self._taking = asyncio.Lock()
        self._ready = False

    @property
    def fence(self) -> int:
        """The live lease's fence, for a store that compares it in its own
        transaction. Raises ``NotOwned`` before the lease is taken and
        ``LeaseLost`` after it is lost (a local check, no round trip)."""
        lease = self._held()
        return lease.fence

    def _held(self) -> AsyncLease:
        if self.lease is None:
            raise NotOwned(f"session {self.key!r} is not owned by this process yet")
        loss = self.lease.loss()
        if loss is not None:
            raise loss
        return self.lease

    async def own(self) -> AsyncLease:
        """The lease, taken now if this process has none yet (then the
        pre-turn repair runs). Raises ``Busy`` while another process holds
        the session, ``LeaseLost`` once this process lost it, and
        ``TranscriptUnrepairable``."""
        if self._ready:
            return self._held()
        async with self._taking:
            if self._ready:
                return self._held()
            lease = await self.client.acquire(
                self.key, ttl=self.settings.ttl, wait=self.settings.wait, owner=self.settings.owner
            )
            # Set before the repair: a context fencing its storage reads the
            # fence for the repaired messages' write.
            self.lease = lease
            try:
                await self._repair()
            except BaseException:
                # No turn ran on this term: hand the session back as
                # unfinished, so a person (or a later run) can look at it.
                self.lease = None
                with contextlib.suppress(Error):
                    await lease.suspend()
                raise
            self._ready = True
            return lease

    async def _repair(self) -> None:
        """The pre-turn repair: the transcript the next request will be built
        from must pair every tool call with its result."""
        messages = list(await self.context.get_messages())
        if not messages:
            return
        fmt = self.settings.transcript_format
        repair = await self.client.repair_transcript(messages, format=fmt)
        if repair.actions:
            await self.context.set_messages(repair.messages)
            self.repair = repair
            # A context may ignore set_messages (context-persistent does on
            # resume): what counts is what it holds now.
            report = await self.client.check_transcript(
                list(await self.context.get_messages()), format=fmt
            )
            healthy = report.healthy
        else:
            healthy = repair.healthy
        if not healthy:
            raise TranscriptUnrepairable(
                f"the transcript of session {self.key!r} still breaks tool-call pairing after "
                "the repair; refusing to send it to a provider",
                key=self.key,
            )

    async def gate(self) -> None:
        """Before a model request: own the session, and check with the
        server that the term is still the live one."""
        lease = await self.own()
        await lease.gate()

    async def before_write(self, fenced_in_storage: bool) -> None:
        """Before a context write: own the session; ``gate()`` unless the
        context compares the fence in its own storage."""
        lease = await self.own()
        if not fenced_in_storage:
            await lease.gate()

    async def end(self) -> None:
        """Ends the term: released, or suspended when a turn is still open."""
        lease, self.lease, self._ready = self.lease, None, False
        if lease is None:
            return
        loss = lease.loss()
        if loss is not None and loss.final:
            return  # the server ended this term already
        # Unreachable or already over: then it expires at its TTL.
        with contextlib.suppress(Error):
            if self.turn_open:
                await lease.suspend()
            else:
                await lease.release()

    def reason(self, err: Error) -> str:
        """What a refused caller is told."""
        if isinstance(err, Busy):
            holder = f" ({err.holder}, fence {err.fence})" if err.holder else ""
            return (
                f"leasehold: session {self.key!r} is being run by another process{holder}; "
                "nothing was written or sent. Try again when its run ends."
            )
        if isinstance(err, LeaseLost):
            return (
                f"leasehold: this process no longer owns session {self.key!r} ({err.reason}): "
                "another process may have taken it over. Nothing more is written or sent from "
                "here; load the session again to continue."
            )
        return f"leasehold: {err}"


def _deny(reason: str) -> Any:
    return HookResult(action="deny", reason=reason, user_message=reason, user_message_level="error")


class OwnedContext:
    """The session's context manager, its writes refused unless this
    process owns the session. Reads pass through, and so does anything else
    the context offers (``__getattr__``)."""

    def __init__(self, inner: Any, owner: SessionOwner) -> None:
        self.inner = inner
        self.owner = owner
        #: Whether the inner context compares the fence in its own storage.
        self.fenced_in_storage = bool(getattr(inner, "leasehold_fenced_writes", False))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def add_message(self, message: dict[str, Any]) -> None:
        await self.owner.before_write(self.fenced_in_storage)
        await self.inner.add_message(message)

    async def set_messages(self, messages: list[dict[str, Any]]) -> None:
        await self.owner.before_write(self.fenced_in_storage)
        await self.inner.set_messages(messages)

    async def clear(self) -> None:
        await self.owner.before_write(self.fenced_in_storage)
        await self.inner.clear()

    async def get_messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = await self.inner.get_messages()
        return messages

    async def get_messages_for_request(
        self, token_budget: int | None = None, provider: Any | None = None
    ) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = await self.inner.get_messages_for_request(
            token_budget=token_budget, provider=provider
        )
        return messages


class _Hooks:
    """The module's event handlers."""

    def __init__(self, owner: SessionOwner) -> None:
        self.owner = owner

    async def prompt_submit(self, event: str, data: dict[str, Any]) -> Any:
        # The first refusal point: the orchestrator has not written the
        # prompt yet, so a refused process leaves the session untouched.
        try:
            await self.owner.own()
        except Error as err:
            return _deny(self.owner.reason(err))
        self.owner.turn_open = True
        return HookResult(action="continue")

    async def provider_request(self, event: str, data: dict[str, Any]) -> Any:
        try:
            await self.owner.gate()
        except Error as err:
            return _deny(self.owner.reason(err))
        self.owner.turn_open = True
        return HookResult(action="continue")

    async def tool_pre(self, event: str, data: dict[str, Any]) -> Any:
        # Local check only: a tool of a lost owner does not start.
        try:
            self.owner._held()
        except Error as err:
            return _deny(self.owner.reason(err))
        return HookResult(action="continue")

    async def orchestrator_complete(self, event: str, data: dict[str, Any]) -> Any:
        self.owner.turn_open = False
        return HookResult(action="continue")

    async def session_end(self, event: str, data: dict[str, Any]) -> Any:
        try:
            await self.owner.end()
        finally:
            await self.owner.client.close()
        return HookResult(action="continue")


class _Refusing:
    """Denies every prompt and model request with one reason: a module that
    cannot work fails closed (a raising mount would be skipped by the kernel
    with a warning, leaving the session unowned)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def __call__(self, event: str, data: dict[str, Any]) -> Any:
        return _deny(self.reason)


async def mount(coordinator: Any, config: dict[str, Any] | None = None) -> Callable[[], None]:
    """The Amplifier module's entry point: wraps the mounted context,
    registers the hooks and the ``leasehold.session`` capability. Returns
    the cleanup that unregisters them."""
    hooks = coordinator.hooks
    try:
        settings = Settings.from_config(config)
    except ValueError as err:
        refuse = _Refusing(f"leasehold: {err}")
        off = [
            hooks.register(event, refuse, priority=_PRIORITY, name="hooks-leasehold")
            for event in ("prompt:submit", "provider:request")
        ]

        def unregister_refusal() -> None:
            for unregister in off:
                unregister()

        return unregister_refusal

    context = coordinator.get("context")
    client = AsyncClient(settings.address, owner=settings.owner, token=settings.token)
    owner = SessionOwner(client, settings, coordinator.session_id, context)
    await coordinator.mount("context", OwnedContext(context, owner))
    coordinator.register_capability(CAPABILITY, owner)
    handlers = _Hooks(owner)
    off = [
        hooks.register(event, handler, priority=_PRIORITY, name="hooks-leasehold")
        for event, handler in (
            ("prompt:submit", handlers.prompt_submit),
            ("provider:request", handlers.provider_request),
            ("tool:pre", handlers.tool_pre),
            ("orchestrator:complete", handlers.orchestrator_complete),
            ("session:end", handlers.session_end),
        )
    ]

    def cleanup() -> None:
        for unregister in off:
            unregister()

    return cleanup
