"""Every table tributary writes — current, tombstones, history, change log — read back by a
reader that shares no code with delta-rs (DuckDB's delta extension, readers.py), with
filters on keys and on decimal, timestamp and partition columns, so that file skipping by
the log's statistics is exercised: a bound that does not hold its file loses rows here.
The tables are built by the CLI on a local folder (no emulator needed), from DMS-shaped
Parquet files with wide decimal keys and amounts (Oracle NUMBER(38), PostgreSQL NUMERIC),
unsigned keys and sub-millisecond timestamps, merged in several commits, then maintained
(compaction, checkpoint)."""

import datetime as dt
import decimal
import json
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from readers import connect, manifest_row_count, rows

ROOT = Path(__file__).resolve().parents[2]
UTC = dt.timezone.utc
D = decimal.Decimal

CONFIG = """
[[table]]
name = "acct"
source = "raw/acct/"
target = "curated/acct"
primary_key = ["id"]
partition_by = ["region"]
sequence_by = ["ts"]
manifests = true
[table.history]
target = "curated/acct_history"
"""

BIG = [D(1234567890123456789), D(10**30 + 7), D(5), D(-(10**37) + 1), D(98765432109876543210)]


def cli(*args, cwd):
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    out = subprocess.run([str(target / "debug" / "tributary"), *args], cwd=cwd,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def write(folder, name, changes, with_op=True):
    """A DMS Parquet file: (op, ts, id, region, amt, updated_at, n) rows."""
    cols = {}
    if with_op:
        cols["Op"] = pa.array([c[0] for c in changes], pa.string())
    cols["ts"] = pa.array([c[1] for c in changes], pa.string())
    cols["id"] = pa.array([c[2] for c in changes], pa.decimal128(38, 0))
    cols["region"] = pa.array([c[3] for c in changes], pa.string())
    cols["amt"] = pa.array([c[4] for c in changes], pa.decimal128(38, 18))
    cols["updated_at"] = pa.array([c[5] for c in changes], pa.timestamp("us", tz="UTC"))
    cols["n"] = pa.array([c[6] for c in changes], pa.uint64())
    pq.write_table(pa.table(cols), folder / name)


def amount(i):
    # 20 integer digits and 18 decimals: no f64 holds it
    return D(f"{12345678901234567890 + i}.{123456789012345678 + i:018d}")


def at(i):
    return dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=i, microseconds=500 + i)


def apply(model, changes):
    for op, _ts, key, *values in changes:
        if op == "D":
            model.pop(key, None)
        else:
            region, amt, instant, n = values
            model[key] = (region, amt, instant, D(n))  # uint64 is stored as decimal(20,0)


def test_every_table_reads_back_exactly_with_filters_in_another_engine(tmp_path):
    (tmp_path / "tributary.toml").write_text(CONFIG)
    raw = tmp_path / "raw" / "acct"
    raw.mkdir(parents=True)
    ts = lambda s: f"2024-01-01 00:00:{s:02d}.000000"  # noqa: E731
    load = [("I", ts(0), k, ["eu", "us"][i % 2], amount(i), at(i), 2**64 - 1 - i) for i, k in enumerate(BIG)]
    write(raw, "LOAD00000001.parquet", load, with_op=False)
    cdc = [
        [("U", ts(1), BIG[0], "eu", amount(100), at(100), 7),
         ("D", ts(1), BIG[1], "us", amount(1), at(1), 0),
         ("I", ts(1), D(10**36), "us", amount(101), at(101), 2**63)],
        [("U", ts(2), BIG[3], "us", amount(102), at(102), 8),  # moves partition
         ("I", ts(2), BIG[1], "eu", amount(103), at(103), 9)],  # back after its delete
        [("D", ts(3), BIG[4], "us", amount(4), at(4), 0),
         ("U", ts(3), BIG[0], "eu", amount(104), at(104), 10)],
    ]
    model = {}
    apply(model, [("I",) + c[1:] for c in load])
    cli("merge", "--config", "tributary.toml", "raw/acct/LOAD00000001.parquet", cwd=tmp_path)
    for i, changes in enumerate(cdc):
        name = f"20240101-00000{i + 1}000.parquet"
        write(raw, name, changes)
        cli("merge", "--config", "tributary.toml", f"raw/acct/{name}", cwd=tmp_path)
        apply(model, changes)
    # a late insert older than the delete of BIG[4]: blocked by its tombstone
    write(raw, "20240101-000009000.parquet", [("I", ts(2), BIG[4], "us", amount(9), at(9), 1)])
    cli("merge", "--config", "tributary.toml", "raw/acct/20240101-000009000.parquet", cwd=tmp_path)

    con = connect()
    current = tmp_path / "curated" / "acct"

    def check_current(when):
        want = sorted((k,) + v for k, v in model.items())
        got = rows(con, current, "id, region, amt, updated_at, n")
        assert got == want, when
        # every key, amount, instant and partition found by a pushed-down filter
        for k, (region, amt, instant, n) in model.items():
            assert rows(con, current, "id", f"id = {k}::DECIMAL(38,0)") == [(k,)], (when, k)
            assert rows(con, current, "id", f"amt = '{amt}'::DECIMAL(38,18)") == [(k,)], (when, amt)
            assert rows(con, current, "id", f"updated_at = '{instant.isoformat()}'::TIMESTAMPTZ") == [(k,)], (when, instant)
            assert (k,) in rows(con, current, "id", f"region = '{region}'"), (when, region)
            assert rows(con, current, "id", f"n = {n}::DECIMAL(20,0)") == [(k,)], (when, n)
        assert rows(con, current, "id", f"id > {max(model)}::DECIMAL(38,0)") == []
        assert manifest_row_count(current) == len(model), when

    check_current("after the merges")

    def check_filters(table, columns, when):
        """Each value of each column, filtered by DuckDB, gives the rows an unfiltered
        scan holds with that value (statistics bound their files)."""
        cols = ", ".join(columns)
        everything = rows(con, table, cols, order=cols)
        assert everything, (table, when)
        for i, c in enumerate(columns):
            for v in {r[i] for r in everything if r[i] is not None}:
                got = con.execute(
                    f"SELECT {cols} FROM delta_scan('{Path(table).as_posix()}') WHERE {c} = ? ORDER BY {cols}",
                    [v]).fetchall()
                assert got == [r for r in everything if r[i] == v], (table, c, v, when)

    history = tmp_path / "curated" / "acct_history"
    tombstones = current / "_tributary_tombstones"
    changes = history / "_tributary_changes"

    def check_all(when):
        check_current(when)
        check_filters(tombstones, ["id"], when)
        check_filters(history, ["id", "amt", "updated_at"], when)
        check_filters(changes, ["id", "amt", "updated_at"], when)
        # the history's open versions are the current table's rows
        cur = rows(con, history, "id, region, amt, updated_at, n", "__END_AT IS NULL")
        assert cur == sorted((k,) + v for k, v in model.items()), when

    check_all("after the merges")
    tomb_keys = {r[0] for r in rows(con, tombstones, "id")}
    assert {BIG[1], BIG[4]} <= tomb_keys

    cli("maintain", "--config", "tributary.toml", cwd=tmp_path)
    assert list((current / "_delta_log").glob("*.checkpoint.parquet")), "maintenance checkpoints"
    check_all("after maintenance (compacted, read from a checkpoint)")


WIDEN_CONFIG = """
[[table]]
name = "w"
source = "raw/w/"
target = "curated/w"
primary_key = ["id"]
partition_by = ["region"]
sequence_by = ["ts"]
manifests = true
[table.history]
target = "curated/w_history"
"""


def write_typed(folder, name, changes, types, with_op=True):
    """A DMS Parquet file of (op, ts, id, region, n, f, d, b) rows in the given column types
    (the source's types at the time: before or after an ALTER ... TYPE)."""
    cols = {}
    if with_op:
        cols["Op"] = pa.array([c[0] for c in changes], pa.string())
    cols["ts"] = pa.array([c[1] for c in changes], pa.string())
    cols["region"] = pa.array([c[3] for c in changes], pa.string())
    for i, col in [(2, "id"), (4, "n"), (5, "f"), (6, "d"), (7, "b")]:
        cols[col] = pa.array([c[i] for c in changes], types[col])
    pq.write_table(pa.table(cols), folder / name)


def test_a_widened_table_reads_back_exactly_in_every_reader(tmp_path):
    """#26: `id`, `n` int -> bigint, `f` real -> double, `d` numeric(10,2) -> numeric(12,3),
    `b` date -> timestamp part-way: DuckDB (with filters on every value), Python deltalake
    and the manifests' plain Parquet files all read every row in the new types, old rows
    included (an old date as its midnight, UTC)."""
    (tmp_path / "tributary.toml").write_text(WIDEN_CONFIG)
    raw = tmp_path / "raw" / "w"
    raw.mkdir(parents=True)
    ts = lambda s: f"2024-01-01 00:00:{s:02d}.000000"  # noqa: E731
    narrow = {"id": pa.int32(), "n": pa.int32(), "f": pa.float32(), "d": pa.decimal128(10, 2),
              "b": pa.date32()}
    # DMS writes a timestamp column without a time zone
    wide = {"id": pa.int64(), "n": pa.int64(), "f": pa.float64(), "d": pa.decimal128(12, 3),
            "b": pa.timestamp("us")}
    big = 2**40
    load = [("I", ts(0), k, ["eu", "us"][k % 2], k * 10, 0.5 * k, D(f"{k}.25"), dt.date(2024, 2, k))
            for k in range(1, 7)]
    write_typed(raw, "LOAD00000001.parquet", load, narrow, with_op=False)
    cdc = [("U", ts(1), 2, "eu", big, 0.1, D("123456789.123"), dt.datetime(2024, 3, 1, 12, 30, 0, 7)),
           ("I", ts(1), big + 1, "us", -big, 1e300, D("-0.001"), dt.datetime(1969, 12, 31, 23, 59, 59)),
           ("D", ts(1), 3, "us", 0, 0.0, D(0), None)]
    write_typed(raw, "20240101-000001000.parquet", cdc, wide)
    for f in ["LOAD00000001.parquet", "20240101-000001000.parquet"]:
        cli("merge", "--config", "tributary.toml", f"raw/w/{f}", cwd=tmp_path)
    model = {}
    for op, _ts, k, region, n, f, d, b in load + cdc:
        if op == "D":
            model.pop(k, None)
        else:
            # the float32 values of the load are exact halves: the same as doubles; a date is
            # its midnight, and a source timestamp is read as UTC
            if not isinstance(b, dt.datetime):
                b = dt.datetime(b.year, b.month, b.day)
            model[k] = (region, n, f, d, b.replace(tzinfo=UTC))
    want = sorted((k,) + tuple(v) for k, v in model.items())
    current = tmp_path / "curated" / "w"
    con = connect()

    def check(when):
        got = rows(con, current, "id, region, n, f, d, epoch_us(b)")
        epoch = dt.datetime(1970, 1, 1, tzinfo=UTC)
        micros = lambda b: (b - epoch) // dt.timedelta(microseconds=1)  # noqa: E731
        assert got == [(k, r, n, f, D(d).quantize(D("0.001")), micros(b)) for k, r, n, f, d, b in want], when
        types = con.execute(
            f"SELECT typeof(id), typeof(n), typeof(f), typeof(d), typeof(b) FROM delta_scan('{current.as_posix()}') LIMIT 1"
        ).fetchall()
        assert types == [("BIGINT", "BIGINT", "DOUBLE", "DECIMAL(12,3)", "TIMESTAMP WITH TIME ZONE")], (when, types)
        for k, region, n, f, d, b in want:
            assert rows(con, current, "id", f"id = {k}") == [(k,)], (when, k)
            assert rows(con, current, "id", f"n = {n}") == [(k,)], (when, n)
            assert rows(con, current, "id", f"d = {d}::DECIMAL(12,3)") == [(k,)], (when, d)
            assert rows(con, current, "id", f"b = '{b.isoformat()}'::TIMESTAMPTZ") == [(k,)], (when, b)
        assert rows(con, current, "id", f"n > {2**31}") == [(2,)], when
        assert rows(con, current, "id", "b < '2024-02-03'::TIMESTAMPTZ") == [(1,), (big + 1,)], when
        # Python deltalake (delta-rs's Python reader) reads the same rows
        import deltalake
        t = deltalake.DeltaTable(str(current)).to_pyarrow_table()
        assert t.schema.field("n").type == pa.int64() and t.schema.field("d").type == pa.decimal128(12, 3)
        assert t.schema.field("b").type == pa.timestamp("us", tz="UTC"), t.schema
        py = sorted(zip(*(t.column(c).to_pylist() for c in ["id", "region", "n", "f", "d", "b"])))
        assert [r[:4] + r[5:] for r in py] == [r[:4] + r[5:] for r in want], when
        # the manifests' plain Parquet files: every one in the new types, the rows complete
        from readers import manifest_files
        for _, f in manifest_files(current):
            path = f[len("file://"):] if f.startswith("file://") else f
            schema = pq.read_schema(path)
            assert schema.field("n").type == pa.int64(), (when, path, schema)
            assert schema.field("id").type == pa.int64(), (when, path, schema)
            assert pa.types.is_timestamp(schema.field("b").type), (when, path, schema)
        assert manifest_row_count(current) == len(want), when
        history = tmp_path / "curated" / "w_history"
        cur = rows(con, history, "id, n", "__END_AT IS NULL")
        assert cur == [(k, n) for k, _r, n, _f, _d, _b in want], when
        old = rows(con, history, "id, n", "id = 2 AND __END_AT IS NOT NULL")
        assert old == [(2, 20)], when

    check("after the merges")
    cli("maintain", "--config", "tributary.toml", cwd=tmp_path)
    check("after maintenance")


@pytest.fixture(autouse=True)
def _needs_cli():
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    assert (target / "debug" / "tributary").exists(), "build the CLI first (scripts/e2e does)"


CUT_CONFIG = """
[[table]]
name = "orders"
source = "raw/shop/orders/"
target = "curated/orders"
primary_key = ["id"]
sequence_by = ["ts"]

[[table]]
name = "customers"
source = "raw/shop/customers/"
target = "curated/customers"
primary_key = ["id"]
sequence_by = ["ts"]
"""


def test_a_groups_cut_read_with_duckdb_time_travel_is_the_source_at_that_moment(tmp_path):
    """#27: `tributary maintain` publishes the group's cut; DuckDB's delta_scan at each
    table's version (time travel, no code shared with delta-rs) gives the source as of the
    cut, filters included; a held file holds the cut, merging it releases it."""
    (tmp_path / "tributary.toml").write_text(CUT_CONFIG)
    con = connect()
    models = {"orders": [], "customers": []}
    files = {}
    for t in models:
        (tmp_path / "raw" / "shop" / t).mkdir(parents=True)
        for m in range(3):  # one file a minute in both tables, as DMS writes them
            ts = f"2024-01-01 00:{m:02d}:00.000000"
            rows_ = [("I" if m == 0 else "U", ts, 1, m), ("I", ts, 10 + m, 0)]
            name = f"20240101-00{m:02d}000000.parquet"
            pq.write_table(pa.table({
                "Op": pa.array([r[0] for r in rows_]), "ts": pa.array([r[1] for r in rows_]),
                "id": pa.array([r[2] for r in rows_], pa.int64()), "v": pa.array([r[3] for r in rows_], pa.int64()),
            }), tmp_path / "raw" / "shop" / t / name)
            files.setdefault(t, []).append(f"raw/shop/{t}/{name}")
            models[t].append(rows_)

    def state(t, upto):
        s = {}
        for f in models[t][:upto + 1]:
            for _op, _ts, k, v in f:
                s[k] = v
        return sorted(s.items())

    for f in files["orders"]:
        cli("merge", "--config", "tributary.toml", f, cwd=tmp_path)
    # customers' second file is held (failed, or in the dead-letter queue)
    for f in (files["customers"][0], files["customers"][2]):
        cli("merge", "--config", "tributary.toml", f, cwd=tmp_path)
    out = cli("maintain", "--config", "tributary.toml", cwd=tmp_path)
    assert "group raw: cut 2024-01-01T00:00:00+00:00" in out and "held by table customers" in out, out

    def read_cut(upto):
        cut = json.loads((tmp_path / "curated" / "_tributary_cuts" / "raw.json").read_text())
        assert cut["cut"] == f"2024-01-01T00:{upto:02d}:00Z", cut
        for t in cut["tables"]:
            path, v = tmp_path / "curated" / t["table"], t["version"]
            got = con.execute(f"SELECT id, v FROM delta_scan('{path}', version => {v}) ORDER BY id").fetchall()
            assert got == state(t["table"], upto), (t, got)
            for k, val in state(t["table"], upto):
                assert con.execute(f"SELECT v FROM delta_scan('{path}', version => {v}) WHERE id = {k}").fetchall() == [(val,)]
        return cut

    cut = read_cut(0)
    assert cut["held_by"] == "customers"
    held = [t["held_by"]["file"] for t in cut["tables"] if t["table"] == "customers"]
    assert held and held[0].endswith(files["customers"][1].split("/")[-1]), cut
    # the held file merged: the cut moves to the newest files
    cli("merge", "--config", "tributary.toml", files["customers"][1], cwd=tmp_path)
    cli("maintain", "--config", "tributary.toml", cwd=tmp_path)
    cut = read_cut(2)
    assert cut["held_by"] is None and cut["consistent_within_seconds"] == 0.0


ADOPT_CONFIG = """
[[table]]
name = "people"
source = "raw/people/"
target = "curated/people"
primary_key = ["id"]
partition_by = ["region"]
sequence_by = ["ts"]
drop_columns = ["ts"]
"""


def test_an_adopted_table_with_a_change_feed_and_a_new_column_reads_back_exactly(tmp_path):
    """A table another writer made (Python deltalake, change data feed on), merged into by
    tributary (#43): adopted, a column the source added part way (files before it and a
    file without it keep the rows' values), a partition move, a delete and an insert. Both
    readers see the source's rows, filters on the new column and the key find them, and the
    change feed holds each change's images as Delta's CDF defines them."""
    from deltalake import DeltaTable, write_deltalake

    (tmp_path / "tributary.toml").write_text(ADOPT_CONFIG)
    table = tmp_path / "curated" / "people"
    raw = tmp_path / "raw" / "people"
    raw.mkdir(parents=True)
    write_deltalake(str(table), pa.table({
        "id": pa.array([1, 2, 3, 4], pa.int64()),
        "name": ["a", "b", "c", "d"],
        "amt": pa.array([D("1.10"), D("2.20"), D("3.30"), D("4.40")], pa.decimal128(10, 2)),
        "region": ["eu", "eu", "eu", "us"],
    }), partition_by=["region"], configuration={"delta.enableChangeDataFeed": "true"})
    adopted_at = DeltaTable(str(table)).version()

    def cdc(name, changes, email=True):
        cols = {
            "Op": [c[0] for c in changes],
            "ts": [f"2024-01-01 00:00:0{name}.000000" for _ in changes],
            "id": pa.array([c[1] for c in changes], pa.int64()),
            "name": [c[2] for c in changes],
            "amt": pa.array([c[3] for c in changes], pa.decimal128(10, 2)),
            "region": [c[4] for c in changes],
        }
        if email:
            cols["email"] = [c[5] for c in changes]
        file = f"20240101-00000{name}000.parquet"
        pq.write_table(pa.table(cols), raw / file)
        cli("merge", "--config", "tributary.toml", f"raw/people/{file}", cwd=tmp_path)

    cdc(1, [("U", 1, "a1", D("1.11"), "eu", "a@x"),
                 ("D", 2, "b", D("2.20"), "eu", None),
                 ("I", 10, "j", D("10.00"), "us", "j@x")])
    # DMS wrote this one without the column (e.g. a task restarted on the old mapping)
    cdc(2, [("U", 3, "c2", D("3.33"), "us", None),  # moves eu -> us
                 ("U", 1, "a2", D("1.12"), "eu", None)], email=False)
    cdc(3, [("U", 4, "d", D("4.40"), "us", "d@x")])
    want = [
        (1, "a2", D("1.12"), "eu", "a@x"),
        (3, "c2", D("3.33"), "us", None),
        (4, "d", D("4.40"), "us", "d@x"),
        (10, "j", D("10.00"), "us", "j@x"),
    ]
    con = connect()
    cols = "id, name, amt, region, email"
    assert rows(con, table, cols) == want
    got = pa.table(DeltaTable(str(table)).to_pyarrow_table()).select(["id", "name", "amt", "region", "email"])
    assert sorted(tuple(r.values()) for r in got.to_pylist()) == want
    for r in want:
        assert rows(con, table, "id", f"id = {r[0]}") == [(r[0],)]
        if r[4] is not None:
            assert rows(con, table, "id", f"email = '{r[4]}'") == [(r[0],)]
        assert (r[0],) in rows(con, table, "id", f"region = '{r[3]}'")
    assert rows(con, table, "id", "email IS NULL") == [(3,)]

    feed = pa.table(DeltaTable(str(table)).load_cdf(starting_version=adopted_at + 1).read_all())
    seen = sorted((r["_commit_version"], r["id"], r["_change_type"], r["name"], r["region"], r["email"])
                  for r in feed.to_pylist())
    # one commit with feed rows per file (a watermark commit has none)
    v1, v2, v3 = sorted({s[0] for s in seen})
    assert [s for s in seen if s[0] == v1] == [
        (v1, 1, "update_postimage", "a1", "eu", "a@x"),
        (v1, 1, "update_preimage", "a", "eu", None),
        (v1, 2, "delete", "b", "eu", None),
        (v1, 10, "insert", "j", "us", "j@x"),
    ]
    assert [s for s in seen if s[0] == v2] == [
        (v2, 1, "update_postimage", "a2", "eu", "a@x"),
        (v2, 1, "update_preimage", "a1", "eu", "a@x"),
        (v2, 3, "update_postimage", "c2", "us", None),
        (v2, 3, "update_preimage", "c", "eu", None),
    ]
    assert [s[1:3] for s in seen if s[0] == v3] == [(4, "update_postimage"), (4, "update_preimage")]
    status = cli("status", "--config", "tributary.toml", "people", "--json", cwd=tmp_path)
    (st,) = json.loads(status)
    assert st["adopted"] and st["change_data_feed"] and st["rows"] == len(want), st


VECTORS_CONFIG = """
[[table]]
name = "dv"
source = "raw/dv/"
target = "curated/dv"
primary_key = ["id"]
partition_by = ["region"]
sequence_by = ["ts"]
drop_columns = ["ts"]
deletion_vectors = true
manifests = false
target_file_size_mb = 0.01
"""


def test_a_table_with_deletion_vectors_reads_back_exactly_in_both_readers(tmp_path):
    """#46: merges with `deletion_vectors = true` — updates in place, deletes, re-inserts of
    deleted keys, partition moves, a merge large enough for a file-stored vector, a
    compaction between, then more merges on the compacted files. DuckDB's delta extension
    (delta-kernel-rs) and Python deltalake (its DataFusion scan) read the source's rows after
    each step, whole and with filters on keys (pushed down: files skipped by statistics the
    vectors made wide)."""
    from deltalake import DeltaTable, QueryBuilder

    (tmp_path / "tributary.toml").write_text(VECTORS_CONFIG)
    raw = tmp_path / "raw" / "dv"
    raw.mkdir(parents=True)
    table = tmp_path / "curated" / "dv"
    ts = lambda s: f"2024-01-01 00:00:{s:02d}.000000"  # noqa: E731
    region = lambda k: ["eu", "us"][k % 2]  # noqa: E731

    def write_dv(name, changes, with_op=True):
        cols = {}
        if with_op:
            cols["Op"] = pa.array([c[0] for c in changes], pa.string())
        cols["ts"] = pa.array([c[1] for c in changes], pa.string())
        cols["id"] = pa.array([c[2] for c in changes], pa.int64())
        cols["region"] = pa.array([c[3] for c in changes], pa.string())
        cols["v"] = pa.array([c[4] for c in changes], pa.string())
        pq.write_table(pa.table(cols), raw / name)

    model = {}

    def merge(name, changes, with_op=True):
        write_dv(name, changes, with_op)
        cli("merge", "--config", "tributary.toml", f"raw/dv/{name}", cwd=tmp_path)
        for op, _ts, k, r, v in changes:
            if op == "D":
                model.pop(k, None)
            else:
                model[k] = (r, v)

    con = connect()

    def check(when):
        want = sorted((k,) + v for k, v in model.items())
        assert rows(con, table, "id, region, v") == want, ("duckdb", when)
        dt = DeltaTable(str(table))
        got = QueryBuilder().register("t", dt).execute("SELECT id, region, v FROM t ORDER BY id").read_all()
        assert sorted(zip(*(got.column(c).to_pylist() for c in ("id", "region", "v")))) == want, ("deltalake", when)
        for k in [1, 2, 3, 8, 9, 10, 11, 12, 100, 101, 2999, 3001, 5000]:
            exp = [(k,) + model[k]] if k in model else []
            assert rows(con, table, "id, region, v", f"id = {k}") == exp, ("duckdb", when, k)
            got = QueryBuilder().register("t", dt).execute(f"SELECT id, region, v FROM t WHERE id = {k}").read_all()
            assert list(zip(*(got.column(c).to_pylist() for c in ("id", "region", "v")))) == exp, ("deltalake", when, k)
        lo, hi = 400, 1600
        exp = sum(1 for k in model if lo <= k <= hi)
        assert rows(con, table, "count(*)", f"id BETWEEN {lo} AND {hi}") == [(exp,)], ("duckdb", when)
        assert rows(con, table, "count(*)", "region = 'eu'") == [(sum(1 for v in model.values() if v[0] == "eu"),)], when

    def vectors():
        """The storage types of the vectors the newest merge committed, from its log entry
        (neither reader under test says which files have vectors)."""
        newest = max((table / "_delta_log").glob("*.json"))
        adds = [json.loads(line).get("add") for line in newest.read_text().splitlines()]
        return sorted(a["deletionVector"]["storageType"] for a in adds if a and a.get("deletionVector"))

    merge("LOAD00000001.parquet", [("I", ts(0), k, region(k), f"v{k}") for k in range(1, 3001)], with_op=False)
    merge("20240101-000001.parquet", [
        ("U", ts(1), 1, "us", "moved"),           # partition move
        ("U", ts(1), 2, "eu", "two"),             # in place
        ("D", ts(1), 3, "us", None),
        ("D", ts(1), 8, "eu", None),
        ("I", ts(1), 5000, "eu", "new"),
    ])
    assert vectors() == ["i", "i"], vectors()
    check("inline vectors")
    merge("20240101-000002.parquet", [
        ("I", ts(2), 3, "us", "back"),            # re-inserted after its delete
        ("U", ts(2), 2, "eu", "two again"),       # its first new version replaced
        ("D", ts(2), 9, "us", None),
    ])
    check("a vector extended")
    big = [("U", ts(3), k, region(k), f"b{k}") for k in range(10, 3000, 3)]
    merge("20240101-000003.parquet", big)
    assert "u" in vectors(), vectors()
    check("file-stored vectors")
    cli("maintain", "--config", "tributary.toml", cwd=tmp_path)
    check("after a compaction")
    merge("20240101-000004.parquet", [
        ("U", ts(4), 11, "eu", "after compaction"),
        ("D", ts(4), 12, "eu", None),
        ("U", ts(4), 100, "us", "moved again"),
    ])
    assert vectors(), "merges after the compaction write vectors again"
    check("vectors on compacted files")
