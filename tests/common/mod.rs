//! Test helpers: a local-store fixture with a configurable table, DMS-shaped files for a
//! small `items` table, and reading the curated table back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tributary::deltalake::arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray,
};
use tributary::deltalake::arrow::compute::cast;
use tributary::deltalake::arrow::datatypes::{DataType, Field, Int64Type, Schema};
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

    /// The items table merged by delta-rs's MERGE (`merge_engine = "delta-rs"`) or by
    /// tributary's rewrite (the default): property tests run half their cases with each.
    pub fn items_merged_by(delta_rs_merge: bool) -> Fixture {
        match delta_rs_merge {
            true => Fixture::new(&format!("{ITEMS_TABLE}merge_engine = \"delta-rs\"\n")),
            false => Fixture::items(),
        }
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

    pub async fn items_rows(&self) -> Vec<Row> {
        read_rows(
            &self.url("curated/items"),
            "SELECT id, part, val FROM t ORDER BY id",
        )
        .await
    }
}

/// Read (id, part, val) rows of a table with the given SQL.
pub async fn read_rows(table: &Url, sql: &str) -> Vec<Row> {
    let t = delta::open(table, &Default::default()).await.expect("open");
    if !delta::exists(&t) {
        return vec![];
    }
    rows_of(&delta::query(&t, sql).await.expect("query"))
}

/// The (id, part, val) rows of query results, in their order.
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

    /// Run SQL against a curated table (`rel` under the fixture dir), table registered as `t`.
    pub async fn query(&self, rel: &str, sql: &str) -> Vec<RecordBatch> {
        let t = delta::open(&self.url(rel), &Default::default())
            .await
            .expect("open");
        delta::query(&t, sql).await.expect("query")
    }

    /// The error of a file that must have failed.
    pub fn failure<'a>(r: &'a tributary::ProcessReport, file: &Url) -> &'a tributary::Error {
        match r.files.iter().find(|f| &f.file == file).map(|f| &f.status) {
            Some(tributary::FileStatus::Failed { error, .. }) => error,
            other => panic!("{file} should have failed, got {other:?}"),
        }
    }
}

/// Every value of the query's first column as text (NULL for nulls), in order.
pub fn column_text(batches: &[RecordBatch]) -> Vec<String> {
    use tributary::deltalake::arrow::util::display::array_value_to_string;
    let mut out = Vec::new();
    for b in batches {
        for i in 0..b.num_rows() {
            out.push(if b.column(0).is_null(i) {
                "NULL".to_string()
            } else {
                array_value_to_string(b.column(0), i).expect("display")
            });
        }
    }
    out
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
