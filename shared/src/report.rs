//! What a merge call reports: an outcome per input file, and per table commit the counts a
//! user can alarm on.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use url::Url;

use crate::error::Error;
use crate::source::FileCounts;

/// What happened to one input file.
#[derive(Debug)]
pub enum FileStatus {
    /// Merged (or found already applied) in the commit described by the table report.
    Merged { table: String, counts: FileCounts },
    /// Not a file for us: outside every configured source, or a folder marker. Not an error.
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

    pub(crate) fn failed(file: Url, table: &str, error: Arc<Error>) -> Self {
        FileOutcome {
            file,
            status: FileStatus::Failed {
                table: Some(table.to_string()),
                error,
            },
        }
    }

    /// The change sets' files merged (each logged `file merged`).
    pub(crate) fn merged(
        table: &crate::config::TableConfig,
        sets: &[crate::source::ChangeSet],
    ) -> Vec<FileOutcome> {
        sets.iter()
            .map(|c| {
                tracing::info!(
                    table = %table.name,
                    file = %crate::storage::display(&c.file),
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

    /// Log a file that is not merged (its outcome says why).
    pub(crate) fn log_failure(table: &str, file: &Url, e: &Error) {
        tracing::error!(table = %table, file = %crate::storage::display(file), error = %e, kind = e.kind(), retryable = e.is_retryable(), "file not merged");
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
    /// Of `files_removed`, small unchanged files the merge had read and wrote into its
    /// rewritten files, so that later merges read fewer files (`rewrite::FOLD_FILE`).
    pub files_folded: usize,
    /// Data files given a deletion vector (or a larger one) instead of being rewritten
    /// (`deletion_vectors = true`).
    pub files_vectored: usize,
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
    /// The manifests were behind the table (a crash or a failure between an earlier commit
    /// and its manifests) and were brought up to date, with the catalog entries.
    pub manifests_caught_up: bool,
    /// What the call did to the history table, when the table has one.
    pub history: Option<HistoryReport>,
    /// What the call did to the Glue Data Catalog (main and history entries), when the
    /// table has catalog settings: no calls at all unless the schema or the partitions
    /// changed; `error` when an entry could not be synced (the merge stands).
    pub catalog: Option<CatalogReport>,
    /// Commits a large file was merged in (0: the files fit one commit).
    pub slices: usize,
    /// How the (last) commit wrote the batch (`None`: nothing was written).
    pub write_path: Option<WritePath>,
    /// Columns whose type the call widened before its commit (`column: from -> to`; a
    /// commit of its own, docs/configuration.md "Types in the Delta table").
    pub widened: Vec<String>,
    /// Data files rewritten in the widened types.
    pub files_rewritten_to_widen: usize,
    /// The table's watermark after the call (`crate::delta::watermark`): every CDC file written up
    /// to it is applied; `held_by` names the first file that is not.
    pub watermark: Option<Progress>,
    /// Why the watermark could not be computed or recorded (the merge stands; the next
    /// merge or the maintenance run moves it).
    pub watermark_error: Option<String>,
}

/// How a commit wrote a batch: chosen once per commit, from the plan and the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WritePath {
    /// The rows appended as new data files: no row of the table had a key in the batch's
    /// key range (a full load into a new table, new keys).
    Append,
    /// The files holding the batch's keys rewritten by tributary's copy-on-write rewrite.
    Rewrite,
}

impl TableReport {
    /// The (last) commit appended the rows.
    pub fn appended(&self) -> bool {
        self.write_path == Some(WritePath::Append)
    }

    /// The (last) commit rewrote files with tributary's copy-on-write rewrite.
    pub fn rewritten(&self) -> bool {
        self.write_path == Some(WritePath::Rewrite)
    }
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
    pub history: u64,
    pub catalog: u64,
    pub watermark: u64,
}

/// Result of one [`crate::Engine::process`] call.
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

impl TableReport {
    /// Add the next commit's report (the slices of a large file: one report for the file).
    pub(crate) fn absorb(&mut self, o: &TableReport) {
        self.version = o.version.or(self.version);
        self.write_path = o.write_path;
        self.source_rows += o.source_rows;
        self.inserted += o.inserted;
        self.updated += o.updated;
        self.deleted += o.deleted;
        self.skipped_stale += o.skipped_stale;
        self.superseded_in_batch += o.superseded_in_batch;
        self.blocked_by_tombstone += o.blocked_by_tombstone;
        self.tombstones_recorded += o.tombstones_recorded;
        self.files_added += o.files_added;
        self.files_removed += o.files_removed;
        self.files_folded += o.files_folded;
        self.commit_attempts += o.commit_attempts;
        self.duration_ms += o.duration_ms;
        self.manifests_written += o.manifests_written;
        self.manifests_deleted += o.manifests_deleted;
        if o.manifest_error.is_some() {
            self.manifest_error.clone_from(&o.manifest_error);
        }
        self.manifests_caught_up |= o.manifests_caught_up;
        self.widened.extend(o.widened.iter().cloned());
        self.files_rewritten_to_widen += o.files_rewritten_to_widen;
        if o.watermark.is_some() {
            self.watermark.clone_from(&o.watermark);
        }
        if o.watermark_error.is_some() {
            self.watermark_error.clone_from(&o.watermark_error);
        }
        if let Some(h) = &o.history {
            match &mut self.history {
                Some(mine) => {
                    mine.version = h.version.or(mine.version);
                    mine.versions_written += h.versions_written;
                    mine.versions_removed += h.versions_removed;
                    mine.late_keys += h.late_keys;
                    mine.commit_attempts += h.commit_attempts;
                    mine.manifests_caught_up |= h.manifests_caught_up;
                    mine.widened.extend(h.widened.iter().cloned());
                }
                None => self.history = Some(h.clone()),
            }
        }
        if let Some(c) = &o.catalog {
            self.catalog.get_or_insert_with(Default::default).absorb(c);
        }
    }

    /// One log line per commit: the counts to filter on, and the whole report.
    pub(crate) fn log(&self) {
        let report = serde_json::to_string(self).unwrap_or_default();
        tracing::info!(
            table = %self.table,
            version = self.version,
            inserted = self.inserted,
            updated = self.updated,
            deleted = self.deleted,
            skipped_stale = self.skipped_stale,
            widened = self.widened.len(),
            duration_ms = self.duration_ms,
            report = %report,
            "merged"
        );
    }
}

/// What a call did to a history table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HistoryReport {
    pub version: Option<u64>,
    /// Versions written (opened, closed or updated in place).
    pub versions_written: usize,
    /// Versions removed because a late change merged them into others.
    pub versions_removed: usize,
    /// Keys whose versions were recomputed from the change log (a late change).
    pub late_keys: usize,
    pub commit_attempts: u32,
    /// Why the history's manifests could not be updated.
    pub manifest_error: Option<String>,
    /// The history's manifests were behind it (a crash or a failure between an earlier
    /// commit and its manifests) and were brought up to date, with its catalog entries.
    pub manifests_caught_up: bool,
    /// Columns whose type the call widened in the history (`column: from -> to`).
    pub widened: Vec<String>,
    /// The watermark, when the history table keeps the table's state (no current table).
    #[serde(skip)]
    pub(crate) watermark: Option<Progress>,
    #[serde(skip)]
    pub(crate) watermark_error: Option<String>,
    /// The history entries' catalog sync (reported with the table's: `TableReport::catalog`).
    #[serde(skip)]
    pub(crate) catalog: Option<CatalogReport>,
}

/// What a catalog sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CatalogReport {
    /// Glue API calls made (0 for a commit that changed no schema and no partition).
    pub calls: u64,
    pub entries_created: usize,
    pub entries_updated: usize,
    pub partitions_added: usize,
    pub partitions_removed: usize,
    /// Registered partitions given the entry's new columns (after a schema change).
    pub partitions_updated: usize,
    /// Why the sync failed (the commit stands; the next sync repairs the entries).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl CatalogReport {
    /// Add another sync's counts (the main and the history table's, in one report).
    pub fn absorb(&mut self, other: &CatalogReport) {
        self.calls += other.calls;
        self.entries_created += other.entries_created;
        self.entries_updated += other.entries_updated;
        self.partitions_added += other.partitions_added;
        self.partitions_removed += other.partitions_removed;
        self.partitions_updated += other.partitions_updated;
        if self.error.is_none() {
            self.error.clone_from(&other.error);
        }
    }
}

/// The file that holds a watermark back.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Held {
    /// The file, as its URL.
    pub file: String,
    /// Its time (the DMS name's, else its modification time).
    pub written: DateTime<Utc>,
    /// Why it holds the watermark.
    pub reason: String,
}

/// A table's watermark and what holds it.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Progress {
    /// Every CDC file written up to this time is applied (`None`: not every full-load file
    /// is, or no CDC file was applied yet).
    pub watermark: Option<DateTime<Utc>>,
    /// The newest file of the applied prefix (when this computation walked it).
    pub file: Option<String>,
    /// The first file not applied.
    pub held_by: Option<Held>,
    /// Files after the watermark found applied out of order, behind [`Progress::held_by`]
    /// (counted up to the first few only).
    pub files_waiting: usize,
    /// Every file under the source is applied.
    pub caught_up: bool,
    /// The watermark moved in this computation (and was committed when it was `advance`d).
    pub advanced: bool,
    /// Keys listed, the S3 LIST requests that took (at 1,000 keys a page), and the table's
    /// records looked up.
    pub listed: usize,
    pub list_requests: usize,
    pub lookups: usize,
}

impl Progress {
    /// `now − watermark`, in seconds.
    pub fn lag_seconds(&self, now: DateTime<Utc>) -> Option<f64> {
        self.watermark
            .map(|w| (now - w).num_milliseconds() as f64 / 1000.0)
    }
}
