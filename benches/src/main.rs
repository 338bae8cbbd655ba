//! tributary-bench: generate DMS workloads shaped like the seed table (partitioned by
//! route_id) at scale and measure the merge engine on them.
//!
//! ```text
//! tributary-bench prepare --dir D --rows N            base Delta table of N rows (cached)
//! tributary-bench files --dir D --rows N --changes C --mix M --count K
//!                                                      K DMS CDC files of C changes each
//! tributary-bench run --dir D --rows N --changes C --mix M --count K
//!                                                      copy the base table, merge the K files one
//!                                                      by one, then maintain; print one JSON line
//! ```
//! `benches/run.sh` drives the matrix (and the Python deltalake comparison) and writes
//! `docs/benchmarks.md` numbers; see there.
// The engine's futures (merge, whole-file append, history) nest deeper than the default
// limit allows when the release build computes their layout.
#![recursion_limit = "256"]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tributary::deltalake::arrow::array::{
    ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use tributary::deltalake::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use tributary::deltalake::DeltaTable;
use tributary::{delta, demo, manifest, Config, Engine, ProcessReport, TableConfig};

const CITIES: [&str; 10] = demo::CITIES;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, ValueEnum, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum Mix {
    /// 40 % inserts of new keys, 55 % updates of the newest 5 % of keys, 5 % deletes of those.
    Realistic,
    /// 95 % updates and 5 % deletes spread uniformly over all keys.
    Worst,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write the base Delta table of N rows (cached); with `--history`, also a history
    /// table with one version per row.
    Prepare {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        rows: i64,
        #[arg(long)]
        history: bool,
        /// The base table's Parquet codec (the table's `parquet_compression`).
        #[arg(long, default_value = "snappy")]
        compression: String,
        /// The base table's order-key encoding (the table's `order_key_encoding`).
        #[arg(long, default_value = "plain")]
        order_keys: String,
    },
    /// Write the workload's CDC files (cached), print their paths.
    Files(Workload),
    /// Copy the base table, merge the files one by one, then maintain; print one JSON line.
    Run(RunArgs),
    /// The read/write floor: read `--mb` MB of the base table's data files into Arrow and
    /// write them back as Parquet with the settings tributary's MERGE writes (both cores, one
    /// thread per core); print one JSON line.
    Floor {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        rows: i64,
        /// How many MB of data files (e.g. a case's MB rewritten per merge).
        #[arg(long)]
        mb: f64,
        #[arg(long, default_value = "snappy")]
        compression: String,
        #[arg(long, default_value = "plain")]
        order_keys: String,
        /// Threads (default: the machine's cores).
        #[arg(long)]
        threads: Option<usize>,
        #[arg(long, default_value_t = 5)]
        repeat: usize,
    },
}

// A workload: the base table size and the CDC files merged into it.
#[derive(clap::Args)]
struct Workload {
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    rows: i64,
    #[arg(long)]
    changes: usize,
    #[arg(long, value_enum)]
    mix: Mix,
    #[arg(long, default_value_t = 10)]
    count: usize,
}

#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    workload: Workload,
    /// Keep manifests on (default, as shipped).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    manifests: bool,
    /// Merge-on-read: the table's `deletion_vectors = true` (and `manifests = false`).
    #[arg(long)]
    deletion_vectors: bool,
    /// Leave the table as the merges left it (no maintenance run after them): for reading
    /// it before maintenance (`benches/readers.py`).
    #[arg(long)]
    no_maintain: bool,
    /// Run maintenance (compaction) on the copied base table before the merges, to
    /// measure merges against the layout maintenance leaves behind.
    #[arg(long)]
    maintain_first: bool,
    /// The table's `target_file_size_mb` (compaction target); tributary's default if unset.
    #[arg(long)]
    target_file_size_mb: Option<f64>,
    /// Also keep a history (SCD type 2) table, from the base one `prepare --history` wrote.
    #[arg(long)]
    history: bool,
    /// The table's `parquet_compression`; the base table `prepare --compression` wrote.
    #[arg(long, default_value = "snappy")]
    compression: String,
    /// The table's `order_key_encoding`; the base table `prepare --order-keys` wrote.
    #[arg(long, default_value = "plain")]
    order_keys: String,
}

fn schema(with_dms: bool) -> Arc<Schema> {
    let mut f = Vec::new();
    if with_dms {
        f.push(Field::new("Op", DataType::Utf8, true));
        f.push(Field::new("update_ts_dms", DataType::Utf8, true));
    }
    f.extend([
        Field::new("trip_id", DataType::Int64, true),
        Field::new(
            "tstamp",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("route_id", DataType::Utf8, true),
        Field::new("destination", DataType::Utf8, true),
        Field::new("source_location", DataType::Utf8, true),
    ]);
    if !with_dms {
        f.push(Field::new("_tributary_seq", DataType::Utf8, true));
    }
    Arc::new(Schema::new(f))
}

fn route(id: i64) -> String {
    ((b'A' + (id % 10) as u8) as char).to_string()
}

/// The trip columns (`trip_id`, `tstamp`, `route_id`, `destination`, `source_location`).
fn trip_columns(ids: &[i64], tstamp_micros: i64, rng: &mut StdRng) -> Vec<ArrayRef> {
    let n = ids.len();
    let mut city = || CITIES[rng.random_range(0..10)];
    let destination = StringArray::from_iter_values((0..n).map(|_| city()));
    let source_location = StringArray::from_iter_values((0..n).map(|_| city()));
    vec![
        Arc::new(Int64Array::from(ids.to_vec())),
        Arc::new(TimestampMicrosecondArray::from(vec![tstamp_micros; n]).with_timezone("UTC")),
        Arc::new(StringArray::from_iter_values(ids.iter().map(|i| route(*i)))),
        Arc::new(destination),
        Arc::new(source_location),
    ]
}

/// The base table of `rows` rows written with `compression` and order keys encoded
/// `order_keys` (snappy, plain: no suffix).
fn base_dir(dir: &Path, rows: i64, compression: &str, order_keys: &str) -> PathBuf {
    let mut name = format!("base-{rows}");
    if compression != "snappy" {
        name.push_str(&format!("-{compression}"));
    }
    if order_keys != "plain" {
        name.push_str(&format!("-{order_keys}"));
    }
    dir.join(name)
}

/// Writer settings of a base table written with `compression` and `order_keys`.
fn base_writer(
    compression: &str,
    order_keys: &str,
) -> Result<tributary::deltalake::parquet::file::properties::WriterProperties> {
    use tributary::deltalake::parquet::basic::{Compression, Encoding};
    use tributary::deltalake::parquet::file::properties::WriterProperties;
    use tributary::deltalake::parquet::schema::types::ColumnPath;
    let c = match compression {
        "snappy" => Compression::SNAPPY,
        "zstd" => Compression::ZSTD(Default::default()),
        "gzip" => Compression::GZIP(Default::default()),
        other => bail!("unknown compression {other}"),
    };
    let mut b = WriterProperties::builder().set_compression(c);
    match order_keys {
        "plain" => {}
        "delta" => {
            let seq = ColumnPath::from("_tributary_seq");
            b = b
                .set_column_dictionary_enabled(seq.clone(), false)
                .set_column_encoding(seq, Encoding::DELTA_BYTE_ARRAY);
        }
        other => bail!("unknown order-key encoding {other}"),
    }
    Ok(b.build())
}

/// The base table: `rows` trips loaded by a full load, written with delta-rs in 1M-row
/// batches (one file per partition per batch); with `history`, the history table of the
/// same load (one version per trip) beside it.
async fn prepare(
    dir: &Path,
    rows: i64,
    history: bool,
    (compression, order_keys): (&str, &str),
) -> Result<()> {
    let dir = std::fs::canonicalize(dir)?;
    let url = |name: String| {
        url::Url::from_directory_path(dir.join(name)).map_err(|_| anyhow::anyhow!("bad dir"))
    };
    let current = url(base_dir(Path::new(""), rows, compression, order_keys)
        .display()
        .to_string())?;
    let versions = url(format!("base-{rows}-history"))?;
    let mut targets = vec![(current, false)];
    if history {
        targets.push((versions, true));
    }
    for (url, history) in targets {
        let t = delta::open(&url, &Default::default()).await?;
        if delta::exists(&t) {
            eprintln!("base table {url} exists");
            continue;
        }
        let t0 = Instant::now();
        write_base(t, rows, history, base_writer(compression, order_keys)?).await?;
        eprintln!(
            "wrote {rows} rows to {url} in {:.1}s",
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The load's versions: open since the transfer time, first and last change the load row.
const TRANSFER_MICROS: i64 = 1_666_731_600_000_000;

async fn write_base(
    mut table: DeltaTable,
    rows: i64,
    history: bool,
    props: tributary::deltalake::parquet::file::properties::WriterProperties,
) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(rows as u64);
    let batch_rows = 1_000_000i64;
    let mut start = 1i64;
    while start <= rows {
        let end = (start + batch_rows - 1).min(rows);
        let ids: Vec<i64> = (start..=end).collect();
        let n = ids.len();
        let mut cols = trip_columns(&ids, 1_666_731_600_000_000, &mut rng);
        // The order key a full load gives every row of its file (source/order.rs).
        let seq: ArrayRef = Arc::new(StringArray::from_iter_values(
            ids.iter().map(|_| "0 LOAD00000001.parquet"),
        ));
        let mut fields: Vec<Field> = schema(false)
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        if history {
            fields.pop(); // the sequence column goes after the interval columns
            let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
            fields.extend([
                Field::new("valid_from", ts.clone(), true),
                Field::new("valid_to", ts, true),
                Field::new("iscurrent", DataType::Boolean, true),
                Field::new("_tributary_seq", DataType::Utf8, true),
                Field::new("_tributary_last_seq", DataType::Utf8, true),
                Field::new("_tributary_end_seq", DataType::Utf8, true),
            ]);
            cols.push(Arc::new(
                TimestampMicrosecondArray::from(vec![TRANSFER_MICROS; n]).with_timezone("UTC"),
            ));
            cols.push(Arc::new(
                TimestampMicrosecondArray::from(vec![None; n]).with_timezone("UTC"),
            ));
            cols.push(Arc::new(BooleanArray::from(vec![true; n])));
            cols.push(seq.clone());
            cols.push(seq);
            cols.push(Arc::new(StringArray::from(vec![None::<&str>; n])));
        } else {
            cols.push(seq);
        }
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?;
        let partition_by = ["route_id".to_string()];
        table = delta::write_batch(table, "bench", &batch, &partition_by, props.clone()).await?;
        start = end + 1;
    }
    Ok(())
}

fn files_dir(dir: &Path, rows: i64, changes: usize, mix: Mix) -> PathBuf {
    dir.join(format!("files-{rows}-{changes}-{mix:?}").to_lowercase())
}

/// `count` CDC files of `changes` rows, DMS-shaped (Op, update_ts_dms first).
fn make_files(
    dir: &Path,
    rows: i64,
    changes: usize,
    mix: Mix,
    count: usize,
) -> Result<Vec<PathBuf>> {
    let out = files_dir(dir, rows, changes, mix);
    std::fs::create_dir_all(&out)?;
    let mut rng = StdRng::seed_from_u64(rows as u64 ^ changes as u64);
    let mut next_id = rows + 1;
    let mut paths = Vec::new();
    let mut clock = 0u64;
    for f in 0..count {
        let name = format!("20240101-{:010}.parquet", f + 1);
        let path = out.join(&name);
        paths.push(path.clone());
        if path.exists() {
            continue;
        }
        let (mut ops, mut ts, mut ids) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..changes {
            clock += 1;
            let roll: f64 = rng.random();
            let (op, id) = match mix {
                Mix::Realistic if roll < 0.40 => {
                    next_id += 1;
                    ("I", next_id - 1)
                }
                Mix::Realistic => {
                    let recent = (rows / 20).max(1);
                    let id = rng.random_range((rows - recent + 1).max(1)..=rows);
                    (if roll < 0.95 { "U" } else { "D" }, id)
                }
                Mix::Worst => (
                    if roll < 0.95 { "U" } else { "D" },
                    rng.random_range(1..=rows),
                ),
            };
            ops.push(op);
            ts.push(format!(
                "2024-01-01 {:02}:{:02}:{:02}.{:06}",
                clock / 3_600_000_000 % 24,
                clock / 60_000_000 % 60,
                clock / 1_000_000 % 60,
                clock % 1_000_000
            ));
            ids.push(id);
        }
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(ops)),
            Arc::new(StringArray::from(ts)),
        ];
        cols.extend(trip_columns(&ids, 1_704_067_200_000_000, &mut rng));
        let batch = RecordBatch::try_new(schema(true), cols)?;
        std::fs::write(&path, demo::to_parquet(&batch)?)?;
    }
    Ok(paths)
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    if to.exists() {
        std::fs::remove_dir_all(to)?;
    }
    let status = std::process::Command::new("cp")
        .arg("-r")
        .arg(from)
        .arg(to)
        .status()?;
    if !status.success() {
        bail!("cp -r {} {} failed", from.display(), to.display());
    }
    Ok(())
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
            })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

#[derive(Serialize)]
struct RunResult {
    engine: &'static str,
    /// With a history table (its MERGE is the `history` phase).
    history: bool,
    /// The table's Parquet codec.
    compression: String,
    rows: i64,
    changes: usize,
    mix: Mix,
    files: usize,
    latency_ms: Vec<f64>,
    p50_ms: f64,
    p95_ms: f64,
    changes_per_s: f64,
    /// File written → rows visible in the table and the manifests (merge incl. manifests).
    freshness_p50_ms: f64,
    files_rewritten_per_merge: f64,
    bytes_rewritten_per_merge: f64,
    /// Bytes each merge wrote into the table's folder: new data files (inserts, new row
    /// versions, rewritten files) and deletion-vector files; not the log.
    bytes_written_per_merge: f64,
    /// Data files given a deletion vector per merge (`--deletion-vectors`).
    files_vectored_per_merge: f64,
    deletion_vectors: bool,
    files_added_per_merge: f64,
    table_files_after: usize,
    maintenance_ms: f64,
    /// With `--maintain-first`: data files of the base table after that maintenance run.
    #[serde(skip_serializing_if = "Option::is_none")]
    base_files_after_maintenance: Option<usize>,
    peak_rss_mb: f64,
    /// Mean milliseconds per merge phase (tributary's own breakdown).
    phases_ms_mean: std::collections::BTreeMap<String, f64>,
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return 0.0;
    }
    let i = ((s.len() - 1) as f64 * p).round() as usize;
    s[i]
}

/// Copies the base table (and, with `history`, the base history table) into a fresh work
/// folder under `dir` and empties its source prefix; returns the work folder and the prefix.
fn stage_work(dir: &Path, base: &Path, rows: i64, history: bool) -> Result<(PathBuf, PathBuf)> {
    let work = dir.join("work-rust");
    let table_dir = work.join("curated/bench");
    std::fs::create_dir_all(work.join("curated"))?;
    copy_dir(base, &table_dir)?;
    if history {
        let versions = dir.join(format!("base-{rows}-history"));
        if !versions.join("_delta_log").exists() {
            bail!(
                "no base history table at {}: run `prepare --history` first",
                versions.display()
            );
        }
        copy_dir(&versions, &work.join("curated/bench_history"))?;
    }
    let raw = work.join("raw/bench/");
    if raw.exists() {
        std::fs::remove_dir_all(&raw)?;
    }
    std::fs::create_dir_all(&raw)?;
    Ok((work, raw))
}

/// The `tributary.toml` of a run: the bench table with the run's settings and, with
/// `--history`, its history table.
fn run_config(args: &RunArgs) -> String {
    let RunArgs {
        manifests,
        deletion_vectors,
        target_file_size_mb,
        history,
        compression,
        order_keys,
        ..
    } = args;
    let config = format!(
        r#"[[table]]
name = "bench"
source = "raw/bench/"
target = "curated/bench"
primary_key = ["trip_id"]
partition_by = ["route_id"]
sequence_by = ["update_ts_dms"]
drop_columns = ["update_ts_dms"]
manifests = {}
deletion_vectors = {deletion_vectors}
parquet_compression = "{compression}"
order_key_encoding = "{order_keys}"
"#,
        manifests & !deletion_vectors
    );
    let config = match target_file_size_mb {
        Some(mb) => format!("{config}target_file_size_mb = {mb}\n"),
        None => config,
    };
    if *history {
        format!("{config}[table.history]\ntarget = \"curated/bench_history\"\nstart_column = \"valid_from\"\nend_column = \"valid_to\"\ncurrent_column = \"iscurrent\"\n")
    } else {
        config
    }
}

/// Maintains the bench table (compaction, checkpoint, vacuum, manifests); returns what
/// maintenance did.
async fn maintain(
    engine: &Engine,
    table: &TableConfig,
) -> Result<tributary::maintenance::MaintenanceReport> {
    Ok(tributary::maintenance::maintain(
        table,
        engine.storage(),
        engine.storage_options(),
        Default::default(),
    )
    .await?)
}

/// The live data files of `table`'s state table.
async fn live_files(table: &TableConfig) -> Result<Vec<manifest::LiveFile>> {
    Ok(manifest::live_files(
        &delta::open(table.state_table()?, &Default::default()).await?,
    )?)
}

/// What the merges of a run measured, merge by merge.
#[derive(Default)]
struct MergeTally {
    /// Milliseconds of each merge (one per merged file).
    latency_ms: Vec<f64>,
    /// Milliseconds from each file landing to its rows being visible.
    freshness_ms: Vec<f64>,
    files_rewritten: usize,
    bytes_rewritten: i64,
    bytes_written: u64,
    files_vectored: usize,
    files_added: usize,
    /// Mean milliseconds per merge phase over the run's files.
    phases_ms_mean: BTreeMap<String, f64>,
}

impl MergeTally {
    /// Lands `file` in the source prefix `raw` as DMS would, merges it and records what the
    /// merge took and rewrote; `files` is how many files the run merges (for the means).
    async fn merge_file(
        &mut self,
        engine: &Engine,
        table: &TableConfig,
        raw: &Path,
        file: &Path,
        files: usize,
    ) -> Result<()> {
        let before = live_files(table).await?;
        let table_dir = table
            .state_table()?
            .to_file_path()
            .map_err(|()| anyhow::anyhow!("a local table"))?;
        let vectors_before = vector_files(&table_dir)?;
        // "Landing": DMS writes the file, then the merge runs.
        let landed = Instant::now();
        let dest = raw.join(file.file_name().context("file name")?);
        std::fs::copy(file, &dest)?;
        let url = url::Url::from_file_path(&dest).map_err(|_| anyhow::anyhow!("url"))?;
        let t0 = Instant::now();
        let report = engine.process(&[url]).await;
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        if let Some(fail) = report.failures().next() {
            bail!("merge failed: {fail:?}");
        }
        self.freshness_ms
            .push(landed.elapsed().as_secs_f64() * 1000.0);
        self.latency_ms.push(ms);
        let after = live_files(table).await?;
        self.count_rewritten(&before, &after);
        self.count_written(&table_dir, &before, &after, &vectors_before)?;
        self.files_added += report.tables.iter().map(|t| t.files_added).sum::<usize>();
        self.files_vectored += report
            .tables
            .iter()
            .map(|t| t.files_vectored)
            .sum::<usize>();
        self.add_phases(&report, files)
    }

    /// Counts the files of `before` that `after` no longer has: those the merge rewrote.
    fn count_rewritten(&mut self, before: &[manifest::LiveFile], after: &[manifest::LiveFile]) {
        let after_set: std::collections::HashSet<&str> =
            after.iter().map(|f| f.path.as_str()).collect();
        for b in before {
            if !after_set.contains(b.path.as_str()) {
                self.files_rewritten += 1;
                self.bytes_rewritten += b.size;
            }
        }
    }

    /// Counts the bytes the merge wrote: the data files of `after` that `before` did not
    /// have, and the deletion-vector files that were not in `vectors_before`.
    fn count_written(
        &mut self,
        table_dir: &Path,
        before: &[manifest::LiveFile],
        after: &[manifest::LiveFile],
        vectors_before: &std::collections::HashMap<PathBuf, u64>,
    ) -> Result<()> {
        let before_set: std::collections::HashSet<&str> =
            before.iter().map(|f| f.path.as_str()).collect();
        self.bytes_written += after
            .iter()
            .filter(|f| !before_set.contains(f.path.as_str()))
            .map(|f| f.size.max(0) as u64)
            .sum::<u64>();
        self.bytes_written += vector_files(table_dir)?
            .into_iter()
            .filter(|(p, _)| !vectors_before.contains_key(p))
            .map(|(_, n)| n)
            .sum::<u64>();
        Ok(())
    }

    /// Adds each table's phase times in `report`, divided by the run's `files`, to the means.
    fn add_phases(&mut self, report: &ProcessReport, files: usize) -> Result<()> {
        for t in &report.tables {
            if let serde_json::Value::Object(m) = serde_json::to_value(&t.phases_ms)? {
                for (k, v) in m {
                    *self.phases_ms_mean.entry(k).or_default() +=
                        v.as_f64().unwrap_or_default() / files as f64;
                }
            }
        }
        Ok(())
    }

    /// The run's JSON line: its settings, what its merges measured, and the maintenance
    /// that followed (`maintained`, in `maintenance_ms`).
    fn into_result(
        self,
        args: &RunArgs,
        maintained: &tributary::maintenance::MaintenanceReport,
        maintenance_ms: f64,
        base_files_after_maintenance: Option<usize>,
    ) -> RunResult {
        let latency = self.latency_ms;
        let total_s: f64 = latency.iter().sum::<f64>() / 1000.0;
        let n = latency.len() as f64;
        let changes = args.workload.changes;
        RunResult {
            engine: "tributary",
            history: args.history,
            compression: args.compression.clone(),
            rows: args.workload.rows,
            changes,
            mix: args.workload.mix,
            files: latency.len(),
            p50_ms: pct(&latency, 0.5),
            p95_ms: pct(&latency, 0.95),
            changes_per_s: (changes as f64 * n) / total_s,
            freshness_p50_ms: pct(&self.freshness_ms, 0.5),
            files_rewritten_per_merge: self.files_rewritten as f64 / n,
            bytes_rewritten_per_merge: self.bytes_rewritten as f64 / n,
            bytes_written_per_merge: self.bytes_written as f64 / n,
            files_vectored_per_merge: self.files_vectored as f64 / n,
            deletion_vectors: args.deletion_vectors,
            files_added_per_merge: self.files_added as f64 / n,
            table_files_after: maintained.files_after,
            maintenance_ms,
            base_files_after_maintenance,
            peak_rss_mb: peak_rss_mb(),
            phases_ms_mean: self.phases_ms_mean,
            latency_ms: latency.iter().map(|v| (v * 10.0).round() / 10.0).collect(),
        }
    }
}

/// The deletion-vector files at a table's root, with their sizes.
fn vector_files(table_dir: &Path) -> Result<std::collections::HashMap<PathBuf, u64>> {
    let mut out = std::collections::HashMap::new();
    for e in std::fs::read_dir(table_dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("deletion_vector_") && name.ends_with(".bin") {
            out.insert(e.path(), e.metadata()?.len());
        }
    }
    Ok(out)
}

/// Copies the base table, merges the workload's files one by one, then maintains; prints
/// one JSON line.
async fn run(args: RunArgs) -> Result<()> {
    let Workload {
        rows,
        changes,
        mix,
        count,
        ..
    } = args.workload;
    let dir = std::fs::canonicalize(&args.workload.dir)?;
    let base = base_dir(&dir, rows, &args.compression, &args.order_keys);
    if !base.join("_delta_log").exists() {
        bail!("no base table at {}: run `prepare` first", base.display());
    }
    let files = make_files(&dir, rows, changes, mix, count)?;
    let (work, raw) = stage_work(&dir, &base, rows, args.history)?;
    std::fs::write(work.join("tributary.toml"), run_config(&args))?;
    let engine = Engine::new(Config::from_path(&work.join("tributary.toml"))?);
    let tcfg = engine.config().tables[0].clone();
    let mut base_files_after_maintenance = None;
    if args.maintain_first {
        base_files_after_maintenance = Some(maintain(&engine, &tcfg).await?.files_after);
    }
    let mut tally = MergeTally::default();
    for f in &files {
        tally
            .merge_file(&engine, &tcfg, &raw, f, files.len())
            .await?;
    }
    let t0 = Instant::now();
    let m = match args.no_maintain {
        true => tributary::maintenance::MaintenanceReport::default(),
        false => maintain(&engine, &tcfg).await?,
    };
    let maintenance_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let r = tally.into_result(&args, &m, maintenance_ms, base_files_after_maintenance);
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}

/// The base table's data files under `base`, whole (as a MERGE rewrites them) and in path
/// order, until they make `mb` MB; returns them and their bytes.
fn pick_files(base: &Path, mb: f64) -> Result<(Vec<PathBuf>, u64)> {
    let mut files = Vec::new();
    walk_parquet(base, &mut files)?;
    files.sort();
    let mut picked = Vec::new();
    let mut bytes = 0u64;
    for f in files {
        if bytes as f64 >= mb * 1e6 {
            break;
        }
        bytes += std::fs::metadata(&f)?.len();
        picked.push(f);
    }
    Ok((picked, bytes))
}

/// The writer settings tributary's MERGE writes the bench table with, under `compression`
/// and `order_keys`.
fn merge_writer(
    dir: &Path,
    compression: &str,
    order_keys: &str,
) -> Result<tributary::deltalake::parquet::file::properties::WriterProperties> {
    let config = Config::from_toml(
        &format!(
            "[[table]]\nname = \"bench\"\nsource = \"raw/bench/\"\ntarget = \"curated/bench\"\nprimary_key = [\"trip_id\"]\npartition_by = [\"route_id\"]\nsequence_by = [\"update_ts_dms\"]\nparquet_compression = \"{compression}\"\norder_key_encoding = \"{order_keys}\"\n"
        ),
        "floor",
        Some(dir),
    )?;
    Ok(delta::writer_properties(&config.tables[0]))
}

/// One pass of the floor: the picked files read by `threads` threads (thread `t` takes
/// every `threads`-th file from the `t`-th) and, when writing, written back into `out`.
struct FloorPass<'a> {
    picked: &'a [PathBuf],
    props: &'a tributary::deltalake::parquet::file::properties::WriterProperties,
    out: &'a Path,
    threads: usize,
}

impl FloorPass<'_> {
    /// Milliseconds the pass takes: every picked file read and, with `write`, written back.
    fn time(&self, write: bool) -> Result<f64> {
        let t0 = Instant::now();
        std::thread::scope(|scope| -> Result<()> {
            let handles: Vec<_> = (0..self.threads)
                .map(|t| scope.spawn(move || self.copy_share(t, write)))
                .collect();
            for h in handles {
                h.join()
                    .map_err(|_| anyhow::anyhow!("floor thread panicked"))??;
            }
            Ok(())
        })?;
        Ok(t0.elapsed().as_secs_f64() * 1000.0)
    }

    /// Reads (and with `write` writes back) thread `t`'s share of the picked files.
    fn copy_share(&self, t: usize, write: bool) -> Result<()> {
        for (i, f) in self.picked.iter().enumerate().skip(t).step_by(self.threads) {
            self.copy_file(i, f, write)?;
        }
        Ok(())
    }

    /// Reads the `i`-th picked file `f` into Arrow and, with `write`, writes it back as
    /// `out/<i>.parquet`.
    fn copy_file(&self, i: usize, f: &Path, write: bool) -> Result<()> {
        use tributary::deltalake::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        use tributary::deltalake::parquet::arrow::ArrowWriter;
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(f)?)?.build()?;
        let mut writer = None;
        for b in reader {
            let b = b?;
            if !write {
                continue;
            }
            let w = match &mut writer {
                Some(w) => w,
                None => writer.insert(ArrowWriter::try_new(
                    std::fs::File::create(self.out.join(format!("{i}.parquet")))?,
                    b.schema(),
                    Some(self.props.clone()),
                )?),
            };
            w.write(&b)?;
        }
        if let Some(w) = writer {
            w.close()?;
        }
        Ok(())
    }
}

/// What reading and writing `mb` MB of the base table's Parquet costs here, without any
/// join or Delta commit: the floor a copy-on-write MERGE of that many bytes cannot go under.
fn floor(
    dir: &Path,
    rows: i64,
    mb: f64,
    (compression, order_keys): (&str, &str),
    threads: Option<usize>,
    repeat: usize,
) -> Result<()> {
    let dir = std::fs::canonicalize(dir)?;
    let base = base_dir(&dir, rows, compression, order_keys);
    let (picked, bytes) = pick_files(&base, mb)?;
    let props = merge_writer(&dir, compression, order_keys)?;
    let threads = threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let out = dir.join("floor-out");
    let pass = FloorPass {
        picked: &picked,
        props: &props,
        out: &out,
        threads,
    };
    let (mut read_ms, mut total_ms) = (Vec::new(), Vec::new());
    for _ in 0..repeat {
        if out.exists() {
            std::fs::remove_dir_all(&out)?;
        }
        std::fs::create_dir_all(&out)?;
        read_ms.push(pass.time(false)?);
        total_ms.push(pass.time(true)?);
    }
    std::fs::remove_dir_all(&out)?;
    println!(
        "{}",
        serde_json::json!({
            "rows": rows, "compression": compression, "order_keys": order_keys,
            "files": picked.len(), "mb": bytes as f64 / 1e6, "threads": threads,
            "read_ms_p50": pct(&read_ms, 0.5), "read_write_ms_p50": pct(&total_ms, 0.5),
            "read_write_ms": total_ms.iter().map(|v| v.round()).collect::<Vec<_>>(),
        })
    );
    Ok(())
}

/// The Parquet data files under `dir` (the Delta log aside).
fn walk_parquet(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            if !p.ends_with("_delta_log") {
                walk_parquet(&p, out)?;
            }
        } else if p.extension().is_some_and(|x| x == "parquet") {
            out.push(p);
        }
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Prepare {
            dir,
            rows,
            history,
            compression,
            order_keys,
        } => {
            std::fs::create_dir_all(&dir)?;
            prepare(&dir, rows, history, (&compression, &order_keys)).await
        }
        Cmd::Files(Workload {
            dir,
            rows,
            changes,
            mix,
            count,
        }) => {
            std::fs::create_dir_all(&dir)?;
            for p in make_files(&dir, rows, changes, mix, count)? {
                println!("{}", p.display());
            }
            Ok(())
        }
        Cmd::Run(args) => run(args).await,
        Cmd::Floor {
            dir,
            rows,
            mb,
            compression,
            order_keys,
            threads,
            repeat,
        } => floor(&dir, rows, mb, (&compression, &order_keys), threads, repeat),
    }
}
