//! Test helpers: a local-store fixture with a configurable table, DMS-shaped files for a
//! small `items` table, and reading the curated table back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tributary::deltalake::arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, Int64Array, RecordBatch, Scalar, StringArray,
    UInt32Array,
};
use tributary::deltalake::arrow::compute::kernels::cmp::{eq, gt, lt};
use tributary::deltalake::arrow::compute::{
    cast, concat_batches, filter_record_batch, lexsort_to_indices, take, take_record_batch,
    SortColumn, SortOptions,
};
use tributary::deltalake::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use tributary::deltalake::arrow::util::display::array_value_to_string;
use tributary::deltalake::DeltaTable;
use tributary::scan::Scan;
use tributary::{delta, demo, Config, Engine};
use url::Url;

/// One change of the `items` source table: id (key), part (partition column), val.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub op: char,
    pub ts: String,
    pub id: i64,
    pub part: String,
    pub val: i64,
}

impl Change {
    pub fn new(op: char, ts: &str, id: i64, part: &str, val: i64) -> Self {
        Change {
            op,
            ts: ts.into(),
            id,
            part: part.into(),
            val,
        }
    }
}

/// Shorthand for [`Change::new`].
pub fn c(op: char, ts: &str, id: i64, part: &str, val: i64) -> Change {
    Change::new(op, ts, id, part, val)
}

/// A curated row: (id, part, val).
pub type Row = (i64, String, i64);

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub engine: Engine,
}

pub const ITEMS_TABLE: &str = r#"
[[table]]
name = "items"
source = "raw/shop/items/"
target = "curated/items"
primary_key = ["id"]
partition_by = ["part"]
sequence_by = ["ts"]
drop_columns = ["ts"]
"#;

impl Fixture {
    /// A fixture with the given config text (relative paths resolve in the temp dir).
    pub fn new(config: &str) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tributary.toml");
        std::fs::write(&path, config).expect("write config");
        let engine = Engine::new(Config::from_path(&path).expect("valid config"));
        Fixture { dir, engine }
    }

    pub fn items() -> Fixture {
        Fixture::new(ITEMS_TABLE)
    }

    /// Another engine (a separate "Lambda instance") over the same config.
    pub fn another_engine(&self) -> Engine {
        Engine::new(Config::from_path(&self.dir.path().join("tributary.toml")).expect("config"))
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn url(&self, rel: &str) -> Url {
        Url::from_file_path(self.path(rel)).expect("url")
    }

    /// Write raw bytes to `raw/shop/items/<name>` and return its URL.
    pub fn put_raw(&self, table_prefix: &str, name: &str, data: &[u8]) -> Url {
        let p = self.path(&format!("raw/{table_prefix}/{name}"));
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, data).expect("write raw");
        Url::from_file_path(&p).expect("url")
    }

    /// Write an `items` CDC (or LOAD) Parquet file.
    pub fn put_items(&self, name: &str, changes: &[Change]) -> Url {
        let with_op = !name.starts_with("LOAD");
        self.put_raw("shop/items", name, &items_parquet(changes, with_op))
    }

    /// Merge files; panics with the error if any failed.
    pub async fn merge_ok(&self, files: &[Url]) -> tributary::ProcessReport {
        let r = self.engine.process(files).await;
        if let Some(f) = r.failures().next() {
            panic!("merge failed: {:?}", f);
        }
        r
    }

    /// The (id, part, val) rows of the `items` table, by id.
    pub async fn items_rows(&self) -> Vec<Row> {
        read_rows(&self.url("curated/items")).await
    }
}

/// The (id, part, val) rows of a table, by id (none when it has no version yet).
pub async fn read_rows(table: &Url) -> Vec<Row> {
    let t = delta::open(table, &Default::default()).await.expect("open");
    if !delta::exists(&t) {
        return vec![];
    }
    rows_of(&[table_batch(&t, &["id", "part", "val"], &["id"]).await])
}

/// The (id, part, val) rows of batches of those three columns, in their order.
pub fn rows_of(batches: &[RecordBatch]) -> Vec<Row> {
    let mut out = Vec::new();
    for b in batches {
        let id = cast(b.column(0), &DataType::Int64).expect("id");
        let id = id.as_primitive::<Int64Type>();
        let part = cast(b.column(1), &DataType::Utf8).expect("part");
        let part = part.as_string::<i32>();
        let val = cast(b.column(2), &DataType::Int64).expect("val");
        let val = val.as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            out.push((id.value(i), part.value(i).to_string(), val.value(i)));
        }
    }
    out
}

/// The `items` rows as DMS would write them (Op first for CDC files).
pub fn items_batch(changes: &[Change], with_op: bool) -> RecordBatch {
    let mut fields = Vec::new();
    let mut cols: Vec<ArrayRef> = Vec::new();
    if with_op {
        fields.push(Field::new("Op", DataType::Utf8, true));
        cols.push(Arc::new(StringArray::from_iter_values(
            changes.iter().map(|c| c.op.to_string()),
        )));
    }
    fields.push(Field::new("ts", DataType::Utf8, true));
    cols.push(Arc::new(StringArray::from_iter_values(
        changes.iter().map(|c| c.ts.clone()),
    )));
    fields.push(Field::new("id", DataType::Int64, true));
    cols.push(Arc::new(Int64Array::from_iter_values(
        changes.iter().map(|c| c.id),
    )));
    fields.push(Field::new("part", DataType::Utf8, true));
    cols.push(Arc::new(StringArray::from_iter_values(
        changes.iter().map(|c| c.part.clone()),
    )));
    fields.push(Field::new("val", DataType::Int64, true));
    cols.push(Arc::new(Int64Array::from_iter_values(
        changes.iter().map(|c| c.val),
    )));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).expect("batch")
}

/// [`items_batch`] with `id` and `val` as 32-bit integers (a source before its columns
/// were widened to `bigint`); every value must fit.
pub fn items_batch_int32(changes: &[Change], with_op: bool) -> RecordBatch {
    let b = items_batch(changes, with_op);
    let schema = b.schema();
    let mut fields = Vec::new();
    let mut cols = Vec::new();
    for (f, c) in schema.fields().iter().zip(b.columns()) {
        if f.name() == "id" || f.name() == "val" {
            fields.push(Field::new(f.name(), DataType::Int32, true));
            cols.push(cast(c, &DataType::Int32).expect("fits int32"));
        } else {
            fields.push(f.as_ref().clone());
            cols.push(c.clone());
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).expect("batch")
}

pub fn items_parquet(changes: &[Change], with_op: bool) -> Bytes {
    demo::to_parquet(&items_batch(changes, with_op)).expect("parquet")
}

/// Apply changes in true order to a model of the source table.
pub fn model(changes: &[Change]) -> Vec<Row> {
    let mut m: BTreeMap<i64, (String, i64)> = BTreeMap::new();
    for c in changes {
        match c.op {
            'D' => {
                m.remove(&c.id);
            }
            _ => {
                m.insert(c.id, (c.part.clone(), c.val));
            }
        }
    }
    m.into_iter().map(|(id, (p, v))| (id, p, v)).collect()
}

/// Every data file (`*.parquet`) under a table folder, live or not, outside `_delta_log` and
/// other hidden (`_…`) folders.
pub fn parquet_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() && !name.starts_with('_') {
                stack.push(p);
            } else if name.ends_with(".parquet") {
                out.push(p);
            }
        }
    }
    out
}

/// Count files of the curated table (live data files only).
pub async fn live_files(table: &Url) -> usize {
    let t = delta::open(table, &Default::default()).await.expect("open");
    t.get_file_uris().map(|i| i.count()).unwrap_or(0)
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}

/// A consistent random history of the `items` source: inserts of absent keys, updates and
/// deletes of present keys, with non-decreasing commit timestamps (ties = one transaction).
/// Returns (full-load rows, CDC files in DMS order).
pub fn history(
    seed: u64,
    keys: i64,
    changes: usize,
    max_file: usize,
) -> (Vec<Change>, Vec<Vec<Change>>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let parts = ["a", "b", "c"];
    let mut present: std::collections::BTreeSet<i64> = Default::default();
    let mut load = Vec::new();
    for id in 0..keys {
        if rng.random_bool(0.4) {
            present.insert(id);
            // full-load rows are stamped with the transfer time: later than any CDC change
            load.push(Change::new(
                'I',
                "2099-01-01 00:00:00.000000",
                id,
                parts[rng.random_range(0..3)],
                rng.random_range(0..1000),
            ));
        }
    }
    let mut t = 0u64;
    let mut stream = Vec::new();
    for _ in 0..changes {
        if rng.random_bool(0.7) {
            t += 1;
        }
        let ts = format!("2024-01-01 00:00:00.{t:06}");
        let id = rng.random_range(0..keys);
        let part = parts[rng.random_range(0..3)];
        let val = rng.random_range(0..1000);
        let op = if present.contains(&id) {
            if rng.random_bool(0.3) {
                'D'
            } else {
                'U'
            }
        } else {
            'I'
        };
        if op == 'D' {
            present.remove(&id);
        } else {
            present.insert(id);
        }
        stream.push(Change::new(op, &ts, id, part, val));
    }
    let mut files = Vec::new();
    let mut i = 0;
    while i < stream.len() {
        let n = rng.random_range(1..=max_file).min(stream.len() - i);
        files.push(stream[i..i + n].to_vec());
        i += n;
    }
    (load, files)
}

/// Write the files; returns their URLs (LOAD first) and the expected final rows.
pub fn land(fx: &Fixture, load: &[Change], files: &[Vec<Change>]) -> (Vec<url::Url>, Vec<Row>) {
    let mut urls = Vec::new();
    if !load.is_empty() {
        urls.push(fx.put_items("LOAD00000001.parquet", load));
    }
    for (n, f) in files.iter().enumerate() {
        urls.push(fx.put_items(&format!("2024/01/01/20240101-{:010}.parquet", n + 1), f));
    }
    let mut all = load.to_vec();
    all.extend(files.iter().flatten().cloned());
    (urls, model(&all))
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A table `t` keyed by `id`, ordered by `ts` (dropped), unpartitioned, under `raw/t/`.
pub const T_TABLE: &str = r#"
[[table]]
name = "t"
source = "raw/t/"
target = "curated/t"
primary_key = ["id"]
sequence_by = ["ts"]
drop_columns = ["ts"]
"#;

/// A record batch from named columns (all nullable).
pub fn batch(cols: Vec<(&str, ArrayRef)>) -> RecordBatch {
    let fields: Vec<Field> = cols
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        cols.into_iter().map(|(_, a)| a).collect(),
    )
    .expect("batch")
}

/// A Utf8 column.
pub fn strings(v: &[&str]) -> ArrayRef {
    Arc::new(StringArray::from(v.to_vec()))
}

impl Fixture {
    /// Write a batch as Parquet to `raw/<table_prefix>/<name>`.
    pub fn put_batch(&self, table_prefix: &str, name: &str, b: &RecordBatch) -> Url {
        self.put_raw(table_prefix, name, &demo::to_parquet(b).expect("parquet"))
    }

    /// Maintain the fixture's (first) table, as the maintenance function does.
    pub async fn maintain(&self) -> tributary::maintenance::MaintenanceReport {
        let t = &self.engine.config().tables[0];
        tributary::maintenance::maintain(
            t,
            self.engine.storage(),
            self.engine.storage_options(),
            Default::default(),
        )
        .await
        .expect("maintenance")
    }

    /// A curated table (`rel` under the fixture dir), at its newest version.
    pub async fn table(&self, rel: &str) -> DeltaTable {
        delta::open(&self.url(rel), &Default::default())
            .await
            .expect("open")
    }

    /// [`table_batch`] of the table `rel`.
    pub async fn batch(&self, rel: &str, columns: &[&str], order_by: &[&str]) -> RecordBatch {
        table_batch(&self.table(rel).await, columns, order_by).await
    }

    /// [`text_values`] of the table `rel`'s rows ([`table_batch`]).
    pub async fn values(
        &self,
        rel: &str,
        columns: &[&str],
        order_by: &[&str],
    ) -> Vec<Vec<Option<String>>> {
        text_values(&self.batch(rel, columns, order_by).await)
    }

    /// [`text_rows`] of the table `rel`'s rows ([`table_batch`]).
    pub async fn rows(&self, rel: &str, columns: &[&str], order_by: &[&str]) -> Vec<Vec<String>> {
        text_rows(&self.batch(rel, columns, order_by).await)
    }

    /// One column of the table `rel` as text (`NULL` for nulls), rows sorted by `order_by`.
    pub async fn column(&self, rel: &str, column: &str, order_by: &[&str]) -> Vec<String> {
        let rows = self.rows(rel, &[column], order_by).await;
        rows.into_iter().map(|mut r| r.remove(0)).collect()
    }

    /// The names of the table `rel`'s columns, in its schema's order.
    pub async fn columns(&self, rel: &str) -> Vec<String> {
        let t = self.table(rel).await;
        let schema = t.snapshot().expect("snapshot").snapshot().arrow_schema();
        schema.fields().iter().map(|f| f.name().clone()).collect()
    }

    /// The error of a file that must have failed.
    pub fn failure<'a>(r: &'a tributary::ProcessReport, file: &Url) -> &'a tributary::Error {
        match r.files.iter().find(|f| &f.file == file).map(|f| &f.status) {
            Some(tributary::FileStatus::Failed { error, .. }) => error,
            other => panic!("{file} should have failed, got {other:?}"),
        }
    }
}

/// A table's rows as one batch, read by tributary's own scan (deletion vectors applied):
/// `columns` (every column when empty), sorted by the `order_by` columns (ascending, nulls
/// last, as SQL's `ORDER BY`), which need not be among them.
pub async fn table_batch(t: &DeltaTable, columns: &[&str], order_by: &[&str]) -> RecordBatch {
    let Ok(snapshot) = t.snapshot() else {
        return RecordBatch::new_empty(Arc::new(Schema::empty()));
    };
    let scan = match columns.is_empty() {
        true => Scan::default(),
        false => {
            let mut read = columns.to_vec();
            read.extend(order_by.iter().filter(|c| !columns.contains(c)));
            Scan::columns(&read)
        }
    };
    let batches = scan.rows(t).await.expect("scan");
    let schema: SchemaRef = match (batches.first(), &scan.columns) {
        (Some(b), _) => b.schema(),
        (None, None) => snapshot.snapshot().arrow_schema(),
        (None, Some(read)) => {
            let all = snapshot.snapshot().arrow_schema();
            let fields: Vec<Field> = read
                .iter()
                .map(|c| all.field_with_name(c).expect("column").clone())
                .collect();
            Arc::new(Schema::new(fields))
        }
    };
    let b = concat_batches(&schema, &batches).expect("concat");
    let b = match order_by.is_empty() {
        true => b,
        false => {
            let keys: Vec<SortColumn> = order_by
                .iter()
                .map(|c| SortColumn {
                    values: b.column_by_name(c).expect("order column").clone(),
                    options: Some(SortOptions {
                        descending: false,
                        nulls_first: false,
                    }),
                })
                .collect();
            let order = lexsort_to_indices(&keys, None).expect("sort");
            take_record_batch(&b, &order).expect("take")
        }
    };
    match columns.is_empty() {
        true => b,
        false => {
            let at: Vec<usize> = columns
                .iter()
                .map(|c| b.schema().index_of(c).expect("column"))
                .collect();
            b.project(&at).expect("project")
        }
    }
}

/// [`text_rows`] of a table's rows ([`table_batch`]).
pub async fn table_rows(t: &DeltaTable, columns: &[&str], order_by: &[&str]) -> Vec<Vec<String>> {
    text_rows(&table_batch(t, columns, order_by).await)
}

/// Each row's values as text, as SQL's `CAST(… AS VARCHAR)` writes them (arrow's display:
/// `1.50` for a decimal(10,2), `2024-01-01T00:00:00Z` for a UTC timestamp; binary as hex,
/// which `CAST` would decode as UTF-8 instead); `None` for nulls.
pub fn text_values(b: &RecordBatch) -> Vec<Vec<Option<String>>> {
    (0..b.num_rows())
        .map(|i| {
            b.columns()
                .iter()
                .map(|c| {
                    c.is_valid(i)
                        .then(|| array_value_to_string(c, i).expect("display"))
                })
                .collect()
        })
        .collect()
}

/// [`text_values`] with `NULL` for nulls.
pub fn text_rows(b: &RecordBatch) -> Vec<Vec<String>> {
    text_values(b)
        .into_iter()
        .map(|r| {
            r.into_iter()
                .map(|v| v.unwrap_or_else(|| "NULL".to_string()))
                .collect()
        })
        .collect()
}

/// SQL's `CONCAT` of values: nulls as empty text.
pub fn concat(values: &[Option<String>]) -> String {
    values.iter().flatten().map(String::as_str).collect()
}

/// SQL's `CONCAT_WS(sep, …)` of values: nulls left out, separator and all.
pub fn concat_ws(sep: &str, values: &[Option<String>]) -> String {
    let present: Vec<&str> = values.iter().flatten().map(String::as_str).collect();
    present.join(sep)
}

/// The rows whose `column` holds `value` (text of a value of the column's type), `columns`
/// as text ([`text_rows`]), read as a reader that skips files by the log's statistics reads
/// them: only the live files whose minimum and maximum of `column` can hold the value.
pub async fn rows_where(
    t: &DeltaTable,
    column: &str,
    value: &str,
    columns: &[&str],
) -> Vec<Vec<String>> {
    let snapshot = t.snapshot().expect("snapshot");
    let schema = snapshot.snapshot().arrow_schema();
    let field = schema.field_with_name(column).expect("column");
    let text: ArrayRef = Arc::new(StringArray::from(vec![value]));
    let wanted = cast(&text, field.data_type()).expect("a value of the column's type");
    assert!(wanted.is_valid(0), "{value:?} is no {}", field.data_type());
    let files = snapshot.add_actions_table(true).expect("files");
    let paths = cast(files.column_by_name("path").expect("path"), &DataType::Utf8).expect("text");
    let paths = paths.as_string::<i32>();
    let bound = |which: &str| files.column_by_name(&format!("{which}.{column}")).cloned();
    let (min, max) = (bound("min"), bound("max"));
    let dv = files
        .column_by_name("deletion_vector.storage_type")
        .cloned();
    let mut out = Vec::new();
    for i in 0..files.num_rows() {
        let may_hold = match (&min, &max) {
            (Some(lo), Some(hi)) if lo.is_valid(i) && hi.is_valid(i) => {
                let v = Scalar::new(cast(&wanted, lo.data_type()).expect("bound type"));
                let (lo, hi) = (lo.slice(i, 1), hi.slice(i, 1));
                !gt(&lo, &v).expect("cmp").value(0) && !lt(&hi, &v).expect("cmp").value(0)
            }
            _ => true,
        };
        if !may_hold {
            continue;
        }
        assert!(
            dv.as_ref().is_none_or(|d| d.is_null(i)),
            "a deletion vector: not read by this helper"
        );
        let b = read_data_file(
            &data_path(t.table_url(), paths.value(i)),
            &schema,
            |c, n| {
                let p = files.column_by_name(&format!("partition.{c}"))?;
                Some(take(p, &UInt32Array::from(vec![i as u32; n]), None).expect("take"))
            },
        );
        let found = eq(
            b.column_by_name(column).expect("column"),
            &Scalar::new(&wanted),
        )
        .expect("cmp");
        let b = filter_record_batch(&b, &found).expect("filter");
        let at: Vec<usize> = columns
            .iter()
            .map(|c| b.schema().index_of(c).expect("column"))
            .collect();
        out.extend(text_rows(&b.project(&at).expect("project")));
    }
    out
}

/// The local path of a file the log names by `path` (a URI reference, relative to the
/// table's folder `table`, or absolute).
pub fn data_path(table: &Url, path: &str) -> PathBuf {
    let mut base = table.clone();
    if !base.path().ends_with('/') {
        base.set_path(&format!("{}/", base.path()));
    }
    base.join(path)
        .expect("file URL")
        .to_file_path()
        .expect("local file")
}

/// A Parquet data file's rows in `schema`: each column the file has, cast to its type; the
/// others from `other(column, rows)` (partition values, constants), or null.
pub fn read_data_file(
    path: &Path,
    schema: &Schema,
    other: impl Fn(&str, usize) -> Option<ArrayRef>,
) -> RecordBatch {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use tributary::deltalake::arrow::array::RecordBatchReader;
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .expect("parquet")
        .build()
        .expect("reader");
    let file_schema = reader.schema();
    let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>().expect("read");
    let b = concat_batches(&file_schema, &batches).expect("concat");
    let n = b.num_rows();
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| match b.column_by_name(f.name()) {
            Some(c) => cast(c, f.data_type()).expect("the table's type"),
            None => other(f.name(), n).unwrap_or_else(|| new_null_array(f.data_type(), n)),
        })
        .collect();
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("batch")
}

/// A table's change data feed from version `from` to its newest, as the Delta protocol
/// defines it: per commit, the rows of its `cdc` files; in a commit without them, the rows
/// of the files it adds as inserts and of those it removes as deletes (data changes only).
/// Every column of the table in its current types, then `_change_type` and
/// `_commit_version`, in commit order.
pub async fn change_data_feed(table: &Url, from: u64) -> RecordBatch {
    let t = delta::open(table, &Default::default()).await.expect("open");
    let latest = t.version().expect("a version");
    let table_schema = t.snapshot().expect("snapshot").snapshot().arrow_schema();
    let mut fields: Vec<Field> = table_schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("_change_type", DataType::Utf8, true));
    fields.push(Field::new("_commit_version", DataType::Int64, true));
    let schema = Schema::new(fields);
    let dir = table.to_file_path().expect("local table");
    let mut parts = Vec::new();
    for version in from..=latest {
        let log = dir.join(format!("_delta_log/{version:020}.json"));
        let text =
            std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let (mut cdc, mut add, mut remove) = (Vec::new(), Vec::new(), Vec::new());
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let action: serde_json::Value = serde_json::from_str(line).expect("action");
            let data_change = |a: &serde_json::Value| a["dataChange"].as_bool().unwrap_or(false);
            if let Some(a) = action.get("cdc") {
                cdc.push(a.clone());
            } else if let Some(a) = action.get("add").filter(|a| data_change(a)) {
                add.push(a.clone());
            } else if let Some(a) = action.get("remove").filter(|a| data_change(a)) {
                remove.push(a.clone());
            }
        }
        let files: Vec<(serde_json::Value, Option<&str>)> = match cdc.is_empty() {
            false => cdc.into_iter().map(|a| (a, None)).collect(),
            true => {
                let added: Vec<&serde_json::Value> = add.iter().map(|a| &a["path"]).collect();
                assert!(
                    remove.iter().all(|r| !added.contains(&&r["path"])),
                    "version {version}: a file added and removed (a deletion vector's change): \
                     not read by this helper"
                );
                let inserts = add.into_iter().map(|a| (a, Some("insert")));
                inserts
                    .chain(remove.into_iter().map(|a| (a, Some("delete"))))
                    .collect()
            }
        };
        for (action, change) in files {
            assert!(
                action["deletionVector"].is_null(),
                "version {version}: a deletion vector: not read by this helper"
            );
            let path = data_path(table, action["path"].as_str().expect("path"));
            parts.push(read_data_file(&path, &schema, |column, n| {
                let value: Option<String> = match column {
                    "_change_type" => Some(change?.to_string()),
                    "_commit_version" => {
                        return Some(Arc::new(Int64Array::from(vec![version as i64; n])));
                    }
                    c => match action["partitionValues"].get(c)? {
                        serde_json::Value::String(s) => Some(s.clone()),
                        _ => None,
                    },
                };
                let text: ArrayRef = Arc::new(StringArray::from(vec![value; n]));
                let to = schema.field_with_name(column).expect("field").data_type();
                Some(cast(&text, to).expect("partition value"))
            }));
        }
    }
    let schema = match parts.first() {
        Some(b) => b.schema(),
        None => Arc::new(schema),
    };
    concat_batches(&schema, &parts).expect("concat")
}

/// A buffer the log lines of a test go to.
#[derive(Clone, Default)]
pub struct Lines(pub Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// What was logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Whether any commit of the table `rel` (under the fixture's folder) holds `needle`, e.g.
/// `"deletionVector"`: that a scenario run with deletion vectors on wrote some.
pub fn log_mentions(fx: &Fixture, rel: &str, needle: &str) -> bool {
    std::fs::read_dir(fx.path(&format!("{rel}/_delta_log")))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|s| s.contains(needle)))
        })
        .unwrap_or(false)
}
