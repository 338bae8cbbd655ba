#!/usr/bin/env bash
# Benchmark matrix: tributary (release) vs Python deltalake on the same workloads.
# Usage: benches/run.sh [DIR] [--smoke]
#   DIR      work folder (default /tmp/tributary-bench; needs ~2 GB for the 10M-row table)
#   --smoke  tiny sizes, debug build: checks that the harness works (CI)
# BENCH_BIN=path skips the build and uses that harness binary; BENCH_CASES overrides the
# matrix ("rows:changes:mix:files ...").
# Output: one JSON line per case in DIR/results.jsonl (kept in benches/results/ for a full
# run), and a Markdown table on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-/tmp/tributary-bench}"
SMOKE=""
[ "${2:-}" = "--smoke" ] || [ "${1:-}" = "--smoke" ] && SMOKE=1
[ "${1:-}" = "--smoke" ] && DIR=/tmp/tributary-bench-smoke
CACHE="${TRIBUTARY_CACHE:-$HOME/.cache/tributary}"
PY="$CACHE/venv-e2e/bin/python"
[ -x "$PY" ] || { echo "needs the Python env of scripts/e2e (deltalake, pyarrow): run scripts/e2e once" >&2; exit 1; }
mkdir -p "$DIR"
if [ -n "${BENCH_BIN:-}" ]; then
  BIN="$BENCH_BIN"   # a prebuilt harness (skips the build)
  CASES="${BENCH_CASES:-1000000:1000:realistic:10 1000000:1000:worst:10 1000000:100000:realistic:3 1000000:100000:worst:3
         10000000:1000:realistic:10 10000000:1000:worst:10 10000000:100000:realistic:3 10000000:100000:worst:3}"
elif [ -n "$SMOKE" ]; then
  # the harness binary on the test build's dependencies, so only the binary itself is
  # linked: with the workspace's tests in the same build, features resolve as in
  # scripts/test (`-p tributary-bench` alone resolves them for its own graph and rebuilt
  # DataFusion and delta-rs once the Lambda crates left the library)
  cargo build --quiet --locked --workspace --bins --tests
  BIN="${CARGO_TARGET_DIR:-target}/debug/tributary-bench"
  CASES="20000:500:realistic:2 20000:500:worst:2"
else
  # same package set as the Lambda release builds, so dependencies are shared
  cargo build --quiet --release -p tributary-cli -p tributary-merge -p tributary-bench
  BIN="${CARGO_TARGET_DIR:-target}/release/tributary-bench"
  CASES="1000000:1000:realistic:10 1000000:1000:worst:10 1000000:100000:realistic:3 1000000:100000:worst:3
         10000000:1000:realistic:10 10000000:1000:worst:10 10000000:100000:realistic:3 10000000:100000:worst:3"
fi
: > "$DIR/results.jsonl"
for c in $CASES; do
  IFS=: read -r rows changes mix count <<< "$c"
  "$BIN" prepare --dir "$DIR" --rows "$rows" >&2
  "$BIN" files --dir "$DIR" --rows "$rows" --changes "$changes" --mix "$mix" --count "$count" > /dev/null
  echo "== $rows rows, $changes changes, $mix: tributary" >&2
  "$BIN" run --dir "$DIR" --rows "$rows" --changes "$changes" --mix "$mix" --count "$count" | tee -a "$DIR/results.jsonl" >&2
  echo "== $rows rows, $changes changes, $mix: python deltalake" >&2
  "$PY" benches/python_merge.py --dir "$DIR" --rows "$rows" --changes "$changes" --mix "$mix" --count "$count" | tee -a "$DIR/results.jsonl" >&2
done
if [ -z "$SMOKE" ]; then
  mkdir -p benches/results
  cp "$DIR/results.jsonl" "benches/results/$(date -u +%Y-%m-%d-%H%M).jsonl"
fi
"$PY" - "$DIR/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| table rows | changes/file | mix | engine | p50 ms | p95 ms | changes/s | files rewritten/merge | MB rewritten/merge | peak RSS MB | maintenance ms |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['rows']:,} | {r['changes']:,} | {r['mix']} | {r['engine']} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['changes_per_s']:,.0f} | "
          f"{r['files_rewritten_per_merge']:.1f} | {r['bytes_rewritten_per_merge']/1e6:.1f} | {r['peak_rss_mb']:.0f} | {r['maintenance_ms']:.0f} |")
PY
