"""DMS-shaped test data, written independently of the Rust code: a simulated source table
(`travel_details` of the AWS walkthrough) whose statements produce the rows DMS would write,
and Parquet encoding of full-load and CDC files."""

import csv
import gzip
import io
import random
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

CITIES = ["Seattle", "New York", "New Jersey", "Los Angeles", "Las Vegas", "Tucson",
          "Washington DC", "Philadelphia", "Miami", "San Francisco"]

SCHEMA = pa.schema([
    ("update_ts_dms", pa.string()),
    ("schema_name", pa.string()),
    ("table_name", pa.string()),
    ("trip_id", pa.int32()),
    ("tstamp", pa.timestamp("us")),
    ("route_id", pa.string()),
    ("destination", pa.string()),
    ("source_location", pa.string()),
])


def parquet(rows, with_op):
    """rows: list of (op, commit_ts, trip_id, row-dict)."""
    cols = {
        "update_ts_dms": [r[1] for r in rows],
        "schema_name": ["delta_emr_source"] * len(rows),
        "table_name": ["travel_details"] * len(rows),
        "trip_id": [r[2] for r in rows],
        "tstamp": [r[3]["tstamp"] for r in rows],
        "route_id": [r[3]["route_id"] for r in rows],
        "destination": [r[3]["destination"] for r in rows],
        "source_location": [r[3]["source_location"] for r in rows],
    }
    schema = SCHEMA
    if with_op:
        cols = {"Op": [r[0] for r in rows], **cols}
        schema = pa.schema([("Op", pa.string())] + list(SCHEMA))
    table = pa.Table.from_pydict(cols, schema=schema)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="snappy")
    return buf.getvalue()


CSV_COLUMNS = [f.name for f in SCHEMA]


def csv_gz(rows, with_op):
    """The same rows as DMS writes them with DataFormat=csv, CompressionType=GZIP (no header,
    Op first in CDC files; the rows have no NULL): a `.csv.gz` object."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for op, ts, trip_id, row in rows:
        line = [ts, "delta_emr_source", "travel_details", trip_id,
                row["tstamp"].strftime("%Y-%m-%d %H:%M:%S"), row["route_id"],
                row["destination"], row["source_location"]]
        w.writerow(([op] if with_op else []) + line)
    return gzip.compress(buf.getvalue().encode())


@dataclass
class Source:
    """The source database table and the change files DMS writes for it."""
    seed: int = 0
    rows: dict = field(default_factory=dict)
    clock: int = 0

    def __post_init__(self):
        self.rng = random.Random(self.seed)

    def _ts(self):
        self.clock += 1
        return f"2022-10-25 21:{self.clock // 60 % 60:02d}:{self.clock % 60:02d}.{self.clock:06d}"

    def _row(self, trip_id):
        import datetime
        return {
            "tstamp": datetime.datetime(2022, 10, 25, 20, 0, 0),
            "route_id": chr(65 + trip_id % 10),
            "destination": self.rng.choice(CITIES),
            "source_location": self.rng.choice(CITIES),
        }

    def insert_records(self, n):
        start = max(self.rows, default=0)
        ts = self._ts()
        out = []
        for trip_id in range(start + 1, start + n + 1):
            self.rows[trip_id] = self._row(trip_id)
            out.append(("I", ts, trip_id, dict(self.rows[trip_id])))
        return out

    def update(self, where, **changes):
        ts = self._ts()
        out = []
        for trip_id, row in sorted(self.rows.items()):
            if where(row):
                row.update(changes)
                out.append(("U", ts, trip_id, dict(row)))
        return out

    def delete(self, where):
        ts = self._ts()
        out = []
        for trip_id in [t for t, r in sorted(self.rows.items()) if where(r)]:
            out.append(("D", ts, trip_id, self.rows.pop(trip_id)))
        return out

    def random_changes(self, n):
        """n single-row statements: inserts, updates (moving partitions too) and deletes."""
        out = []
        for _ in range(n):
            roll = self.rng.random()
            if not self.rows or roll < 0.3:
                out += self.insert_records(1)
            elif roll < 0.8:
                t = self.rng.choice(sorted(self.rows))
                out += self.update(lambda r, t=t, rows=self.rows: r is rows[t],
                                   destination=self.rng.choice(CITIES),
                                   route_id=chr(65 + self.rng.randrange(10)))
            else:
                t = self.rng.choice(sorted(self.rows))
                out += self.delete(lambda r, t=t, rows=self.rows: r is rows[t])
        return out

    def state(self):
        return {t: (r["route_id"], r["destination"], r["source_location"]) for t, r in self.rows.items()}


def history_model(changes):
    """SCD type 2 versions of changes in their true order (all columns tracked): rows of
    (trip_id, destination, valid_from, valid_to, iscurrent)."""
    out, open_ = [], {}
    tracked = lambda row: (row["route_id"], row["destination"], row["source_location"], row["tstamp"])
    for op, ts, trip_id, row in changes:
        cur = open_.get(trip_id)
        if op == "D":
            if cur:
                out.append((trip_id, cur[1]["destination"], cur[0], ts, False))
                del open_[trip_id]
            continue
        if cur and tracked(cur[1]) == tracked(row):
            open_[trip_id] = (cur[0], row)
            continue
        if cur:
            out.append((trip_id, cur[1]["destination"], cur[0], ts, False))
        open_[trip_id] = (ts, row)
    out += [(t, row["destination"], start, None, True) for t, (start, row) in open_.items()]
    return sorted(out)


def seed_files(source, full_load_rows=20000, new_rows=200):
    """The walkthrough: full load (two LOAD files), insert_records(200), Miami → Tucson,
    delete Los Angeles. Returns [(relative key, bytes)] in the order DMS writes them."""
    load = source.insert_records(full_load_rows)
    half = (len(load) + 1) // 2
    transfer = "2022-10-25 23:59:59.000000"  # full-load rows carry the transfer time
    files = [
        ("LOAD00000001.parquet", parquet([(None, transfer, *r[2:]) for r in load[:half]], False)),
        ("LOAD00000002.parquet", parquet([(None, transfer, *r[2:]) for r in load[half:]], False)),
    ]
    files.append(("2022/10/25/20221025-2105000000.parquet", parquet(source.insert_records(new_rows), True)))
    files.append(("2022/10/25/20221025-2110000000.parquet",
                  parquet(source.update(lambda r: r["destination"] == "Miami", destination="Tucson"), True)))
    files.append(("2022/10/25/20221025-2115000000.parquet",
                  parquet(source.delete(lambda r: r["destination"] == "Los Angeles"), True)))
    return files
