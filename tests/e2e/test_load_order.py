"""A full load larger than a slice and its first CDC files merged by one `tributary merge`
(#48), every version the command wrote read back with Python deltalake (time travel) and the
last one with DuckDB's delta extension (a reader sharing no code with delta-rs): each version
is a state the source had — a prefix of the full load, or the full load and the first k CDC
files — and the last is the final state. Before, the CDC files were merged first, into the
empty table, and the load after them slice by slice: versions held rows updated before they
were inserted."""

import os
import subprocess
from pathlib import Path

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq

from readers import connect, rows

ROOT = Path(__file__).resolve().parents[2]
N = 20_000


def write(path, ops, ids, vals, parts):
    cols = {"ts": [f"2024-01-01 00:00:00.{i:06d}" for i in range(len(ids))], "id": ids, "part": parts,
            "val": vals}
    if ops is not None:
        cols = {"Op": ops, **cols}
    pq.write_table(pa.table(cols), path)


def test_every_version_of_a_backfill_is_a_state_the_source_had(tmp_path):
    raw = tmp_path / "raw" / "shop" / "items"
    raw.mkdir(parents=True)
    (tmp_path / "tributary.toml").write_text(
        '[[table]]\nname = "items"\nsource = "raw/shop/items/"\ntarget = "curated/items"\n'
        'primary_key = ["id"]\ndrop_columns = ["ts"]\nslice_rows = 1024\n')
    # The source's changes in order: the full load, then three CDC files.
    changes = [("I", i, i, "a") for i in range(1, N + 1)]
    write(raw / "LOAD00000001.parquet", None, [c[1] for c in changes], [c[2] for c in changes],
          [c[3] for c in changes])
    cdc = [
        [("U", (i * 61) % N + 1, -i, "b") for i in range(300)],
        [("D", (i * 127) % N + 1, 0, "a") for i in range(100)] +
        [("U", (i * 131) % N + 1, 7 * i, "c") for i in range(50)],
        [("I", N + 1 + i, i, "d") for i in range(200)],
    ]
    for k, f in enumerate(cdc):
        write(raw / f"20240101-1{k}0000000.parquet", [c[0] for c in f], [c[1] for c in f],
              [c[2] for c in f], [c[3] for c in f])
        changes += f
    # Every state the source had: after each prefix of the changes.
    table, states = {}, {0}
    apply(table, changes, states)
    curated = str(tmp_path / "curated" / "items")
    merge_and_check(tmp_path, raw, curated, states, table, first=0)
    # Then a CDC file larger than a slice (3,000 changes) between two small ones, in one call.
    later = [
        [("U", 5, 55, "h")],
        [(("D", "I", "U", "U")[i % 4], (i * 7919) % (N + 200) + 1, 1000 + i, "fg"[i % 2]) for i in range(3000)],
        [("D", 5, 0, "h"), ("U", 6, 66, "h")],
    ]
    # A key inserted twice in the big file would be an update: keep DMS's shape (I only
    # when absent, U/D only when present), as the source produced it.
    live = set(table)
    big = []
    for op, key, val, part in later[1]:
        op = "I" if key not in live else ("D" if op == "D" else "U")
        (live.discard if op == "D" else live.add)(key)
        big.append((op, key, val, part))
    later[1] = big
    first = deltalake.DeltaTable(curated).version() + 1
    states = {digest(table.items())}
    for k, f in enumerate(later):
        write(raw / f"20240101-1{k + 3}0000000.parquet", [c[0] for c in f], [c[1] for c in f],
              [c[2] for c in f], [c[3] for c in f])
        apply(table, f, states)
    merge_and_check(tmp_path, raw, curated, states, table, first)


def digest(rows):
    """A digest of a set of (key, (val, part)) rows that does not depend on their order."""
    h = 0
    for row in rows:
        h ^= hash(row)
    return h


def apply(table, changes, states):
    """Apply changes in order to `table` (key → (val, part)), adding each state's digest."""
    h = digest(table.items())
    for op, key, val, part in changes:
        if key in table:
            h ^= hash((key, table.pop(key)))
        if op != "D":
            table[key] = (val, part)
            h ^= hash((key, table[key]))
        states.add(h)


def merge_and_check(tmp_path, raw, curated, states, table, first):
    """`tributary merge` of the folder (files applied already change nothing); every version
    from `first` on is one of `states`; the last equals `table`, read with DuckDB."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    out = subprocess.run([str(target / "debug" / "tributary"), "merge", "--config", str(tmp_path / "tributary.toml"),
                          str(raw) + "/"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    latest = deltalake.DeltaTable(curated).version()
    for v in range(first, latest + 1):
        t = deltalake.DeltaTable(curated, version=v).to_pyarrow_table(columns=["id", "val", "part"]).to_pylist()
        assert digest((r["id"], (r["val"], r["part"])) for r in t) in states, \
            f"version {v} ({len(t)} rows) is not a state the source had"
    final = sorted((k, v, p) for k, (v, p) in table.items())
    assert rows(connect(), curated, "id, val, part", order="id") == final
