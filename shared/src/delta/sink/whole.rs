//! A large file appended whole, in one commit, reading it once (docs/design.md, "Large
//! files"): when every slice can be appended — no row of the table has a key in the slice's
//! key range, and the slices' ranges do not overlap each other — each slice is checked,
//! planned and written as data files as it is read, and one commit adds them all (with the
//! full-load file's transaction id). A full load into a new table, or LOAD files with
//! disjoint key ranges, take this path. Otherwise (a slice that would update or delete rows,
//! keys out of order across slices, a concurrent commit in the range) the files written are
//! discarded and the file is merged slice by slice, as before.

use std::time::Instant;

use deltalake::kernel::Action;
use deltalake::DeltaTable;
use url::Url;

use super::recheck::Rechecked;
use super::{DeltaSink, TableReport, TableView, Whole};
use crate::config::TableConfig;
use crate::delta;
use crate::delta::scan::KeyRange;
use crate::delta::tombstones::Tombstones;
use crate::error::Result;
use crate::plan::{self, MergePlan};
use crate::source::{self, ChangeSet, FileCounts};
use crate::storage;

/// Slices written at once while the next is read. Writing a slice (splitting it by
/// partition, encoding Parquet) takes longer than reading and planning one, so with one
/// writer the reading core waited; two keep both cores busy (docs/benchmarks.md, "Full
/// loads").
const WRITES_IN_FLIGHT: usize = 2;

/// What the pass has written so far.
struct Written {
    adds: Vec<Action>,
    ranges: Vec<KeyRange>,
    counts: FileCounts,
    rows: usize,
    slices: usize,
    superseded: usize,
    txn: Option<deltalake::kernel::Transaction>,
    /// The slices being written (at most [`WRITES_IN_FLIGHT`], while the next is read and
    /// planned), oldest first.
    pending: std::collections::VecDeque<tokio::task::JoinHandle<Result<Vec<Action>>>>,
    /// Time spent waiting for data files to be written.
    write_wait_ms: u64,
    /// The sequence kinds the file's order keys were made with.
    kinds: Option<Vec<source::SeqKind>>,
    /// What the file was screened on (checked again before the commit).
    screened: super::Screened,
}

impl Written {
    /// The table report of the committed append.
    fn report(&self, table: &TableConfig) -> TableReport {
        TableReport {
            table: table.name.clone(),
            files: 1,
            source_rows: self.counts.rows,
            superseded_in_batch: self.superseded,
            inserted: self.rows,
            files_added: self.adds.len(),
            slices: 1,
            write_path: Some(super::WritePath::Append),
            ..Default::default()
        }
    }

    /// Wait for every slice being written; their files join the others.
    async fn settle(&mut self) -> Result<()> {
        self.make_room(1).await
    }

    /// Wait for the oldest slices being written until fewer than `limit` are.
    async fn make_room(&mut self, limit: usize) -> Result<()> {
        while self.pending.len() >= limit {
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            let t = Instant::now();
            let adds = p
                .await
                .map_err(|e| crate::error::Error::internal(format!("slice writer: {e}")))??;
            self.adds.extend(adds);
            self.write_wait_ms += t.elapsed().as_millis() as u64;
        }
        Ok(())
    }

    /// Every file written so far, for discarding (after the slice being written).
    async fn written(&mut self) -> Vec<Action> {
        // Each slice awaited, whatever the others' outcome: all their files are discarded.
        while !self.pending.is_empty() {
            if let Err(e) = self.make_room(self.pending.len()).await {
                tracing::warn!(error = %e, "a slice's files could not be written; VACUUM removes what is left");
            }
        }
        std::mem::take(&mut self.adds)
    }
}

impl DeltaSink {
    /// Try to apply a large file as one append (see the module documentation).
    pub(super) async fn append_file_whole(
        &self,
        table: &TableConfig,
        file: &Url,
        raw: &source::RawFile,
    ) -> Result<Whole> {
        if table.history.is_some() || table.target.is_none() || table.primary_key.len() != 1 {
            return Ok(Whole::Fallback("history table or composite key"));
        }
        let start = Instant::now();
        let view = TableView::open(table, &self.options).await?;
        if view
            .schema
            .as_ref()
            .is_some_and(|s| s.field_with_name(&table.writing.sequence_column).is_err())
        {
            return Ok(Whole::Fallback(
                "a table tributary did not create: adopted by the first slice's merge",
            ));
        }
        crate::delta::refuse_unwritable(&view.table, &table.name)?;
        let mut slices = super::slices_of(table, &view, file, raw)?;
        let Some(first) = slices.next_slice()? else {
            return Ok(Whole::Fallback("no rows"));
        };
        let first = match self.screen(table, &view, vec![first]).await {
            (mut kept, _) if kept.len() == 1 => kept.remove(0),
            (_, settled) => return Ok(Whole::Done(None, settled)),
        };
        let mut kinds = view.props.sequence_kinds.clone();
        let first = admit_one(first, table, &view, &mut kinds)?;
        let base_plan = plan::plan(table, std::slice::from_ref(&first))?;
        if let Some(schema) = &view.schema {
            if !crate::delta::widen::needed(schema, &base_plan.table_schema()).is_empty() {
                // The widening commit rewrites the table: made by the slices' merge.
                return Ok(Whole::Fallback("a column's type widens"));
            }
        }
        let mut c = self
            .prepare(table, &first, &base_plan, &kinds, start)
            .await?;
        let mut pass = Pass {
            table,
            view: &view,
            slices: &mut slices,
            kinds,
        };
        match pass.run(self, &mut c, first, base_plan).await {
            Ok(None) => {}
            Ok(Some(why)) => {
                discard(&c.target, c.written.written().await).await;
                return Ok(Whole::Fallback(why));
            }
            // A bad row anywhere fails the file, nothing of it committed.
            Err(e) => {
                discard(&c.target, c.written.written().await).await;
                return Err(e);
            }
        }
        let report = self.commit_whole(table, file, raw, c).await?;
        let Some((report, counts)) = report else {
            return Ok(Whole::Fallback("a concurrent commit in the key range"));
        };
        let outcomes = merged_file(table, file, counts);
        Ok(Whole::Done(Some(Box::new(report)), outcomes))
    }

    /// The table (created from the first slice when new, with its catalog entries at once:
    /// the file may still fall back to slices), its state before, and the tombstones.
    async fn prepare<'a>(
        &self,
        table: &'a TableConfig,
        first: &ChangeSet,
        base_plan: &MergePlan,
        kinds: &Option<Vec<source::SeqKind>>,
        start: Instant,
    ) -> Result<Commit<'a>> {
        let batch = super::Batch {
            changes: std::slice::from_ref(first),
            kinds: kinds.clone(),
            delete_unmatched_below: None,
        };
        let (target, created) = self.load_or_create(table, &batch, base_plan).await?;
        let created = match created {
            true => self.catalog.created(table, false, &target).await,
            false => None,
        };
        // Before the metadata commits below, as a merge's (`DeltaSink::try_merge`).
        let before = super::batch::Before::of(table, &target)?;
        let target = crate::delta::record_kinds(target, kinds.as_deref()).await?;
        let target = super::batch::enable_change_data_feed(table, target).await?;
        Ok(Commit {
            before,
            target,
            created,
            tombstones: Tombstones::open(table, &self.options, &base_plan.batch.schema()).await?,
            first_read: None,
            written: Written {
                adds: Vec::new(),
                ranges: Vec::new(),
                counts: FileCounts::default(),
                rows: 0,
                slices: 0,
                superseded: 0,
                txn: crate::delta::applied::file_txn(table, first)
                    .or_else(|| crate::delta::applied::record(table, first)),
                pending: std::collections::VecDeque::new(),
                write_wait_ms: 0,
                kinds: kinds.clone(),
                screened: super::Screened::of(first),
            },
            start,
        })
    }

    /// Check one slice against the table and tombstones and write it (uncommitted). `Some`
    /// with the reason when the file cannot be appended whole.
    async fn write_slice(
        &self,
        table: &TableConfig,
        target: &DeltaTable,
        tombstones: &mut Tombstones<'_>,
        cs: ChangeSet,
        mut plan: MergePlan,
        w: &mut Written,
    ) -> Result<Option<&'static str>> {
        let tombs = tombstones.read(&plan).await?;
        if plan::apply_tombstones(&mut plan, table, &tombs)? > 0
            || plan::hold_back(&mut plan, table, tombstones.pending())? > 0
        {
            return Ok(Some("a tombstone blocks a row"));
        }
        delta::align_to_table(table, &mut plan, target)?;
        let Some(range) = delta::append_range(table, target, &plan).await? else {
            return Ok(Some("the table has rows in the slice's key range"));
        };
        if w.ranges.iter().any(|r| r.overlaps(&range)) {
            return Ok(Some("slices with overlapping key ranges"));
        }
        w.ranges.push(range);
        w.counts.add(&cs.counts);
        w.rows += plan.batch.num_rows();
        w.superseded += plan.superseded;
        // Written while the next slice is read and planned.
        w.make_room(WRITES_IN_FLIGHT).await?;
        let (cfg, t) = (table.clone(), target.clone());
        let file = storage::display(&cs.file);
        w.pending.push_back(tokio::spawn(async move {
            delta::write_rows(&cfg, &t, &plan, &file).await
        }));
        w.slices += 1;
        Ok(None)
    }

    /// Commit the written files in one append; then the tombstone re-check, manifests and
    /// catalog, as after any commit. `None` when a concurrent commit in the key range made
    /// the append conflict (the file then goes slice by slice).
    async fn commit_whole(
        &self,
        table: &TableConfig,
        file: &Url,
        raw: &source::RawFile,
        c: Commit<'_>,
    ) -> Result<Option<(TableReport, FileCounts)>> {
        let name = storage::display(file);
        let Commit {
            target,
            created,
            before,
            mut tombstones,
            first_read,
            written: w,
            start,
        } = c;
        let written = w.adds.len();
        let Some((after, attempts, carried)) = self.try_commit(table, target, &w, &name).await?
        else {
            return Ok(None);
        };
        let mut report = w.report(table);
        report.commit_attempts = attempts;
        super::batch::absorb(&mut report, created);
        let recheck = self
            .recheck_whole(
                table,
                after.clone(),
                (file, raw),
                (&mut tombstones, first_read),
            )
            .await;
        let (after, failed) = match recheck {
            Ok((t, r)) => {
                report.deleted += r.deleted;
                report.blocked_by_tombstone += r.blocked;
                report.files_added += r.files_added;
                report.files_removed += r.files_removed;
                (t, None)
            }
            Err(e) => (after, Some(e)),
        };
        report.version = after.version();
        tracing::info!(table = %table.name, file = %name, slices = w.slices, rows = w.rows, files_added = written, write_wait_ms = w.write_wait_ms, total_ms = start.elapsed().as_millis() as u64, "appended the whole file in one commit");
        let published = self
            .after_merge(
                table,
                crate::delta::pipeline::Committed {
                    watermark: carried,
                    ..crate::delta::pipeline::Committed::since(before, after)
                },
            )
            .await;
        super::batch::published(&mut report, published);
        if let Some(e) = failed {
            // Committed, but a delete recorded meanwhile may not be applied: the file fails
            // (retried: its rows are there, and the tombstone turns them into the delete).
            return Err(e);
        }
        report.duration_ms = start.elapsed().as_millis() as u64;
        report.log();
        Ok(Some((report, w.counts)))
    }

    /// The append commit: the written files, the file's load transaction id, the union of
    /// the slices' key ranges as what it read. A commit that loses to a concurrent one is
    /// made again on the new snapshot while the file is still an append there. `None` (the
    /// file goes slice by slice) when it is not; else the table and the attempts made.
    async fn try_commit(
        &self,
        table: &TableConfig,
        target: DeltaTable,
        w: &Written,
        name: &str,
    ) -> Result<Option<(DeltaTable, u32, Carried)>> {
        let Some((first, rest)) = w.ranges.split_first() else {
            return Err(crate::error::Error::internal(
                "a whole-file append without slices",
            ));
        };
        let range = rest.iter().fold(first.clone(), |a, r| a.union(r));
        let txns: Vec<_> = w.txn.iter().cloned().collect();
        #[cfg(test)]
        self.hooks
            .reach(crate::delta::testing::Point::BeforeMerge, "", vec![])
            .await;
        let mut appending = Appending {
            table,
            storage: &self.storage,
            schema: delta::arrow_schema(&target),
            target,
            w,
            range,
            files: [name.to_string()],
            txns,
            carried: None,
        };
        let retry = crate::delta::retry::Retry::new(&table.name, table.limits.max_commit_attempts);
        match retry.drive("whole-file append", &mut appending).await {
            Ok((Some(t), attempts)) => Ok(Some((t, attempts, appending.carried))),
            Ok((None, _)) | Err(crate::error::Error::Contention { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A delete was recorded while the file was being appended: its MERGE may have found
    /// no row (ours were not committed), so read the file again (the same bytes) and delete
    /// what a newer tombstone supersedes, slice by slice (the rare path), retried like a
    /// merge. Nothing to do when the tombstone table did not move.
    async fn recheck_whole(
        &self,
        table: &TableConfig,
        mut target: DeltaTable,
        (file, raw): (&Url, &source::RawFile),
        (tombstones, first_read): (&mut Tombstones<'_>, Option<u64>),
    ) -> Result<(DeltaTable, Rechecked)> {
        let mut done = Rechecked::default();
        if !tombstones.moved_since(first_read).await? {
            return Ok((target, done));
        }
        let view = TableView::open(table, &self.options).await?;
        let files = [storage::display(file)];
        let mut slices = super::slices_of(table, &view, file, raw)?;
        while let Some(cs) = slices.next_slice()? {
            let mut recheck = Rechecking {
                table,
                target,
                plan: plan::plan(table, std::slice::from_ref(&cs))?,
                tombstones: &mut *tombstones,
                files: &files,
            };
            let r;
            ((target, r), _) =
                crate::delta::retry::Retry::new(&table.name, table.limits.max_commit_attempts)
                    .drive("tombstone re-check", &mut recheck)
                    .await?;
            done += r;
        }
        Ok((target, done))
    }
}

/// The tombstone re-check of one slice of an appended file, retried on conflicts (on the
/// newest table each time).
struct Rechecking<'a, 'b> {
    table: &'a TableConfig,
    target: DeltaTable,
    plan: MergePlan,
    tombstones: &'a mut Tombstones<'b>,
    files: &'a [String],
}

impl crate::delta::retry::Attempts for Rechecking<'_, '_> {
    type Out = (DeltaTable, Rechecked);

    async fn attempt(&mut self, n: u32) -> Result<Self::Out> {
        if n > 1 {
            self.target
                .update_incremental(None)
                .await
                .map_err(|e| crate::error::Error::delta(&self.table.name, e))?;
        }
        self.tombstones.forget_read();
        let mut p = self.plan.clone();
        super::recheck::recheck_tombstones(
            self.table,
            self.target.clone(),
            &mut p,
            self.tombstones,
            self.files,
        )
        .await
    }
}

/// A whole-file append's commit attempts: the written files, the file's record, the union
/// of the slices' key ranges as what it read. An attempt after a lost race is made on the
/// newest snapshot while the file is still an append there; `None` (the file goes slice by
/// slice) when it is not.
struct Appending<'a> {
    table: &'a TableConfig,
    target: DeltaTable,
    schema: Option<arrow::datatypes::SchemaRef>,
    w: &'a Written,
    /// The union of the slices' key ranges: what the append read.
    range: KeyRange,
    files: [String; 1],
    txns: Vec<deltalake::kernel::Transaction>,
    storage: &'a crate::storage::Storage,
    /// The watermark the commit carried (see `commit::Committed::watermark`).
    carried: Carried,
}

/// The watermark a commit carried, and the progress that computed it.
type Carried = Option<(
    crate::delta::watermark::Progress,
    crate::delta::watermark::Stored,
)>;

impl crate::delta::retry::Attempts for Appending<'_> {
    type Out = Option<DeltaTable>;

    async fn attempt(&mut self, n: u32) -> Result<Option<DeltaTable>> {
        let (table, retried) = (self.table, n > 1);
        if retried {
            self.target
                .update_incremental(None)
                .await
                .map_err(|e| crate::error::Error::delta(&table.name, e))?;
        }
        let check = (&self.schema, &self.range);
        if !still_an_append(table, &self.target, self.w, check, retried).await? {
            tracing::info!(table = %table.name, file = %self.files[0], "no longer an append on the table's newest version; merging the file slice by slice");
            if !retried {
                discard(&self.target, self.w.adds.clone()).await;
            }
            return Ok(None);
        }
        // The watermark this commit moves goes into it (one commit per merge).
        let mut txns = self.txns.clone();
        self.carried =
            crate::delta::watermark::carried(self.storage, table, &self.target, &mut txns).await;
        // Once the commit was tried, the files are never deleted: it may have landed (a
        // lost response, a failed post-commit step); VACUUM removes them if not.
        let t = delta::commit_append(
            table,
            self.target.clone(),
            self.w.adds.clone(),
            self.range.clone(),
            &self.files,
            &txns,
        )
        .await?;
        Ok(Some(t))
    }
}

/// Reading, checking and writing the slices after the first.
struct Pass<'a, 'b> {
    table: &'a TableConfig,
    view: &'b TableView,
    slices: &'b mut source::Slices,
    /// The sequence kinds the file established so far.
    kinds: Option<Vec<source::SeqKind>>,
}

impl Pass<'_, '_> {
    /// Write every slice (each while the next is read and planned). `Some` with the reason
    /// when the file cannot be appended whole.
    async fn run(
        &mut self,
        engine: &DeltaSink,
        c: &mut Commit<'_>,
        first: ChangeSet,
        base_plan: MergePlan,
    ) -> Result<Option<&'static str>> {
        let first_kinds = self.kinds.clone();
        let mut next = Some((first, base_plan));
        while let Some((cs, plan)) = next.take() {
            let why = engine
                .write_slice(
                    self.table,
                    &c.target,
                    &mut c.tombstones,
                    cs,
                    plan,
                    &mut c.written,
                )
                .await?;
            if why.is_some() {
                return Ok(why);
            }
            c.first_read = c.first_read.or(c.tombstones.read_version());
            if let Some(cs) = self.slices.next_slice()? {
                let cs = admit_one(cs, self.table, self.view, &mut self.kinds)?;
                let plan = plan::plan(self.table, std::slice::from_ref(&cs))?;
                next = Some((cs, plan));
            }
        }
        c.written.settle().await?;
        if self.kinds != first_kinds {
            // Recording them would be a commit between the checks and the append.
            return Ok(Some(
                "the sequence kinds became known after the first slice",
            ));
        }
        Ok(None)
    }
}

/// What the commit of a whole-file append works with.
struct Commit<'a> {
    target: DeltaTable,
    /// The new table's catalog sync, when this append created it.
    created: Option<crate::delta::catalog::CatalogReport>,
    /// The table before the append (for manifests and catalog).
    before: super::batch::Before,
    tombstones: Tombstones<'a>,
    /// The tombstone table's version at the first slice's read.
    first_read: Option<u64>,
    written: Written,
    start: Instant,
}

/// Whether the written files are still an append on `target` (the snapshot a commit will be
/// based on): the same schema and sequence kinds, the file's screening still holds (no DMS
/// reload, no tombstone horizon past it since), and — after a lost commit race, when the
/// slices' checks were made on an older snapshot — still no row in the key range.
async fn still_an_append(
    table: &TableConfig,
    target: &DeltaTable,
    w: &Written,
    (schema, range): (&Option<arrow::datatypes::SchemaRef>, &KeyRange),
    retried: bool,
) -> Result<bool> {
    let props = delta::props(target);
    if delta::arrow_schema(target) != *schema
        || !same_kinds(target, &w.kinds)
        || super::rescreen(table, &props, std::iter::once(&w.screened)).is_err()
    {
        return Ok(false);
    }
    // Another version of the file applied since (merged slice by slice, it is refused).
    if retried
        && super::rescreen_contents(table, target, std::slice::from_ref(&w.screened))
            .await
            .is_err()
    {
        return Ok(false);
    }
    Ok(
        !retried
            || !crate::delta::scan::rows_in_range(target, &table.primary_key[0], range).await?,
    )
}

/// The table records the sequence kinds the order keys were made with (none recorded and
/// none needed — a table without `sequence_by` — is the same).
fn same_kinds(table: &DeltaTable, kinds: &Option<Vec<source::SeqKind>>) -> bool {
    let recorded = delta::props(table).sequence_kinds.unwrap_or_default();
    recorded == kinds.clone().unwrap_or_default()
}

/// Admit one slice against the table (and the kinds the file established so far).
fn admit_one(
    cs: ChangeSet,
    table: &TableConfig,
    view: &TableView,
    kinds: &mut Option<Vec<source::SeqKind>>,
) -> Result<ChangeSet> {
    let mut a = plan::admit(
        vec![cs],
        &table.primary_key,
        view.schema.as_deref(),
        kinds.as_deref(),
    );
    if let Some((_, e)) = a.rejected.pop() {
        return Err(e);
    }
    *kinds = a.kinds.take();
    a.admitted
        .pop()
        .ok_or_else(|| crate::error::Error::internal("an admitted slice went missing"))
}

/// The file's outcome (logged as `merged` logs it).
fn merged_file(table: &TableConfig, file: &Url, counts: FileCounts) -> Vec<super::FileOutcome> {
    tracing::info!(table = %table.name, file = %storage::display(file), rows = counts.rows, inserts = counts.inserts, updates = counts.updates, deletes = counts.deletes, "file merged");
    vec![super::FileOutcome {
        file: file.clone(),
        status: super::FileStatus::Merged {
            table: table.name.clone(),
            counts,
        },
    }]
}

/// Delete data files written but never committed (best effort: VACUUM removes what is
/// left, as it does after any failed write).
async fn discard(table: &DeltaTable, adds: Vec<Action>) {
    use object_store::ObjectStoreExt;
    let store = table.log_store().object_store(None);
    for a in adds {
        if let Action::Add(add) = a {
            // `add.path` is the object key as written (partition values already encoded):
            // parsed, not encoded again.
            let deleted = match object_store::path::Path::parse(&add.path) {
                Ok(path) => store.delete(&path).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = deleted {
                tracing::warn!(file = %add.path, error = %e, "uncommitted data file not deleted; VACUUM will");
            }
        }
    }
}
