//! Table maintenance: compaction (OPTIMIZE per partition), checkpoint and log cleanup,
//! VACUUM, tombstone garbage collection and a full manifest regeneration.
//!
//! Safe next to merges: every step commits through Delta's optimistic concurrency. A
//! compaction that loses a race with a merge (the merge removed files it was compacting) is
//! retried on the new snapshot, and skipped until the next run if it keeps losing; a merge
//! that loses against a compaction retries by itself. No merge commit is ever lost.

use std::collections::BTreeMap;
use std::num::NonZeroU64;
use std::time::Instant;

use deltalake::datafusion::prelude::{col, lit};
use deltalake::operations::vacuum::VacuumMode;
use deltalake::{DeltaTable, FilterOp, FilterValue};
use serde::Serialize;

use crate::config::{Config, TableConfig};
use crate::delta;
use crate::error::{Error, Result};
use crate::manifest;
use crate::storage::Storage;

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
    /// Partitions whose compaction kept losing to concurrent merges (retried next run).
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
}

/// Outcome for every table of a run.
#[derive(Debug, Default)]
pub struct RunReport {
    pub tables: Vec<(String, Result<MaintenanceReport>)>,
}

impl RunReport {
    pub fn failed(&self) -> impl Iterator<Item = (&str, &Error)> {
        self.tables
            .iter()
            .filter_map(|(t, r)| r.as_ref().err().map(|e| (t.as_str(), e)))
    }
}

/// Maintain the named tables (all when `only` is empty). A failing table does not stop
/// the others.
pub async fn run(
    config: &Config,
    storage: &Storage,
    options: &std::collections::HashMap<String, String>,
    only: &[String],
    opts: MaintenanceOptions,
) -> Result<RunReport> {
    for name in only {
        if config.table(name).is_none() {
            return Err(Error::config(
                &config.origin,
                format!(
                    "maintenance asked for table `{name}`, which is not configured (tables: {})",
                    config
                        .tables
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    let mut report = RunReport::default();
    for t in &config.tables {
        if !only.is_empty() && !only.contains(&t.name) {
            continue;
        }
        let r = maintain(t, storage, options, opts).await;
        match &r {
            Ok(m) => tracing::info!(
                table = %t.name,
                files_before = m.files_before,
                files_after = m.files_after,
                bytes_before = m.bytes_before,
                bytes_after = m.bytes_after,
                partitions_compacted = m.partitions_compacted,
                partitions_skipped = m.partitions_skipped,
                version_after = m.version_after,
                files_vacuumed = m.files_vacuumed,
                tombstones_expired = m.tombstones_expired,
                manifests_written = m.manifests_written,
                manifests_deleted = m.manifests_deleted,
                duration_ms = m.duration_ms,
                "maintained"
            ),
            Err(e) => {
                tracing::error!(table = %t.name, error = %e, kind = e.kind(), "maintenance failed")
            }
        }
        report.tables.push((t.name.clone(), r));
    }
    Ok(report)
}

/// Maintain one table.
pub async fn maintain(
    table_cfg: &TableConfig,
    storage: &Storage,
    options: &std::collections::HashMap<String, String>,
    opts: MaintenanceOptions,
) -> Result<MaintenanceReport> {
    let start = Instant::now();
    let mcfg = &table_cfg.maintenance;
    let mut report = MaintenanceReport {
        table: table_cfg.name.clone(),
        ..Default::default()
    };
    if mcfg.vacuum_retention < mcfg.min_vacuum_retention && !opts.force {
        return Err(Error::config(
            &table_cfg.name,
            format!(
                "vacuum_retention_hours ({:.1}) is shorter than min_vacuum_retention_hours ({:.1}); readers of older versions could lose files. Raise it, or force this run",
                mcfg.vacuum_retention.as_secs_f64() / 3600.0,
                mcfg.min_vacuum_retention.as_secs_f64() / 3600.0
            ),
        ));
    }
    let label = table_cfg.name.as_str();
    let table = delta::open(&table_cfg.target, options).await?;
    if !delta::exists(&table) {
        report.skipped = Some("the Delta table does not exist yet".into());
        return Ok(report);
    }
    report.version_before = table.version();
    let before = manifest::live_files(&table)?;
    report.files_before = before.len();
    report.bytes_before = before.iter().map(|f| f.size).sum();

    // 1. Compaction, partition by partition, only where two or more small files exist.
    let target_size = mcfg.target_file_size.max(1);
    let mut small: BTreeMap<String, usize> = BTreeMap::new();
    for f in &before {
        if (f.size as u64) < target_size {
            *small.entry(f.partition.clone()).or_default() += 1;
        }
    }
    let parts: Vec<String> = table_partition_columns(&table, label)?;
    for (partition, n) in small.iter().filter(|(_, n)| **n >= 2) {
        let values = partition_values(&parts, partition);
        let mut done = false;
        for attempt in 1..=3u32 {
            let t = delta::open(&table_cfg.target, options).await?;
            let filters: Vec<_> = values
                .iter()
                .map(|(c, v)| (c.as_str(), FilterOp::Eq, FilterValue::Scalar(v.as_str())))
                .collect();
            let res = t
                .optimize()
                .with_filters(&filters)
                .with_target_size(NonZeroU64::new(target_size).unwrap_or(NonZeroU64::MIN))
                .with_commit_properties(delta::tributary_commit(&[]))
                .await;
            match res {
                Ok((_, m)) => {
                    report.files_compacted += m.num_files_removed;
                    report.partitions_compacted += usize::from(m.num_files_removed > 0);
                    done = true;
                    break;
                }
                Err(e) if crate::error::is_commit_conflict(&e) && attempt < 3 => {
                    tracing::debug!(table = label, partition = %partition, error = %e, "compaction conflicted with a merge; retrying");
                    delta::backoff(attempt).await;
                }
                Err(e) if crate::error::is_commit_conflict(&e) => {
                    tracing::warn!(table = label, partition = %partition, files = n, error = %e, "compaction keeps conflicting with merges; skipped until the next run");
                    break;
                }
                Err(e) => return Err(Error::delta(label, e)),
            }
        }
        report.partitions_skipped += usize::from(!done);
    }

    // 2. Checkpoint and expired log cleanup.
    let table = delta::open(&table_cfg.target, options).await?;
    deltalake::checkpoints::create_checkpoint(&table, None)
        .await
        .map_err(|e| Error::delta(label, e))?;
    report.checkpoint_version = table.version();
    report.log_files_removed = deltalake::checkpoints::cleanup_metadata(&table, None)
        .await
        .map_err(|e| Error::delta(label, e))?;

    // 3. VACUUM (full: also removes files of failed, uncommitted writes).
    report.files_vacuumed = vacuum(table, mcfg.vacuum_retention, label).await?;

    // 4. Tombstones past their retention, then tidy the tombstone table itself.
    report.tombstones_expired = expire_tombstones(table_cfg, options).await?;

    // 5. All manifests, deleting those of partitions without files.
    let table = delta::open(&table_cfg.target, options).await?;
    if table_cfg.manifests {
        let m = manifest::sync(storage, table, None).await?;
        report.manifests_written = m.written;
        report.manifests_deleted = m.deleted;
    }
    let table = delta::open(&table_cfg.target, options).await?;
    let after = manifest::live_files(&table)?;
    report.version_after = table.version();
    report.files_after = after.len();
    report.bytes_after = after.iter().map(|f| f.size).sum();
    report.duration_ms = start.elapsed().as_millis() as u64;
    Ok(report)
}

async fn vacuum(table: DeltaTable, retention: std::time::Duration, label: &str) -> Result<usize> {
    let retention = chrono::Duration::from_std(retention)
        .map_err(|e| Error::Internal(format!("retention out of range: {e}")))?;
    let (_, m) = table
        .vacuum()
        .with_retention_period(retention)
        .with_enforce_retention_duration(false)
        .with_mode(VacuumMode::Full)
        .with_commit_properties(delta::tributary_commit(&[]))
        .await
        .map_err(|e| Error::delta(label, e))?;
    Ok(m.files_deleted.len())
}

async fn expire_tombstones(
    table_cfg: &TableConfig,
    options: &std::collections::HashMap<String, String>,
) -> Result<usize> {
    let label = format!("{} tombstones", table_cfg.name);
    let cutoff = chrono::Utc::now()
        - chrono::Duration::from_std(table_cfg.tombstone_retention)
            .map_err(|e| Error::Internal(format!("retention out of range: {e}")))?;
    let mut expired = 0;
    for attempt in 1..=5u32 {
        let t = delta::open(&table_cfg.tombstones, options).await?;
        if !delta::exists(&t) {
            return Ok(0);
        }
        let predicate = col(crate::tombstones::DELETED_AT_COLUMN).lt(lit(
            deltalake::datafusion::scalar::ScalarValue::TimestampMicrosecond(
                Some(cutoff.timestamp_micros()),
                Some("UTC".into()),
            ),
        ));
        match t
            .delete()
            .with_predicate(predicate)
            .with_commit_properties(delta::tributary_commit(&[]))
            .await
        {
            Ok((_, m)) => {
                expired = m.num_deleted_rows.unwrap_or_default();
                break;
            }
            Err(e) if crate::error::is_commit_conflict(&e) && attempt < 5 => {
                delta::backoff(attempt).await
            }
            Err(e) => return Err(Error::delta(&label, e)),
        }
    }
    // The tombstone table gets one small file per delete batch: compact and vacuum it too.
    let t = delta::open(&table_cfg.tombstones, options).await?;
    match t
        .optimize()
        .with_commit_properties(delta::tributary_commit(&[]))
        .await
    {
        Ok(_) => {}
        Err(e) if crate::error::is_commit_conflict(&e) => {
            tracing::debug!(table = %label, "tombstone compaction conflicted; next run")
        }
        Err(e) => return Err(Error::delta(&label, e)),
    }
    let t = delta::open(&table_cfg.tombstones, options).await?;
    deltalake::checkpoints::create_checkpoint(&t, None)
        .await
        .map_err(|e| Error::delta(&label, e))?;
    vacuum(t, table_cfg.maintenance.vacuum_retention, &label).await?;
    Ok(expired)
}

fn table_partition_columns(table: &DeltaTable, label: &str) -> Result<Vec<String>> {
    Ok(table
        .snapshot()
        .map_err(|e| Error::delta(label, e))?
        .metadata()
        .partition_columns()
        .iter()
        .map(|c| c.to_string())
        .collect())
}

/// `a=1/b=x` → [(a, 1), (b, x)] (values as written in the Delta log).
fn partition_values(columns: &[String], partition: &str) -> Vec<(String, String)> {
    if partition.is_empty() {
        return vec![];
    }
    columns
        .iter()
        .zip(partition.split('/'))
        .map(|(c, kv)| {
            let v = kv.split_once('=').map(|(_, v)| v).unwrap_or("");
            (c.clone(), crate::storage::percent_decode(v))
        })
        .collect()
}

/// What a maintenance invocation asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// Tables to maintain; empty = all configured tables.
    pub tables: Vec<String>,
    pub force: bool,
}

impl Request {
    /// Read `table` / `tables` / `force` from the event or its `detail` (scheduled events,
    /// EventBridge Scheduler input, or a manual invoke).
    pub fn from_event(event: &serde_json::Value) -> Request {
        let mut r = Request::default();
        for v in [Some(event), event.get("detail")].into_iter().flatten() {
            if let Some(t) = v.get("table").and_then(|t| t.as_str()) {
                r.tables.push(t.to_string());
            }
            if let Some(ts) = v.get("tables").and_then(|t| t.as_array()) {
                r.tables
                    .extend(ts.iter().filter_map(|t| t.as_str()).map(str::to_string));
            }
            if v.get("force").and_then(|f| f.as_bool()) == Some(true) {
                r.force = true;
            }
        }
        r.tables.dedup();
        r
    }
}

/// Summary of a maintenance invocation.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub maintained: Vec<MaintenanceReport>,
    /// (table, error) of tables that failed.
    pub failed: Vec<(String, String)>,
}

impl Summary {
    /// The Lambda result: the summary, or an error naming the failed tables (after all
    /// tables were attempted) so that the invocation counts as failed and alarms fire.
    pub fn response(&self) -> std::result::Result<serde_json::Value, String> {
        if self.failed.is_empty() {
            serde_json::to_value(self).map_err(|e| e.to_string())
        } else {
            Err(format!(
                "maintenance failed for {} table(s): {}",
                self.failed.len(),
                self.failed
                    .iter()
                    .map(|(t, e)| format!("{t}: {e}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        }
    }
}

/// Run maintenance for a request with the engine's configuration and storage.
pub async fn handle(
    engine: &crate::Engine,
    request: &Request,
) -> std::result::Result<Summary, String> {
    let run = run(
        engine.config(),
        engine.storage(),
        engine.storage_options(),
        &request.tables,
        MaintenanceOptions {
            force: request.force,
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut s = Summary::default();
    for (t, r) in run.tables {
        match r {
            Ok(m) => s.maintained.push(m),
            Err(e) => s.failed.push((t, e.to_string())),
        }
    }
    Ok(s)
}
