"""A reader that shares no code with delta-rs: DuckDB's `delta` extension (delta-kernel-rs,
the log replay and statistics-based file skipping other engines do), loaded from its PyPI
package (DuckDB would download it otherwise), and the manifest path Athena's manifest tables
and Redshift Spectrum read (the files a `_symlink_format_manifest` lists)."""

import glob
import os
from pathlib import Path

import duckdb
import duckdb_extension_delta
import pyarrow.parquet as pq


def connect():
    ext = glob.glob(os.path.join(os.path.dirname(duckdb_extension_delta.__file__),
                                 "extensions", "*", "delta.duckdb_extension"))
    assert ext, "duckdb-extension-delta ships no delta.duckdb_extension"
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{ext[0]}'")
    return con


def rows(con, table, select="*", where=None, order="1"):
    """Rows of a local Delta table through DuckDB's delta_scan, optionally filtered (the
    filter is pushed down: files are skipped by the log's statistics)."""
    sql = f"SELECT {select} FROM delta_scan('{Path(table).as_posix()}')"
    if where:
        sql += f" WHERE {where}"
    sql += f" ORDER BY {order}"
    return con.execute(sql).fetchall()


def manifest_files(table):
    """Data files the symlink manifests list, with their partition (folder) values."""
    out = []
    root = Path(table) / "_symlink_format_manifest"
    for m in sorted(root.rglob("manifest")):
        part = m.parent.relative_to(root).as_posix()
        for line in m.read_text().splitlines():
            if line.strip():
                out.append((part, line.strip()))
    return out


def manifest_row_count(table):
    total = 0
    for _, f in manifest_files(table):
        path = f[len("file://"):] if f.startswith("file://") else f
        total += pq.ParquetFile(path).metadata.num_rows
    return total
