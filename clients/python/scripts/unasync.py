#!/usr/bin/env python3
"""Writes leasehold/_sync.py from leasehold/_async.py, as httpcore's unasync does.

    python scripts/unasync.py          # rewrite leasehold/_sync.py
    python scripts/unasync.py --check  # fail if it is out of date

``_async.py`` is the one source of both clients. Each line goes through
``SUBS`` (``async def`` -> ``def``, ``await`` dropped, ``AsyncLease`` ->
``Lease``, asyncio's sleep and event -> time's and threading's, ...), and
three markers say where the flavours part:

- a line ending in ``# async-only`` is left out of ``_sync.py``;
- so is every line from ``# unasync: async-only`` to ``# unasync: end``;
- a ``# | <text>`` comment is the sync client's alone: ``<text>`` at the
  comment's indentation (``# |`` alone: an empty line).

The machinery that cannot be written once (the Session stream, unary calls,
the keep-alive, the watch, fork handling) lives by the same names in
``_async_rt.py`` and ``_sync_rt.py``, written by hand. The result is sorted
(ruff's isort rules) and formatted with ruff, so it reads as written by hand
and passes the same checks. A substitution that no longer matches anything
is an error, so the list stays what the source needs.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "leasehold"
SOURCE = PACKAGE / "_async.py"
TARGET = PACKAGE / "_sync.py"
HEADER = "# Generated from _async.py by scripts/unasync.py; do not edit.\n"

#: (pattern, replacement), applied in order to every line the sync client keeps.
SUBS = [
    (r"\bfrom \._async_rt import\b", "from ._sync_rt import"),
    (r"\bAsync([A-Z][A-Za-z0-9_]*)", r"\1"),  # AsyncClient, AsyncLease, AsyncRunner, ...
    (r"\basync def\b", "def"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\basyncio\.Event\b", "threading.Event"),
    (r"\bgrpc\.aio\.(insecure|secure)_channel\b", r"grpc.\1_channel"),
    (r"\bAwaitable\[T\]", "T"),
    (r"\bself\.channel\.close\(None\)", "self.channel.close()"),  # grace: None
    # acquire() returns the lease itself, not an awaitable context manager.
    (r"-> _Acquire:", "-> Lease:"),
    (r"\breturn _Acquire\($", "return ("),
    (r"\blambda: self\._acquire\(", "self._acquire("),
]
COMPILED = [(re.compile(pattern), repl) for pattern, repl in SUBS]

ASYNC_ONLY_LINE = re.compile(r"\s+# async-only$")
BLOCK_START = "# unasync: async-only"
BLOCK_END = "# unasync: end"
SYNC_ONLY = re.compile(r"^(\s*)# \|(?: (.*))?$")


def unasync(text: str, used: set[int]) -> str:
    out: list[str] = []
    in_block = False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped == BLOCK_START:
            if in_block:
                raise SystemExit(f"{SOURCE.name}:{number}: {BLOCK_START} inside another")
            in_block = True
            continue
        if stripped == BLOCK_END:
            if not in_block:
                raise SystemExit(f"{SOURCE.name}:{number}: {BLOCK_END} without a start")
            in_block = False
            continue
        if in_block or ASYNC_ONLY_LINE.search(line):
            continue
        sync_only = SYNC_ONLY.match(line)
        if sync_only:
            body = sync_only.group(2)
            out.append(sync_only.group(1) + body if body else "")
            continue
        for index, (pattern, repl) in enumerate(COMPILED):
            line, count = pattern.subn(repl, line)
            if count:
                used.add(index)
        out.append(line)
    if in_block:
        raise SystemExit(f"{SOURCE.name}: {BLOCK_START} never ended")
    return "\n".join(out) + "\n"


def ruff(args: list[str], text: str) -> str:
    """Runs ruff (the venv's, as test.sh does) over ``text`` as if it were _sync.py."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(TARGET), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=HERE.parent,
    )
    if done.returncode != 0:
        raise SystemExit(f"ruff {' '.join(args)} failed on the generated code:\n{done.stderr}")
    return done.stdout


def generate() -> str:
    used: set[int] = set()
    text = HEADER + unasync(SOURCE.read_text(), used)
    unused = [SUBS[i][0] for i in range(len(SUBS)) if i not in used]
    if unused:
        raise SystemExit(f"substitutions that match nothing in {SOURCE.name}: {unused}")
    text = ruff(["check", "--quiet", "--fix-only", "--select", "I"], text)
    return ruff(["format", "--quiet"], text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if _sync.py is out of date")
    args = parser.parse_args()
    text = generate()
    if args.check:
        current = TARGET.read_text() if TARGET.exists() else ""
        if current != text:
            diff = difflib.unified_diff(
                current.splitlines(), text.splitlines(), str(TARGET), "generated", lineterm=""
            )
            print("\n".join(list(diff)[:40]), file=sys.stderr)
            print(
                f"{TARGET.name} is out of date with {SOURCE.name}; run python scripts/unasync.py",
                file=sys.stderr,
            )
            return 1
        print(f"{TARGET.name} is up to date with {SOURCE.name}")
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(HERE.parent)} from {SOURCE.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
