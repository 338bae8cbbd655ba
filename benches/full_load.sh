#!/usr/bin/env bash
# Full-load files into a new table: tributary (release CLI) vs Python deltalake (append).
# Usage: benches/full_load.sh [DIR] [ROWS ...]     (default: /tmp/tributary-full-load 5000000)
# Writes a DMS-shaped LOAD00000001.parquet (walkthrough table, 10k-row row groups) per size,
# merges it with `tributary merge` and appends it with Python deltalake, each in a fresh
# process under /usr/bin/time: wall seconds and peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-/tmp/tributary-full-load}"; shift || true
SIZES="${*:-5000000}"
CACHE="${TRIBUTARY_CACHE:-$HOME/.cache/tributary}"
PY="$CACHE/venv-e2e/bin/python"
[ -x "$PY" ] || { echo "needs the Python env of scripts/e2e (deltalake, pyarrow): run scripts/e2e once" >&2; exit 1; }
cargo build --quiet --release -p tributary-cli
BIN="${CARGO_TARGET_DIR:-target}/release/tributary"
for rows in $SIZES; do
  d="$DIR/$rows"; rm -rf "$d"; mkdir -p "$d/raw/dms/s/t"
  "$PY" benches/full_load.py make --rows "$rows" --out "$d/raw/dms/s/t/LOAD00000001.parquet"
  cat > "$d/t.toml" <<TOML
[[table]]
name = "t"
source = "raw/dms/s/t/"
target = "curated/t"
primary_key = ["trip_id"]
partition_by = ["route_id"]
sequence_by = ["update_ts_dms"]
drop_columns = ["schema_name", "table_name", "update_ts_dms"]
TOML
  echo "== $rows rows ($(du -h "$d/raw/dms/s/t/LOAD00000001.parquet" | cut -f1) Parquet)"
  (cd "$d" && /usr/bin/time -f "tributary: %e s, peak %M KB" "$BIN" merge --config t.toml raw/dms/s/t/LOAD00000001.parquet >/dev/null)
  (cd "$d" && /usr/bin/time -f "python deltalake: %e s, peak %M KB" "$PY" "$OLDPWD/benches/full_load.py" append --file raw/dms/s/t/LOAD00000001.parquet --table "$d/py" >/dev/null)
done
