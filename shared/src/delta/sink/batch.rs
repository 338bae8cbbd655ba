//! One batch of admitted change sets of one table → one commit: plan, record tombstones
//! (pending), MERGE (re-planned and retried on conflicts), re-check tombstones, confirm the
//! tombstones (and apply the deletes again if a concurrent writer committed meanwhile),
//! update manifests (also after a merge that commits nothing: they may be behind an
//! earlier commit).

use std::time::Instant;

use deltalake::kernel::Transaction;
use deltalake::DeltaTable;

use super::recheck::{recheck_tombstones, Rechecked};
use super::{Batch, DeltaSink, TableReport, WritePath};
use crate::config::TableConfig;
use crate::delta::retry::Retry;
use crate::delta::rewrite::Applied;
use crate::delta::tombstones::Tombstones;
use crate::delta::{self, MergeExtras};
use crate::error::Result;
use crate::plan::{self, MergePlan};
use crate::props::TableProps;
use crate::source::SeqKind;

fn ms_since(t: Instant) -> u64 {
    t.elapsed().as_millis() as u64
}

pub(crate) use crate::delta::pipeline::{Before, Committed};

/// A batch's MERGE attempts ([`DeltaSink::try_merge`]).
struct Merging<'a, 'b> {
    engine: &'a DeltaSink,
    table: &'a TableConfig,
    attempt: &'a Attempt<'b>,
    /// The table the files were screened on, for the first attempt.
    loaded: Option<DeltaTable>,
    tombstones: &'a mut Tombstones<'b>,
    /// What earlier attempts did that stays when they lose the race.
    kept: Kept,
    first_read: Option<Before>,
}

impl crate::delta::retry::Attempts for Merging<'_, '_> {
    type Out = (Committed, AttemptMetrics);

    async fn attempt(&mut self, _: u32) -> Result<Self::Out> {
        self.engine
            .try_merge(
                self.table,
                self.attempt,
                self.loaded.take(),
                self.tombstones,
                &mut self.kept,
                &mut self.first_read,
            )
            .await
    }
}

/// What a batch's commit attempts did that outlasts an attempt that loses the race: the
/// commits of their own an attempt makes before its MERGE (a created table's catalog sync,
/// widenings), and the time spent computing the watermark, summed over the attempts.
#[derive(Debug, Default)]
struct Kept {
    catalog: Option<crate::delta::catalog::CatalogReport>,
    widened: Vec<crate::delta::widen::Widened>,
    watermark_ms: u64,
}

impl Kept {
    fn fold_into(self, report: &mut TableReport) {
        absorb(report, self.catalog);
        for w in &self.widened {
            report.widen(w);
        }
        report.phases_ms.watermark += self.watermark_ms;
    }
}

/// What the attempt that committed did: its phases and its commits' counts.
#[derive(Debug, Default)]
struct AttemptMetrics {
    load_ms: u64,
    tombstones_read_ms: u64,
    merge_ms: u64,
    recheck_ms: u64,
    path: Option<WritePath>,
    applied: Applied,
    /// Rows the tombstones held back before the commit.
    blocked: usize,
    /// The post-commit re-check's deletes.
    rechecked: Rechecked,
    skipped_stale: usize,
    version: Option<u64>,
}

impl AttemptMetrics {
    fn fold_into(self, report: &mut TableReport) {
        let p = &mut report.phases_ms;
        p.load_table = self.load_ms;
        p.tombstones_read = self.tombstones_read_ms;
        p.merge = self.merge_ms;
        p.recheck = self.recheck_ms;
        report.write_path = self.path;
        let (c, r) = (self.applied, self.rechecked);
        report.inserted = c.inserted;
        report.updated = c.updated;
        report.deleted = c.deleted + r.deleted;
        report.files_added = c.files_added + r.files_added;
        report.files_removed = c.files_removed + r.files_removed;
        report.files_folded = c.files_folded;
        report.files_vectored = c.files_vectored;
        report.blocked_by_tombstone = self.blocked + r.blocked;
        report.skipped_stale = self.skipped_stale;
        report.version = self.version;
    }
}

/// The deletes of a batch applied again on the newest table ([`DeltaSink::reapply_deletes`]).
struct DeletesAgain<'a> {
    table: &'a TableConfig,
    after: DeltaTable,
    deletes: MergePlan,
    files: &'a [String],
}

impl crate::delta::retry::Attempts for DeletesAgain<'_> {
    type Out = (DeltaTable, Applied);

    async fn attempt(&mut self, n: u32) -> Result<Self::Out> {
        if n > 1 {
            self.after
                .update_incremental(None)
                .await
                .map_err(|e| crate::error::Error::delta(&self.table.name, e))?;
        }
        let mut fix = self.deletes.clone();
        delta::align_to_table(self.table, &mut fix, &self.after)?;
        let extras = MergeExtras::default();
        let (t, _, counts) =
            write(self.table, self.after.clone(), &fix, self.files, &extras).await?;
        Ok((t, counts))
    }
}

/// The state a commit attempt starts from.
struct Attempt<'a> {
    batch: &'a Batch<'a>,
    base_plan: &'a MergePlan,
    files: &'a [String],
    extras: &'a MergeExtras,
}

impl DeltaSink {
    /// Plan and commit one batch. Retries commit conflicts with jittered backoff,
    /// re-reading the table (and tombstones) each time; the table loaded by the caller
    /// serves the first attempt (if stale, the commit conflicts and the retry reloads).
    pub(crate) async fn merge_batch(
        &self,
        table: &TableConfig,
        batch: &Batch<'_>,
        loaded: Option<DeltaTable>,
    ) -> Result<TableReport> {
        let start = Instant::now();
        let files = batch.file_names();
        if table.target.is_none() {
            return self.merge_history_only(table, batch, &files, start).await;
        }
        let base_plan = plan::plan(table, batch.changes)?;
        let mut report = batch.report(table);
        report.superseded_in_batch = base_plan.superseded;
        #[cfg(test)]
        self.hooks
            .reach(crate::delta::testing::Point::BeforeTombstones, "", vec![])
            .await;
        // Deletes are recorded first, as pending: durable before this MERGE reads the table,
        // so a concurrent older upsert either is seen by this MERGE or sees them — and holds
        // its change back. Other writers apply a tombstone (turn their older upserts into
        // deletes) only once it is confirmed, after the MERGE that applies it: one whose
        // MERGE never committed (a crash, a contention give-up) is not applied early by a
        // retry's already-applied groups (#28).
        let t = Instant::now();
        let mut tombstones =
            Tombstones::open(table, &self.options, &base_plan.batch.schema()).await?;
        report.tombstones_recorded = tombstones.record(&base_plan, &files).await?;
        report.phases_ms.tombstones_recorded = ms_since(t);
        let extras = MergeExtras {
            txns: file_records(table, batch),
            delete_unmatched_below: batch.delete_unmatched_below.clone(),
        };
        let attempt = Attempt {
            batch,
            base_plan: &base_plan,
            files: &files,
            extras: &extras,
        };
        let mut merging = Merging {
            engine: self,
            table,
            attempt: &attempt,
            loaded,
            tombstones: &mut tombstones,
            kept: Kept::default(),
            first_read: None,
        };
        let driven = Retry::new(&table.name, table.limits.max_commit_attempts)
            .drive("merge", &mut merging)
            .await;
        std::mem::take(&mut merging.kept).fold_into(&mut report);
        let ((mut merged, metrics), attempts) = driven?;
        metrics.fold_into(&mut report);
        #[cfg(test)]
        self.hooks
            .reach(crate::delta::testing::Point::BetweenCommits, "", vec![])
            .await;
        if base_plan.deletes > 0 {
            let t = Instant::now();
            tombstones.confirm(&base_plan, &files).await?;
            report.phases_ms.tombstones_recorded += ms_since(t);
            let again;
            (merged, again) = self
                .reapply_deletes(table, &base_plan, merged, &files, report.version)
                .await?;
            if let Some((version, m)) = again {
                report.deleted += m.deleted;
                report.files_added += m.files_added;
                report.files_removed += m.files_removed;
                report.version = version;
            }
        }
        report.commit_attempts = attempts;
        published(&mut report, self.after_merge(table, merged).await);
        if let Some(h) = &table.history {
            let (r, ms) = self.merge_history(table, h, batch, &files, None).await?;
            adopt_history(&mut report, r, ms);
        }
        report.duration_ms = ms_since(start);
        report.log();
        Ok(report)
    }

    /// A table that keeps only its history: the batch goes to the history table, which
    /// records what the current table would (the sequence kinds, the full-load files) in
    /// its commit. No tombstones: the history's change log keeps every delete, and a late
    /// change is placed in its key's chain from it (docs/design.md, "History only").
    async fn merge_history_only(
        &self,
        table: &TableConfig,
        batch: &Batch<'_>,
        files: &[String],
        start: Instant,
    ) -> Result<TableReport> {
        let h = table
            .history
            .as_ref()
            .ok_or_else(|| crate::error::Error::internal("no target and no history table"))?;
        let mut report = batch.report(table);
        let record = crate::delta::history::Record {
            txns: file_records(table, batch),
        };
        let (r, ms) = self
            .merge_history(table, h, batch, files, Some(record))
            .await?;
        adopt_history(&mut report, r, ms);
        report.version = report.history.as_ref().and_then(|r| r.version);
        if let Some(h) = report.history.as_mut() {
            report.watermark = h.watermark.take();
            report.watermark_error = h.watermark_error.take();
        }
        report.commit_attempts = report.history.as_ref().map_or(0, |r| r.commit_attempts);
        report.duration_ms = ms_since(start);
        report.log();
        Ok(report)
    }

    /// After a merge: the post-commit observers ([`crate::delta::pipeline::publish`]). Neither fails
    /// the merge: it is committed.
    pub(super) async fn after_merge(
        &self,
        table: &TableConfig,
        m: Committed,
    ) -> crate::delta::pipeline::Published {
        crate::delta::pipeline::publish(
            &self.storage,
            &self.catalog,
            table,
            crate::delta::pipeline::Output::Current,
            &m,
        )
        .await
    }

    /// The batch's versions into the history table: what it did and how long it took.
    async fn merge_history(
        &self,
        table: &TableConfig,
        h: &crate::config::HistoryConfig,
        batch: &Batch<'_>,
        files: &[String],
        record: Option<crate::delta::history::Record>,
    ) -> Result<(crate::delta::history::HistoryReport, u64)> {
        let t = Instant::now();
        let changes = crate::delta::history::Changes {
            sets: batch.changes,
            kinds: batch.kinds.as_deref(),
            files,
            record,
        };
        let r = crate::delta::history::apply(
            table,
            h,
            &self.storage,
            &self.options,
            &self.catalog,
            &changes,
        )
        .await?;
        Ok((r, ms_since(t)))
    }

    /// One attempt, in stages: the table made ready ([`DeltaSink::ready`]), the plan on the
    /// tombstones as they are now ([`planned`]), the table widened and the plan aligned to it
    /// ([`aligned`]), the commit ([`write`]), the post-commit tombstone re-check, the files'
    /// records. Returns the table after it (and before it when a commit happened), and what
    /// the attempt did.
    async fn try_merge(
        &self,
        table: &TableConfig,
        a: &Attempt<'_>,
        loaded: Option<DeltaTable>,
        tombstones: &mut Tombstones<'_>,
        kept: &mut Kept,
        first_read: &mut Option<Before>,
    ) -> Result<(Committed, AttemptMetrics)> {
        let mut m = AttemptMetrics::default();
        let t = Instant::now();
        let target = self.ready(table, a, loaded, kept, first_read).await?;
        m.load_ms = ms_since(t);
        let t = Instant::now();
        let (mut plan, blocked) = planned(table, a.base_plan, tombstones).await?;
        m.tombstones_read_ms = ms_since(t);
        m.blocked = blocked;
        let target = aligned(table, target, &mut plan, a.files, kept).await?;
        #[cfg(test)]
        self.hooks
            .reach(crate::delta::testing::Point::BeforeMerge, "", vec![])
            .await;
        let read_version = target.version();
        let t = Instant::now();
        // The watermark this commit moves goes into it (one commit per merge); when it
        // cannot be computed, the post-commit step tries on its own.
        let mut extras = a.extras.clone();
        let carried =
            crate::delta::watermark::carried(&self.storage, table, &target, &mut extras.txns).await;
        kept.watermark_ms += ms_since(t);
        let t = Instant::now();
        let (target, path, applied) = write(table, target, &plan, a.files, &extras).await?;
        m.merge_ms = ms_since(t);
        let t = Instant::now();
        let (target, rechecked) =
            recheck_tombstones(table, target, &mut plan, tombstones, a.files).await?;
        m.recheck_ms = ms_since(t);
        let target =
            crate::delta::applied::record_unrecorded(target, &extras.txns, read_version).await?;
        let done = applied.inserted + applied.updated + applied.deleted + rechecked.deleted;
        m.skipped_stale = plan.batch.num_rows().saturating_sub(done);
        m.version = target.version();
        (m.path, m.applied, m.rechecked) = (Some(path), applied, rechecked);
        let before = first_read
            .clone()
            .ok_or_else(|| crate::error::Error::internal("no first read"))?;
        // Any commit since the first read (this attempt's or an earlier one's).
        let committed = Committed {
            read: read_version,
            watermark: carried,
            ..Committed::since(before, target)
        };
        Ok((committed, m))
    }

    /// An attempt's first stage: the table it writes — the one the files were screened on
    /// (the first attempt), else loaded again or created — made ready ([`prepared`]).
    async fn ready(
        &self,
        table: &TableConfig,
        a: &Attempt<'_>,
        loaded: Option<DeltaTable>,
        kept: &mut Kept,
        first_read: &mut Option<Before>,
    ) -> Result<DeltaTable> {
        let retried = loaded.is_none();
        let target = match loaded {
            Some(t) => t,
            None => {
                let (t, created) = self.load_or_create(table, a.batch, a.base_plan).await?;
                if created {
                    let r = self.catalog.created(table, false, &t).await;
                    crate::delta::pipeline::absorb(&mut kept.catalog, r);
                }
                t
            }
        };
        // Before this attempt's own commits (the sequence kinds, the change data feed):
        // metadata commits whose versions the manifests' marker must not take for a gap.
        if first_read.is_none() {
            *first_read = Some(Before::of(table, &target)?);
        }
        Box::pin(prepared(table, target, a.batch, retried)).await
    }

    /// After the batch's tombstones are confirmed: a concurrent writer that read the
    /// tombstones before they were confirmed and committed an older upsert of a deleted key
    /// after this MERGE read the table has revived the row (its re-check saw no applied
    /// tombstone). When the table has moved since this batch's read (other than by its own
    /// commit), apply the deletes again on the newest table. One of the two writers always
    /// sees the other: the other's re-check reads the tombstones after its commit, this
    /// read of the table comes after the tombstones are confirmed.
    async fn reapply_deletes(
        &self,
        table: &TableConfig,
        base_plan: &MergePlan,
        merged: Committed,
        files: &[String],
        ours: Option<u64>,
    ) -> Result<(Committed, Option<(Option<u64>, Applied)>)> {
        let Committed {
            before,
            mut after,
            read,
            watermark,
        } = merged;
        after
            .update_incremental(None)
            .await
            .map_err(|e| crate::error::Error::delta(&table.name, e))?;
        // Nothing committed since this batch's read, or only its own commit right after it
        // (a commit between its read and its MERGE commit in the range of its keys would
        // have conflicted). A commit of only the files' records (the MERGE changed nothing)
        // conflicts with nothing: one that is not right after the read may follow another
        // writer's rows.
        let only_ours = match (ours, read) {
            (Some(o), Some(r)) => o <= r + 1,
            _ => true,
        };
        if after.version() == ours && only_ours {
            let unmoved = Committed {
                before,
                after,
                read,
                watermark,
            };
            return Ok((unmoved, None));
        }
        let deletes = crate::delta::tombstones::deletes_only(base_plan)?;
        let before = match before {
            Some(b) => b,
            None => Before::of(table, &after)?,
        };
        let mut fixing = DeletesAgain {
            table,
            after,
            deletes,
            files,
        };
        let ((t, m), _) = Retry::new(&table.name, table.limits.max_commit_attempts)
            .drive("re-apply deletes", &mut fixing)
            .await?;
        let version = t.version();
        let committed = Committed {
            read,
            watermark,
            ..Committed::since(before, t)
        };
        Ok((committed, Some((version, m))))
    }

    pub(super) async fn load_or_create(
        &self,
        table: &TableConfig,
        batch: &Batch<'_>,
        plan: &MergePlan,
    ) -> Result<(DeltaTable, bool)> {
        let kinds: Vec<Option<SeqKind>> = match &batch.kinds {
            Some(k) => k.iter().copied().map(Some).collect(),
            None => vec![None; table.sequence_by.len()],
        };
        let mut props = TableProps::for_new_table(&kinds);
        props.extend(crate::delta::applied::new_table_properties(table));
        if table.writing.change_data_feed {
            props.extend(TableProps::for_change_data_feed());
        }
        delta::open_or_create(
            table.state_table()?,
            &self.options,
            &table.name,
            &plan.table_schema(),
            &table.partition_by,
            props,
        )
        .await
    }
}

/// How a commit will write its plan, chosen once from the plan and the table.
enum Chosen {
    /// No row of the table can match: the rows appended (what a merge would insert, without
    /// reading or rewriting a file), with the key range the commit read.
    Append(crate::delta::scan::KeyRange),
    /// tributary's copy-on-write rewrite of the files holding the plan's keys.
    Rewrite(Box<crate::delta::rewrite::Rewrite>),
    /// No change to write (every change stale or screened): only the transactions.
    Nothing,
}

impl Chosen {
    async fn of(
        table: &TableConfig,
        target: &DeltaTable,
        plan: &MergePlan,
        extras: &MergeExtras,
    ) -> Result<Chosen> {
        if extras.delete_unmatched_below.is_none() {
            if plan.batch.num_rows() == 0 {
                return Ok(Chosen::Nothing);
            }
            if let Some(range) = delta::append_range(table, target, plan).await? {
                return Ok(Chosen::Append(range));
            }
        }
        Ok(
            match crate::delta::rewrite::Rewrite::eligible(table, target, plan, extras)? {
                Some(rewrite) => Chosen::Rewrite(Box::new(rewrite.with_vectors(
                    table.writing.deletion_vectors && delta::writes_deletion_vectors(target),
                ))),
                None => Chosen::Nothing,
            },
        )
    }
}

/// The table made ready for the batch's commit, checked again: adopted, its sequence kinds
/// recorded (and the batch's checked against them), the change data feed turned on when
/// configured, and the batch's files screened again against its records (their contents
/// too on a retry: another writer may have applied them since).
async fn prepared(
    table: &TableConfig,
    target: DeltaTable,
    batch: &Batch<'_>,
    retried: bool,
) -> Result<DeltaTable> {
    let target = adopt(table, target).await?;
    let target = delta::record_kinds(target, batch.kinds.as_deref()).await?;
    let kinds = delta::props(&target).sequence_kinds;
    plan::recheck_kinds(batch.changes, kinds.as_deref())?;
    let target = enable_change_data_feed(table, target).await?;
    let target = enable_deletion_vectors(table, target).await?;
    let screened: Vec<super::Screened> = batch.changes.iter().map(super::Screened::of).collect();
    super::rescreen(table, &delta::props(&target), &screened)?;
    if retried {
        super::rescreen_contents(table, &target, &screened).await?;
    }
    Ok(target)
}

/// Commit the plan on the path chosen for it ([`Chosen`]): the table after it, the path as
/// it was taken, and the counts.
pub(super) async fn write(
    table: &TableConfig,
    target: DeltaTable,
    plan: &MergePlan,
    files: &[String],
    extras: &MergeExtras,
) -> Result<(DeltaTable, WritePath, Applied)> {
    Ok(match Chosen::of(table, &target, plan, extras).await? {
        Chosen::Append(range) => {
            let rows = plan.batch.num_rows();
            let (target, written) =
                delta::append(table, target, plan, range, files, extras).await?;
            let counts = Applied {
                inserted: rows,
                files_added: written,
                ..Default::default()
            };
            (target, WritePath::Append, counts)
        }
        Chosen::Rewrite(rw) => {
            let (target, counts) = rw.run(table, target, files, extras).await?;
            (target, WritePath::Rewrite, counts)
        }
        Chosen::Nothing if extras.txns.is_empty() => {
            (target, WritePath::Rewrite, Applied::default())
        }
        Chosen::Nothing => {
            let info = ("tributary.files", serde_json::json!(files));
            let target = delta::commit_txns_with(target, extras.txns.clone(), Some(info)).await?;
            (target, WritePath::Rewrite, Applied::default())
        }
    })
}

/// An attempt's second stage: the batch's plan on the tombstones as they are now (changes a
/// newer delete supersedes dropped, changes a pending delete holds back set aside), and how
/// many rows they held back.
async fn planned(
    table: &TableConfig,
    base: &MergePlan,
    tombstones: &mut Tombstones<'_>,
) -> Result<(MergePlan, usize)> {
    let mut plan = base.clone();
    let tombs = tombstones.read(&plan).await?;
    let blocked = plan::apply_tombstones(&mut plan, table, &tombs)?
        + plan::hold_back(&mut plan, table, tombstones.pending())?;
    Ok((plan, blocked))
}

/// An attempt's third stage: a column whose type the batch widens takes the wider type
/// first, once every check passed (a commit of its own, kept in `kept`: a conflict retries
/// the attempt, not the widening); the plan follows the table's columns and types, and the
/// table takes the batch's new columns.
async fn aligned(
    table: &TableConfig,
    target: DeltaTable,
    plan: &mut MergePlan,
    files: &[String],
    kept: &mut Kept,
) -> Result<DeltaTable> {
    let (target, widened) = crate::delta::widen::widen(
        table,
        &table.name,
        target,
        &plan.table_schema(),
        delta::writer_properties(table),
        files,
    )
    .await?;
    kept.widened.push(widened);
    delta::align_to_table(table, plan, &target)?;
    delta::add_new_columns(table, target, &plan.table_schema()).await
}

/// The post-commit observers' outcome in the batch's report.
pub(super) fn published(report: &mut TableReport, p: crate::delta::pipeline::Published) {
    report.manifests_written = p.manifests_written;
    report.manifests_deleted = p.manifests_deleted;
    report.manifests_caught_up = p.caught_up;
    report.manifest_error = p.manifest_error;
    report.phases_ms.manifests = p.manifests_ms;
    report.phases_ms.catalog = p.catalog_ms;
    report.phases_ms.watermark = p.watermark_ms;
    report.watermark = p.watermark;
    report.watermark_error = p.watermark_error;
    absorb(report, p.catalog);
}

/// The history table's report in the batch's.
fn adopt_history(report: &mut TableReport, mut r: crate::delta::history::HistoryReport, ms: u64) {
    absorb(report, r.catalog.take());
    report.history = Some(r);
    report.phases_ms.history = ms;
}

/// The Delta application transactions that record the batch's files as applied: full
/// loads (`reload`) and CDC files (`applied`). A large file's slices other than its last
/// record nothing (the file is applied with its last).
fn file_records(table: &TableConfig, batch: &Batch<'_>) -> Vec<Transaction> {
    batch
        .changes
        .iter()
        .filter(|c| !c.partial)
        .filter_map(|c| {
            crate::delta::applied::file_txn(table, c)
                .or_else(|| crate::delta::applied::record(table, c))
        })
        .collect()
}

/// Add a catalog sync's report to the table's.
pub(super) fn absorb(report: &mut TableReport, r: Option<crate::delta::catalog::CatalogReport>) {
    crate::delta::pipeline::absorb(&mut report.catalog, r);
}

/// Adopt a table another writer created (Spark, Databricks, an earlier job): it has no
/// order-key column, so tributary adds it, nullable, with a metadata commit — what Spark's
/// `ALTER TABLE ADD COLUMNS` writes — and records the adoption (`tributary.adopted`) and,
/// from then on, the CDC files it applies (as in a table it creates). The rows already in
/// the table have no order key and rank below every change (`t.seq IS NULL` is older): the
/// first change of each key replaces its row; a re-delivered file is screened out.
pub(crate) async fn adopt(table: &TableConfig, target: DeltaTable) -> Result<DeltaTable> {
    delta::refuse_unwritable(&target, &table.name)?;
    let Some(schema) = delta::arrow_schema(&target) else {
        return Ok(target);
    };
    if schema
        .field_with_name(&table.writing.sequence_column)
        .is_ok()
    {
        return Ok(target);
    }
    tracing::info!(table = %table.name, column = %table.writing.sequence_column, "adopting a table tributary did not create: adding its order-key column");
    let column = deltalake::kernel::StructField::new(
        table.writing.sequence_column.clone(),
        deltalake::kernel::DataType::STRING,
        true,
    );
    let target = delta::add_columns(&table.name, target, vec![column]).await?;
    // From now on every CDC file applied is recorded, as in a table tributary creates: a
    // re-delivered file is then screened out, and commits nothing.
    let mut props = TableProps::for_adoption(chrono::Utc::now());
    props.extend(crate::delta::applied::new_table_properties(table));
    delta::set_properties(target, props).await
}

/// `deletion_vectors = true` on a table that does not allow them yet: the property set and
/// the protocol raised to reader 3 / writer 7 with `deletionVectors` (one metadata commit)
/// before this merge. Never turned off by tributary: readers of the table need the feature
/// while any file has a vector, and maintenance materialises them.
pub(super) async fn enable_deletion_vectors(
    table: &TableConfig,
    target: DeltaTable,
) -> Result<DeltaTable> {
    if !table.writing.deletion_vectors || delta::writes_deletion_vectors(&target) {
        return Ok(target);
    }
    tracing::info!(table = %table.name, "allowing deletion vectors (delta.enableDeletionVectors, protocol reader 3 / writer 7)");
    delta::set_properties(target, TableProps::for_deletion_vectors()).await
}

/// `change_data_feed = true` on a table that does not have the feed on yet: turned on (a
/// metadata commit) before this merge, so that the merge's changes are in the feed. Never
/// turned off by tributary (a table property other tools may rely on).
pub(super) async fn enable_change_data_feed(
    table: &TableConfig,
    target: DeltaTable,
) -> Result<DeltaTable> {
    if !table.writing.change_data_feed || delta::props(&target).change_data_feed {
        return Ok(target);
    }
    tracing::info!(table = %table.name, "turning on the change data feed (delta.enableChangeDataFeed)");
    delta::set_properties(target, TableProps::for_change_data_feed()).await
}
