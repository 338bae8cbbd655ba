#!/usr/bin/env bash
# Before, after and Python deltalake in one run: the full loads (5M and 30M rows, two rounds,
# the three engines back to back), then the merge matrix (one round per case).
# Usage: benches/compare.sh BEFORE_DIR AFTER_DIR [OUT]
#   *_DIR: folders holding the release `tributary` and `tributary-bench` of each build
#   (e.g. copies of target/release after `cargo build --release -p tributary-cli -p
#   tributary-bench` at each commit). Needs the Python env of scripts/e2e.
# Output: OUT/full_load.txt (wall seconds, peak RSS per engine and round) and
# OUT/matrix.jsonl (the harness's and python_merge.py's lines, with "build").
set -uo pipefail
cd "$(dirname "$0")/.."
CACHE="${TRIBUTARY_CACHE:-$HOME/.cache/tributary}"
P="$CACHE/venv-e2e/bin/python"
B="$1"; A="$2"; OUT="${3:-/tmp/tributary-compare}"
FL=/tmp/tributary-full-load
mkdir -p "$OUT"; : > ""$OUT"/full_load.txt"; : > ""$OUT"/matrix.jsonl"
for rows in 5000000 30000000; do
  mkdir -p "$FL/$rows/raw/dms/s/t"
  [ -f "$FL/$rows/raw/dms/s/t/LOAD00000001.parquet" ] ||
    "$P" benches/full_load.py make --rows "$rows" --out "$FL/$rows/raw/dms/s/t/LOAD00000001.parquet"
done
for round in 1 2; do
  for rows in 5000000 30000000; do
    d=$FL/$rows
    cat > $d/t.toml <<TOML
[[table]]
name = "t"
source = "raw/dms/s/t/"
target = "curated/t"
primary_key = ["trip_id"]
partition_by = ["route_id"]
sequence_by = ["update_ts_dms"]
drop_columns = ["schema_name", "table_name", "update_ts_dms"]
TOML
    for who in before after python; do
      rm -rf $d/curated $d/py
      if [ $who = python ]; then
        (cd $d && /usr/bin/time -f "$rows round $round python: %e s, peak %M KB" $P "$OLDPWD/benches/full_load.py" append --file raw/dms/s/t/LOAD00000001.parquet --table $d/py >/dev/null) 2>>"$OUT"/full_load.txt
      else
        bin=$B/tributary; [ $who = after ] && bin=$A/tributary
        (cd $d && /usr/bin/time -f "$rows round $round $who: %e s, peak %M KB" $bin merge --config t.toml raw/dms/s/t/LOAD00000001.parquet >/dev/null) 2>>"$OUT"/full_load.txt
      fi
    done
  done
done
DIR=/tmp/tributary-bench
CASES="1000000:1000:realistic:10 1000000:1000:worst:10 1000000:100000:realistic:3 1000000:100000:worst:3
       10000000:1000:realistic:10 10000000:1000:worst:10 10000000:100000:realistic:3 10000000:100000:worst:3"
for c in $CASES; do
  IFS=: read -r rows changes mix count <<< "$c"
  $A/tributary-bench prepare --dir $DIR --rows $rows >&2
  $A/tributary-bench files --dir $DIR --rows $rows --changes $changes --mix $mix --count $count > /dev/null
  for who in before after; do
    bin=$B/tributary-bench; [ $who = after ] && bin=$A/tributary-bench
    $bin run --dir $DIR --rows $rows --changes $changes --mix $mix --count $count \
      | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r.update(build='$who'); print(json.dumps(r))" >> "$OUT"/matrix.jsonl
  done
  $P benches/python_merge.py --dir $DIR --rows $rows --changes $changes --mix $mix --count $count \
      | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r.update(build='python'); print(json.dumps(r))" >> "$OUT"/matrix.jsonl
done
