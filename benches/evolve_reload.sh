#!/usr/bin/env bash
# The merges that went to delta-rs's MERGE before #43 made tributary's rewrite execute them,
# on a 10M-row table: a schema-evolution merge (1,000 updates carrying a column the table
# lacks) and a DMS table reload (a new 10M-row full load without the first 100,000 trips,
# which the reload deletes). Before, after and Python deltalake (merge with schema merging;
# merge with `when_not_matched_by_source_delete`) on copies of the same table, two rounds.
# Usage: benches/evolve_reload.sh BEFORE_DIR AFTER_DIR [OUT]   (dirs as for compare.sh)
# Output: OUT/evolve_reload.txt (wall seconds and peak RSS per case, engine and round).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${TRIBUTARY_CACHE:-$HOME/.cache/tributary}"
P="$CACHE/venv-e2e/bin/python"
B="$1"; A="$2"; OUT="${3:-/tmp/tributary-compare}"
W=/tmp/tributary-evolve-reload
mkdir -p "$OUT" "$W/raw/dms/s/t"
: > "$OUT/evolve_reload.txt"
rows=10000000
[ -f "$W/load1.parquet" ] || "$P" benches/full_load.py make --rows $rows --out "$W/load1.parquet"
[ -f "$W/load2.parquet" ] ||
  "$P" benches/full_load.py make --rows $((rows - 100000)) --first 100000 --out "$W/load2.parquet"
[ -f "$W/evolve.parquet" ] || "$P" - "$W/evolve.parquet" $rows <<'PY'
import random, sys
import pyarrow as pa, pyarrow.parquet as pq
out, rows = sys.argv[1], int(sys.argv[2])
rng = random.Random(7)
ids = rng.sample(range(1, rows + 1), 1000)
n = len(ids)
pq.write_table(pa.table({
    "Op": ["U"] * n,
    "update_ts_dms": ["2024-01-01 00:00:00.000000"] * n,
    "schema_name": ["delta_emr_source"] * n, "table_name": ["travel_details"] * n,
    "trip_id": pa.array(ids, pa.int32()),
    "tstamp": pa.array([1704067200_000000] * n, pa.timestamp("us")),
    "route_id": [chr(65 + i % 10) for i in ids],
    "destination": ["Miami"] * n, "source_location": ["Tucson"] * n,
    "fare": pa.array([float(i % 97) for i in ids], pa.float64()),
}), out)
PY
cat > "$W/t.toml" <<TOML
[[table]]
name = "t"
source = "raw/dms/s/t/"
target = "curated/t"
primary_key = ["trip_id"]
partition_by = ["route_id"]
sequence_by = ["update_ts_dms"]
drop_columns = ["schema_name", "table_name", "update_ts_dms"]
TOML
# The base tables: tributary's (the after build's full load) and Python's (its append).
if [ ! -d "$W/base-t/_delta_log" ]; then
  rm -rf "$W/curated" && cp "$W/load1.parquet" "$W/raw/dms/s/t/LOAD00000001.parquet"
  (cd "$W" && "$A/tributary" merge --config t.toml raw/dms/s/t/LOAD00000001.parquet >/dev/null)
  mv "$W/curated/t" "$W/base-t"
fi
[ -d "$W/base-py/_delta_log" ] ||
  "$P" benches/full_load.py append --file "$W/load1.parquet" --table "$W/base-py" >/dev/null
for round in 1 2; do
  for case in evolve reload; do
    for who in before after python; do
      rm -rf "$W/curated" "$W/py" "$W/raw/dms/s/t"/*
      cp "$W/load1.parquet" "$W/raw/dms/s/t/LOAD00000001.parquet"
      label="$case round $round $who"
      if [ $who = python ]; then
        cp -r "$W/base-py" "$W/py"
        src="$W/evolve.parquet"; [ $case = reload ] && src="$W/load2.parquet"
        /usr/bin/time -f "$label: %e s, peak %M KB" "$P" - "$case" "$src" "$W/py" <<'PY' 2>>"$OUT/evolve_reload.txt"
import sys
import pyarrow.parquet as pq
from deltalake import DeltaTable
case, src, table = sys.argv[1:]
s = pq.read_table(src).drop_columns(["update_ts_dms", "schema_name", "table_name"])
if case == "evolve":
    s = s.drop_columns(["Op"])
    (DeltaTable(table).merge(s, "t.trip_id = s.trip_id", source_alias="s", target_alias="t",
                             merge_schema=True)
     .when_matched_update_all().when_not_matched_insert_all().execute())
else:
    (DeltaTable(table).merge(s, "t.trip_id = s.trip_id", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all()
     .when_not_matched_by_source_delete().execute())
PY
        continue
      fi
      bin=$B/tributary; [ $who = after ] && bin=$A/tributary
      mkdir -p "$W/curated" && cp -r "$W/base-t" "$W/curated/t"
      if [ $case = evolve ]; then
        cp "$W/evolve.parquet" "$W/raw/dms/s/t/20240101-000000000.parquet"
        (cd "$W" && /usr/bin/time -f "$label: %e s, peak %M KB" "$bin" merge --config t.toml \
          raw/dms/s/t/20240101-000000000.parquet >/dev/null) 2>>"$OUT/evolve_reload.txt"
      else
        cp "$W/load2.parquet" "$W/raw/dms/s/t/LOAD00000001.parquet"
        touch "$W/raw/dms/s/t/LOAD00000001.parquet"
        (cd "$W" && /usr/bin/time -f "$label: %e s, peak %M KB" "$bin" reload --config t.toml t \
          >/dev/null) 2>>"$OUT/evolve_reload.txt"
      fi
      "$P" - "$W/curated/t" "$case" <<'PY' >>"$OUT/evolve_reload.txt"
import sys
from deltalake import DeltaTable
t = DeltaTable(sys.argv[1])
n = t.to_pyarrow_dataset().count_rows()
want = 10_000_000 if sys.argv[2] == "evolve" else 9_900_000
ops = [h.get("operation") for h in t.history(3)]
print(f"  rows {n} (want {want}), columns {[f.name for f in t.schema().fields]}, last ops {ops}")
assert n == want
PY
    done
  done
done
