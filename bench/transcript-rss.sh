#!/usr/bin/env bash
# Peak RSS of a transcript check (and repair) on the issue-18 shape, with
# /usr/bin/time -v, one process per measurement. See docs/benchmarks.md.
#
#   bench/transcript-rss.sh                 # 1,000,000 messages per format
#   MESSAGES=200000 MODES="check-owned" bench/transcript-rss.sh
#
# Knobs: MESSAGES (default 1000000), FORMATS, MODES (of the transcript_check
# example: check, check-owned, repair, value), BIN (an already built
# transcript_check, e.g. one built from an older commit), KEEP=1 keeps the
# generated files. Finds the build where cargo puts it (CARGO_TARGET_DIR too).
set -euo pipefail

cd "$(dirname "$0")/.."
MESSAGES=${MESSAGES:-1000000}
FORMATS=${FORMATS:-"openai-chat anthropic openai-responses"}
MODES=${MODES:-"check check-owned repair value"}
if [[ -z "${BIN:-}" ]]; then
    cargo build --release -q -p leasehold-transcript --example transcript_check
    BIN="$(scripts/cargo-target-dir)/release/examples/transcript_check"
fi
DIR=$(mktemp -d)
if [[ "${KEEP:-0}" != 1 ]]; then
    trap 'rm -rf "$DIR"' EXIT
fi

printf '| format | messages | input MB | mode | wall s | peak RSS MB | RSS beyond input, bytes/message |\n'
printf '|---|---:|---:|---|---:|---:|---:|\n'
for format in $FORMATS; do
    file="$DIR/$format.json"
    # GEN: the binary that generates (BIN by default); give the current
    # tree's example when BIN is an old build, so both read the same bytes.
    # "N messages, B bytes"
    messages=$("${GEN:-$BIN}" generate "$format" "$MESSAGES" "$file" | awk '{print $1}')
    bytes=$(stat -c %s "$file")
    for mode in $MODES; do
        log="$DIR/$format.$mode.time"
        if ! /usr/bin/time -v "$BIN" "$mode" "$file" >/dev/null 2>"$log"; then
            printf '| %s | %s | %.1f | %s | failed | | |\n' "$format" "$messages" "$(echo "$bytes / 1000000" | bc -l)" "$mode"
            continue
        fi
        kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
        wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log")
        python3 - "$format" "$messages" "$bytes" "$mode" "$wall" "$kb" <<'PY'
import sys
fmt, messages, size, mode, wall, kb = sys.argv[1:]
messages, size, kb = int(messages), int(size), int(kb)
parts = [float(p) for p in wall.split(":")]
seconds = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
rss = kb * 1024
print(f"| {fmt} | {messages:,} | {size / 1e6:.1f} | {mode} | {seconds:.2f} | {rss / 1e6:.0f} | {(rss - size) / messages:.0f} |")
PY
    done
done
