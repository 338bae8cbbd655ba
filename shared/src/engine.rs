//! The merge pipeline: route files to tables, read them, plan, and commit — one commit per
//! table per call, retried on conflicts, with bad files isolated.
//!
//! ```text
//! files ──route──▶ per table ──read──▶ ChangeSets ──plan──▶ MergePlan
//!   ──record tombstones──▶ MERGE (retry on conflict) ──re-check tombstones──▶ report
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use deltalake::DeltaTable;
use futures::stream::{self, StreamExt};
use serde::Serialize;
use url::Url;

use crate::config::{Config, TableConfig};
use crate::delta;
use crate::error::{Error, Result};
use crate::manifest;
use crate::plan::{self, MergePlan};
use crate::source::{self, ChangeSet, FileCounts};
use crate::storage::{self, Storage};
use crate::tombstones::{self, Tombstones};

/// What happened to one input file.
#[derive(Debug)]
pub enum FileStatus {
    /// Merged (or found already applied) in the commit described by the table report.
    Merged { table: String, counts: FileCounts },
    /// Not a file for us (no table owns the prefix, or not a data file). Not an error.
    Ignored { reason: String },
    /// Could not be merged; the file stays where it is and the event must fail.
    Failed {
        table: Option<String>,
        error: Arc<Error>,
    },
}

/// Outcome per input file.
#[derive(Debug)]
pub struct FileOutcome {
    pub file: Url,
    pub status: FileStatus,
}

impl FileOutcome {
    pub fn is_failure(&self) -> bool {
        matches!(self.status, FileStatus::Failed { .. })
    }
}

/// One table's commit(s) in a call.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TableReport {
    pub table: String,
    pub files: usize,
    /// Delta version after the merge (None when nothing needed committing).
    pub version: Option<u64>,
    pub source_rows: usize,
    pub inserted: usize,
    pub updated: usize,
    pub deleted: usize,
    /// Changes not applied because the table already had the same or a newer change of
    /// that key (re-delivery, late files), including deletes of absent keys.
    pub skipped_stale: usize,
    /// Rows dropped because a later change of the same key was in the same batch.
    pub superseded_in_batch: usize,
    /// Upserts turned into deletes by a newer tombstone (late insert of a deleted row).
    pub blocked_by_tombstone: usize,
    pub tombstones_recorded: usize,
    pub files_added: usize,
    pub files_removed: usize,
    pub commit_attempts: u32,
    pub duration_ms: u64,
    /// Where the time went (last attempt): loading the table, reading tombstones, the
    /// MERGE, the post-commit tombstone re-check, manifests.
    pub phases_ms: Phases,
    /// Manifests written / deleted after the commit (when enabled).
    pub manifests_written: usize,
    pub manifests_deleted: usize,
    /// Why the manifests could not be updated (the merge itself succeeded; the next merge
    /// of the partition or the maintenance run rewrites them).
    pub manifest_error: Option<String>,
}

/// Milliseconds per phase of a table merge.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Phases {
    pub tombstones_recorded: u64,
    pub load_table: u64,
    pub tombstones_read: u64,
    pub merge: u64,
    pub recheck: u64,
    pub manifests: u64,
}

fn ms_since(t: Instant) -> u64 {
    t.elapsed().as_millis() as u64
}

/// Result of one [`Engine::process`] call.
#[derive(Debug, Default)]
pub struct ProcessReport {
    pub files: Vec<FileOutcome>,
    pub tables: Vec<TableReport>,
}

impl ProcessReport {
    pub fn failures(&self) -> impl Iterator<Item = &FileOutcome> {
        self.files.iter().filter(|f| f.is_failure())
    }
}

/// The merge engine: configuration, storage and delta-rs options, built once.
#[derive(Debug, Clone)]
pub struct Engine {
    config: Arc<Config>,
    storage: Arc<Storage>,
    options: Arc<HashMap<String, String>>,
    local_s3_root: Option<Arc<std::path::PathBuf>>,
    #[cfg(test)]
    before_merge: Option<tests::Hook>,
}

impl Engine {
    pub fn new(config: Config) -> Self {
        Self {
            config: Arc::new(config),
            storage: Arc::new(Storage::new()),
            options: Arc::new(storage::delta_storage_options()),
            local_s3_root: None,
            #[cfg(test)]
            before_merge: None,
        }
    }

    /// Serve `s3://bucket/key` from `<root>/bucket/key` on the local disk — the announced
    /// files and the configured tables alike: for running the Lambda locally
    /// (`cargo lambda watch`) against the sample events without AWS.
    pub fn with_local_s3_root(mut self, root: impl Into<std::path::PathBuf>) -> Self {
        let root: std::path::PathBuf = root.into();
        let root = std::fs::canonicalize(&root).unwrap_or(root);
        self.local_s3_root = Some(Arc::new(root));
        let mut config = (*self.config).clone();
        for t in &mut config.tables {
            t.source = self.resolve(&t.source);
            t.target = self.resolve(&t.target);
            t.tombstones = self.resolve(&t.tombstones);
        }
        self.config = Arc::new(config);
        self
    }

    /// The URL a file is actually read from (see [`Engine::with_local_s3_root`]).
    pub fn resolve(&self, url: &Url) -> Url {
        match (&self.local_s3_root, url.scheme()) {
            (Some(root), "s3") => {
                let p = root.join(url.host_str().unwrap_or("")).join(
                    storage::object_path(url)
                        .map(|p| p.to_string())
                        .unwrap_or_default(),
                );
                Url::from_file_path(&p).unwrap_or_else(|_| url.clone())
            }
            _ => url.clone(),
        }
    }

    /// Load the configuration from a local path or `s3://` URI and build the engine.
    pub async fn from_config_location(location: &str) -> Result<Self> {
        let config = if location.starts_with("s3://") || location.starts_with("file://") {
            let url = Url::parse(location)
                .map_err(|e| Error::config(location, format!("not a valid URI: {e}")))?;
            let storage = Storage::new();
            let bytes = storage.get(&url).await.map_err(|e| {
                Error::config(location, format!("cannot read the configuration: {e}"))
            })?;
            let text = String::from_utf8(bytes.to_vec())
                .map_err(|_| Error::config(location, "the file is not UTF-8 text"))?;
            Config::from_toml(&text, location, None)?
        } else {
            Config::from_path(std::path::Path::new(location))?
        };
        Ok(Self::new(config))
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Delta storage options (endpoint overrides) used for every table.
    pub fn storage_options(&self) -> &HashMap<String, String> {
        &self.options
    }

    /// Merge these files. Files of one table go into one commit; tables are independent;
    /// a bad file fails alone. Never panics on input; every file gets an outcome.
    pub async fn process(&self, files: &[Url]) -> ProcessReport {
        let mut report = ProcessReport::default();
        let mut by_table: BTreeMap<String, Vec<Url>> = BTreeMap::new();
        let resolved: Vec<Url> = files.iter().map(|f| self.resolve(f)).collect();
        for f in &resolved {
            match self.config.table_for(f) {
                None => {
                    tracing::warn!(file = %storage::display(f), "ignored: no configured table has this prefix (check the tables' `source`)");
                    report.files.push(FileOutcome {
                        file: f.clone(),
                        status: FileStatus::Ignored {
                            reason: "no configured table has this prefix".into(),
                        },
                    })
                }
                Some(t) if !source::is_data_file(f, &t.format) => {
                    tracing::info!(table = %t.name, file = %storage::display(f), "ignored: not a data file");
                    report.files.push(FileOutcome {
                        file: f.clone(),
                        status: FileStatus::Ignored {
                            reason: format!("not a {} data file", format_name(t)),
                        },
                    })
                }
                Some(t) => {
                    let list = by_table.entry(t.name.clone()).or_default();
                    if !list.contains(f) {
                        list.push(f.clone());
                    }
                }
            }
        }
        let results = stream::iter(by_table)
            .map(|(name, files)| async move {
                let table = self
                    .config
                    .table(&name)
                    .expect("routed to a configured table");
                self.process_table(table, files).await
            })
            .buffer_unordered(4)
            .collect::<Vec<_>>()
            .await;
        for (outcomes, tables) in results {
            report.files.extend(outcomes);
            report.tables.extend(tables);
        }
        report
    }

    async fn process_table(
        &self,
        table: &TableConfig,
        files: Vec<Url>,
    ) -> (Vec<FileOutcome>, Vec<TableReport>) {
        let mut outcomes = Vec::new();
        let fail_all = |files: &[Url], e: Error| -> Vec<FileOutcome> {
            let e = Arc::new(e);
            files
                .iter()
                .map(|f| FileOutcome {
                    file: f.clone(),
                    status: FileStatus::Failed {
                        table: Some(table.name.clone()),
                        error: e.clone(),
                    },
                })
                .collect()
        };
        let target = match delta::open(&table.target, &self.options).await {
            Ok(t) => t,
            Err(e) => return (fail_all(&files, e), vec![]),
        };
        let schema = delta::arrow_schema(&target);
        let read = stream::iter(files.iter().cloned())
            .map(|f| {
                let schema = schema.clone();
                async move {
                    let r = async {
                        let bytes = self.storage.get(&f).await?;
                        source::read_changes(&f, bytes, table, schema.as_deref())
                    }
                    .await;
                    (f, r)
                }
            })
            .buffered(8)
            .collect::<Vec<_>>()
            .await;
        let mut good: Vec<ChangeSet> = Vec::new();
        for (f, r) in read {
            match r {
                Ok(cs) => good.push(cs),
                Err(e) => {
                    tracing::error!(table = %table.name, file = %storage::display(&f), error = %e, kind = e.kind(), retryable = e.is_retryable(), "cannot read file");
                    outcomes.push(FileOutcome {
                        file: f,
                        status: FileStatus::Failed {
                            table: Some(table.name.clone()),
                            error: Arc::new(e),
                        },
                    });
                }
            }
        }
        if good.is_empty() {
            return (outcomes, vec![]);
        }
        let mut reports = Vec::new();
        // The table loaded for the files' schema serves the first merge attempt too.
        let loaded = delta::exists(&target).then_some(target);
        match self.merge_loaded(table, &good, loaded).await {
            Ok(r) => {
                reports.push(r);
                outcomes.extend(merged(table, &good));
            }
            Err(e) if !e.is_retryable() && good.len() > 1 => {
                // Isolate the file that does not fit: merge one by one.
                tracing::warn!(table = %table.name, error = %e, "batch merge failed; retrying file by file to isolate the bad file");
                for cs in good {
                    let one = std::slice::from_ref(&cs);
                    match self.merge_change_sets(table, one).await {
                        Ok(r) => {
                            reports.push(r);
                            outcomes.extend(merged(table, one));
                        }
                        Err(e) => outcomes.extend(fail_all(std::slice::from_ref(&cs.file), e)),
                    }
                }
            }
            Err(e) => {
                let files: Vec<Url> = good.iter().map(|c| c.file.clone()).collect();
                outcomes.extend(fail_all(&files, e));
            }
        }
        (outcomes, reports)
    }

    /// Plan and commit change sets of one table. Retries commit conflicts with jittered
    /// backoff, re-reading the table (and tombstones) each time.
    pub async fn merge_change_sets(
        &self,
        table: &TableConfig,
        changes: &[ChangeSet],
    ) -> Result<TableReport> {
        self.merge_loaded(table, changes, None).await
    }

    /// [`Engine::merge_change_sets`], with the table already loaded for the first attempt
    /// (if it is stale, the commit conflicts and the retry reloads it).
    async fn merge_loaded(
        &self,
        table: &TableConfig,
        changes: &[ChangeSet],
        mut loaded: Option<DeltaTable>,
    ) -> Result<TableReport> {
        let start = Instant::now();
        let file_names: Vec<String> = changes.iter().map(|c| storage::display(&c.file)).collect();
        let base_plan = plan::plan(table, changes)?;
        let mut report = TableReport {
            table: table.name.clone(),
            files: changes.len(),
            source_rows: changes.iter().map(|c| c.counts.rows).sum(),
            superseded_in_batch: base_plan.superseded,
            ..Default::default()
        };
        // Deletes are recorded first: a tombstone states a fact of the source, true whether
        // or not the main table has caught up, and it stops late older upserts.
        let t = Instant::now();
        let mut tombstones =
            Tombstones::open(table, &self.options, &base_plan.batch.schema()).await?;
        report.tombstones_recorded = tombstones.record(&base_plan, &file_names).await?;
        report.phases_ms.tombstones_recorded = ms_since(t);

        let mut attempt = 0u32;
        let committed = loop {
            attempt += 1;
            match self
                .try_merge(
                    table,
                    &base_plan,
                    &file_names,
                    loaded.take(),
                    &mut tombstones,
                    &mut report,
                )
                .await
            {
                Ok(c) => break c,
                Err(e) if delta::is_conflict(&e) && attempt < table.max_commit_attempts => {
                    tracing::debug!(table = %table.name, attempt, error = %e, "commit conflict; retrying");
                    delta::backoff(attempt).await;
                }
                Err(e) if delta::is_conflict(&e) => {
                    tracing::warn!(table = %table.name, attempt, error = %e, "giving up after commit conflicts");
                    return Err(Error::Contention {
                        table: table.name.clone(),
                        attempts: attempt,
                    });
                }
                Err(e) => return Err(e),
            }
        };
        report.commit_attempts = attempt;
        if let Some((before, after)) = committed {
            let t = Instant::now();
            self.update_manifests(table, &before, after, &mut report)
                .await;
            report.phases_ms.manifests = ms_since(t);
        }
        report.duration_ms = start.elapsed().as_millis() as u64;
        tracing::info!(
            table = %report.table,
            version = report.version,
            files = report.files,
            source_rows = report.source_rows,
            inserted = report.inserted,
            updated = report.updated,
            deleted = report.deleted,
            skipped_stale = report.skipped_stale,
            superseded_in_batch = report.superseded_in_batch,
            blocked_by_tombstone = report.blocked_by_tombstone,
            commit_attempts = report.commit_attempts,
            duration_ms = report.duration_ms,
            manifests_written = report.manifests_written,
            phases_ms = ?report.phases_ms,
            "merged"
        );
        Ok(report)
    }

    /// Rewrite the manifests of the partitions the commit touched. A failure here does not
    /// fail the merge (it is committed); it is logged and reported.
    async fn update_manifests(
        &self,
        table: &TableConfig,
        before: &[manifest::LiveFile],
        after: DeltaTable,
        report: &mut TableReport,
    ) {
        let result = async {
            let touched = manifest::touched_partitions(before, &manifest::live_files(&after)?);
            if touched.is_empty() {
                return Ok(manifest::ManifestReport::default());
            }
            manifest::sync(&self.storage, after, Some(&touched)).await
        }
        .await;
        match result {
            Ok(m) => {
                report.manifests_written = m.written;
                report.manifests_deleted = m.deleted;
            }
            Err(e) => {
                tracing::error!(table = %table.name, error = %e, "manifests not updated; maintenance will regenerate them");
                report.manifest_error = Some(e.to_string());
            }
        }
    }

    async fn try_merge(
        &self,
        table: &TableConfig,
        base_plan: &MergePlan,
        files: &[String],
        loaded: Option<DeltaTable>,
        tombstones: &mut Tombstones<'_>,
        report: &mut TableReport,
    ) -> Result<Option<(Vec<manifest::LiveFile>, DeltaTable)>> {
        let t = Instant::now();
        let target = match loaded {
            Some(t) => t,
            None => {
                delta::create_or_open(
                    &table.target,
                    &self.options,
                    &table.name,
                    &base_plan.table_schema(),
                    &table.partition_by,
                )
                .await?
            }
        };
        report.phases_ms.load_table = ms_since(t);
        let t = Instant::now();
        let mut plan = base_plan.clone();
        let tombs = tombstones.read(&plan).await?;
        let blocked = plan::apply_tombstones(&mut plan, table, &tombs)?;
        report.phases_ms.tombstones_read = ms_since(t);
        delta::align_to_table(table, &mut plan, &target)?;
        #[cfg(test)]
        if let Some(hook) = &self.before_merge {
            (hook.0)().await;
        }
        let read_version = target.version();
        let before = if table.manifests {
            manifest::live_files(&target)?
        } else {
            Vec::new()
        };
        let t = Instant::now();
        let (mut target, m) = delta::merge(table, target, &plan, files).await?;
        report.phases_ms.merge = ms_since(t);
        let t = Instant::now();
        report.blocked_by_tombstone = blocked;
        report.inserted = m.num_target_rows_inserted;
        report.updated = m.num_target_rows_updated;
        report.deleted = m.num_target_rows_deleted;
        report.files_added = m.num_target_files_added;
        report.files_removed = m.num_target_files_removed;
        // A delete may have been recorded by a concurrent writer after we read tombstones;
        // if so our upsert may have revived the row: apply those deletes now.
        if plan.upserts > 0 {
            let mut rounds = 0;
            loop {
                // Unchanged tombstone table since the last read: nothing new to apply.
                let Some(tombs) = tombstones.read_if_changed(&plan).await? else {
                    break;
                };
                let Some(fix) = tombstones::superseded_upserts(table, &plan, &tombs)? else {
                    break;
                };
                rounds += 1;
                if rounds > 5 {
                    return Err(Error::Internal(format!(
                        "table {}: tombstones kept changing while re-checking; retry the event",
                        table.name
                    )));
                }
                let mut fix = fix;
                plan::apply_tombstones(&mut plan, table, &tombs)?;
                delta::align_to_table(table, &mut fix, &target)?;
                let (t, m) = delta::merge(table, target, &fix, files).await?;
                target = t;
                report.deleted += m.num_target_rows_deleted;
                report.blocked_by_tombstone += fix.deletes;
                report.files_added += m.num_target_files_added;
                report.files_removed += m.num_target_files_removed;
            }
        }
        report.phases_ms.recheck = ms_since(t);
        let applied = report.inserted + report.updated + report.deleted;
        report.skipped_stale = plan.batch.num_rows().saturating_sub(applied);
        report.version = target.version();
        let committed = target.version() != read_version;
        Ok((committed && table.manifests).then_some((before, target)))
    }
}

fn merged(table: &TableConfig, sets: &[ChangeSet]) -> Vec<FileOutcome> {
    sets.iter()
        .map(|c| {
            tracing::info!(
                table = %table.name,
                file = %storage::display(&c.file),
                rows = c.counts.rows,
                inserts = c.counts.inserts,
                updates = c.counts.updates,
                deletes = c.counts.deletes,
                "file merged"
            );
            FileOutcome {
                file: c.file.clone(),
                status: FileStatus::Merged {
                    table: table.name.clone(),
                    counts: c.counts,
                },
            }
        })
        .collect()
}

fn format_name(t: &TableConfig) -> &'static str {
    match t.format {
        crate::config::Format::Parquet => "Parquet (.parquet)",
        crate::config::Format::Csv(_) => "CSV (.csv)",
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicBool, Ordering};

    use arrow::array::{Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    type HookFn = dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync;

    /// Runs inside `try_merge` between planning and the MERGE, to force interleavings.
    #[derive(Clone)]
    pub(crate) struct Hook(pub Arc<HookFn>);

    impl std::fmt::Debug for Hook {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Hook")
        }
    }

    fn cdc(op: &str, ts: &str, id: i64) -> bytes::Bytes {
        let schema = Arc::new(Schema::new(vec![
            Field::new("Op", DataType::Utf8, true),
            Field::new("ts", DataType::Utf8, true),
            Field::new("id", DataType::Int64, true),
        ]));
        let b = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec![op])),
                Arc::new(StringArray::from(vec![ts])),
                Arc::new(Int64Array::from(vec![id])),
            ],
        )
        .unwrap();
        crate::demo::to_parquet(&b).unwrap()
    }

    /// The race the post-commit tombstone re-check exists for: a late, older insert reads
    /// the tombstones (none yet), then a newer delete of the same key records its tombstone
    /// and merges (finding no row), then the insert commits. The insert's re-check must
    /// remove the row again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn late_insert_racing_a_delete_does_not_revive_the_row() {
        let dir = tempfile::tempdir().unwrap();
        let text = r#"
[[table]]
name = "t"
source = "raw/t/"
target = "curated/t"
primary_key = ["id"]
sequence_by = ["ts"]
"#;
        let config = Config::from_toml(text, "test", Some(dir.path())).unwrap();
        let deleter = Engine::new(config.clone());
        let src = config.tables[0].source.clone();
        let insert = src.join("20240101-0000000001.parquet").unwrap();
        let delete = src.join("20240101-0000000002.parquet").unwrap();
        let storage = Storage::new();
        storage
            .put(&insert, cdc("I", "2024-01-01 00:00:01", 1))
            .await
            .unwrap();
        storage
            .put(&delete, cdc("D", "2024-01-01 00:00:02", 1))
            .await
            .unwrap();
        // create the table first with an unrelated row
        let other = src.join("20240101-0000000000.parquet").unwrap();
        storage
            .put(&other, cdc("I", "2024-01-01 00:00:00", 2))
            .await
            .unwrap();
        assert_eq!(deleter.process(&[other]).await.failures().count(), 0);

        let fired = Arc::new(AtomicBool::new(false));
        let mut inserter = Engine::new(config.clone());
        let (d, f, del) = (deleter.clone(), fired.clone(), delete.clone());
        inserter.before_merge = Some(Hook(Arc::new(move || {
            let (d, f, del) = (d.clone(), f.clone(), del.clone());
            Box::pin(async move {
                if !f.swap(true, Ordering::SeqCst) {
                    let r = d.process(&[del]).await;
                    assert_eq!(r.failures().count(), 0);
                    assert_eq!(r.tables[0].deleted, 0, "the row is not there yet");
                }
            })
        })));
        let r = inserter.process(&[insert]).await;
        assert_eq!(r.failures().count(), 0, "{:?}", r.files);
        assert!(fired.load(Ordering::SeqCst));
        assert_eq!(
            r.tables[0].inserted, 1,
            "the insert did commit before the re-check"
        );
        assert_eq!(r.tables[0].deleted, 1, "the re-check removed it again");
        let table = delta::open(&config.tables[0].target, &Default::default())
            .await
            .unwrap();
        let rows = delta::query(&table, "SELECT id FROM t ORDER BY id")
            .await
            .unwrap();
        let ids: Vec<i64> = rows
            .iter()
            .flat_map(|b| {
                arrow::compute::cast(b.column(0), &DataType::Int64)
                    .unwrap()
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(ids, vec![2]);
    }
}
