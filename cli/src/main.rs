//! `tributary`: run the seed demo on a local folder, or replay/backfill DMS files.

use std::path::{Path, PathBuf};

/// Lines on stdout / stderr that a closed pipe (`tributary ... | head`) does not abort:
/// the output stops, the work goes on, and the exit code still says how the work went.
mod output {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};

    static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
    static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);

    pub fn out(args: std::fmt::Arguments<'_>) {
        if !STDOUT_CLOSED.load(Ordering::Relaxed)
            && writeln!(std::io::stdout().lock(), "{args}").is_err()
        {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
        }
    }

    pub fn err(args: std::fmt::Arguments<'_>) {
        if !STDERR_CLOSED.load(Ordering::Relaxed)
            && writeln!(std::io::stderr().lock(), "{args}").is_err()
        {
            STDERR_CLOSED.store(true, Ordering::Relaxed);
        }
    }
}

macro_rules! out {
    ($($t:tt)*) => { output::out(format_args!($($t)*)) };
}

macro_rules! err {
    ($($t:tt)*) => { output::err(format_args!($($t)*)) };
}
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use tributary::deltalake::arrow::util::pretty::pretty_format_batches;
use tributary::{delta, demo, storage, Config, Engine, FileStatus};
use url::Url;

#[derive(Parser)]
#[command(
    name = "tributary",
    version,
    about = "Merge AWS DMS CDC files into Delta Lake tables"
)]
struct Cli {
    /// Log filter for diagnostics on stderr (RUST_LOG syntax, e.g. `info` or `debug`).
    #[arg(
        long,
        global = true,
        default_value = tributary::CLI_LOG_FILTER
    )]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate the seed scenario as DMS Parquet files in a local folder, merge each file
    /// through the same code path as the Lambda, and show the resulting Delta table.
    Demo {
        /// Folder for everything (raw files, Delta table, config). Emptied of earlier demo
        /// output (raw/, curated/) first.
        #[arg(long, default_value = "tributary-demo")]
        dir: PathBuf,
        /// Rows in the full load (insert_records(N)).
        #[arg(long, default_value_t = 20_000)]
        rows: i32,
        /// Rows inserted during CDC.
        #[arg(long, default_value_t = 200)]
        new_rows: i32,
    },
    /// Merge files (or every data file under prefixes) into their tables: replay a failed
    /// file, or backfill. Full-load files go first, then CDC files in name order.
    Merge {
        /// Table configuration (path or s3:// URI).
        #[arg(long)]
        config: String,
        /// Files merged per commit.
        #[arg(long, default_value_t = 16)]
        batch: usize,
        /// Files or prefixes: local paths, file:// or s3:// URIs.
        #[arg(required = true)]
        inputs: Vec<String>,
    },
    /// Write the seed scenario's DMS files in the S3 layout of the sample events in
    /// `events/` (`<dir>/tributary-raw/dms/...`), plus `<dir>/tributary.toml` with s3://
    /// locations: for the local Lambda loop (TRIBUTARY_LOCAL_S3_ROOT=<dir>) or to upload to
    /// an emulator (`scripts/localstack seed`).
    Seed {
        /// Folder standing for S3 (one sub-folder per bucket).
        #[arg(long, default_value = "local-s3")]
        dir: PathBuf,
        /// Rows in the full load.
        #[arg(long, default_value_t = 20_000)]
        rows: i32,
    },
    /// Apply a DMS table reload (a new full load written over the LOAD files) as a whole: the
    /// new full load plus the changes since it started, deleting rows it no longer has, in
    /// one commit. Run it once DMS reports the table's reload complete; then redrive the
    /// dead-letter queue (the merge function refuses the reload's files until then).
    Reload {
        /// Table configuration (path or s3:// URI).
        #[arg(long)]
        config: String,
        /// The table to reload.
        table: String,
    },
    /// Maintain tables: compact small files, checkpoint, vacuum, expire tombstones and
    /// regenerate the symlink manifests (what the maintenance function does on schedule).
    Maintain {
        /// Table configuration (path or s3:// URI).
        #[arg(long)]
        config: String,
        /// Allow a vacuum retention below the configured minimum.
        #[arg(long)]
        force: bool,
        /// Tables to maintain (default: all).
        tables: Vec<String>,
    },
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            err!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Command::Demo {
            dir,
            rows,
            new_rows,
        } => run_demo(&dir, rows, new_rows).await,
        Command::Merge {
            config,
            batch,
            inputs,
        } => run_merge(&config, batch.max(1), &inputs).await,
        Command::Seed { dir, rows } => run_seed(&dir, rows).await,
        Command::Maintain {
            config,
            force,
            tables,
        } => run_maintain(&config, force, &tables).await,
        Command::Reload { config, table } => run_reload(&config, &table).await,
    }
}

fn to_url(input: &str) -> Result<Url> {
    if input.starts_with("s3://") || input.starts_with("file://") {
        return Url::parse(input).with_context(|| format!("invalid URI {input}"));
    }
    let p = Path::new(input);
    let abs =
        std::fs::canonicalize(p).with_context(|| format!("no such file or folder: {input}"))?;
    let url = if abs.is_dir() {
        Url::from_directory_path(&abs)
    } else {
        Url::from_file_path(&abs)
    };
    url.map_err(|_| anyhow::anyhow!("cannot turn {} into a URL", abs.display()))
}

async fn run_merge(config: &str, batch: usize, inputs: &[String]) -> Result<()> {
    let engine = Engine::from_config_location(config).await?;
    let mut files = Vec::new();
    for i in inputs {
        let url = to_url(i)?;
        let is_prefix = url.path().ends_with('/') || i.ends_with('/');
        if is_prefix {
            let listed = engine.storage().list(&url).await?;
            if listed.is_empty() {
                bail!("nothing found under {i}");
            }
            files.extend(listed);
        } else {
            files.push(url);
        }
    }
    // Full load first, then CDC in file-name order (what DMS intends; the engine converges
    // in any order, this just keeps commits small and meaningful).
    files.sort_by_key(|u| {
        let name = storage::file_name(u);
        (!name.starts_with("LOAD"), name, u.to_string())
    });
    files.dedup();
    let mut failed = 0usize;
    let mut merged = 0usize;
    let mut ignored = 0usize;
    for chunk in files.chunks(batch) {
        let t0 = Instant::now();
        let report = engine.process(chunk).await;
        for f in &report.files {
            match &f.status {
                FileStatus::Merged { .. } => merged += 1,
                FileStatus::Ignored { reason } => {
                    ignored += 1;
                    err!("ignored {}: {reason}", storage::display(&f.file));
                }
                FileStatus::Failed { error, .. } => {
                    failed += 1;
                    err!(
                        "FAILED {} ({}, {}): {error}",
                        storage::display(&f.file),
                        error.kind(),
                        if error.is_retryable() {
                            "retryable"
                        } else {
                            "not retryable"
                        }
                    );
                }
            }
        }
        for t in &report.tables {
            out!(
                "{}: v{} files={} inserted={} updated={} deleted={} skipped_stale={} ({} ms)",
                t.table,
                t.version
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "-".into()),
                t.files,
                t.inserted,
                t.updated,
                t.deleted,
                t.skipped_stale,
                t0.elapsed().as_millis()
            );
        }
    }
    out!("{merged} merged, {ignored} ignored, {failed} failed");
    if failed > 0 {
        bail!("{failed} file(s) could not be merged (they are unchanged; fix and replay them)");
    }
    Ok(())
}

async fn run_seed(dir: &Path, rows: i32) -> Result<()> {
    if rows < 1 {
        bail!("--rows must be at least 1");
    }
    let raw = dir.join(demo::S3_RAW_BUCKET).join(demo::S3_RAW_PREFIX);
    let scenario = demo::seed_scenario(2022, rows, 200, 1)?;
    for f in &scenario.files {
        let path = raw.join(&f.path);
        std::fs::create_dir_all(path.parent().context("file path has a parent")?)?;
        std::fs::write(&path, demo::to_parquet(&f.batch)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        out!(
            "{:<60} {}",
            format!(
                "s3://{}/{}{}",
                demo::S3_RAW_BUCKET,
                demo::S3_RAW_PREFIX,
                f.path
            ),
            f.description
        );
    }
    std::fs::create_dir_all(dir.join("tributary-curated"))?;
    let config = dir.join("tributary.toml");
    std::fs::write(&config, demo::S3_CONFIG)?;
    out!(
        "config: {} (s3:// locations; run the functions with TRIBUTARY_LOCAL_S3_ROOT={})",
        config.display(),
        dir.display()
    );
    Ok(())
}

async fn run_reload(config: &str, table: &str) -> Result<()> {
    let engine = Engine::from_config_location(config).await?;
    let r = tributary::reload::reload(&engine, table).await?;
    out!(
        "{}: generation {} (full load written from {}): {} full-load files, {} CDC files since; v{} inserted={} updated={} deleted={} ({} ms)",
        r.table,
        r.generation,
        r.started.to_rfc3339(),
        r.load_files,
        r.cdc_files,
        r.merge.version.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
        r.merge.inserted,
        r.merge.updated,
        r.merge.deleted,
        r.merge.duration_ms
    );
    for f in &r.earlier_load_files {
        err!("not part of the reload (an earlier load's file, not rewritten): {f}");
    }
    Ok(())
}

async fn run_maintain(config: &str, force: bool, tables: &[String]) -> Result<()> {
    let engine = Engine::from_config_location(config).await?;
    let request = tributary::maintenance::Request {
        tables: tables.to_vec(),
        force,
        reload: None,
    };
    let summary = tributary::maintenance::handle(&engine, &request)
        .await
        .map_err(anyhow::Error::msg)?;
    for m in &summary.maintained {
        print_maintenance(m, "");
    }
    for (t, e) in &summary.failed {
        err!("FAILED {t}: {e}");
    }
    if !summary.failed.is_empty() {
        bail!("maintenance failed for {} table(s)", summary.failed.len());
    }
    Ok(())
}

fn print_maintenance(m: &tributary::maintenance::MaintenanceReport, indent: &str) {
    if let Some(why) = &m.skipped {
        out!("{indent}{}: skipped ({why})", m.table);
        return;
    }
    out!(
        "{indent}{}: files {} → {} ({} → {} bytes); {} partitions compacted, {} skipped; checkpoint at v{}; {} files vacuumed; {} tombstones expired; manifests: {} written, {} deleted ({} ms)",
        m.table,
        m.files_before,
        m.files_after,
        m.bytes_before,
        m.bytes_after,
        m.partitions_compacted,
        m.partitions_skipped,
        m.checkpoint_version.unwrap_or_default(),
        m.files_vacuumed,
        m.tombstones_expired,
        m.manifests_written,
        m.manifests_deleted,
        m.duration_ms
    );
}

async fn run_demo(dir: &Path, rows: i32, new_rows: i32) -> Result<()> {
    if rows < 1 || new_rows < 0 {
        bail!("--rows must be at least 1 and --new-rows at least 0");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = std::fs::canonicalize(dir)?;
    for sub in ["raw", "curated"] {
        let p = dir.join(sub);
        if p.exists() {
            std::fs::remove_dir_all(&p).with_context(|| format!("cannot clear {}", p.display()))?;
        }
    }
    let config_path = dir.join("tributary.toml");
    std::fs::write(&config_path, demo::CONFIG)?;
    let config = Config::from_path(&config_path)?;
    let engine = Engine::new(config);
    let table_cfg = &engine.config().tables[0];

    out!("tributary demo in {}", dir.display());
    out!("  config: {}", config_path.display());
    let scenario = demo::seed_scenario(2022, rows, new_rows, 2)?;
    let raw_root = dir.join("raw").join(demo::SOURCE_PREFIX);
    out!(
        "\n1. DMS lands {} files under {}:",
        scenario.files.len(),
        raw_root.display()
    );
    let mut urls = Vec::new();
    for f in &scenario.files {
        let url = table_cfg.source.join(&f.path)?;
        engine
            .storage()
            .put(&url, demo::to_parquet(&f.batch)?)
            .await?;
        out!("   {:<42} {}", f.path, f.description);
        urls.push(url);
    }

    out!("\n2. Each file is merged as its S3 event would be (one invocation per file):");
    for (f, url) in scenario.files.iter().zip(&urls) {
        let t0 = Instant::now();
        let report = engine.process(std::slice::from_ref(url)).await;
        let ms = t0.elapsed().as_millis();
        if let Some(failure) = report.failures().next() {
            if let FileStatus::Failed { error, .. } = &failure.status {
                bail!("merging {} failed: {error}", f.path);
            }
        }
        for t in &report.tables {
            out!(
                "   {:<42} v{:<2} +{} ~{} -{} ({} ms)",
                f.path,
                t.version.unwrap_or_default(),
                t.inserted,
                t.updated,
                t.deleted,
                ms
            );
        }
    }

    out!("\n3. Every event delivered again, all at once (at-least-once delivery):");
    let t0 = Instant::now();
    let report = engine.process(&urls).await;
    for t in &report.tables {
        out!(
            "   {} files in one call: inserted={} updated={} deleted={} skipped_stale={}; table still at v{} ({} ms)",
            t.files,
            t.inserted,
            t.updated,
            t.deleted,
            t.skipped_stale,
            t.version.unwrap_or_default(),
            t0.elapsed().as_millis()
        );
    }

    let table = delta::open(&table_cfg.target, engine.storage_options()).await?;
    out!("\n4. SELECT destination, count(*) FROM travel_details GROUP BY destination:");
    let batches = delta::query(
        &table,
        "SELECT destination, count(*) AS count FROM t GROUP BY destination ORDER BY destination",
    )
    .await?;
    out!("{}", indent(&pretty_format_batches(&batches)?.to_string()));
    let total = delta::query(&table, "SELECT count(*) AS rows, count(DISTINCT trip_id) AS trips, max(trip_id) AS max_trip_id FROM t").await?;
    out!("{}", indent(&pretty_format_batches(&total)?.to_string()));

    // Compare with the source database's true state, row by row.
    let rows_now = delta::query(
        &table,
        "SELECT CAST(trip_id AS INT) AS trip_id, CAST(destination AS VARCHAR) AS d, CAST(source_location AS VARCHAR) AS s, CAST(route_id AS VARCHAR) AS r FROM t ORDER BY trip_id",
    )
    .await?;
    let mut table_rows = Vec::new();
    for b in &rows_now {
        use tributary::deltalake::arrow::array::AsArray;
        use tributary::deltalake::arrow::compute::cast;
        use tributary::deltalake::arrow::datatypes::{DataType, Int32Type};
        let id = cast(b.column(0), &DataType::Int32)?;
        let id = id.as_primitive::<Int32Type>();
        let (dest, src, route) = (
            cast(b.column(1), &DataType::Utf8)?,
            cast(b.column(2), &DataType::Utf8)?,
            cast(b.column(3), &DataType::Utf8)?,
        );
        let (dest, src, route) = (
            dest.as_string::<i32>(),
            src.as_string::<i32>(),
            route.as_string::<i32>(),
        );
        for i in 0..b.num_rows() {
            table_rows.push((
                id.value(i),
                dest.value(i).to_string(),
                src.value(i).to_string(),
                route.value(i).to_string(),
            ));
        }
    }
    let source_rows: Vec<_> = scenario
        .source
        .iter()
        .map(|(id, t)| {
            (
                *id,
                t.destination.clone(),
                t.source_location.clone(),
                t.route_id.clone(),
            )
        })
        .collect();
    if table_rows == source_rows {
        out!(
            "   The Delta table equals the source table: {} rows, no Miami, no Los Angeles.",
            source_rows.len()
        );
    } else {
        bail!(
            "the Delta table ({} rows) differs from the source ({} rows)",
            table_rows.len(),
            source_rows.len()
        );
    }

    out!("\n5. Table history (DESCRIBE HISTORY):");
    let latest = table.version().unwrap_or(0);
    let history = table_history(&table).await?;
    for (i, (op, files, ts)) in history.iter().enumerate() {
        out!(
            "   v{:<3} {:<24} {:<10} {}",
            latest.saturating_sub(i as u64),
            ts,
            op,
            files
        );
    }
    let v0 = delta::open(&table_cfg.target, engine.storage_options()).await?;
    let mut v0 = v0;
    v0.load_version(0).await?;
    let c = delta::query(&v0, "SELECT count(*) AS rows FROM t").await?;
    out!("\n   Time travel: version 0 (table creation) has {} rows; version 2 (full load) has {} rows.", count(&c), {
        let mut v2 = delta::open(&table_cfg.target, engine.storage_options()).await?;
        v2.load_version(2).await?;
        count(&delta::query(&v2, "SELECT count(*) AS rows FROM t").await?)
    });
    out!("\n6. Maintenance (what the scheduled function does): compaction, checkpoint, vacuum, manifests");
    let summary = tributary::maintenance::handle(&engine, &Default::default())
        .await
        .map_err(anyhow::Error::msg)?;
    if let Some((t, e)) = summary.failed.first() {
        bail!("maintenance of {t} failed: {e}");
    }
    for m in &summary.maintained {
        print_maintenance(m, "   ");
    }
    let table = delta::open(&table_cfg.target, engine.storage_options()).await?;
    let manifests = tributary::manifest::read_manifests(engine.storage(), &table).await?;
    let expected = tributary::manifest::expected_manifests(&table)?;
    out!(
        "   {} partition manifests under _symlink_format_manifest/ ({}), e.g. route_id=A/manifest:",
        manifests.len(),
        if manifests == expected {
            "exactly the live files"
        } else {
            "OUT OF DATE"
        }
    );
    if let Some(first) = manifests.get("route_id=A").and_then(|m| m.first()) {
        out!("     {first}");
    }
    let c = delta::query(&table, "SELECT count(*) FROM t").await?;
    out!("   Rows after maintenance: {} (unchanged)", count(&c));
    out!(
        "\nInspect: {}/curated/travel_details (Delta table), {}/raw (DMS files).",
        dir.display(),
        dir.display()
    );
    Ok(())
}

async fn table_history(
    table: &tributary::deltalake::DeltaTable,
) -> Result<Vec<(String, String, String)>> {
    use futures::TryStreamExt;
    let commits: Vec<_> = table.history(None).try_collect().await?;
    Ok(commits
        .into_iter()
        .map(|c| {
            let files = c
                .info
                .get("tributary.files")
                .and_then(|v| v.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str())
                        .map(|s| s.rsplit('/').next().unwrap_or(s).to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            let ts = c
                .timestamp
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_default();
            (c.operation.unwrap_or_default(), files, ts)
        })
        .collect())
}

fn count(b: &[tributary::deltalake::arrow::array::RecordBatch]) -> i64 {
    use tributary::deltalake::arrow::array::AsArray;
    use tributary::deltalake::arrow::datatypes::Int64Type;
    b.iter()
        .filter(|b| b.num_rows() > 0)
        .map(|b| b.column(0).as_primitive::<Int64Type>().value(0))
        .sum()
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("   {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
