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
    ($($t:tt)*) => { $crate::output::out(format_args!($($t)*)) };
}

macro_rules! err {
    ($($t:tt)*) => { $crate::output::err(format_args!($($t)*)) };
}

mod demo_cmd;
mod progress;
mod status_cmd;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use tributary::{demo, storage, Engine, FileStatus, ProcessReport, TableReport};
use url::Url;

const EXAMPLES: &str = "\
Examples:
  tributary demo                                          the walkthrough's scenario on a local folder
  tributary status --config s3://curated/config/tributary.toml
  tributary status --config tributary.toml orders --json
  tributary merge --config tributary.toml s3://raw/dms/sales/orders/2024/05/01/20240501-1200000000.parquet
  tributary merge --config tributary.toml s3://raw/dms/sales/orders/    every file under a prefix
  tributary maintain --config tributary.toml              compact, checkpoint, vacuum, manifests
  tributary reload --config tributary.toml orders         apply a DMS table reload
  tributary catalog sync --config tributary.toml

Configuration reference: docs/configuration.md";

#[derive(Parser)]
#[command(
    name = "tributary",
    version,
    about = "Merge AWS DMS CDC files into Delta Lake tables",
    after_help = EXAMPLES
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
    /// file, or backfill. Files are applied in one order, whatever their sizes: full-load
    /// files in name order, then CDC files in name order. Small files are grouped into
    /// commits (at most --batch files and one slice of rows each); a file larger than a slice
    /// is merged at its place in that order (appended whole, or slice by slice), so every
    /// version written is a state the source had.
    Merge {
        /// Table configuration (path or s3:// URI).
        #[arg(long)]
        config: String,
        /// Files given to the engine at a time (at most this many per commit).
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
    /// Each table's state: version and last commit, rows and files (small files), freshness
    /// (the newest change applied and how far behind now it is), tombstones, whether the
    /// symlink manifests match the live files, the catalog entries. Read only.
    Status {
        /// Table configuration (path or s3:// URI).
        #[arg(long)]
        config: String,
        /// JSON (an array, one object per table) instead of text.
        #[arg(long)]
        json: bool,
        /// Tables to show (default: all).
        tables: Vec<String>,
    },
    /// The Glue Data Catalog entries of the tables with catalog settings.
    Catalog {
        #[command(subcommand)]
        command: CatalogCommand,
    },
}

#[derive(Subcommand)]
enum CatalogCommand {
    /// Bring the entries in step with the tables as they are now (what the maintenance
    /// function does after its upkeep): create missing entries, correct drifted ones,
    /// register and remove the manifest tables' partitions.
    Sync {
        /// Table configuration (path or s3:// URI).
        #[arg(long)]
        config: String,
        /// Tables to sync (default: all with catalog settings).
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
        } => demo_cmd::run(&dir, rows, new_rows).await,
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
        Command::Status {
            config,
            json,
            tables,
        } => status_cmd::run(&config, &tables, json).await,
        Command::Catalog {
            command: CatalogCommand::Sync { config, tables },
        } => run_catalog_sync(&config, &tables).await,
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

/// The files named, and those under the prefixes named, in the order they are applied
/// ([`tributary::apply_order`]: full load first, then CDC, each in file-name order).
async fn files_to_merge(engine: &Engine, inputs: &[String]) -> Result<Vec<Url>> {
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
    files.sort_by_key(tributary::apply_order);
    files.dedup();
    Ok(files)
}

/// How many files a merge run merged, ignored and failed.
#[derive(Default)]
struct MergeCounts {
    merged: usize,
    ignored: usize,
    failed: usize,
}

impl MergeCounts {
    /// Counts the files of `report`, printing those ignored and those that failed.
    fn count(&mut self, report: &ProcessReport) {
        for f in &report.files {
            match &f.status {
                FileStatus::Merged { .. } => self.merged += 1,
                FileStatus::Ignored { reason } => {
                    self.ignored += 1;
                    err!("ignored {}: {reason}", storage::display(&f.file));
                }
                FileStatus::Failed { error, .. } => {
                    self.failed += 1;
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
    }
}

/// Prints what a batch did to table `t`: its history table's line, its own line (unless it
/// only keeps a history; milliseconds since `t0`, the batch's start) and its catalog sync.
fn print_table_report(engine: &Engine, t: &TableReport, t0: Instant) {
    let history_only = engine
        .config()
        .table(&t.table)
        .is_some_and(|c| c.target.is_none());
    if let Some(h) = &t.history {
        out!(
            "{}{}: v{} files={} versions written={} removed={} late_keys={}",
            t.table,
            if history_only { "" } else { " history" },
            h.version
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into()),
            t.files,
            h.versions_written,
            h.versions_removed,
            h.late_keys
        );
    }
    if !history_only {
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
    if let Some(c) = &t.catalog {
        print_catalog(&t.table, c, "  ");
    }
}

/// Merges the files named (and those under the prefixes named) `batch` at a time, printing
/// each batch's tables and the totals; fails when any file could not be merged.
async fn run_merge(config: &str, batch: usize, inputs: &[String]) -> Result<()> {
    let engine = Engine::from_config_location(config).await?;
    let files = files_to_merge(&engine, inputs).await?;
    let mut counts = MergeCounts::default();
    let mut progress = progress::Progress::new("files", files.len());
    for chunk in files.chunks(batch) {
        let t0 = Instant::now();
        let report = engine.process(chunk).await;
        progress.clear();
        counts.count(&report);
        for t in &report.tables {
            print_table_report(&engine, t, t0);
        }
        let rows = report.tables.iter().map(|t| t.source_rows as u64).sum();
        progress.advance(chunk.len(), rows);
    }
    progress.clear();
    let MergeCounts {
        merged,
        ignored,
        failed,
    } = counts;
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

async fn run_catalog_sync(config: &str, tables: &[String]) -> Result<()> {
    let engine = Engine::from_config_location(config).await?;
    engine.config().require_tables(tables, "catalog sync")?;
    for t in tables {
        match engine.config().table(t) {
            None => {}
            Some(c) if c.catalog.is_none() => {
                bail!("table `{t}` has no catalog settings ([table.catalog])")
            }
            Some(_) => {}
        }
    }
    let reports = tributary::maintenance::sync_catalog(&engine, tables).await;
    if reports.is_empty() {
        bail!("no table has catalog settings: add [table.catalog] (or [defaults.catalog]) to the configuration");
    }
    let mut failed = 0;
    for (t, r) in &reports {
        print_catalog(t, r, "");
        failed += usize::from(r.error.is_some());
    }
    if failed > 0 {
        bail!("the catalog entries of {failed} table(s) could not be synced");
    }
    Ok(())
}

pub(crate) fn print_catalog(table: &str, r: &tributary::catalog::CatalogReport, indent: &str) {
    out!(
        "{indent}{table}: catalog: {} created, {} updated, partitions +{} -{} ({} Glue calls)",
        r.entries_created,
        r.entries_updated,
        r.partitions_added,
        r.partitions_removed,
        r.calls
    );
    if let Some(e) = &r.error {
        err!("{indent}{table}: catalog FAILED: {e}");
    }
}

async fn run_maintain(config: &str, force: bool, tables: &[String]) -> Result<()> {
    let engine = Engine::from_config_location(config).await?;
    engine.config().require_tables(tables, "maintain")?;
    // One table at a time (what the scheduled fan-out does), with progress between them.
    let names: Vec<String> = engine
        .config()
        .tables
        .iter()
        .map(|t| t.name.clone())
        .filter(|n| tables.is_empty() || tables.contains(n))
        .collect();
    let mut progress = progress::Progress::new("tables", names.len());
    let mut failed = 0usize;
    for name in names {
        let request = tributary::maintenance::Request {
            tables: vec![name],
            force,
            ..Default::default()
        };
        let summary = tributary::maintenance::handle(&engine, &request).await?;
        progress.clear();
        for m in &summary.maintained {
            print_maintenance(m, "");
        }
        for (t, e) in &summary.failed {
            err!("FAILED {t}: {e}");
        }
        for (t, r) in &summary.catalog {
            print_catalog(t, r, "");
        }
        failed += summary.failed.len();
        progress.advance(1, 0);
    }
    progress.clear();
    // Then, as the scheduled run does, the watermarks and the groups' cuts.
    let request = tributary::maintenance::Request {
        tables: tables.to_vec(),
        cuts: true,
        ..Default::default()
    };
    let summary = tributary::maintenance::handle(&engine, &request).await?;
    for g in summary.watermarks.iter().flat_map(|w| &w.groups) {
        match g.cut {
            Some(c) => out!(
                "group {}: cut {} published to {}{}",
                g.group,
                c.to_rfc3339(),
                g.published_at,
                g.held_by
                    .as_ref()
                    .map(|t| format!(" (held by table {t})"))
                    .unwrap_or_default()
            ),
            None => out!(
                "group {}: no cut yet (a table has no watermark) — published to {}",
                g.group,
                g.published_at
            ),
        }
    }
    for (t, e) in &summary.failed {
        err!("FAILED {t}: {e}");
    }
    failed += summary.failed.len();
    if failed > 0 {
        bail!("maintenance failed for {failed} table(s)");
    }
    Ok(())
}

pub(crate) fn print_maintenance(m: &tributary::maintenance::MaintenanceReport, indent: &str) {
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
    if let Some(h) = &m.history {
        print_maintenance(h, &format!("{indent}  "));
    }
}
