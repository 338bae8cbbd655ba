//! History tables (SCD type 2): one row per version of a source row, with the interval during
//! which it was current, fed from the same files in the same invocation as the current table.
//!
//! For each key, the history is the sequence of its changes in order-key order, folded into
//! versions (`fold`): a change that alters a tracked column (or follows a delete) opens a
//! version; one that alters only untracked columns updates the version in place; a delete
//! closes it. Version i is current from its first change's sequence value until the next
//! version's (or the delete's); the last one is open.
//!
//! Per call, for each key of the batch:
//! - **in order** (every change newer than the key's newest known change — the usual case):
//!   the batch's changes are folded onto the key's open version;
//! - **late** (a change at or before the newest known one: a late file, or a re-delivery):
//!   the key's versions are recomputed from the change log (`log`) and the batch, and
//!   versions that no longer exist are removed.
//!
//! The batch's changes not in the log yet are appended to it before the MERGE (a
//! re-delivered file's are: it logs nothing). Either way one MERGE (on key and the version's
//! first order key) writes the versions that changed (none for a re-delivery: no commit):
//! the result is a function of the set of changes, whatever their order or grouping into
//! calls. The interval columns are typed by the sequence kind (recorded on the history
//! table), not by the first file; a version opened without a sequence value (a full-load
//! row) starts at the kind's floor (`interval::floor`).

mod fold;
mod interval;
mod log;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{
    make_comparator, Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray, UInt32Array,
};
use arrow::compute::{concat_batches, take, SortOptions};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::OwnedRow;
use deltalake::DeltaTable;

use crate::config::{HistoryConfig, HistoryDeletes, TableConfig};
use crate::delta;
use crate::delta::pipeline::{Before, Committed};
use crate::delta::retry::Retry;
use crate::error::{Error, Result};
use crate::plan::{KeyEncoder, PlanOp};
pub use crate::report::HistoryReport;
use crate::source::{ChangeOp, ChangeSet, SeqKind};
use crate::storage::Storage;
use fold::{Fold, Step, Version};

pub use crate::model::{END_SEQ_COLUMN, LAST_SEQ_COLUMN};
/// What the MERGE does with a version row (`U`: write it, `D`: remove it).
const OP: &str = "_tributary_op";

/// A batch as the history sees it: the admitted change sets, the sequence kinds the batch
/// establishes (the first gives the intervals' type; `None` when no file tells, such as a
/// full load without sequence values), and the files (for the commit).
pub(crate) struct Changes<'a> {
    pub(crate) sets: &'a [ChangeSet],
    pub(crate) kinds: Option<&'a [SeqKind]>,
    pub(crate) files: &'a [String],
    /// For a table that keeps only its history: what its commit records.
    pub(crate) record: Option<Record>,
}

/// What the history table of a table without a current table records, as the current
/// table would: its full-load files (application transactions in the commit that applies
/// them; reload detection reads them). Every history table records the sequence kinds
/// (`Changes::kinds`, once, on a table that has none).
pub(crate) struct Record {
    pub(crate) txns: Vec<deltalake::kernel::Transaction>,
}

/// Apply a batch of admitted change sets to the table's history (one commit), then its
/// manifests.
pub(crate) async fn apply(
    cfg: &TableConfig,
    h: &HistoryConfig,
    storage: &Storage,
    options: &HashMap<String, String>,
    catalog: &crate::delta::catalog::Catalog,
    changes: &Changes<'_>,
) -> Result<HistoryReport> {
    let columns = data_columns(changes.sets);
    check_names(cfg, h, &columns)?;
    // Appended by the first attempt, before its MERGE, less the changes already logged.
    let unlogged = Some(log::rows(changes.sets, &columns)?);
    let label = cfg.label(crate::config::Managed::History);
    let mut attempts = Attempts {
        ctx: Attempt {
            cfg,
            h,
            storage,
            options,
            catalog,
            changes,
            columns: &columns,
        },
        log_table: delta::open(&h.changes, options).await?,
        unlogged,
    };
    let ((mut r, w), n) = Retry::new(&label, cfg.limits.max_commit_attempts)
        .drive("history merge", &mut attempts)
        .await?;
    r.commit_attempts = n;
    let p = crate::delta::pipeline::publish(
        storage,
        catalog,
        cfg,
        crate::delta::pipeline::Output::History,
        &w,
    )
    .await;
    r.manifests_caught_up = p.caught_up;
    r.manifest_error = p.manifest_error;
    r.watermark = p.watermark;
    r.watermark_error = p.watermark_error;
    crate::delta::pipeline::absorb(&mut r.catalog, p.catalog);
    Ok(r)
}

/// A history call's attempts: each reads the change log again after the first.
struct Attempts<'a> {
    ctx: Attempt<'a>,
    log_table: DeltaTable,
    unlogged: Option<RecordBatch>,
}

impl crate::delta::retry::Attempts for Attempts<'_> {
    type Out = (HistoryReport, Committed);

    async fn attempt(&mut self, n: u32) -> Result<Self::Out> {
        if n > 1 {
            self.log_table = delta::open(&self.ctx.h.changes, self.ctx.options).await?;
        }
        self.ctx
            .run(&mut self.log_table, &mut self.unlogged, n > 1)
            .await
    }
}

/// The batch's columns (every file's, first-seen order; admission gave them one type).
fn data_columns(changes: &[ChangeSet]) -> Vec<Field> {
    let mut out: Vec<Field> = Vec::new();
    for cs in changes {
        for f in cs.data.schema().fields() {
            if !out.iter().any(|x| x.name() == f.name()) {
                out.push(f.as_ref().clone().with_nullable(true));
            }
        }
    }
    out
}

/// The history's own columns, in table order after the data columns. Without a kind (no
/// file has told it yet) no interval columns: they are added, typed, by the first commit
/// that knows the kind.
fn own_columns(cfg: &TableConfig, h: &HistoryConfig, kind: Option<SeqKind>) -> Vec<Field> {
    let mut f = Vec::new();
    if let Some(kind) = kind {
        let interval = interval::interval_type(kind);
        f.push(Field::new(&h.start_column, interval.clone(), true));
        f.push(Field::new(&h.end_column, interval, true));
    }
    if let Some(c) = &h.current_column {
        f.push(Field::new(c, DataType::Boolean, true));
    }
    if let HistoryDeletes::Flag(c) = &h.deletes {
        f.push(Field::new(c, DataType::Boolean, true));
    }
    for n in [
        cfg.writing.sequence_column.as_str(),
        LAST_SEQ_COLUMN,
        END_SEQ_COLUMN,
    ] {
        f.push(Field::new(n, DataType::Utf8, true));
    }
    f
}

fn check_names(cfg: &TableConfig, h: &HistoryConfig, columns: &[Field]) -> Result<()> {
    let own = own_columns(cfg, h, Some(SeqKind::Text));
    match columns.iter().find(|c| own.iter().any(|o| o.name() == c.name())) {
        Some(c) => Err(Error::Schema {
            table: cfg.name.clone(),
            message: format!(
                "the files have a column `{}`, which the history table uses for its intervals; rename it in [table.history]",
                c.name()
            ),
        }),
        None => Ok(()),
    }
}

/// What one attempt works with.
struct Attempt<'a> {
    cfg: &'a TableConfig,
    h: &'a HistoryConfig,
    storage: &'a Storage,
    options: &'a HashMap<String, String>,
    catalog: &'a crate::delta::catalog::Catalog,
    changes: &'a Changes<'a>,
    columns: &'a [Field],
}

/// The history table an attempt writes, opened (or created) and checked.
struct Opened {
    table: DeltaTable,
    /// The catalog entries of a table this attempt created.
    created: Option<crate::delta::catalog::CatalogReport>,
    before: Before,
    /// The batch's sequence kind, as the intervals take it.
    batch_kind: Option<SeqKind>,
}

/// The history table made ready for the batch's versions.
struct Ready {
    table: DeltaTable,
    /// The intervals' kind (`None`: not known yet).
    kind: Option<SeqKind>,
    /// The table's sequence kinds are not recorded yet (settled at the commit).
    unsettled: bool,
    /// The table has its interval columns.
    has_intervals: bool,
    widened: crate::delta::widen::Widened,
}

impl Attempt<'_> {
    /// Read the keys' versions (and, for late keys, their logged changes), log the batch's
    /// changes not logged yet (`unlogged`, once), fold, MERGE — in stages: the table opened
    /// ([`Attempt::open`]), made ready ([`Attempt::ready`]), the versions folded
    /// ([`Attempt::fold`]), the watermark a table that keeps the state carries
    /// ([`Attempt::carried`]), the commit ([`Attempt::commit`]).
    async fn run(
        &self,
        log_table: &mut DeltaTable,
        unlogged: &mut Option<RecordBatch>,
        retried: bool,
    ) -> Result<(HistoryReport, Committed)> {
        let label = self.cfg.label(crate::config::Managed::History);
        let opened = self.open(retried).await?;
        let ready = self.ready(&label, opened.table, opened.batch_kind).await?;
        let (out, late) = self.fold(&label, &ready, log_table, unlogged).await?;
        let mut report = HistoryReport {
            version: ready.table.version(),
            versions_written: out.written,
            versions_removed: out.removed,
            late_keys: late,
            widened: ready
                .widened
                .columns
                .iter()
                .map(ToString::to_string)
                .collect(),
            ..Default::default()
        };
        crate::delta::pipeline::absorb(&mut report.catalog, opened.created);
        let (txns, carried) = self.carried(&ready.table).await;
        let table = self.commit(ready, &out.batch, &txns).await?;
        report.version = table.version();
        let committed = Committed {
            watermark: carried,
            ..Committed::since(opened.before, table)
        };
        Ok((report, committed))
    }

    /// The history table opened, or created with the batch's columns and the properties a
    /// new table records; on a retry of a table that records the files, the batch's files
    /// screened again (another writer may have applied one since).
    async fn open(&self, retried: bool) -> Result<Opened> {
        let (cfg, h) = (self.cfg, self.h);
        let batch_kind = if cfg.sequence_by.is_empty() {
            // No sequence values: the intervals stay empty, in the type they always had.
            Some(SeqKind::Timestamp)
        } else {
            self.changes.kinds.and_then(|k| k.first().copied())
        };
        let mut schema_fields = self.columns.to_vec();
        schema_fields.extend(own_columns(cfg, h, batch_kind));
        let record = self.changes.record.as_ref();
        // A new history table records the batch's sequence kinds when they are known.
        let known = self
            .changes
            .kinds
            .filter(|k| !k.is_empty() && k.len() == cfg.sequence_by.len());
        let props = match (record, known) {
            (Some(_), _) => {
                let kinds: Vec<Option<SeqKind>> = match known {
                    Some(k) => k.iter().copied().map(Some).collect(),
                    None => vec![None; cfg.sequence_by.len()],
                };
                let mut p = crate::props::TableProps::for_new_table(&kinds);
                // The state table: it records the CDC files applied (`applied`).
                p.extend(crate::delta::applied::new_table_properties(cfg));
                p
            }
            (None, Some(k)) => crate::props::TableProps::for_kinds(k),
            (None, None) => Default::default(),
        };
        let (table, created) = delta::open_or_create(
            &h.target,
            self.options,
            &cfg.label(crate::config::Managed::History),
            &Schema::new(schema_fields),
            &h.partition_by,
            props,
        )
        .await?;
        let created = match created {
            true => self.catalog.created(cfg, true, &table).await,
            false => None,
        };
        if retried && record.is_some() {
            // The table that records the files: another version of one may have been
            // applied since it was screened (a concurrent writer; see `applied`).
            for cs in self.changes.sets {
                crate::delta::applied::check(cfg, &table, &crate::delta::applied::Identity::of(cs))
                    .await?;
            }
        }
        let before = Before::of(cfg, &table)?;
        Ok(Opened {
            table,
            created,
            before,
            batch_kind,
        })
    }

    /// The table made ready: the intervals' kind settled, the batch's kinds checked against
    /// the table's, a column the batch widens widened (its own commit; a conflict retries the
    /// attempt).
    async fn ready(
        &self,
        label: &str,
        table: DeltaTable,
        batch_kind: Option<SeqKind>,
    ) -> Result<Ready> {
        let (cfg, h) = (self.cfg, self.h);
        let kind = history_kind(cfg, h, &table, batch_kind)?;
        // Starts left null (a full load without sequence values, before the kind was known
        // or before this rule) get the kind's floor once, when the kinds are recorded.
        let unsettled = kind.is_some()
            && !cfg.sequence_by.is_empty()
            && delta::props(&table).sequence_kinds.is_none();
        let has_intervals = has_column(&table, &h.start_column);
        let mut table = table;
        if unsettled && has_intervals {
            table = settle_kinds(cfg, h, table, kind, self.changes.kinds).await?;
        }
        crate::plan::recheck_kinds(
            self.changes.sets,
            delta::props(&table).sequence_kinds.as_deref(),
        )?;
        let (table, widened) = crate::delta::widen::widen(
            cfg,
            label,
            table,
            &Schema::new(self.columns.to_vec()),
            delta::writer_properties(cfg),
            self.changes.files,
        )
        .await?;
        Ok(Ready {
            table,
            kind,
            unsettled,
            has_intervals,
            widened,
        })
    }

    /// The keys' versions folded with the batch's changes (and, for late keys, their logged
    /// changes); the batch's changes not logged yet appended to the change log first (a
    /// committed version's changes are always in the log). With the number of late keys.
    async fn fold(
        &self,
        label: &str,
        ready: &Ready,
        log_table: &mut DeltaTable,
        unlogged: &mut Option<RecordBatch>,
    ) -> Result<(FoldOutput, usize)> {
        let (cfg, h) = (self.cfg, self.h);
        let data = history_data_columns(cfg, h, &ready.table, self.columns)?;
        let keys = key_batch(cfg, self.changes.sets, &data)?;
        let existing =
            crate::delta::scan::rows_with_keys(&ready.table, label, &cfg.primary_key, &keys)
                .await?;
        let mut work = Work::new(cfg, h, ready.kind, &data)?;
        work.add_versions(&existing)?;
        work.add_changes(self.changes.sets)?;
        let late = work.late_keys();
        let mut logged_seqs = HashSet::new();
        if !late.is_empty() {
            let late_keys = work.keys_batch(&late)?;
            let logged =
                crate::delta::scan::rows_with_keys(log_table, label, &cfg.primary_key, &late_keys)
                    .await?;
            logged_seqs = work.add_log(&logged, &late)?;
        }
        if let Some(rows) = unlogged.as_ref() {
            let fresh = work.not_logged(rows, &logged_seqs)?;
            if fresh.num_rows() > 0 {
                *log_table = log::append(cfg, h, self.options, fresh, self.changes.files).await?;
            }
            *unlogged = None;
        }
        Ok((work.fold()?, late.len()))
    }

    /// The transactions the commit records (the files a table that keeps the state
    /// applies) and, for such a table, the watermark the commit moves (one commit per merge,
    /// as the current table's).
    async fn carried(
        &self,
        table: &DeltaTable,
    ) -> (
        Vec<deltalake::kernel::Transaction>,
        Option<(
            crate::delta::watermark::Progress,
            crate::delta::watermark::Stored,
        )>,
    ) {
        let Some(record) = self.changes.record.as_ref() else {
            return (Vec::new(), None);
        };
        let mut txns = record.txns.clone();
        let now = chrono::Utc::now();
        let progress =
            crate::delta::watermark::progress_with(self.storage, self.cfg, table, now, &txns);
        match Box::pin(progress).await {
            Ok((p, Some(next))) if p.advanced => {
                txns.push(next.txn());
                (txns, Some((p, next)))
            }
            Ok(_) => (txns, None),
            Err(e) => {
                tracing::warn!(table = %self.cfg.name, error = %e, "watermark not computed before the commit; computing it after");
                (txns, None)
            }
        }
    }

    /// The versions' MERGE (none when nothing changed), the files' records, and the
    /// sequence kinds recorded (settled, when the MERGE added the interval columns).
    async fn commit(
        &self,
        ready: Ready,
        versions: &RecordBatch,
        txns: &[deltalake::kernel::Transaction],
    ) -> Result<DeltaTable> {
        let (cfg, h, kinds) = (self.cfg, self.h, self.changes.kinds);
        let Ready {
            table,
            kind,
            unsettled,
            has_intervals,
            ..
        } = ready;
        let read_version = table.version();
        if versions.num_rows() == 0 {
            let mut table =
                crate::delta::applied::record_unrecorded(table, txns, read_version).await?;
            if !unsettled {
                table = crate::delta::record_kinds(table, kinds).await?;
            }
            return Ok(table);
        }
        #[cfg(test)]
        crate::delta::testing::global()
            .reach(
                crate::delta::testing::Point::BeforeMerge,
                h.target.as_str(),
                vec![],
            )
            .await;
        let table = merge_versions(cfg, table, versions, self.changes.files, txns).await?;
        let mut table = crate::delta::applied::record_unrecorded(table, txns, read_version).await?;
        if unsettled && !has_intervals {
            // The MERGE added the interval columns: the versions written before have none.
            table = settle_kinds(cfg, h, table, kind, kinds).await?;
        } else if !unsettled {
            table = crate::delta::record_kinds(table, kinds).await?;
        }
        Ok(table)
    }
}

/// The kind of the history's intervals: the one recorded on the history table, else the
/// batch's, checked against the type an existing start column has (`None`: no file has
/// told it yet, e.g. a full load without sequence values; the intervals wait for it). A
/// start column of another type (typed from the first file by tributary before 2026-12, a
/// full load without sequence values typed it `timestamp`) cannot be retyped in place.
fn history_kind(
    cfg: &TableConfig,
    h: &HistoryConfig,
    table: &DeltaTable,
    batch: Option<SeqKind>,
) -> Result<Option<SeqKind>> {
    let recorded = delta::props(table)
        .sequence_kinds
        .and_then(|k| k.first().copied());
    let want = if cfg.sequence_by.is_empty() {
        batch
    } else {
        recorded.or(batch)
    };
    let typed = delta::arrow_schema(table)
        .and_then(|s| s.field_with_name(&h.start_column).ok().cloned())
        .map(|f| (interval::kind_of_type(f.data_type()), f.data_type().clone()));
    match (typed, want) {
        (Some((Some(t), _)), Some(w)) if t == w => Ok(Some(t)),
        (Some((Some(t), _)), None) => Ok(Some(t)),
        (None, w) => Ok(w),
        (Some((_, ty)), w) => Err(Error::Schema {
            table: cfg.name.clone(),
            message: format!(
                "the history table's `{}` column is of type {ty}, but the table orders changes by {} values (`sequence_by`); it was typed by a file without sequence values (a full load) before tributary derived it from the sequence kind. Recreate the history table: delete its folder ({}, with its change log) and replay the table's DMS files (`tributary merge` of the source prefix)",
                h.start_column,
                w.map(SeqKind::as_str).unwrap_or("unknown"),
                crate::storage::display(&h.target),
            ),
        }),
    }
}

fn has_column(table: &DeltaTable, name: &str) -> bool {
    delta::arrow_schema(table).is_some_and(|s| s.field_with_name(name).is_ok())
}

/// A history table without recorded sequence kinds, once its kind is known and its interval
/// columns exist: versions whose start is null (opened by a full load without sequence
/// values) get the kind's floor (and, when closed with a null end, end there), then the
/// kinds are recorded. Idempotent: a crash in between redoes it on the next call.
async fn settle_kinds(
    cfg: &TableConfig,
    h: &HistoryConfig,
    table: DeltaTable,
    kind: Option<SeqKind>,
    kinds: Option<&[SeqKind]>,
) -> Result<DeltaTable> {
    let Some(kind) = kind else {
        return Ok(table);
    };
    let label = cfg.label(crate::config::Managed::History);
    let floor = interval::to_typed(kind, &[Some(interval::floor(kind))])?;
    // Versions opened without a start get the floor; those of them closed by a delete with
    // a null end end there too.
    let (start, end) = (h.start_column.clone(), h.end_column.clone());
    let floor_at = |b: RecordBatch| -> Result<(RecordBatch, usize)> {
        let schema = b.schema();
        let s = schema.index_of(&start).map_err(Error::arrow)?;
        let e = schema.index_of(&end).map_err(Error::arrow)?;
        let end_seq = b
            .column_by_name(END_SEQ_COLUMN)
            .ok_or_else(|| Error::internal(format!("{label}: no {END_SEQ_COLUMN}")))?;
        let starts = b.column(s);
        let n = starts.null_count();
        if n == 0 {
            return Ok((b, 0));
        }
        let floor = floor.slice(0, 1);
        let floor = arrow::compute::cast(&floor, starts.data_type()).map_err(Error::arrow)?;
        let picks = |take: &dyn Fn(usize) -> bool, col: &ArrayRef| -> Result<ArrayRef> {
            let idx: Vec<(usize, usize)> = (0..b.num_rows())
                .map(|i| if take(i) { (1, 0) } else { (0, i) })
                .collect();
            arrow::compute::interleave(&[col.as_ref(), floor.as_ref()], &idx).map_err(Error::arrow)
        };
        let no_start = |i: usize| starts.is_null(i);
        let ends = b.column(e);
        let closed_without_end =
            |i: usize| starts.is_null(i) && ends.is_null(i) && end_seq.is_valid(i);
        let mut cols = b.columns().to_vec();
        cols[s] = picks(&no_start, starts)?;
        cols[e] = picks(&closed_without_end, ends)?;
        Ok((RecordBatch::try_new(schema, cols).map_err(Error::arrow)?, n))
    };
    let operation = deltalake::protocol::DeltaOperation::Update { predicate: None };
    let (table, _) = Box::pin(delta::rewrite_rows(
        &label,
        table,
        Some(delta::writer_properties(cfg)),
        floor_at,
        operation,
        &[],
    ))
    .await?;
    let kinds: Vec<SeqKind> = match kinds {
        Some(k) if k.len() == cfg.sequence_by.len() => k.to_vec(),
        _ => vec![kind],
    };
    crate::delta::record_kinds(table, Some(&kinds)).await
}

/// The history's data columns: the table's (in its types), then the batch's new ones.
fn history_data_columns(
    cfg: &TableConfig,
    h: &HistoryConfig,
    table: &DeltaTable,
    columns: &[Field],
) -> Result<Vec<Field>> {
    let own: Vec<String> = own_columns(cfg, h, Some(SeqKind::Text))
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let mut data: Vec<Field> = delta::arrow_schema(table)
        .map(|s| {
            s.fields()
                .iter()
                .filter(|f| !own.contains(f.name()))
                .map(|f| f.as_ref().clone())
                .collect()
        })
        .unwrap_or_default();
    for c in columns {
        if !data.iter().any(|d| d.name() == c.name()) {
            data.push(c.clone());
        }
    }
    Ok(data)
}

fn key_batch(cfg: &TableConfig, changes: &[ChangeSet], data: &[Field]) -> Result<RecordBatch> {
    let fields: Vec<Field> = cfg
        .primary_key
        .iter()
        .map(|k| {
            data.iter()
                .find(|f| f.name() == k)
                .cloned()
                .ok_or_else(|| Error::internal(format!("no key column {k}")))
        })
        .collect::<Result<_>>()?;
    let schema = Arc::new(Schema::new(fields.clone()));
    let parts = changes
        .iter()
        .map(|cs| {
            let cols = fields
                .iter()
                .map(|f| {
                    let c = cs
                        .data
                        .column_by_name(f.name())
                        .ok_or_else(|| Error::internal(format!("no key column {}", f.name())))?;
                    crate::coerce::exact_cast(c, f.data_type()).map_err(|e| Error::Schema {
                        table: cfg.name.clone(),
                        message: e.describe(c.data_type(), f.data_type()),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            RecordBatch::try_new(schema.clone(), cols).map_err(Error::arrow)
        })
        .collect::<Result<Vec<_>>>()?;
    concat_batches(&schema, &parts).map_err(Error::arrow)
}

/// Where a candidate row came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Version,
    Change,
    Log,
}

/// A candidate row's facts besides its data columns.
struct Meta {
    origin: Origin,
    version: Option<Version>,
    step: Option<Step>,
}

/// All candidate rows of a call (existing versions, the batch's changes, logged changes of
/// late keys) in the history's data columns, and what each is.
struct Work<'a> {
    cfg: &'a TableConfig,
    h: &'a HistoryConfig,
    /// The intervals' kind (`None`: not known yet, no interval columns).
    kind: Option<SeqKind>,
    schema: SchemaRef,
    parts: Vec<RecordBatch>,
    meta: Vec<Meta>,
    keys: Vec<OwnedRow>,
    encoder: KeyEncoder,
}

impl<'a> Work<'a> {
    fn new(
        cfg: &'a TableConfig,
        h: &'a HistoryConfig,
        kind: Option<SeqKind>,
        data: &[Field],
    ) -> Result<Self> {
        let schema = Arc::new(Schema::new(data.to_vec()));
        Ok(Work {
            encoder: KeyEncoder::new(&schema, &cfg.primary_key)?,
            cfg,
            h,
            kind,
            schema,
            parts: Vec::new(),
            meta: Vec::new(),
            keys: Vec::new(),
        })
    }

    fn offset(&self) -> usize {
        self.meta.len()
    }

    /// A start as the history writes it: a change without a sequence value (a full-load
    /// row without one) starts at the kind's floor.
    fn start(&self, start: Option<String>) -> Option<String> {
        match (start, self.kind) {
            (Some(s), _) => Some(s),
            (None, Some(k)) if !self.cfg.sequence_by.is_empty() => Some(interval::floor(k)),
            (None, _) => None,
        }
    }

    /// The log rows of the batch (`rows`, from `log::rows`) that are not in the log yet:
    /// neither among the late keys' logged changes (`logged`: key and order key) nor
    /// earlier in `rows`. A re-delivered file logs nothing.
    fn not_logged(
        &self,
        rows: &RecordBatch,
        logged: &HashSet<(OwnedRow, String)>,
    ) -> Result<RecordBatch> {
        let (p, _) = self.project(rows)?;
        let keys = self.encoder.encode(&p)?;
        let seqs = rows
            .column_by_name(log::SEQ)
            .and_then(|c| c.as_string_opt::<i32>())
            .ok_or_else(|| Error::internal("log rows without order keys"))?;
        let mut seen = HashSet::new();
        let keep: BooleanArray = keys
            .into_iter()
            .enumerate()
            .map(|(i, k)| {
                let id = (k, seqs.value(i).to_string());
                Some(!logged.contains(&id) && seen.insert(id))
            })
            .collect();
        arrow::compute::filter_record_batch(rows, &keep).map_err(Error::arrow)
    }

    /// `b` in the data schema (missing columns null), and the data columns it lacks.
    fn project(&self, b: &RecordBatch) -> Result<(RecordBatch, Vec<usize>)> {
        let mut absent = Vec::new();
        let cols = self
            .schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| match b.column_by_name(f.name()) {
                Some(c) => crate::coerce::exact_cast(c, f.data_type()).map_err(|e| Error::Schema {
                    table: self.cfg.name.clone(),
                    message: format!(
                        "history column `{}`: {}",
                        f.name(),
                        e.describe(c.data_type(), f.data_type())
                    ),
                }),
                None => {
                    absent.push(i);
                    Ok(arrow::array::new_null_array(f.data_type(), b.num_rows()))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let p = RecordBatch::try_new_with_options(
            self.schema.clone(),
            cols,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(b.num_rows())),
        )
        .map_err(Error::arrow)?;
        Ok((p, absent))
    }

    fn push(&mut self, b: RecordBatch, meta: Vec<Meta>) -> Result<()> {
        self.keys.extend(self.encoder.encode(&b)?);
        self.parts.push(b);
        self.meta.extend(meta);
        Ok(())
    }

    fn add_versions(&mut self, batches: &[RecordBatch]) -> Result<()> {
        for b in batches {
            let (p, _) = self.project(b)?;
            let text = |name: &str| -> Result<Vec<Option<String>>> {
                let c = b
                    .column_by_name(name)
                    .ok_or_else(|| Error::internal(format!("history has no column {name}")))?;
                let c = arrow::compute::cast(c, &DataType::Utf8).map_err(Error::arrow)?;
                Ok(c.as_string::<i32>()
                    .iter()
                    .map(|v| v.map(str::to_string))
                    .collect())
            };
            // No interval columns yet (the kind was not known when they were written).
            let typed = |name: &str| -> Result<Vec<Option<String>>> {
                match (self.kind, b.column_by_name(name)) {
                    (Some(kind), Some(c)) => interval::from_typed(kind, c),
                    _ => Ok(vec![None; b.num_rows()]),
                }
            };
            let (seq, last, end_seq) = (
                text(&self.cfg.writing.sequence_column)?,
                text(LAST_SEQ_COLUMN)?,
                text(END_SEQ_COLUMN)?,
            );
            let (start, end) = (typed(&self.h.start_column)?, typed(&self.h.end_column)?);
            let deleted: Vec<bool> = match &self.h.deletes {
                HistoryDeletes::Flag(c) => match b.column_by_name(c) {
                    Some(a) => (0..b.num_rows())
                        .map(|i| {
                            a.as_boolean_opt()
                                .is_some_and(|a| a.is_valid(i) && a.value(i))
                        })
                        .collect(),
                    None => vec![false; b.num_rows()],
                },
                HistoryDeletes::Close => vec![false; b.num_rows()],
            };
            let base = self.offset();
            let width = self.schema.fields().len();
            let meta = (0..b.num_rows())
                .map(|i| Meta {
                    origin: Origin::Version,
                    version: Some(Version {
                        seq: seq[i].clone().unwrap_or_default(),
                        last_seq: last[i]
                            .clone()
                            .or_else(|| seq[i].clone())
                            .unwrap_or_default(),
                        start: self.start(start[i].clone()),
                        end: end[i].clone(),
                        end_seq: end_seq[i].clone(),
                        deleted: deleted[i],
                        values: vec![Some(base + i); width],
                    }),
                    step: None,
                })
                .collect();
            self.push(p, meta)?;
        }
        Ok(())
    }

    fn add_changes(&mut self, changes: &[ChangeSet]) -> Result<()> {
        for cs in changes {
            let (p, absent) = self.project(&cs.data)?;
            let base = self.offset();
            let meta = (0..cs.data.num_rows())
                .map(|i| Meta {
                    origin: Origin::Change,
                    version: None,
                    step: Some(Step {
                        seq: cs.order.value(i).to_string(),
                        start: self.start(cs.starts[i].clone()),
                        delete: cs.ops[i] == ChangeOp::Delete,
                        row: base + i,
                        absent: row_absent(&self.schema, &absent, cs, i),
                    }),
                })
                .collect();
            self.push(p, meta)?;
        }
        Ok(())
    }

    /// Add the late keys' logged changes; returns their keys and order keys.
    fn add_log(
        &mut self,
        batches: &[RecordBatch],
        late: &HashSet<OwnedRow>,
    ) -> Result<HashSet<(OwnedRow, String)>> {
        let mut logged = HashSet::new();
        for b in batches {
            let (p, _) = self.project(b)?;
            let keys = self.encoder.encode(&p)?;
            let base = self.offset();
            let names: Vec<String> = self
                .schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect();
            let meta = (0..b.num_rows())
                .map(|i| {
                    let l = log::Logged { batch: b, row: i };
                    let present = l.present();
                    let absent = (0..names.len())
                        .filter(|c| !present.contains(&names[*c]))
                        .collect();
                    let keep = late.contains(&keys[i]);
                    if keep {
                        logged.insert((keys[i].clone(), l.seq().unwrap_or_default()));
                    }
                    Meta {
                        origin: Origin::Log,
                        version: None,
                        step: keep.then(|| Step {
                            seq: l.seq().unwrap_or_default(),
                            start: self.start(l.start()),
                            delete: l.is_delete(),
                            row: base + i,
                            absent,
                        }),
                    }
                })
                .collect();
            self.push(p, meta)?;
        }
        Ok(logged)
    }

    /// Candidate rows by key.
    fn by_key(&self) -> HashMap<&OwnedRow, Vec<usize>> {
        let mut m: HashMap<&OwnedRow, Vec<usize>> = HashMap::new();
        for (i, k) in self.keys.iter().enumerate() {
            m.entry(k).or_default().push(i);
        }
        m
    }

    /// The newest version of each key among the existing ones.
    fn newest_version(&self, rows: &[usize]) -> Option<&Version> {
        rows.iter()
            .filter_map(|r| self.meta[*r].version.as_ref())
            .max_by(|a, b| a.seq.cmp(&b.seq))
    }

    /// Keys with a change at or before their newest known change.
    fn late_keys(&self) -> HashSet<OwnedRow> {
        self.by_key()
            .into_iter()
            .filter(|(_, rows)| {
                let newest = self
                    .newest_version(rows)
                    .map(|v| v.newest_seq().to_string());
                rows.iter()
                    .filter_map(|r| self.meta[*r].step.as_ref())
                    .any(|s| newest.as_deref().is_some_and(|n| s.seq.as_str() <= n))
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn keys_batch(&self, keys: &HashSet<OwnedRow>) -> Result<RecordBatch> {
        let rows: Vec<u32> = self
            .keys
            .iter()
            .enumerate()
            .filter(|(_, k)| keys.contains(*k))
            .map(|(i, _)| i as u32)
            .collect();
        let all = self.candidates()?;
        let idx = UInt32Array::from(rows);
        let cols = self
            .cfg
            .primary_key
            .iter()
            .map(|k| {
                let c = all
                    .column_by_name(k)
                    .ok_or_else(|| Error::internal("no key"))?;
                take(c, &idx, None).map_err(Error::arrow)
            })
            .collect::<Result<Vec<_>>>()?;
        let fields: Vec<Field> = self
            .cfg
            .primary_key
            .iter()
            .filter_map(|k| self.schema.field_with_name(k).ok().cloned())
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(Error::arrow)
    }

    fn candidates(&self) -> Result<RecordBatch> {
        concat_batches(&self.schema, &self.parts).map_err(Error::arrow)
    }

    /// Fold every key and shape the MERGE source.
    fn fold(&self) -> Result<FoldOutput> {
        let all = self.candidates()?;
        let comparators = all
            .columns()
            .iter()
            .map(|c| {
                make_comparator(c.as_ref(), c.as_ref(), SortOptions::default())
                    .map_err(Error::arrow)
            })
            .collect::<Result<Vec<_>>>()?;
        let same = |c: usize, a: Option<usize>, b: usize| match a {
            Some(a) => comparators[c](a, b).is_eq(),
            None => all.column(c).is_null(b),
        };
        let tracked = self
            .schema
            .fields()
            .iter()
            .map(|f| !self.cfg.primary_key.contains(f.name()) && self.h.track.tracks(f.name()))
            .collect();
        let fold = Fold {
            tracked,
            flag_deletes: matches!(self.h.deletes, HistoryDeletes::Flag(_)),
            same: &same,
        };
        let mut rows = Rows::default();
        for (_, cand) in self.by_key() {
            self.fold_key(&fold, &cand, &mut rows);
        }
        rows.into_batch(self, &all)
    }

    fn fold_key(&self, fold: &Fold<'_>, cand: &[usize], rows: &mut Rows) {
        let late = cand.iter().any(|r| self.meta[*r].origin == Origin::Log);
        let versions: Vec<&Version> = cand
            .iter()
            .filter_map(|r| self.meta[*r].version.as_ref())
            .collect();
        // A late key: every change, logged (read before this batch's were appended) and in
        // the batch (the fold drops duplicates).
        let steps: Vec<Step> = cand
            .iter()
            .filter(|r| match self.meta[**r].origin {
                Origin::Change => true,
                Origin::Log => late,
                Origin::Version => false,
            })
            .filter_map(|r| self.meta[*r].step.clone())
            .collect();
        if steps.is_empty() {
            return;
        }
        if late {
            let out = fold.run(None, &steps);
            let kept: HashSet<&str> = out.iter().map(|v| v.seq.as_str()).collect();
            for v in versions.iter().filter(|v| !kept.contains(v.seq.as_str())) {
                rows.remove((*v).clone());
            }
            // Versions the recomputation gives as they are (a re-delivery: all of them)
            // are not written again.
            let changed = out
                .into_iter()
                .filter(|v| !versions.iter().any(|old| unchanged(fold, v, old)))
                .collect();
            rows.write(changed);
        } else {
            let current = self
                .newest_version(cand)
                .filter(|v| v.end_seq.is_none())
                .cloned();
            rows.write(fold.run(current, &steps));
        }
    }
}

/// Whether a recomputed version `new` is the existing `old`: same identity, interval,
/// flags and values.
fn unchanged(fold: &Fold<'_>, new: &Version, old: &Version) -> bool {
    new.seq == old.seq
        && new.last_seq == old.last_seq
        && new.start == old.start
        && new.end == old.end
        && new.end_seq == old.end_seq
        && new.deleted == old.deleted
        && new.values.len() == old.values.len()
        && new
            .values
            .iter()
            .zip(&old.values)
            .enumerate()
            .all(|(c, (n, o))| match (n, o) {
                (n, Some(o)) => (fold.same)(c, *n, *o),
                (Some(n), None) => (fold.same)(c, None, *n),
                (None, None) => true,
            })
}

/// The MERGE source being built.
#[derive(Default)]
struct Rows {
    versions: Vec<(Version, bool)>,
}

/// The MERGE source and its counts.
struct FoldOutput {
    batch: RecordBatch,
    written: usize,
    removed: usize,
}

impl Rows {
    fn write(&mut self, vs: Vec<Version>) {
        self.versions.extend(vs.into_iter().map(|v| (v, true)));
    }

    fn remove(&mut self, v: Version) {
        self.versions.push((v, false));
    }

    fn into_batch(self, w: &Work<'_>, all: &RecordBatch) -> Result<FoldOutput> {
        let n = self.versions.len();
        let mut cols: Vec<ArrayRef> = Vec::new();
        let mut fields: Vec<Field> = w
            .schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        for c in 0..w.schema.fields().len() {
            let idx: UInt32Array = self
                .versions
                .iter()
                .map(|(v, _)| v.values[c].map(|r| r as u32))
                .collect();
            cols.push(take(all.column(c), &idx, None).map_err(Error::arrow)?);
        }
        for (field, col) in own_columns(w.cfg, w.h, w.kind)
            .into_iter()
            .zip(self.own(w)?)
        {
            fields.push(field);
            cols.push(col);
        }
        fields.push(Field::new(OP, DataType::Utf8, false));
        cols.push(Arc::new(StringArray::from_iter_values(
            self.versions.iter().map(|(_, w)| PlanOp::marker_of(!*w)),
        )));
        let written = self.versions.iter().filter(|(_, w)| *w).count();
        let batch = RecordBatch::try_new_with_options(
            Arc::new(Schema::new(fields)),
            cols,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(n)),
        )
        .map_err(Error::arrow)?;
        Ok(FoldOutput {
            batch,
            written,
            removed: n - written,
        })
    }

    /// The history's own columns, in `own_columns` order.
    fn own(&self, w: &Work<'_>) -> Result<Vec<ArrayRef>> {
        let vs = || self.versions.iter().map(|(v, _)| v);
        let starts: Vec<Option<String>> = vs().map(|v| v.start.clone()).collect();
        let ends: Vec<Option<String>> = vs().map(|v| v.end.clone()).collect();
        let mut out = Vec::new();
        if let Some(kind) = w.kind {
            out.push(interval::to_typed(kind, &starts)?);
            out.push(interval::to_typed(kind, &ends)?);
        }
        if w.h.current_column.is_some() {
            out.push(Arc::new(BooleanArray::from(
                vs().map(|v| Some(v.end_seq.is_none())).collect::<Vec<_>>(),
            )));
        }
        if let HistoryDeletes::Flag(_) = &w.h.deletes {
            out.push(Arc::new(BooleanArray::from(
                vs().map(|v| Some(v.deleted)).collect::<Vec<_>>(),
            )));
        }
        out.push(Arc::new(StringArray::from_iter_values(
            vs().map(|v| v.seq.as_str()),
        )));
        out.push(Arc::new(StringArray::from_iter_values(
            vs().map(|v| v.last_seq.as_str()),
        )));
        out.push(Arc::new(StringArray::from(
            vs().map(|v| v.end_seq.clone()).collect::<Vec<_>>(),
        )));
        Ok(out)
    }
}

/// The history columns row `row` of `cs` does not carry: those its file lacks (`absent`)
/// and those the row has no value for ([`ChangeSet::absent`]).
fn row_absent(schema: &SchemaRef, absent: &[usize], cs: &ChangeSet, row: usize) -> Vec<usize> {
    let mut out = absent.to_vec();
    for (column, rows) in &cs.absent {
        if rows[row] {
            if let Ok(i) = schema.index_of(column) {
                if !out.contains(&i) {
                    out.push(i);
                }
            }
        }
    }
    out
}

/// Write versions on (key, first order key): remove, update or insert — by tributary's
/// copy-on-write rewrite (the columns the history lacks first added by a metadata commit).
async fn merge_versions(
    cfg: &TableConfig,
    table: DeltaTable,
    source: &RecordBatch,
    files: &[String],
    txns: &[deltalake::kernel::Transaction],
) -> Result<DeltaTable> {
    let mut vcfg = cfg.clone();
    vcfg.name = cfg.label(crate::config::Managed::History);
    vcfg.primary_key.push(cfg.writing.sequence_column.clone());
    let ops = crate::plan::MergePlan {
        batch: source.clone(),
        upserts: 0,
        deletes: 0,
        superseded: 0,
        sparse: vec![],
    }
    .ops()?;
    let plan = crate::plan::MergePlan {
        batch: source.clone(),
        upserts: ops.iter().filter(|o| **o == PlanOp::Upsert).count(),
        deletes: ops.iter().filter(|o| **o == PlanOp::Delete).count(),
        superseded: 0,
        sparse: vec![],
    };
    let table = delta::add_new_columns(&vcfg, table, &plan.table_schema()).await?;
    let extras = delta::MergeExtras {
        txns: txns.to_vec(),
        delete_unmatched_below: None,
    };
    match crate::delta::rewrite::Rewrite::eligible(&vcfg, &table, &plan, &extras)? {
        Some(rw) => {
            let run = rw.unconditional().run(&vcfg, table, files, &extras);
            Ok(Box::pin(run).await?.0)
        }
        None => Ok(table),
    }
}

#[cfg(test)]
mod tests;
