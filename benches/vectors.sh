#!/usr/bin/env bash
# Deletion vectors against copy-on-write (#46), one build, one run. First the merge matrix
# (1M and 10M rows, realistic and spread mixes, 1k and 100k changes): each case merged with
# copy-on-write and with `--deletion-vectors` (manifests off in both, as vectors need), and
# by Python deltalake, back to back. Then what each layout costs readers: the 10M-row
# spread 1k-change case merged 10 and 100 times, then read by DuckDB's delta extension and
# Python deltalake (full scan, key lookup; benches/readers.py) before and after maintenance.
# Usage: benches/vectors.sh BIN_DIR [OUT]
#   BIN_DIR: the release `tributary` and `tributary-bench` (cargo build --release -p
#   tributary-cli -p tributary-bench). Needs the Python env of scripts/e2e.
# Output: OUT/matrix.jsonl (harness and python_merge.py lines, with "build": cow, vectors or
# python) and OUT/readers.jsonl (readers.py lines).
set -uo pipefail
cd "$(dirname "$0")/.."
CACHE="${TRIBUTARY_CACHE:-$HOME/.cache/tributary}"
P="$CACHE/venv-e2e/bin/python"
B="$1"; OUT="${2:-/tmp/tributary-vectors}"
DIR=/tmp/tributary-bench
mkdir -p "$OUT"; : > "$OUT/matrix.jsonl"; : > "$OUT/readers.jsonl"
tag() { python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r.update($1); print(json.dumps(r))"; }
CASES="${BENCH_CASES:-1000000:1000:realistic:10 1000000:1000:worst:10 1000000:100000:realistic:3 1000000:100000:worst:3
       10000000:1000:realistic:10 10000000:1000:worst:10 10000000:100000:realistic:3 10000000:100000:worst:3}"
for c in $CASES; do
  IFS=: read -r rows changes mix count <<< "$c"
  $B/tributary-bench prepare --dir $DIR --rows $rows >&2
  $B/tributary-bench files --dir $DIR --rows $rows --changes $changes --mix $mix --count $count > /dev/null
  $B/tributary-bench run --dir $DIR --rows $rows --changes $changes --mix $mix --count $count --manifests false \
    | tag "build='cow'" >> "$OUT/matrix.jsonl"
  $B/tributary-bench run --dir $DIR --rows $rows --changes $changes --mix $mix --count $count --deletion-vectors \
    | tag "build='vectors'" >> "$OUT/matrix.jsonl"
  $P benches/python_merge.py --dir $DIR --rows $rows --changes $changes --mix $mix --count $count \
    | tag "build='python'" >> "$OUT/matrix.jsonl"
done
[ -n "${SKIP_READERS:-}" ] && exit 0
rows=10000000; changes=1000; mix=worst
for count in 10 100; do
  $B/tributary-bench files --dir $DIR --rows $rows --changes $changes --mix $mix --count $count > /dev/null
  for layout in cow vectors; do
    flag="--manifests false"; [ $layout = vectors ] && flag="--deletion-vectors"
    $B/tributary-bench run --dir $DIR --rows $rows --changes $changes --mix $mix --count $count $flag --no-maintain \
      | tag "build='$layout', readers_case=True" >> "$OUT/matrix.jsonl"
    t=$DIR/work-rust/curated/bench
    $P benches/readers.py --table $t --key 4242 --label "$layout, $count merges, before maintenance" >> "$OUT/readers.jsonl"
    (cd $DIR/work-rust && /usr/bin/time -f "%e" $B/tributary maintain --config tributary.toml > /dev/null) 2> "$OUT/maintain-$layout-$count.txt"
    $P benches/readers.py --table $t --key 4242 --label "$layout, $count merges, after maintenance ($(tail -1 "$OUT/maintain-$layout-$count.txt") s)" >> "$OUT/readers.jsonl"
  done
done
