#!/usr/bin/env bash
# Before/after: two builds of the benchmark harness on the same cases, alternating the
# binaries case by case and round by round (so drift in the machine hits both alike).
# Usage: benches/ab.sh BEFORE_BIN AFTER_BIN [ROUNDS] [DIR]
#   BENCH_CASES overrides the cases ("rows:changes:mix:files ...", as in benches/run.sh).
# Output: DIR/ab.jsonl (each line the harness's result plus "build": before|after, "round"),
# and a Markdown table of p50 per case and build on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE="$1"; AFTER="$2"; ROUNDS="${3:-2}"; DIR="${4:-/tmp/tributary-bench}"
CASES="${BENCH_CASES:-1000000:1000:realistic:10 1000000:1000:worst:10 1000000:100000:realistic:3 1000000:100000:worst:3
       10000000:1000:realistic:10 10000000:1000:worst:10 10000000:100000:realistic:3 10000000:100000:worst:3}"
mkdir -p "$DIR"
: > "$DIR/ab.jsonl"
for c in $CASES; do
  IFS=: read -r rows changes mix count <<< "$c"
  "$AFTER" prepare --dir "$DIR" --rows "$rows" >&2
  "$AFTER" files --dir "$DIR" --rows "$rows" --changes "$changes" --mix "$mix" --count "$count" > /dev/null
  for round in $(seq 1 "$ROUNDS"); do
    for build in before after; do
      bin="$BEFORE"; [ "$build" = after ] && bin="$AFTER"
      echo "== $rows rows, $changes changes, $mix: $build, round $round" >&2
      "$bin" run --dir "$DIR" --rows "$rows" --changes "$changes" --mix "$mix" --count "$count" \
        | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r.update(build='$build', round=$round); print(json.dumps(r))" \
        | tee -a "$DIR/ab.jsonl" >&2
    done
  done
done
python3 - "$DIR/ab.jsonl" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cases = collections.OrderedDict()
for r in rows:
    cases.setdefault((r["rows"], r["changes"], r["mix"]), {"before": [], "after": []})[r["build"]].append(r)
print("| table rows | changes/file | mix | before p50 ms | after p50 ms | before peak RSS MB | after peak RSS MB |")
print("|---|---|---|---|---|---|---|")
for (rows, changes, mix), b in cases.items():
    p = lambda k: ", ".join(f"{r['p50_ms']:.0f}" for r in b[k])
    m = lambda k: ", ".join(f"{r['peak_rss_mb']:.0f}" for r in b[k])
    print(f"| {rows:,} | {changes:,} | {mix} | {p('before')} | {p('after')} | {m('before')} | {m('after')} |")
PY
