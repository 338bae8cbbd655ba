//! Table maintenance: compaction (OPTIMIZE per partition), checkpoint and log cleanup,
//! VACUUM, tombstone garbage collection and a full manifest regeneration.
//!
//! Safe next to merges and next to other maintenance runs (a CLI run during the schedule,
//! two stacks on one table): every step commits through Delta's optimistic concurrency, and
//! every commit that rewrites files carries the application transaction id
//! [`MAINTENANCE_APP_ID`], so that two such commits based on the same version conflict.
//! delta-rs does not detect two OPTIMIZEs removing the same files (its conflict checker
//! ignores removes without data change; docs/design.md, "Concurrency"): without the id, both
//! would commit and every compacted row would be there twice.
//!
//! A compaction that loses a race is retried on the new snapshot, and skipped until the next
//! run if it keeps losing; a merge that loses against a compaction retries by itself. No
//! merge commit is ever lost.

mod compact;

use std::time::Instant;

use chrono::{DateTime, Utc};
use deltalake::kernel::Transaction;
use deltalake::operations::vacuum::VacuumMode;
use deltalake::DeltaTable;
use serde::Serialize;
use std::collections::HashMap;

use crate::config::{Config, TableConfig};
use crate::delta;
use crate::delta::manifest::{self, Partition};
use crate::delta::retry::Retry;
use crate::error::{Error, Result};
use crate::props::TableProps;
use crate::storage::Storage;

/// Application transaction id carried by every maintenance commit that rewrites files.
pub const MAINTENANCE_APP_ID: &str = "tributary.maintenance";

/// Attempts of a partition's compaction before it waits for the next run.
const COMPACTION_ATTEMPTS: u32 = 3;
/// Partitions compacted in one commit.
const COMPACTION_GROUP: usize = 16;

/// Per-run options.
#[derive(Debug, Clone, Copy, Default)]
pub struct MaintenanceOptions {
    /// Allow a VACUUM retention shorter than the table's `min_vacuum_retention_hours`.
    pub force: bool,
}

/// What maintenance did to one table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MaintenanceReport {
    pub table: String,
    pub version_before: Option<u64>,
    pub version_after: Option<u64>,
    pub files_before: usize,
    pub files_after: usize,
    pub bytes_before: i64,
    pub bytes_after: i64,
    pub partitions_compacted: usize,
    /// Partitions whose compaction kept losing to concurrent writers (retried next run).
    pub partitions_skipped: usize,
    pub files_compacted: u64,
    pub checkpoint_version: Option<u64>,
    pub log_files_removed: usize,
    pub files_vacuumed: usize,
    pub tombstones_expired: usize,
    pub manifests_written: usize,
    pub manifests_deleted: usize,
    pub duration_ms: u64,
    /// Set when the table has no Delta table yet (nothing to do).
    pub skipped: Option<String>,
    /// The history table's upkeep, when the table has one (and it exists).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Box<MaintenanceReport>>,
}

/// The application transaction of a maintenance commit that rewrites files: the guard id
/// (its version only has to be new; the conflict comes from the id itself).
fn guard() -> Transaction {
    Transaction::new(MAINTENANCE_APP_ID, Utc::now().timestamp_millis())
}

/// Maintain the named tables (all when `only` is empty). A failing table does not stop
/// the others.
pub async fn run(
    config: &Config,
    storage: &Storage,
    options: &std::collections::HashMap<String, String>,
    only: &[String],
    opts: MaintenanceOptions,
) -> Result<Summary> {
    config.require_tables(only, "maintenance")?;
    let mut summary = Summary::default();
    for t in &config.tables {
        if !only.is_empty() && !only.contains(&t.name) {
            continue;
        }
        match maintain(t, storage, options, opts).await {
            Ok(m) => {
                log_report(&m);
                summary.maintained.push(m);
            }
            Err(e) => {
                tracing::error!(table = %t.name, error = %e, kind = e.kind(), "maintenance failed");
                summary.failed.push((t.name.clone(), e.to_string()));
            }
        }
    }
    Ok(summary)
}

fn log_report(m: &MaintenanceReport) {
    // The numbers are also EMF metrics; the log line carries the whole report.
    let report = serde_json::to_string(m).unwrap_or_default();
    tracing::info!(table = %m.table, duration_ms = m.duration_ms, report = %report, "maintained");
}

/// Maintain one table.
pub async fn maintain(
    table_cfg: &TableConfig,
    storage: &Storage,
    options: &std::collections::HashMap<String, String>,
    opts: MaintenanceOptions,
) -> Result<MaintenanceReport> {
    let start = Instant::now();
    check_vacuum_retention(table_cfg, opts)?;
    let mut report = match &table_cfg.target {
        Some(target) => {
            let main = Tidy {
                url: target,
                label: &table_cfg.name,
                cfg: table_cfg,
                manifests: table_cfg.writing.manifests,
            };
            let Some(mut report) = main.run(storage, options).await? else {
                return Ok(not_created(table_cfg, "the Delta table"));
            };
            // Tombstones past their retention (after moving the table's horizon), then tidy
            // the tombstone table itself.
            report.tombstones_expired = expire_tombstones(table_cfg, options).await?;
            report
        }
        None => MaintenanceReport {
            table: table_cfg.name.clone(),
            ..Default::default()
        },
    };
    if let Some(h) = &table_cfg.history {
        let history = history_upkeep(table_cfg, h, storage, options).await?;
        match (history, &table_cfg.target) {
            (Some(h), Some(_)) => report.history = Some(Box::new(h)),
            // Without a current table, the history table is the table.
            (Some(h), None) => {
                report = MaintenanceReport {
                    table: table_cfg.name.clone(),
                    ..h
                }
            }
            (None, Some(_)) => {}
            (None, None) => return Ok(not_created(table_cfg, "the history table")),
        }
    }
    report.duration_ms = start.elapsed().as_millis() as u64;
    Ok(report)
}

fn not_created(table_cfg: &TableConfig, what: &str) -> MaintenanceReport {
    MaintenanceReport {
        table: table_cfg.name.clone(),
        skipped: Some(format!("{what} does not exist yet")),
        ..Default::default()
    }
}

/// The history table (like the main table) and its change log (compaction, checkpoint,
/// vacuum).
async fn history_upkeep(
    table_cfg: &TableConfig,
    h: &crate::config::HistoryConfig,
    storage: &Storage,
    options: &std::collections::HashMap<String, String>,
) -> Result<Option<MaintenanceReport>> {
    let label = table_cfg.label(crate::config::Managed::History);
    let history = Tidy {
        url: &h.target,
        label: &label,
        cfg: table_cfg,
        manifests: table_cfg.writing.manifests,
    };
    let report = history.run(storage, options).await?;
    let log_label = table_cfg.label(crate::config::Managed::ChangeLog);
    let log = Tidy {
        url: &h.changes,
        label: &log_label,
        cfg: table_cfg,
        manifests: false,
    };
    log.run(storage, options).await?;
    Ok(report)
}

/// The upkeep of one Delta table: compaction, checkpoint, log cleanup, VACUUM, manifests.
struct Tidy<'a> {
    url: &'a url::Url,
    label: &'a str,
    cfg: &'a TableConfig,
    manifests: bool,
}

impl Tidy<'_> {
    /// `None` when the table does not exist yet.
    async fn run(
        &self,
        storage: &Storage,
        options: &std::collections::HashMap<String, String>,
    ) -> Result<Option<MaintenanceReport>> {
        let label = self.label;
        // One handle for the whole upkeep, brought forward after each commit (ours from the
        // commit's own snapshot, others' incrementally): re-opening the table at every step
        // replays the log again each time (hundreds of GETs per table on S3).
        let mut table = delta::open(self.url, options).await?;
        if !delta::exists(&table) {
            return Ok(None);
        }
        let mut report = MaintenanceReport {
            table: label.to_string(),
            version_before: table.version(),
            ..Default::default()
        };
        ensure_table_properties(&mut table, label, self.cfg).await?;
        let before = manifest::live_files(&table)?;
        report.files_before = before.len();
        report.bytes_before = before.iter().map(|f| f.size).sum();
        // 1. Compaction, partition by partition, only where two or more small files exist.
        compact(&mut table, label, self.cfg, &before, &mut report).await?;
        // 2. Checkpoint of the newest version and expired log cleanup.
        update(&mut table, label).await?;
        if delta::classic_checkpoints(&table) {
            deltalake::checkpoints::create_checkpoint(&table, None)
                .await
                .map_err(|e| Error::delta(label, e))?;
            report.checkpoint_version = table.version();
            report.log_files_removed = deltalake::checkpoints::cleanup_metadata(&table, None)
                .await
                .map_err(|e| Error::delta(label, e))?;
        } else {
            tracing::info!(table = %label, "v2 checkpoints: left to the table's writer, and its log with them");
        }
        // 3. VACUUM (full: also removes files of failed, uncommitted writes).
        let (mut table, vacuumed) =
            vacuum(table, self.cfg.maintenance.vacuum_retention, label).await?;
        report.files_vacuumed = vacuumed;
        // 4. All manifests, deleting those of partitions without files.
        update(&mut table, label).await?;
        if self.manifests {
            let (m, newest) = manifest::sync_all(storage, table).await?;
            report.manifests_written = m.written;
            report.manifests_deleted = m.deleted;
            table = newest;
        }
        let after = manifest::live_files(&table)?;
        report.version_after = table.version();
        report.files_after = after.len();
        report.bytes_after = after.iter().map(|f| f.size).sum();
        Ok(Some(report))
    }
}

/// Give a table created before tributary set them the properties it sets on new tables
/// (one metadata commit, once): `delta.checkpointInterval`, and the retention of its
/// records of applied files (`delta.setTransactionRetentionDuration`, see `applied`). A
/// property a table has, the user's or tributary's, is left as it is.
async fn ensure_table_properties(
    table: &mut DeltaTable,
    label: &str,
    cfg: &TableConfig,
) -> Result<()> {
    let base = &*table;
    let set = |n: u32| {
        let mut table = base.clone();
        async move {
            if n > 1 {
                update(&mut table, label).await?;
            }
            let mut props = HashMap::new();
            if !delta::has_checkpoint_interval(&table) {
                props.insert(
                    delta::CHECKPOINT_INTERVAL.to_string(),
                    delta::CHECKPOINT_EVERY.to_string(),
                );
            }
            if !crate::delta::applied::has_retention(&table) {
                props.extend(crate::delta::applied::new_table_properties(cfg));
            }
            match props.is_empty() {
                true => Ok(table),
                false => delta::set_properties(table, props).await,
            }
        }
    };
    *table = Retry::new(label, cfg.limits.max_commit_attempts)
        .run("table properties", set)
        .await?
        .0;
    Ok(())
}

/// Bring a loaded table to its newest version (delta-rs reads the commits since the last
/// checkpoint again).
async fn update(table: &mut DeltaTable, label: &str) -> Result<()> {
    table
        .update_state()
        .await
        .map_err(|e| Error::delta(label, e))
}

fn check_vacuum_retention(table_cfg: &TableConfig, opts: MaintenanceOptions) -> Result<()> {
    let m = &table_cfg.maintenance;
    if m.vacuum_retention < m.min_vacuum_retention && !opts.force {
        return Err(Error::config(
            &table_cfg.name,
            format!(
                "vacuum_retention_hours ({:.1}) is shorter than min_vacuum_retention_hours ({:.1}); readers of older versions could lose files. Raise it, or force this run",
                m.vacuum_retention.as_secs_f64() / 3600.0,
                m.min_vacuum_retention.as_secs_f64() / 3600.0
            ),
        ));
    }
    Ok(())
}

/// Compact every partition that has two or more files below the target size, or a file
/// whose deletion vector deletes more than [`crate::delta::vectors::MATERIALISE_SHARE`] of
/// its rows — any vector, when the table keeps manifests (every compaction materialises
/// the vectors of the files it rewrites).
async fn compact(
    table: &mut DeltaTable,
    label: &str,
    table_cfg: &TableConfig,
    files: &[manifest::LiveFile],
    report: &mut MaintenanceReport,
) -> Result<()> {
    let target_size = table_cfg.maintenance.target_file_size.max(1);
    let mut small: std::collections::BTreeMap<&Partition, usize> = Default::default();
    for f in files.iter().filter(|f| (f.size as u64) < target_size) {
        *small.entry(&f.partition).or_default() += 1;
    }
    // A file whose vector deletes more than the share is rewritten without its deleted rows,
    // even alone.
    let candidates: Vec<Partition> = small
        .into_iter()
        .filter(|(_, n)| *n >= 2)
        .map(|(p, _)| p.clone())
        .chain(
            files
                .iter()
                .filter(|f| {
                    f.deletion_vector && (table_cfg.writing.manifests || f.vector_to_materialise())
                })
                .map(|f| f.partition.clone()),
        )
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    // Partitions are committed in groups: every commit replays the log to bring the handle
    // forward, so one commit per partition costs reads that grow with the partitions. A group
    // that keeps conflicting is tried again partition by partition, so that one busy
    // partition does not hold back the others.
    for group in candidates.chunks(COMPACTION_GROUP) {
        let outcome = compact_table(table, label, table_cfg, group, target_size).await;
        let outcomes = match outcome {
            Err(Error::Contention { .. }) if group.len() > 1 => {
                let mut each = Vec::with_capacity(group.len());
                for p in group {
                    let one = compact_table(
                        table,
                        label,
                        table_cfg,
                        std::slice::from_ref(p),
                        target_size,
                    );
                    each.push((std::slice::from_ref(p), one.await));
                }
                each
            }
            other => vec![(group, other)],
        };
        for (partitions, outcome) in outcomes {
            match outcome {
                Ok((removed, compacted)) => {
                    report.files_compacted += removed;
                    report.partitions_compacted += compacted;
                }
                Err(Error::Contention { .. }) => {
                    for p in partitions {
                        tracing::warn!(table = %label, partition = %p.folder(), "compaction keeps conflicting with concurrent writers; skipped until the next run");
                    }
                    report.partitions_skipped += partitions.len();
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Compact partitions of a table (the main table or its tombstone table) in one commit,
/// planned on the loaded version and re-planned on the newest after a conflict. The handle
/// ends at the compaction's commit. Returns the files removed and the partitions compacted.
async fn compact_table(
    table: &mut DeltaTable,
    label: &str,
    table_cfg: &TableConfig,
    partitions: &[Partition],
    target_size: u64,
) -> Result<(u64, usize)> {
    let base = &*table;
    let compaction = |n: u32| {
        let mut table = base.clone();
        async move {
            if n > 1 {
                update(&mut table, label).await?;
            }
            // Manifests cannot express deleted rows: with them on, every vector goes.
            let plan = compact::plan(&table, partitions, target_size, table_cfg.writing.manifests)?;
            let compacted = plan.len();
            #[cfg(test)]
            crate::delta::testing::global()
                .reach(
                    crate::delta::testing::Point::BeforeCompactionCommit,
                    label,
                    partitions.iter().map(|p| p.folder()).collect(),
                )
                .await;
            let props = delta::writer_properties(table_cfg);
            let (removed, table) =
                compact::execute(table, plan, (target_size, props), guard()).await?;
            Ok((removed, compacted, table))
        }
    };
    let attempts = COMPACTION_ATTEMPTS.min(table_cfg.limits.max_commit_attempts);
    let ((removed, compacted, t), _) = Retry::new(label, attempts)
        .run("compaction", compaction)
        .await?;
    *table = t;
    Ok((removed, compacted))
}

/// VACUUM past the retention, deleting only what a Delta writer made: the files the log
/// removed (delta-rs's lite mode), then the unreferenced files of failed or uncommitted
/// writes — among the files no commit references (full mode, listed as a dry run), only
/// Parquet data files in the table's partition layout (`col=value/…/name.parquet`) and
/// deletion-vector files. Anything else in the table's folder (another tool's files, a
/// folder of other data under a `target` set too high) is left, and named in a WARN:
/// delta-rs's full mode deletes every object of the folder the log does not reference.
async fn vacuum(
    table: DeltaTable,
    retention: std::time::Duration,
    label: &str,
) -> Result<(DeltaTable, usize)> {
    let retention = chrono::Duration::from_std(retention)
        .map_err(|e| Error::config(label, format!("vacuum retention out of range: {e}")))?;
    let dry_run = |table: DeltaTable, mode| {
        table
            .vacuum()
            .with_retention_period(retention)
            .with_enforce_retention_duration(false)
            .with_mode(mode)
            .with_dry_run(true)
    };
    let (table, removed) = dry_run(table, VacuumMode::Lite)
        .await
        .map_err(|e| Error::delta(label, e))?;
    let (table, unreferenced) = dry_run(table, VacuumMode::Full)
        .await
        .map_err(|e| Error::delta(label, e))?;
    let partitions = table
        .snapshot()
        .map_err(|e| Error::delta(label, e))?
        .metadata()
        .partition_columns()
        .to_vec();
    let (orphans, foreign): (Vec<String>, Vec<String>) = unreferenced
        .files_deleted
        .into_iter()
        .partition(|p| written_by_delta(p, &partitions));
    if !foreign.is_empty() {
        tracing::warn!(table = label, kept = foreign.len(), first = ?&foreign[..foreign.len().min(5)], "objects in the table's folder that no Delta writer made are never vacuumed; move them out of it");
    }
    let mut doomed = removed.files_deleted;
    doomed.extend(orphans);
    doomed.sort();
    doomed.dedup();
    if doomed.is_empty() {
        return Ok((table, 0));
    }
    // As Delta's VACUUM: a START commit (which also checks the table's protocol, e.g.
    // `vacuumProtocolCheck`), the deletes, an END commit.
    let start = deltalake::protocol::DeltaOperation::VacuumStart {
        retention_check_enabled: false,
        specified_retention_millis: Some(retention.num_milliseconds()),
        default_retention_millis: retention.num_milliseconds(),
    };
    let metrics = serde_json::json!({"numFilesToDelete": doomed.len()});
    let table = delta::commit_marker(label, table, start, metrics).await?;
    let store = table.log_store().object_store(None);
    let mut deleted = 0;
    for p in doomed {
        // As listed: parsed, not re-encoded (a partition value's `%3D` stays as it is).
        let Ok(path) = deltalake::Path::parse(&p) else {
            continue;
        };
        match object_store::ObjectStoreExt::delete(store.as_ref(), &path).await {
            Ok(()) => deleted += 1,
            Err(deltalake::ObjectStoreError::NotFound { .. }) => {}
            Err(e) => return Err(Error::storage(label, e)),
        }
    }
    let end = deltalake::protocol::DeltaOperation::VacuumEnd {
        status: "COMPLETED".to_string(),
    };
    let metrics = serde_json::json!({"numDeletedFiles": deleted, "numVacuumedDirectories": 0});
    let table = delta::commit_marker(label, table, end, metrics).await?;
    Ok((table, deleted))
}

/// Whether a path relative to a table's root is a file a Delta writer makes there: a
/// Parquet data file directly in the partition folders of the table's partition columns (in
/// their order), or a deletion-vector file at the root.
fn written_by_delta(path: &str, partition_columns: &[String]) -> bool {
    let mut parts: Vec<&str> = path.split('/').collect();
    let Some(name) = parts.pop() else {
        return false;
    };
    if parts.is_empty() && name.starts_with("deletion_vector_") && name.ends_with(".bin") {
        return true;
    }
    name.ends_with(".parquet")
        && parts.len() == partition_columns.len()
        && parts
            .iter()
            .zip(partition_columns)
            .all(|(p, c)| p.split_once('=').is_some_and(|(k, _)| k == c))
}

/// The newest `deleted_at` among tombstones recorded before `cutoff` (`None`: none expire).
async fn newest_expiring(t: &DeltaTable, cutoff: DateTime<Utc>) -> Result<Option<DateTime<Utc>>> {
    use deltalake::arrow::array::AsArray;
    use deltalake::arrow::datatypes::{DataType, Int64Type};
    let cutoff = cutoff.timestamp_micros();
    let mut newest: Option<i64> = None;
    crate::delta::scan::Scan::columns(&[crate::delta::tombstones::DELETED_AT_COLUMN])
        .each(t, |b| {
            let at = deltalake::arrow::compute::cast(b.column(0), &DataType::Int64)
                .map_err(Error::arrow)?;
            let below = at
                .as_primitive::<Int64Type>()
                .iter()
                .flatten()
                .filter(|v| *v < cutoff)
                .max();
            newest = newest.max(below);
            Ok(true)
        })
        .await?;
    Ok(newest.and_then(DateTime::from_timestamp_micros))
}

/// Expire tombstones recorded before the retention cutoff. The cutoff is rounded down (to
/// the day for the default retention) so that the horizon moves at most once per step. The
/// main table's horizon moves first: from then on, files written before it are refused
/// instead of risking a revived row.
async fn expire_tombstones(
    table_cfg: &TableConfig,
    options: &std::collections::HashMap<String, String>,
) -> Result<usize> {
    let (Some(target), Some(tombstones)) = (&table_cfg.target, &table_cfg.tombstones) else {
        return Ok(0);
    };
    let label = table_cfg.label(crate::config::Managed::Tombstones);
    let cutoff = expiry_cutoff(Utc::now(), table_cfg.limits.tombstone_retention);
    let mut t = delta::open(tombstones, options).await?;
    if !delta::exists(&t) {
        return Ok(0);
    }
    ensure_table_properties(&mut t, &label, table_cfg).await?;
    let mut expired = 0;
    if let Some(newest) = newest_expiring(&t, cutoff).await? {
        move_horizon(table_cfg, target, options, newest).await?;
        expired = delete_tombstones_up_to(table_cfg, tombstones, options, newest).await?;
        update(&mut t, &label).await?;
    }
    // The tombstone table gets one small file per delete batch: compact and vacuum it too.
    let target = table_cfg.maintenance.target_file_size.max(1);
    match compact_table(&mut t, &label, table_cfg, &[Partition::default()], target).await {
        Ok(_) => {}
        Err(Error::Contention { .. }) => {
            tracing::info!(table = %label, "tombstone compaction kept conflicting with other writers; next run")
        }
        Err(e) => return Err(e),
    }
    update(&mut t, &label).await?;
    deltalake::checkpoints::create_checkpoint(&t, None)
        .await
        .map_err(|e| Error::delta(&label, e))?;
    vacuum(t, table_cfg.maintenance.vacuum_retention, &label).await?;
    Ok(expired)
}

/// `now - retention`, rounded down to a step of a seventh of the retention (at least a
/// second, at most a day).
fn expiry_cutoff(now: DateTime<Utc>, retention: std::time::Duration) -> DateTime<Utc> {
    let step = (retention.as_secs() / 7).clamp(1, 86_400) as i64;
    let raw = now.timestamp() - retention.as_secs() as i64;
    DateTime::from_timestamp(raw - raw.rem_euclid(step), 0).unwrap_or(now)
}

/// Record on the main table that tombstones up to `horizon` may be gone.
async fn move_horizon(
    table_cfg: &TableConfig,
    target: &url::Url,
    options: &std::collections::HashMap<String, String>,
    horizon: DateTime<Utc>,
) -> Result<()> {
    let set = |_: u32| async move {
        let t = delta::open(target, options).await?;
        if delta::exists(&t) && delta::props(&t).tombstone_horizon < Some(horizon) {
            delta::set_properties(t, TableProps::for_horizon(horizon)).await?;
        }
        Ok(())
    };
    Retry::new(&table_cfg.name, table_cfg.limits.max_commit_attempts)
        .run("tombstone horizon", set)
        .await?;
    Ok(())
}

async fn delete_tombstones_up_to(
    table_cfg: &TableConfig,
    tombstones: &url::Url,
    options: &std::collections::HashMap<String, String>,
    horizon: DateTime<Utc>,
) -> Result<usize> {
    let label = table_cfg.label(crate::config::Managed::Tombstones);
    let label = &label;
    let expire = |_: u32| async move {
        let t = delta::open(tombstones, options).await?;
        delete_expired(label, t, horizon).await
    };
    Ok(Retry::new(label, 5)
        .run("tombstone expiry", expire)
        .await?
        .0)
}

/// Delete the tombstones recorded at or before `horizon`: each file holding one is written
/// again without them (`delta::rewrite_rows`), in one commit with the maintenance guard's
/// transaction. Returns the tombstones deleted.
async fn delete_expired(label: &str, t: DeltaTable, horizon: DateTime<Utc>) -> Result<usize> {
    use deltalake::arrow::array::{Array, AsArray, BooleanArray};
    use deltalake::arrow::datatypes::{DataType, Int64Type};
    let horizon_us = horizon.timestamp_micros();
    let schema =
        delta::arrow_schema(&t).ok_or_else(|| Error::internal(format!("{label}: no schema")))?;
    let at = schema
        .index_of(crate::delta::tombstones::DELETED_AT_COLUMN)
        .map_err(Error::arrow)?;
    let expire = |b: deltalake::arrow::array::RecordBatch| {
        let when = deltalake::arrow::compute::cast(b.column(at), &DataType::Int64)
            .map_err(Error::arrow)?;
        let when = when.as_primitive::<Int64Type>();
        let keep: BooleanArray = (0..b.num_rows())
            .map(|i| Some(!(when.is_valid(i) && when.value(i) <= horizon_us)))
            .collect();
        let kept =
            deltalake::arrow::compute::filter_record_batch(&b, &keep).map_err(Error::arrow)?;
        Ok((kept, keep.false_count()))
    };
    // No read predicate: a concurrent commit that removes a file read conflicts; one that
    // adds tombstones adds newer ones, which this does not touch.
    let operation = deltalake::protocol::DeltaOperation::Delete { predicate: None };
    let txn = Transaction::new(MAINTENANCE_APP_ID, Utc::now().timestamp_millis());
    Ok(
        delta::rewrite_rows(label, t, None, expire, operation, &[txn])
            .await?
            .1,
    )
}

/// What a maintenance invocation asks for (the Lambda adapter parses its payload into one:
/// `tributary_lambda::maintenance`; the library reads no event).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// Tables to maintain; empty = all configured tables.
    pub tables: Vec<String>,
    pub force: bool,
    /// Apply this table's DMS reload (`{"reload": "table"}`) instead of maintaining.
    pub reload: Option<String>,
    /// Only list the configured tables (`{"list": true}`): the scheduled state machine
    /// maintains each in an invocation of its own.
    pub list: bool,
    /// Only move every table's watermark and publish the groups' cuts (`{"cuts": true}`):
    /// the scheduled state machine's last step, after the tables' upkeep.
    pub cuts: bool,
}

/// What a maintenance run (or a reload request) did: a report per maintained table, the
/// tables that failed with their errors.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub maintained: Vec<MaintenanceReport>,
    /// (table, error) of tables that failed.
    pub failed: Vec<(String, String)>,
    /// What a `reload` request did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reloaded: Option<crate::delta::reload::ReloadReport>,
    /// The configured tables (a `list` request).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tables: Option<Vec<String>>,
    /// The catalog reconciliation of each table with catalog settings (a failed one has
    /// its `error`; it does not fail the run: `CatalogSyncFailed` is the alarm).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub catalog: std::collections::BTreeMap<String, crate::delta::catalog::CatalogReport>,
    /// The tables' watermarks, moved where they can move, and the groups' cuts, published
    /// (`crate::delta::cut`). A table whose watermark cannot be computed fails the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watermarks: Option<crate::delta::cut::Watermarks>,
}

impl Summary {
    /// `Ok` when no table failed; otherwise the failed tables with their errors (after all
    /// tables were attempted), for a caller to fail the run with.
    pub fn outcome(&self) -> std::result::Result<(), Failed> {
        if self.failed.is_empty() {
            return Ok(());
        }
        Err(Failed {
            count: self.failed.len(),
            reasons: self
                .failed
                .iter()
                .map(|(t, e)| format!("{t}: {e}"))
                .collect::<Vec<_>>()
                .join("; "),
        })
    }
}

/// Maintenance (or a reload) failed for some tables, after all were attempted
/// ([`Summary::outcome`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("maintenance failed for {count} table(s): {reasons}")]
pub struct Failed {
    pub count: usize,
    /// `table: error`, separated by `; `.
    pub reasons: String,
}

/// Run maintenance for a request with the engine's configuration and storage. Per-table
/// failures are in the summary; an error means nothing was attempted (an unknown table).
pub async fn handle(engine: &crate::Engine, request: &Request) -> Result<Summary> {
    if request.list {
        return Ok(Summary {
            tables: Some(
                engine
                    .config()
                    .tables
                    .iter()
                    .map(|t| t.name.clone())
                    .collect(),
            ),
            ..Default::default()
        });
    }
    if request.cuts {
        let mut s = Summary::default();
        watermarks(engine, &request.tables, true, &mut s).await;
        return Ok(s);
    }
    if let Some(table) = &request.reload {
        let mut s = Summary::default();
        // Boxed like the upkeep below (future nesting depth).
        match Box::pin(crate::delta::reload::reload(engine, table)).await {
            Ok(r) => s.reloaded = Some(r),
            Err(e) => {
                tracing::error!(table = %table, error = %e, kind = e.kind(), "reload failed");
                s.failed.push((table.clone(), e.to_string()));
            }
        }
        return Ok(s);
    }
    // Boxed: the upkeep and the catalog futures nested are too deep for the compiler's
    // layout query otherwise.
    let mut summary = Box::pin(run(
        engine.config(),
        engine.storage(),
        engine.storage_options(),
        &request.tables,
        MaintenanceOptions {
            force: request.force,
        },
    ))
    .await?;
    summary.catalog = Box::pin(sync_catalog(engine, &request.tables)).await;
    // The tables' watermarks; the groups' cuts when every table was maintained (a run for
    // some tables — the state machine's per-table invocations — leaves them to `cuts`).
    watermarks(
        engine,
        &request.tables,
        request.tables.is_empty(),
        &mut summary,
    )
    .await;
    Ok(summary)
}

/// Move the watermarks of `only` (all when empty) and, with `groups`, publish the cuts of
/// their groups, into the summary. A table or group that fails fails the run.
async fn watermarks(engine: &crate::Engine, only: &[String], groups: bool, summary: &mut Summary) {
    let w = Box::pin(crate::delta::cut::compute(
        engine.config(),
        engine.storage(),
        engine.storage_options(),
        only,
        true,
        groups,
        Utc::now(),
    ))
    .await;
    summary.failed.extend(w.failed.iter().cloned());
    if groups {
        summary
            .failed
            .extend(crate::delta::cut::publish(engine.storage(), engine.config(), &w).await);
    }
    summary.watermarks = Some(w);
}

/// Reconcile the catalog entries of the named tables (all when `only` is empty): what the
/// maintenance run does after the upkeep, and `tributary catalog sync`. A table that cannot
/// be read has the error in its report.
pub async fn sync_catalog(
    engine: &crate::Engine,
    only: &[String],
) -> std::collections::BTreeMap<String, crate::delta::catalog::CatalogReport> {
    let mut out = std::collections::BTreeMap::new();
    for t in &engine.config().tables {
        if !only.is_empty() && !only.contains(&t.name) {
            continue;
        }
        let report = match Box::pin(engine.catalog().reconcile(t, engine.storage_options())).await {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                tracing::error!(table = %t.name, error = %e, "catalog not reconciled");
                crate::delta::catalog::CatalogReport {
                    error: Some(e.to_string()),
                    ..Default::default()
                }
            }
        };
        tracing::info!(table = %t.name, calls = report.calls, created = report.entries_created, updated = report.entries_updated, partitions_added = report.partitions_added, partitions_removed = report.partitions_removed, error = report.error.as_deref(), "catalog reconciled");
        out.insert(t.name.clone(), report);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vacuum deletes only what a Delta writer makes in the table's layout (#44): data files
    /// in the partition folders, deletion vectors; never another tool's files.
    #[test]
    fn only_files_a_delta_writer_makes_are_vacuumed() {
        let parts = vec!["route_id".to_string(), "day".to_string()];
        assert!(written_by_delta(
            "route_id=A/day=1/part-00000-x.snappy.parquet",
            &parts
        ));
        assert!(written_by_delta("deletion_vector_0c7f.bin", &parts));
        for other in [
            "part-00000-x.snappy.parquet",
            "route_id=A/part-00000-x.parquet",
            "day=1/route_id=A/part-0.parquet",
            "route_id=A/day=1/notes.txt",
            "dms/shop/orders/LOAD00000001.parquet",
            "route_id=A/day=1/.part-0.parquet.crc",
        ] {
            assert!(!written_by_delta(other, &parts), "{other}");
        }
        assert!(written_by_delta("part-0.parquet", &[]));
        assert!(!written_by_delta("exports/part-0.parquet", &[]));
    }

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// One CDC file: (op, ts, id, part) rows.
    fn cdc(rows: &[(&str, &str, i64, &str)]) -> bytes::Bytes {
        use arrow::array::{Int64Array, RecordBatch, StringArray};
        use arrow::datatypes::{DataType, Field, Schema};
        let schema = Arc::new(Schema::new(vec![
            Field::new("Op", DataType::Utf8, true),
            Field::new("ts", DataType::Utf8, true),
            Field::new("id", DataType::Int64, true),
            Field::new("part", DataType::Utf8, true),
        ]));
        let op: Vec<&str> = rows.iter().map(|r| r.0).collect();
        let ts: Vec<&str> = rows.iter().map(|r| r.1).collect();
        let part: Vec<&str> = rows.iter().map(|r| r.3).collect();
        let b = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(op)),
                Arc::new(StringArray::from(ts)),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
                Arc::new(StringArray::from(part)),
            ],
        )
        .unwrap();
        crate::demo::to_parquet(&b).unwrap()
    }

    /// A compaction group that keeps conflicting (a writer keeps changing one of its
    /// partitions) is tried again partition by partition: the busy partition is skipped
    /// until the next run, the others are compacted, and no change is lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_partition_does_not_hold_back_its_compaction_group() {
        let dir = tempfile::tempdir().unwrap();
        let extra = "partition_by = [\"part\"]\nsequence_by = [\"ts\"]";
        let text = crate::config::test_table("busy", "raw/busy/", "curated/busy", extra);
        let config = crate::Config::from_toml(&text, "test", Some(dir.path())).unwrap();
        let engine = crate::Engine::new(config.clone());
        let src = config.tables[0].source.clone();
        for i in 0..3i64 {
            let f = src.join(&format!("20240101-000000000{i}.parquet")).unwrap();
            let ts = format!("2024-01-01 00:00:0{i}");
            let rows: Vec<(&str, &str, i64, &str)> = (0..4)
                .map(|j| ("I", ts.as_str(), i * 10 + j, ["a", "b"][j as usize % 2]))
                .collect();
            engine.storage().put(&f, cdc(&rows)).await.unwrap();
            let r = engine.process(&[f]).await;
            assert_eq!(r.failures().count(), 0, "{:?}", r.files);
        }
        // Every compaction attempt touching partition a meets an update of row 0 (in a).
        let calls: Arc<Mutex<Vec<usize>>> = Arc::default();
        let n = Arc::new(AtomicUsize::new(0));
        let (e, c) = (engine.clone(), calls.clone());
        let hook = crate::delta::testing::Hook::each(move |partitions: Vec<String>| {
            let (e, c, n, src) = (e.clone(), c.clone(), n.clone(), src.clone());
            async move {
                if !partitions.iter().any(|p| p == "part=a") {
                    return;
                }
                c.lock().unwrap().push(partitions.len());
                let k = n.fetch_add(1, Ordering::SeqCst);
                let f = src
                    .join(&format!("20240102-00000000{k:02}.parquet"))
                    .unwrap();
                let ts = format!("2024-01-02 00:00:{k:02}");
                let update = cdc(&[("U", ts.as_str(), 0, "a")]);
                e.storage().put(&f, update).await.unwrap();
                let r = e.process(&[f]).await;
                assert_eq!(r.failures().count(), 0, "{:?}", r.files);
            }
        });
        let point = crate::delta::testing::Point::BeforeCompactionCommit;
        crate::delta::testing::global().set(point, "busy", hook);
        let cfg = &config.tables[0];
        let report = maintain(
            cfg,
            engine.storage(),
            engine.storage_options(),
            MaintenanceOptions { force: false },
        )
        .await
        .unwrap();
        crate::delta::testing::global().clear("busy");
        let calls = calls.lock().unwrap().clone();
        assert_eq!(
            calls,
            vec![2, 2, 2, 1, 1, 1],
            "three attempts of the group, then three of partition a alone"
        );
        assert_eq!(
            (report.partitions_compacted, report.partitions_skipped),
            (1, 1),
            "{report:?}"
        );
        let t = delta::open(cfg.target.as_ref().unwrap(), &Default::default())
            .await
            .unwrap();
        // count(*), count(DISTINCT id)
        let ids = crate::delta::testing::text_values(
            &crate::delta::testing::table_batch(&t, &["id"], &[]).await,
        );
        let distinct: std::collections::HashSet<_> =
            ids.iter().filter_map(|r| r[0].clone()).collect();
        assert_eq!((ids.len(), distinct.len()), (12, 12), "every row once");
        let b_files = t
            .get_file_uris()
            .unwrap()
            .filter(|u| u.contains("part=b"))
            .count();
        assert_eq!(b_files, 1, "partition b compacted");
    }

    /// A table created without `delta.checkpointInterval` or
    /// `delta.setTransactionRetentionDuration` (before tributary set them) gets them from
    /// its next maintenance run; a user's own values are kept, without a commit.
    #[tokio::test]
    async fn maintenance_gives_an_older_table_the_properties_of_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let text = crate::config::test_table("t", "raw/t/", "curated/t", "");
        let config = crate::Config::from_toml(&text, "test", Some(dir.path())).unwrap();
        let cfg = &config.tables[0];
        let url = cfg.target.clone().unwrap();
        let create = |own: &[(&str, &str)]| {
            let url = url.clone();
            let own: Vec<(String, String)> = own
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            async move {
                let t = delta::open(&url, &Default::default()).await.unwrap();
                t.create()
                    .with_columns([deltalake::kernel::StructField::new(
                        "id",
                        deltalake::kernel::DataType::LONG,
                        true,
                    )])
                    .with_configuration(own.into_iter().map(|(k, v)| (k, Some(v))))
                    .await
                    .unwrap()
            }
        };
        let mut t = create(&[]).await;
        assert!(!delta::has_checkpoint_interval(&t));
        assert!(!crate::delta::applied::has_retention(&t));
        ensure_table_properties(&mut t, "t", cfg).await.unwrap();
        let t = delta::open(&url, &Default::default()).await.unwrap();
        let prop = |t: &DeltaTable, k: &str| {
            t.snapshot()
                .unwrap()
                .metadata()
                .configuration()
                .get(k)
                .cloned()
        };
        let retention = crate::delta::applied::TXN_RETENTION;
        assert_eq!(prop(&t, delta::CHECKPOINT_INTERVAL).as_deref(), Some("10"));
        assert_eq!(
            prop(&t, retention),
            Some(format!(
                "interval {} seconds",
                cfg.limits.tombstone_retention.as_secs() + 7 * 86_400
            )),
            "the tombstone retention and a week"
        );
        assert!(
            delta::props(&t).file_records_since.is_some(),
            "the records start now"
        );
        std::fs::remove_dir_all(url.to_file_path().unwrap()).unwrap();
        let mut t = create(&[
            (delta::CHECKPOINT_INTERVAL, "50"),
            (retention, "interval 30 days"),
        ])
        .await;
        let version = t.version();
        ensure_table_properties(&mut t, "t", cfg).await.unwrap();
        assert_eq!(
            (
                prop(&t, delta::CHECKPOINT_INTERVAL).as_deref(),
                prop(&t, retention).as_deref(),
                t.version()
            ),
            (Some("50"), Some("interval 30 days"), version)
        );
    }

    #[test]
    fn the_expiry_cutoff_moves_in_steps() {
        let now = DateTime::parse_from_rfc3339("2026-11-30T15:47:11Z")
            .unwrap()
            .with_timezone(&Utc);
        let day = |d: u64| std::time::Duration::from_secs(d * 86_400);
        // 35 days: a day's step, so the horizon moves at most once a day
        assert_eq!(
            expiry_cutoff(now, day(35)).to_rfc3339(),
            "2026-10-26T00:00:00+00:00"
        );
        // short retentions (tests) step by a seventh, at least a second
        assert_eq!(
            expiry_cutoff(now, std::time::Duration::from_secs(70)).to_rfc3339(),
            "2026-11-30T15:46:00+00:00"
        );
        assert!(expiry_cutoff(now, std::time::Duration::from_millis(500)) <= now);
    }
}
