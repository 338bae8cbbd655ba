//! Copy-on-write application of a merge plan: tributary's one write path for changes to
//! rows a table has (appends of new keys take `delta::append`).
//!
//! What a SQL MERGE would do for tributary's plan — rewrite every data file holding a key
//! the plan changes, insert the keys no file holds — done with the plan's own key index
//! instead of a join: the data files whose key statistics can hold a key of the plan are
//! streamed (in groups of one partition, four groups at a time), each row whose key the
//! plan changes with a newer order key is replaced (upsert) or dropped (delete), files with
//! no change are left alone, and the result (a group's changed files into one output; the
//! inserts and rows moved to another partition apart; small unchanged files read on the way
//! folded in, see [`FOLD_FILE`]) is written through delta-rs's
//! `DeltaWriter` (the same Parquet writer and
//! statistics as every other write) and committed as a MERGE that read the plan's key range
//! (`delta::commit`: a concurrent commit adding rows in that range conflicts).
//!
//! Per column, an update takes the plan's value or keeps the row's: a column of the table
//! the plan lacks keeps the row's value, a sparse column takes the plan's only where the
//! change that set it is newer than the row (plan.rs); inserts have nulls there. Columns
//! the plan brings and the table lacks are added before, by a metadata commit
//! (`delta::add_new_columns`). A reload deletes the rows no change matches whose order key
//! is below the new load's (every file read). Keys of a type without statistics pruning
//! (decimals, dates, timestamps, binary) are looked up in every file.
//!
//! On a table with the change data feed, the merge's row images (pre- and post-images of
//! updates, deletes, inserts) are written as `_change_data` files and committed as `cdc`
//! actions, as the protocol specifies.
//!
//! A data file's deletion vector is applied as it is read (`datafile::TableFiles`): the
//! rows it deletes stay deleted, and a rewritten file leaves without them (its `remove`
//! carries the vector). Every row written is checked against the table's CHECK
//! constraints, invariants and NOT NULL columns (`constraints`). The history's versions
//! are written the same way, matched on key and first order key ([`Rewrite::unconditional`]).
//!
//! Tables tributary cannot write exactly (column mapping, identity or generated columns,
//! features it does not know) are refused by name before anything is written
//! (`delta::refuse_unwritable`); so is an order-key column that is not text.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::delta::writer::{FileLayout, Writer};
use arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, RecordBatch, StringArray, UInt32Array,
};
use arrow::datatypes::{DataType, SchemaRef};
use deltalake::kernel::{Action, LogicalFileView};
use deltalake::protocol::DeltaOperation;
use deltalake::DeltaTable;
use futures::StreamExt;
use object_store::ObjectStoreExt;

use crate::config::TableConfig;
use crate::delta::manifest::Partition;
use crate::delta::scan::{KeyBound, KeyRange};
use crate::delta::MergeExtras;
use crate::error::{Error, Result};
use crate::plan::{KeyEncoder, MergePlan, PlanOp};

/// Groups of files read, applied and written at once: two per core of a 2-vCPU function,
/// so that one group's reads and uploads overlap another's decoding (4 against 2 here, one
/// task per file: 10M rows × 1k spread changes 1156–1229 against 1306–1352 ms, the same
/// memory; docs/benchmarks.md).
const PARALLEL_FILES: usize = 4;

/// What a rewrite changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Applied {
    pub(crate) inserted: usize,
    pub(crate) updated: usize,
    pub(crate) deleted: usize,
    pub(crate) files_added: usize,
    pub(crate) files_removed: usize,
    /// Of `files_removed`, the unchanged small files folded into a rewritten file.
    pub(crate) files_folded: usize,
    /// Data files given a deletion vector (or a larger one) instead of being rewritten.
    pub(crate) files_vectored: usize,
}

/// Where an update takes a column's value from.
enum Keep {
    /// The plan's value.
    Never,
    /// The row's value (a column of the table the plan lacks).
    Always,
    /// The plan's value where the change that set it (its order key here) is newer than
    /// the row, else the row's (a sparse column).
    Sparse(StringArray),
}

impl Keep {
    /// Whether plan row `p` gives the value of the row whose order key is `tseq[i]`.
    fn takes_plan(&self, p: usize, tseq: &StringArray, i: usize) -> bool {
        match self {
            Keep::Never => true,
            Keep::Always => false,
            Keep::Sparse(seq) => {
                seq.is_valid(p) && (tseq.is_null(i) || seq.value(p) > tseq.value(i))
            }
        }
    }
}

/// The plan indexed by key, in the table's schema, ready to apply to data files.
pub(crate) struct Rewrite {
    /// The plan's rows in the table's schema (same column order and types; nulls in the
    /// columns the plan lacks).
    rows: RecordBatch,
    /// Per column of `rows`, where an update takes its value from.
    keep: Vec<Keep>,
    ops: Vec<PlanOp>,
    /// Encoded key → plan row.
    index: KeyIndex,
    /// The plan rows' partition values, row-encoded (partitioned tables): an upsert whose
    /// partition differs from its file's leaves the file and is written with the inserts,
    /// so a merge adds one file per partition for moved rows, not one per file rewritten.
    partitions: Option<(arrow::row::RowConverter, arrow::row::Rows, Vec<usize>)>,
    seq_column: usize,
    /// The plan's first key column values, sorted (file pruning).
    sorted_keys: Vec<KeyBound>,
    key0: String,
    /// The plan's range of first key values (integer and string keys): the files whose
    /// statistics can hold one are read, and the commit declares it as what it read. None:
    /// every file read, and the commit reads the whole table.
    range: Option<KeyRange>,
    /// A reload: the rows no change matches and whose order key is below this are deleted.
    reload: Option<String>,
    /// The table keeps a change data feed: the merge's row images go to `_change_data`.
    feed: bool,
    /// Decoded bytes of a file held back before its first changed row (half the table's
    /// `slice_mb`); past that, the file is read on without holding its rows, and read again
    /// if it changes after all.
    held_bytes: usize,
    /// Whether a matched change applies whatever the row's order key.
    always: bool,
    /// Merge-on-read: a changed data file gets a deletion vector for its replaced and
    /// deleted rows, and only the new row versions are written (unless most of its rows
    /// go, [`Marked::vector`]).
    vectors: bool,
    /// The table's schema, as its data files are read and written (`rows` has every
    /// column nullable: the constraints check its nulls, by name).
    schema: SchemaRef,
    /// The table's key columns (merge-on-read reads them first).
    key_schema: SchemaRef,
    /// What merge-on-read reads of the rows the plan changes: the key, the order key, the
    /// partition columns, the columns whose value an update may keep ([`Keep`]); every
    /// column when the change data feed needs the rows' pre-images. The other columns are
    /// left null: only the new versions are written, from the plan's values.
    changed_rows_schema: SchemaRef,
    /// The table's constraints, checked on every row written.
    checks: crate::delta::constraints::Checks,
    /// The files being applied, the table's label and key (for a refusal's message).
    files: String,
    label: String,
    key: Vec<String>,
}

impl Rewrite {
    /// The rewrite of `plan` into `table` (`None`: an empty plan, not a reload, has nothing
    /// to write). A plan the rewrite cannot express is refused by name (the planner and the
    /// metadata commits before it make every plan expressible: columns added, types
    /// aligned).
    #[allow(
        clippy::too_many_lines,
        reason = "the rewrite is plan (`eligible`), execute (`run`) and metrics (`Applied`) already; each step is one piece on the merge's hot path, split only with the benchmark matrix rerun"
    )]
    pub(crate) fn eligible(
        cfg: &TableConfig,
        table: &DeltaTable,
        plan: &MergePlan,
        extras: &MergeExtras,
    ) -> Result<Option<Rewrite>> {
        let reload = extras.delete_unmatched_below.clone();
        if plan.batch.num_rows() == 0 && reload.is_none() {
            return Ok(None);
        }
        let label = cfg.name.as_str();
        let state = table.snapshot().map_err(|e| Error::delta(label, e))?;
        crate::delta::refuse_unwritable(table, label)?;
        let feed = crate::delta::props(table).change_data_feed;
        let schema = state.snapshot().arrow_schema();
        let schema_error = |message: String| Error::Schema {
            table: label.to_string(),
            message,
        };
        // Every column of the plan is a column of the table, in its type (new columns were
        // added by a metadata commit before; `delta::align_to_table` converted types).
        if let Some(f) = plan
            .table_schema()
            .fields()
            .iter()
            .find(|f| schema.field_with_name(f.name()).is_err())
        {
            return Err(Error::internal(format!(
                "table {label}: column `{}` of the changes is not a column of the table",
                f.name()
            )));
        }
        let partition_columns = state.metadata().partition_columns();
        let n = plan.batch.num_rows();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        let mut keep = Vec::with_capacity(schema.fields().len());
        for f in schema.fields() {
            let sparse = plan.sparse.iter().find(|s| &s.column == f.name());
            let k = match (plan.batch.column_by_name(f.name()), sparse) {
                (Some(c), _) if c.data_type() != f.data_type() => {
                    return Err(schema_error(format!(
                        "column `{}` is {} in the changes and {} in the table",
                        f.name(),
                        c.data_type(),
                        f.data_type()
                    )))
                }
                (Some(c), None) => {
                    columns.push(c.clone());
                    Keep::Never
                }
                (Some(c), Some(s)) => {
                    let seq = plan.column(&s.seq_column)?;
                    let seq = seq.as_string_opt::<i32>().ok_or_else(|| {
                        Error::internal(format!(
                            "table {label}: order key `{}` of a sparse column is not text",
                            s.seq_column
                        ))
                    })?;
                    columns.push(c.clone());
                    Keep::Sparse(seq.clone())
                }
                (None, _) => {
                    columns.push(new_null_array(f.data_type(), n));
                    Keep::Always
                }
            };
            // Keys, the order key and partition values are whole in every change.
            let whole = cfg.primary_key.contains(f.name())
                || f.name() == &cfg.writing.sequence_column
                || partition_columns.contains(f.name());
            if whole && !matches!(k, Keep::Never) {
                return Err(schema_error(format!(
                    "column `{}` (a key, the order key or a partition column) is missing from the changes or sparse in them; every change must carry it",
                    f.name()
                )));
            }
            keep.push(k);
        }
        let checks = crate::delta::constraints::Checks::of(table, label)?;
        let rows = RecordBatch::try_new(relaxed(&schema), columns).map_err(Error::arrow)?;
        let seq_column = schema
            .fields()
            .iter()
            .position(|f| f.name() == &cfg.writing.sequence_column)
            .ok_or_else(|| {
                schema_error(format!(
                    "the table has no order-key column `{}`",
                    cfg.writing.sequence_column
                ))
            })?;
        if schema.field(seq_column).data_type() != &DataType::Utf8 {
            return Err(Error::Unsupported {
                table: label.to_string(),
                feature: format!(
                    "the table's column `{}` is {}, and tributary keeps its order keys there as text",
                    cfg.writing.sequence_column,
                    schema.field(seq_column).data_type()
                ),
                way_forward: "nothing was written; set `sequence_column` to a name the table does not use, then replay the file".into(),
            });
        }
        let key0 = cfg.primary_key[0].clone();
        let keys0 = rows
            .column_by_name(&key0)
            .ok_or_else(|| schema_error(format!("the table has no key column `{key0}`")))?;
        let range = KeyRange::of(keys0)?;
        let mut sorted_keys = match range {
            Some(_) => key_bounds(keys0)?,
            None => Vec::new(),
        };
        sorted_keys.sort();
        let index = KeyIndex::new(&rows, &cfg.primary_key).map_err(|e| match e {
            Error::Internal(m) => Error::internal(format!("table {label}: {m}")),
            e => e,
        })?;
        let partitions = partition_index(&rows, partition_columns)?;
        let changed_rows_schema = {
            let read: Vec<usize> = schema
                .fields()
                .iter()
                .enumerate()
                .filter(|(c, f)| {
                    feed || *c == seq_column
                        || cfg.primary_key.contains(f.name())
                        || partition_columns.contains(f.name())
                        || !matches!(keep[*c], Keep::Never)
                })
                .map(|(c, _)| c)
                .collect();
            Arc::new(schema.project(&read).map_err(Error::arrow)?)
        };
        Ok(Some(Rewrite {
            ops: plan.ops()?,
            rows,
            keep,
            index,
            partitions,
            seq_column,
            sorted_keys,
            key0,
            range,
            reload,
            feed,
            held_bytes: cfg.limits.slice_bytes / 2,
            always: false,
            vectors: false,
            key_schema: Arc::new(
                schema
                    .project(
                        &cfg.primary_key
                            .iter()
                            .map(|k| schema.index_of(k).map_err(Error::arrow))
                            .collect::<Result<Vec<_>>>()?,
                    )
                    .map_err(Error::arrow)?,
            ),
            changed_rows_schema,
            schema,
            checks,
            files: String::new(),
            label: label.to_string(),
            key: cfg.primary_key.clone(),
        }))
    }

    /// Every matched change applies, whatever the row's order key (the history's versions,
    /// matched on key and first order key, are written as computed).
    pub(crate) fn unconditional(mut self) -> Rewrite {
        self.always = true;
        self
    }

    /// Merge-on-read when `on` (the table allows deletion vectors and its configuration
    /// asks for them): see [`Rewrite::vectors`].
    pub(crate) fn with_vectors(mut self, on: bool) -> Rewrite {
        self.vectors = on;
        self
    }

    /// Whether a file's key statistics can hold a key of the plan (no statistics: yes).
    fn may_hold(&self, f: &LogicalFileView) -> bool {
        let Some(range) = self.range.as_ref().filter(|_| self.reload.is_none()) else {
            return true;
        };
        let Some((lo, hi)) = crate::delta::scan::file_bounds(f, &self.key0, &range.lo) else {
            return true;
        };
        // The first plan key at or above the file's minimum, if it is not above its maximum.
        let i = self.sorted_keys.partition_point(|k| k < &lo);
        self.sorted_keys.get(i).is_some_and(|k| k <= &hi)
    }

    /// Which rows of a file's batch stay, are replaced (here or in another partition) or
    /// deleted (see [`Picks`]); the plan rows matched and the rows updated and deleted add
    /// up in `out`.
    fn pick(&self, b: &RecordBatch, tseq: &StringArray, out: &mut FileResult) -> Result<Picks> {
        let seq = self.rows.column(self.seq_column).as_string::<i32>();
        let found = self.index.lookup(b)?;
        let file_partition = self.file_partition(b)?;
        let moves = |p: usize| match (&self.partitions, &file_partition) {
            (Some((_, plan, _)), Some(file)) => plan.row(p) != file.row(0),
            _ => false,
        };
        let mut k = Picks {
            picks: Vec::with_capacity(b.num_rows()),
            ..Picks::default()
        };
        for (i, p) in found.into_iter().enumerate() {
            let Some(p) = p else {
                let gone_row = self
                    .reload
                    .as_deref()
                    .is_some_and(|floor| tseq.is_null(i) || tseq.value(i) < floor);
                if gone_row {
                    out.deleted += 1;
                    k.changed = true;
                    k.gone.push(i as u32);
                } else {
                    k.picks.push((0, i));
                }
                continue;
            };
            out.matched.push(p);
            let p = p as usize;
            let newer = self.always || tseq.is_null(i) || seq.value(p) > tseq.value(i);
            match (newer, self.ops[p]) {
                (false, _) => k.picks.push((0, i)),
                (true, PlanOp::Upsert) => {
                    if moves(p) {
                        k.moved_updates.push((k.moved.len(), i, p));
                        k.moved.push((1, p));
                    } else {
                        k.updates.push((k.picks.len(), i, p));
                        k.picks.push((1, p));
                    }
                    out.updated += 1;
                    k.changed = true;
                }
                (true, PlanOp::Delete) => {
                    out.deleted += 1;
                    k.changed = true;
                    k.gone.push(i as u32);
                }
            }
        }
        Ok(k)
    }

    /// Apply the plan to a batch of a file's rows: the batch to write instead (`only_new`:
    /// only the new versions of its rows updated in place), whether it differs, and which
    /// rows changed (see [`Applied1`]); the plan rows matched, the rows
    /// updated and deleted, and the updated rows that leave for another partition add up
    /// in `out`.
    fn apply(&self, b: &RecordBatch, out: &mut FileResult, only_new: bool) -> Result<Applied1> {
        let tseq = b.column(self.seq_column).as_string::<i32>();
        let Picks {
            picks,
            updates,
            moved,
            moved_updates,
            gone,
            changed,
        } = self.pick(b, tseq, out)?;
        if !changed {
            return Ok(Applied1 {
                rows: b.clone(),
                changed: false,
                replaced: Vec::new(),
                versions: Vec::new(),
            });
        }
        let replaced: Vec<u32> = updates
            .iter()
            .chain(&moved_updates)
            .map(|u| u.1 as u32)
            .chain(gone.iter().copied())
            .collect();
        let moved = match moved.is_empty() {
            true => None,
            false => Some(self.merged(b, tseq, &moved, &moved_updates)?),
        };
        // Merge-on-read writes only the new versions: the batch built of them alone (the
        // rows kept stay in the file, and may have columns left unread, see `vector_pass`).
        let (picks, updates) = match only_new {
            true => (
                updates.iter().map(|u| (1, u.2)).collect(),
                updates
                    .iter()
                    .enumerate()
                    .map(|(at, u)| (at, u.1, u.2))
                    .collect(),
            ),
            false => (picks, updates),
        };
        let versions: Vec<u32> = updates.iter().map(|u| u.0 as u32).collect();
        let merged = self.merged(b, tseq, &picks, &updates)?;
        if self.feed {
            let pre: Vec<u32> = updates
                .iter()
                .chain(&moved_updates)
                .map(|u| u.1 as u32)
                .collect();
            let post: Vec<u32> = updates.iter().map(|u| u.0 as u32).collect();
            out.feed
                .record(b, &merged, moved.as_ref(), (pre, post, gone))?;
        }
        out.moved.extend(moved);
        Ok(Applied1 {
            rows: merged,
            changed: true,
            replaced,
            versions,
        })
    }

    /// The partition of a file's batch (the same for every row of it), when the table is
    /// partitioned.
    fn file_partition(&self, b: &RecordBatch) -> Result<Option<arrow::row::Rows>> {
        Ok(match &self.partitions {
            Some((converter, _, columns)) if b.num_rows() > 0 => {
                let cols: Vec<ArrayRef> =
                    columns.iter().map(|c| b.column(*c).slice(0, 1)).collect();
                Some(converter.convert_columns(&cols).map_err(Error::arrow)?)
            }
            _ => None,
        })
    }

    /// The rows `picks` chooses from the file's batch (0) and the plan (1); in the
    /// `updates` among them, a column the plan does not give (see [`Keep`]) keeps the
    /// file row's value.
    fn merged(
        &self,
        b: &RecordBatch,
        tseq: &StringArray,
        picks: &[(usize, usize)],
        updates: &[(usize, usize, usize)],
    ) -> Result<RecordBatch> {
        let columns = self
            .keep
            .iter()
            .enumerate()
            .map(|(c, keep)| {
                let sources = [b.column(c).as_ref(), self.rows.column(c).as_ref()];
                if matches!(keep, Keep::Never) {
                    return arrow::compute::interleave(&sources, picks).map_err(Error::arrow);
                }
                let mut own = picks.to_vec();
                for &(at, i, p) in updates {
                    if !keep.takes_plan(p, tseq, i) {
                        own[at] = (0, i);
                    }
                }
                arrow::compute::interleave(&sources, &own).map_err(Error::arrow)
            })
            .collect::<Result<Vec<_>>>()?;
        self.checked(RecordBatch::try_new(self.rows.schema(), columns).map_err(Error::arrow)?)
    }

    /// Rows about to be written (in `rows`' schema), checked against the table's
    /// constraints, in the table's schema.
    fn checked(&self, b: RecordBatch) -> Result<RecordBatch> {
        self.checks
            .verify(&self.label, &self.files, &self.key, &b)?;
        RecordBatch::try_new(self.schema.clone(), b.columns().to_vec()).map_err(Error::arrow)
    }

    /// Rewrite a group of files of one partition into one output (files near the target
    /// size), file by file: each is read batch by batch and the plan applied; a file's rows
    /// are held until its first change, then written as they come. A file with more than
    /// `held_bytes` of rows before its first change is read on without holding them; if a
    /// change comes after all, it is read again and written whole. A file that does not
    /// change is not written (and stays in the table).
    async fn rewrite_group(
        self: Arc<Self>,
        files: Group,
        table_files: Arc<crate::delta::datafile::TableFiles>,
        config: FileLayout,
        table: String,
    ) -> Result<GroupResult> {
        let mut out = GroupResult::default();
        let mut writer: Option<Writer> = None;
        // Unchanged small files read whole before the group had an output (`FOLD_FILE`),
        // held up to `held_bytes` of rows: folded in if a later file changes.
        let mut spare: Vec<(deltalake::kernel::Remove, Vec<RecordBatch>)> = Vec::new();
        let mut spare_bytes = 0usize;
        let written = async {
            for (f, partition) in &files {
                let (r, unchanged, vector) = self
                    .read_file(f, &table_files, &config, partition, &table, &mut writer)
                    .await?;
                out.matched.extend(r.matched);
                if r.changed {
                    out.updated += r.updated;
                    out.deleted += r.deleted;
                    out.feed.extend(r.feed);
                    out.moved.extend(r.moved);
                    match vector {
                        Some(deleted) => out.vectors.push((f.clone(), deleted)),
                        None => out.removes.push(f.remove_action(true)),
                    }
                } else if let Some((rows, bytes)) = unchanged.filter(|_| f.size() <= FOLD_FILE) {
                    if writer.is_some() || spare_bytes + bytes <= self.held_bytes {
                        spare_bytes += bytes;
                        spare.push((f.remove_action(true), rows));
                    }
                }
                if let Some(w) = writer.as_mut() {
                    for (remove, rows) in spare.drain(..) {
                        for b in &rows {
                            w.write(b).await.map_err(|e| Error::delta(&table, e))?;
                        }
                        out.removes.push(remove);
                        out.folded += 1;
                    }
                    spare_bytes = 0;
                }
            }
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = written {
            if let Some(w) = writer {
                let _ = w.abort().await;
            }
            return Err(e);
        }
        if let Some(w) = writer {
            out.adds = w.close().await.map_err(|e| Error::delta(&table, e))?;
        }
        Ok(out)
    }

    /// Read one file of a group and apply the plan: what changed, and the file's rows when
    /// it did not change and all of them were held (copy-on-write, for folding), or its new
    /// deletion vector (merge-on-read); rewritten rows go to the group's `writer`.
    async fn read_file(
        &self,
        f: &LogicalFileView,
        table_files: &crate::delta::datafile::TableFiles,
        config: &FileLayout,
        partition: &Partition,
        table: &str,
        writer: &mut Option<Writer>,
    ) -> Result<FileRead> {
        let mut r = FileResult::default();
        let mut unchanged = None;
        let mut vector = None;
        let mut whole = false;
        let w = |writer: &mut Option<Writer>| {
            let store = table_files.store.clone();
            writer
                .take()
                .unwrap_or_else(|| Writer::new(store, config.clone()))
        };
        if self.vectors {
            let m = self
                .vector_pass(f, table_files, partition, table, &mut r)
                .await?;
            match r.changed.then(|| m.vector()).flatten() {
                Some(deleted) => {
                    let mut out = w(writer);
                    for b in &m.versions {
                        out.write(b).await.map_err(|e| Error::delta(table, e))?;
                    }
                    *writer = Some(out);
                    vector = Some(deleted);
                }
                // Unchanged, or most of the file changes: rewritten, as without vectors.
                None => whole = r.changed,
            }
        } else {
            (whole, unchanged) = self
                .first_pass(f, table_files, config, partition, table, &mut r, writer)
                .await?;
        }
        if whole {
            r = FileResult::default();
            let mut out = w(writer);
            self.write_pass(f, table_files, partition, table, &mut r, &mut out)
                .await?;
            *writer = Some(out);
        }
        Ok((r, unchanged, vector))
    }

    /// The first read of a file (see [`Self::rewrite_group`]): true when it must be read
    /// again; and when it did not change and all its rows were held, those rows and their
    /// decoded size.
    #[allow(clippy::too_many_arguments)]
    async fn first_pass(
        &self,
        f: &LogicalFileView,
        table_files: &crate::delta::datafile::TableFiles,
        config: &FileLayout,
        partition: &Partition,
        table: &str,
        r: &mut FileResult,
        writer: &mut Option<Writer>,
    ) -> Result<(bool, Option<(Vec<RecordBatch>, usize)>)> {
        let delta_err = |e| Error::delta(table, e);
        let store = &table_files.store;
        let schema = self.schema.clone();
        let mut batches = table_files
            .stream(f, &schema, partition)
            .await
            .map_err(|e| e.into_error(table))?;
        let mut held: Vec<RecordBatch> = Vec::new();
        let mut held_bytes = 0usize;
        let mut holding = true;
        let mut writing = false;
        while let Some(b) = batches.next().await {
            let b = b.map_err(|e| e.into_error(table))?;
            let a = self.apply(&b, r, false)?;
            let b = a.rows;
            r.changed |= a.changed;
            if writing {
                let w = writer.get_or_insert_with(|| Writer::new(store.clone(), config.clone()));
                w.write(&b).await.map_err(delta_err)?;
            } else if r.changed && !holding {
                return Ok((true, None));
            } else if r.changed {
                let w = writer.get_or_insert_with(|| Writer::new(store.clone(), config.clone()));
                for b in held.drain(..).chain(std::iter::once(b)) {
                    w.write(&b).await.map_err(delta_err)?;
                }
                writing = true;
            } else if holding {
                held_bytes += b.get_array_memory_size();
                held.push(b);
                if held_bytes > self.held_bytes {
                    held.clear();
                    holding = false;
                }
            }
        }
        Ok((false, (holding && !r.changed).then_some((held, held_bytes))))
    }

    /// Apply the plan to a file under merge-on-read: the rows it replaces or deletes, the
    /// new versions of the rows it updates in place, and the file's vector and row count.
    /// Nothing is written. The file's key columns are read first, and then only the rows
    /// whose key the plan has (a spread-out merge changes a few rows of each file: decoding
    /// every column of every row was most of its time); a reload, which deletes rows no
    /// change matches, reads every row.
    async fn vector_pass(
        &self,
        f: &LogicalFileView,
        table_files: &crate::delta::datafile::TableFiles,
        partition: &Partition,
        table: &str,
        r: &mut FileResult,
    ) -> Result<Marked> {
        let read_err = |e: crate::delta::datafile::ReadError| e.into_error(table);
        let file = table_files.open(f).await.map_err(read_err)?;
        let mut marked = Marked {
            old: file.deleted.clone(),
            marked: roaring::RoaringTreemap::new(),
            versions: Vec::new(),
            rows: file.rows(),
        };
        if self.reload.is_some() {
            let mut batches = file.positioned(&self.schema, partition).map_err(read_err)?;
            while let Some(p) = batches.next().await {
                let p = p.map_err(read_err)?;
                let positions: Vec<u64> = (0..p.batch.num_rows()).map(|i| p.position(i)).collect();
                self.mark(&p.batch, &positions, r, &mut marked)?;
            }
            return Ok(marked);
        }
        let mut keys = file
            .positioned(&self.key_schema, partition)
            .map_err(read_err)?;
        let mut hits: Vec<u64> = Vec::new();
        while let Some(p) = keys.next().await {
            let p = p.map_err(read_err)?;
            for (i, found) in self.index.lookup(&p.batch)?.into_iter().enumerate() {
                if found.is_some() {
                    hits.push(p.position(i));
                }
            }
        }
        if hits.is_empty() {
            return Ok(marked);
        }
        let mut at = 0;
        for b in file
            .rows_at(&self.changed_rows_schema, &self.schema, partition, &hits)
            .await
            .map_err(read_err)?
        {
            let positions = &hits[at..at + b.num_rows()];
            at += b.num_rows();
            self.mark(&b, positions, r, &mut marked)?;
        }
        Ok(marked)
    }

    /// Apply the plan to rows of a file at `positions`, adding to `m` what it replaces and
    /// the new versions.
    fn mark(
        &self,
        b: &RecordBatch,
        positions: &[u64],
        r: &mut FileResult,
        m: &mut Marked,
    ) -> Result<()> {
        let a = self.apply(b, r, true)?;
        r.changed |= a.changed;
        m.marked
            .extend(a.replaced.iter().map(|i| positions[*i as usize]));
        if !a.versions.is_empty() {
            let idx = UInt32Array::from(a.versions);
            m.versions
                .push(arrow::compute::take_record_batch(&a.rows, &idx).map_err(Error::arrow)?);
        }
        Ok(())
    }

    /// Read a file again and write all of it, changed.
    async fn write_pass(
        &self,
        f: &LogicalFileView,
        table_files: &crate::delta::datafile::TableFiles,
        partition: &Partition,
        table: &str,
        r: &mut FileResult,
        w: &mut Writer,
    ) -> Result<()> {
        let schema = self.schema.clone();
        let mut batches = table_files
            .stream(f, &schema, partition)
            .await
            .map_err(|e| e.into_error(table))?;
        while let Some(b) = batches.next().await {
            let b = b.map_err(|e| e.into_error(table))?;
            let a = self.apply(&b, r, false)?;
            r.changed |= a.changed;
            w.write(&a.rows).await.map_err(|e| Error::delta(table, e))?;
        }
        Ok(())
    }

    /// The plan's upserts that matched no row of the table: the rows inserted.
    fn inserts(&self, matched: &HashSet<u32>) -> Result<Option<RecordBatch>> {
        let idx: UInt32Array = (0..self.rows.num_rows() as u32)
            .filter(|i| self.ops[*i as usize] == PlanOp::Upsert && !matched.contains(i))
            .collect();
        if idx.is_empty() {
            return Ok(None);
        }
        let rows = arrow::compute::take_record_batch(&self.rows, &idx).map_err(Error::arrow)?;
        self.checked(rows).map(Some)
    }

    /// Rewrite the files, write the inserts, commit (with the application transactions
    /// `extras.txns` and the merged `files` in the commit info). A lost commit race is
    /// returned as the commit conflict it is (the caller reloads and plans again).
    #[allow(
        clippy::too_many_lines,
        reason = "the rewrite is plan (`eligible`), execute (`run`) and metrics (`Applied`) already; each step is one piece on the merge's hot path, split only with the benchmark matrix rerun"
    )]
    pub(crate) async fn run(
        self,
        cfg: &TableConfig,
        table: DeltaTable,
        files: &[String],
        extras: &MergeExtras,
    ) -> Result<(DeltaTable, Applied)> {
        let label = cfg.name.as_str();
        let delta_err = |e| Error::delta(label, e);
        let snapshot = table.snapshot().map_err(delta_err)?;
        let table_files = Arc::new(crate::delta::datafile::TableFiles::of(&table));
        let store = table_files.store.clone();
        let partition_columns = snapshot.metadata().partition_columns().to_vec();
        let candidates: Vec<LogicalFileView> = snapshot
            .log_data()
            .iter()
            .filter(|f| self.may_hold(f))
            .collect();
        let mut this = self;
        this.files = files.join(", ");
        let this = Arc::new(this);
        let config =
            crate::delta::writer_config(snapshot, Some(crate::delta::writer_properties(cfg)), None);
        // Files are rewritten in groups of one partition (up to GROUP_BYTES of them), each
        // group by its own task into one output: the Parquet decoding and encoding are most
        // of the work, and a partition's rewritten rows land in few files, not one per file.
        let groups = group_by_partition(candidates, &partition_columns);
        let mut pending = groups.into_iter();
        let mut tasks = tokio::task::JoinSet::new();
        let spawn = |tasks: &mut tokio::task::JoinSet<Result<GroupResult>>, group: Group| {
            tasks.spawn(this.clone().rewrite_group(
                group,
                table_files.clone(),
                config.clone(),
                label.to_string(),
            ));
        };
        for g in pending.by_ref().take(PARALLEL_FILES) {
            spawn(&mut tasks, g);
        }
        let mut applied = Applied::default();
        let mut matched: HashSet<u32> = HashSet::new();
        let mut moved: Vec<RecordBatch> = Vec::new();
        let mut feed = Feed::default();
        let mut actions = Vec::new();
        let mut adds = Vec::new();
        let mut vectors = Vec::new();
        let mut failed = None;
        while let Some(done) = tasks.join_next().await {
            let r = match done {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    failed.get_or_insert(e);
                    continue;
                }
                Err(e) => {
                    failed.get_or_insert(Error::internal(format!(
                        "table {label}: rewrite task: {e}"
                    )));
                    continue;
                }
            };
            if failed.is_none() {
                if let Some(g) = pending.next() {
                    spawn(&mut tasks, g);
                }
            }
            matched.extend(r.matched);
            moved.extend(r.moved);
            feed.extend(r.feed);
            adds.extend(r.adds);
            vectors.extend(r.vectors);
            applied.updated += r.updated;
            applied.deleted += r.deleted;
            applied.files_removed += r.removes.len();
            applied.files_folded += r.folded;
            actions.extend(r.removes.into_iter().map(Action::Remove));
        }
        if let Some(e) = failed {
            // The tasks running when one failed have finished; what they wrote is never
            // committed.
            discard(&store, &adds).await;
            return Err(e);
        }
        // The inserts, and the updated rows that moved to another partition: written apart
        // from the files rewritten; the change data feed's rows into `_change_data`.
        let inserts = this.inserts(&matched)?;
        applied.inserted = inserts.as_ref().map_or(0, RecordBatch::num_rows);
        let feed = match this.feed {
            true => {
                let schema = feed_schema(&this.schema);
                let rows = feed.rows(inserts.as_ref(), &schema)?;
                Some((
                    rows,
                    crate::delta::writer_config_for(
                        snapshot,
                        schema,
                        Some(crate::delta::writer_properties(cfg)),
                        None,
                    ),
                ))
            }
            false => None,
        };
        let apart: Vec<RecordBatch> = inserts.into_iter().chain(moved).collect();
        let written = async {
            let mut out = Vec::new();
            if !apart.is_empty() {
                let mut writer = Writer::new(store.clone(), config);
                for b in &apart {
                    writer.write(b).await.map_err(delta_err)?;
                }
                out.extend(
                    writer
                        .close()
                        .await
                        .map_err(delta_err)?
                        .into_iter()
                        .map(Action::Add),
                );
            }
            if let Some((rows, config)) = feed.filter(|(rows, _)| !rows.is_empty()) {
                out.extend(write_feed(&store, config, &rows).await.map_err(delta_err)?);
            }
            Ok::<_, Error>(out)
        }
        .await;
        let written = match written {
            Ok(w) => w,
            Err(e) => {
                discard(&store, &adds).await;
                return Err(e);
            }
        };
        adds.extend(written.iter().filter_map(|a| match a {
            Action::Add(a) => Some(a.clone()),
            _ => None,
        }));
        let feed_files: Vec<Action> = written
            .into_iter()
            .filter(|a| matches!(a, Action::Cdc(_)))
            .collect();
        // The vectors last: a failure before the commit leaves at most one unreferenced
        // `deletion_vector_*.bin`, which VACUUM removes.
        applied.files_vectored = vectors.len();
        match crate::delta::vectors::write(&store, label, vectors).await {
            Ok(v) => actions.extend(v),
            Err(e) => {
                discard(&store, &adds).await;
                return Err(e);
            }
        }
        applied.files_added = adds.len();
        if actions.is_empty() && adds.is_empty() {
            // Every change was stale or deleted an absent key: nothing to commit (the
            // caller records full-load transactions on their own).
            return Ok((table, applied));
        }
        actions.extend(adds.into_iter().map(Action::Add));
        actions.extend(feed_files);
        let on = cfg
            .primary_key
            .iter()
            .map(|k| format!("t.{k} = s.{k}"))
            .collect::<Vec<_>>()
            .join(" AND ");
        // A reload or a key without a range read the whole table.
        let read = this.range.as_ref().filter(|_| this.reload.is_none());
        let operation = DeltaOperation::Merge {
            predicate: read.map(|r| r.predicate(&this.key0)),
            merge_predicate: Some(on),
            matched_predicates: vec![],
            not_matched_predicates: vec![],
            not_matched_by_source_predicates: vec![],
        };
        let read = match read {
            Some(range) => crate::delta::Read::Keys {
                column: this.key0.clone(),
                range: range.clone(),
            },
            None => crate::delta::Read::Table,
        };
        let table = crate::delta::commit_actions(
            &cfg.name,
            table,
            actions,
            operation,
            read,
            files,
            &extras.txns,
        )
        .await?;
        Ok((table, applied))
    }
}

/// `schema` with every field nullable.
fn relaxed(schema: &SchemaRef) -> SchemaRef {
    Arc::new(arrow::datatypes::Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ))
}

/// The schema of a table's change data feed files: its columns and `_change_type`.
fn feed_schema(table: &SchemaRef) -> SchemaRef {
    let mut fields: Vec<arrow::datatypes::FieldRef> = table.fields().iter().cloned().collect();
    fields.push(Arc::new(arrow::datatypes::Field::new(
        "_change_type",
        DataType::Utf8,
        false,
    )));
    Arc::new(arrow::datatypes::Schema::new(fields))
}

/// Write change data feed rows as the protocol's `_change_data` files (partitioned as the
/// table): the `cdc` actions that commit them. The writer lays them out under a store
/// rooted at `_change_data`, so the paths are prefixed back (as delta-rs's writer does).
async fn write_feed(
    store: &Arc<dyn deltalake::ObjectStore>,
    config: FileLayout,
    rows: &[RecordBatch],
) -> deltalake::DeltaResult<Vec<Action>> {
    let feed_store: Arc<dyn deltalake::ObjectStore> = Arc::new(
        object_store::prefix::PrefixStore::new(store.clone(), "_change_data"),
    );
    let mut writer = Writer::new(feed_store, config);
    for b in rows {
        writer.write(b).await?;
    }
    Ok(writer
        .close()
        .await?
        .into_iter()
        .map(|add| {
            Action::Cdc(deltalake::kernel::AddCDCFile {
                path: format!("_change_data/{}", add.path),
                size: add.size,
                partition_values: add.partition_values,
                data_change: false,
                tags: add.tags,
            })
        })
        .collect())
}

/// Delete data files written but never committed (best effort: VACUUM removes what is left).
async fn discard(store: &Arc<dyn deltalake::ObjectStore>, adds: &[deltalake::kernel::Add]) {
    for add in adds {
        // `add.path` is the object key as written (partition values already encoded).
        let deleted = match object_store::path::Path::parse(&add.path) {
            Ok(path) => store.delete(&path).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = deleted {
            tracing::warn!(file = %add.path, error = %e, "uncommitted data file not deleted; VACUUM will");
        }
    }
}

/// The plan's keys → plan row: a single integer key hashed as an integer, any other key
/// through Arrow's row encoding.
enum KeyIndex {
    Int {
        column: String,
        map: HashMap<i64, u32, foldhash::fast::RandomState>,
    },
    Rows {
        encoder: KeyEncoder,
        map: HashMap<Vec<u8>, u32, foldhash::fast::RandomState>,
    },
}

fn is_int(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64
    )
}

impl KeyIndex {
    fn new(rows: &RecordBatch, key: &[String]) -> Result<KeyIndex> {
        let twice = || Error::internal("the merge plan has a key twice");
        let n = rows.num_rows();
        if let [k] = key {
            if let Some(c) = rows.column_by_name(k).filter(|c| is_int(c.data_type())) {
                let mut map = HashMap::with_capacity_and_hasher(n, Default::default());
                for (i, v) in ints(c)?.iter().enumerate() {
                    if let Some(v) = v {
                        if map.insert(v, i as u32).is_some() {
                            return Err(twice());
                        }
                    }
                }
                return Ok(KeyIndex::Int {
                    column: k.clone(),
                    map,
                });
            }
        }
        let encoder = KeyEncoder::new(&rows.schema(), key)?;
        let mut map = HashMap::with_capacity_and_hasher(n, Default::default());
        for (i, r) in encoder.rows(rows)?.iter().enumerate() {
            if map.insert(r.as_ref().to_vec(), i as u32).is_some() {
                return Err(twice());
            }
        }
        Ok(KeyIndex::Rows { encoder, map })
    }

    /// The plan row of each row of `b` (same key columns and types as the plan).
    fn lookup(&self, b: &RecordBatch) -> Result<Vec<Option<u32>>> {
        match self {
            KeyIndex::Int { column, map } => {
                let c = b
                    .column_by_name(column)
                    .ok_or_else(|| Error::internal(format!("key column {column} missing")))?;
                Ok(ints(c)?
                    .iter()
                    .map(|v| v.and_then(|v| map.get(&v).copied()))
                    .collect())
            }
            KeyIndex::Rows { encoder, map } => Ok(encoder
                .rows(b)?
                .iter()
                .map(|k| map.get(k.as_ref()).copied())
                .collect()),
        }
    }
}

/// An integer column as 64-bit integers.
fn ints(c: &ArrayRef) -> Result<arrow::array::Int64Array> {
    use arrow::datatypes::Int64Type;
    let a = arrow::compute::cast(c, &DataType::Int64).map_err(Error::arrow)?;
    Ok(a.as_primitive::<Int64Type>().clone())
}

/// The partition columns' positions, a row encoder for them, and the plan's rows encoded
/// (none for an unpartitioned table).
fn partition_index(
    rows: &RecordBatch,
    partition_columns: &[String],
) -> Result<Option<(arrow::row::RowConverter, arrow::row::Rows, Vec<usize>)>> {
    use arrow::row::{RowConverter, SortField};
    if partition_columns.is_empty() {
        return Ok(None);
    }
    let schema = rows.schema();
    let columns = partition_columns
        .iter()
        .map(|c| schema.index_of(c).map_err(Error::arrow))
        .collect::<Result<Vec<usize>>>()?;
    let converter = RowConverter::new(
        columns
            .iter()
            .map(|c| SortField::new(schema.field(*c).data_type().clone()))
            .collect(),
    )
    .map_err(Error::arrow)?;
    let arrays: Vec<ArrayRef> = columns.iter().map(|c| rows.column(*c).clone()).collect();
    let encoded = converter.convert_columns(&arrays).map_err(Error::arrow)?;
    Ok(Some((converter, encoded, columns)))
}

/// A data file read by [`Rewrite::vector_pass`].
struct Marked {
    /// The rows its deletion vector deleted before.
    old: crate::delta::datafile::Deleted,
    /// The rows the plan replaces or deletes.
    marked: roaring::RoaringTreemap,
    /// The new versions of the rows it updates in place (in the table's schema).
    versions: Vec<RecordBatch>,
    /// The file's rows (deleted ones included).
    rows: u64,
}

impl Marked {
    /// The file's new vector (the old vector's rows and the plan's), when the file keeps its
    /// rows under one rather than being rewritten: while at most [`VECTOR_SHARE`] of its rows
    /// are deleted. Past that, rewriting it writes fewer bytes than the rows it keeps would
    /// cost every reader to skip.
    fn vector(&self) -> Option<roaring::RoaringTreemap> {
        let all = match &self.old {
            Some(old) => &self.marked | old.as_ref(),
            None => self.marked.clone(),
        };
        ((all.len() as f64) <= VECTOR_SHARE * self.rows as f64).then_some(all)
    }
}

/// The share of a data file's rows a deletion vector may delete before a merge rewrites the
/// file instead (see [`Marked::vector`]).
const VECTOR_SHARE: f64 = 0.5;

/// A file read by [`Rewrite::read_file`]: what changed; its rows, when unchanged and all
/// held; its new deletion vector.
type FileRead = (
    FileResult,
    Option<(Vec<RecordBatch>, usize)>,
    Option<roaring::RoaringTreemap>,
);

/// What the plan does to a batch of a file's rows ([`Rewrite::pick`]).
#[derive(Default)]
struct Picks {
    /// Per row written in the file's place: (0, file row) keeps it, (1, plan row) replaces
    /// it.
    picks: Vec<(usize, usize)>,
    /// The updates among `picks`: (position in `picks`, file row, plan row).
    updates: Vec<(usize, usize, usize)>,
    /// The rows that move to another partition (as `picks`), and their updates.
    moved: Vec<(usize, usize)>,
    moved_updates: Vec<(usize, usize, usize)>,
    /// The file rows deleted.
    gone: Vec<u32>,
    changed: bool,
}

/// A batch of a file's rows with the plan applied.
struct Applied1 {
    /// The batch to write instead (copy-on-write).
    rows: RecordBatch,
    /// Whether it differs from the batch read.
    changed: bool,
    /// The rows of the batch read that the plan replaced (updated here or into another
    /// partition) or deleted: what a deletion vector marks.
    replaced: Vec<u32>,
    /// The rows of `rows` that are new versions of rows of this partition: with a deletion
    /// vector, the only rows written.
    versions: Vec<u32>,
}

/// One file's outcome (within its group).
#[derive(Default)]
struct FileResult {
    changed: bool,
    /// Rows of this file updated into another partition, as they are written there.
    moved: Vec<RecordBatch>,
    matched: Vec<u32>,
    updated: usize,
    deleted: usize,
    feed: Feed,
}

/// A merge's rows for the change data feed (tables with `delta.enableChangeDataFeed`), by
/// change type; the inserts are the plan's (`Rewrite::inserts`).
#[derive(Default)]
struct Feed {
    preimages: Vec<RecordBatch>,
    postimages: Vec<RecordBatch>,
    deletes: Vec<RecordBatch>,
}

impl Feed {
    /// A file batch's images: `pre` (its rows updated) and `gone` (deleted) from the file's
    /// batch `b`, `post` from what replaces it (`merged`), and the rows `moved` to another
    /// partition, as written there.
    fn record(
        &mut self,
        b: &RecordBatch,
        merged: &RecordBatch,
        moved: Option<&RecordBatch>,
        (pre, post, gone): (Vec<u32>, Vec<u32>, Vec<u32>),
    ) -> Result<()> {
        let take = |from: &RecordBatch, idx: Vec<u32>| {
            arrow::compute::take_record_batch(from, &UInt32Array::from(idx)).map_err(Error::arrow)
        };
        self.preimages.push(take(b, pre)?);
        self.deletes.push(take(b, gone)?);
        self.postimages.push(take(merged, post)?);
        self.postimages.extend(moved.cloned());
        Ok(())
    }
}

impl Feed {
    fn extend(&mut self, other: Feed) {
        self.preimages.extend(other.preimages);
        self.postimages.extend(other.postimages);
        self.deletes.extend(other.deletes);
    }

    /// The feed's rows with their `_change_type`, the inserts' too, in `schema` (the
    /// table's and `_change_type`).
    fn rows(self, inserts: Option<&RecordBatch>, schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
        let typed = |b: &RecordBatch, kind: &str| -> Result<Option<RecordBatch>> {
            if b.num_rows() == 0 {
                return Ok(None);
            }
            let mut columns = b.columns().to_vec();
            columns.push(Arc::new(StringArray::from(vec![kind; b.num_rows()])));
            RecordBatch::try_new(schema.clone(), columns)
                .map(Some)
                .map_err(Error::arrow)
        };
        let mut out = Vec::new();
        for (batches, kind) in [
            (self.preimages, "update_preimage"),
            (self.postimages, "update_postimage"),
            (self.deletes, "delete"),
            (inserts.into_iter().cloned().collect(), "insert"),
        ] {
            for b in &batches {
                out.extend(typed(b, kind)?);
            }
        }
        Ok(out)
    }
}

/// Unchanged files up to this size that a group reads (their key statistics could hold a
/// key of the plan) are written into the group's output when it has one, and removed: each
/// merge adds a file per partition for its inserts and moved rows, whose keys can be
/// scattered (statistics prune none of them), so without this every later merge of a key in
/// their range reads all of them until the next maintenance run, one more each time
/// (`small_files_a_rewrite_reads_are_folded_into_its_output`: 15 live files after 12 merges,
/// at most 5 with it). Folding costs writing rows the merge has already read; Hudi's
/// copy-on-write tables route inserts into small files for the same reason. The rows are
/// the same; only the layout changes.
const FOLD_FILE: i64 = 4 * 1024 * 1024;

/// A group's outcome: the files it rewrote (their removes), the files it wrote instead.
#[derive(Default)]
struct GroupResult {
    /// Of `removes`, the unchanged small files folded into the output.
    folded: usize,
    removes: Vec<deltalake::kernel::Remove>,
    adds: Vec<deltalake::kernel::Add>,
    /// The files kept under a deletion vector, with the rows it deletes.
    vectors: Vec<(LogicalFileView, roaring::RoaringTreemap)>,
    moved: Vec<RecordBatch>,
    matched: Vec<u32>,
    updated: usize,
    deleted: usize,
    feed: Feed,
}

/// Decoded-size proxy for grouping: files of one partition are rewritten together up to
/// this many bytes of Parquet (one output near delta-rs's target file size, or smaller).
const GROUP_BYTES: i64 = 32 * 1024 * 1024;

/// Files of one partition rewritten together.
type Group = Vec<(LogicalFileView, Partition)>;

/// The candidate files in groups: one partition per group, at most [`GROUP_BYTES`] of files
/// per group (a larger file alone), in log order.
fn group_by_partition(files: Vec<LogicalFileView>, partition_columns: &[String]) -> Vec<Group> {
    let mut groups: Vec<(i64, Group)> = Vec::new();
    let mut open: HashMap<Partition, usize> = HashMap::new();
    for f in files {
        let partition = Partition::of(&f, partition_columns);
        let size = f.size().max(0);
        match open.get(&partition).copied() {
            Some(i) if groups[i].0 + size <= GROUP_BYTES => {
                groups[i].0 += size;
                groups[i].1.push((f, partition));
            }
            _ => {
                open.insert(partition.clone(), groups.len());
                groups.push((size, vec![(f, partition)]));
            }
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// The values of an integer or string key column as bounds (nulls left out).
fn key_bounds(keys: &ArrayRef) -> Result<Vec<KeyBound>> {
    Ok(match keys.data_type() {
        DataType::Utf8 => keys
            .as_string::<i32>()
            .iter()
            .flatten()
            .map(|s| KeyBound::Text(s.to_string()))
            .collect(),
        _ => ints(keys)?.iter().flatten().map(KeyBound::Int).collect(),
    })
}
