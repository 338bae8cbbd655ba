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
//!   the key's versions are recomputed from the change log (`log`), where every change is
//!   appended before versions are computed, and versions that no longer exist are removed.
//!
//! Either way one MERGE (on key and the version's first order key) writes the versions: the
//! result is a function of the set of changes, whatever their order or grouping into calls.

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
use deltalake::datafusion::common::Column;
use deltalake::datafusion::logical_expr::utils::conjunction;
use deltalake::datafusion::prelude::{lit, Expr, SessionContext};
use deltalake::DeltaTable;
use serde::Serialize;

use crate::config::{HistoryConfig, HistoryDeletes, TableConfig};
use crate::delta;
use crate::error::{Error, Result};
use crate::plan::{KeyEncoder, PlanOp};
use crate::retry::Retry;
use crate::source::{ChangeOp, ChangeSet, SeqKind};
use crate::storage::Storage;
use fold::{Fold, Step, Version};

/// Order key of the last change a version absorbed.
pub const LAST_SEQ_COLUMN: &str = "_tributary_last_seq";
/// Order key of the change that closed a version.
pub const END_SEQ_COLUMN: &str = "_tributary_end_seq";
/// What the MERGE does with a version row (`U`: write it, `D`: remove it).
const OP: &str = "_tributary_op";

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
    /// The history entries' catalog sync (reported with the table's: `TableReport::catalog`).
    #[serde(skip)]
    pub(crate) catalog: Option<crate::catalog::CatalogReport>,
}

/// A batch as the history sees it: the admitted change sets, the kind of the first
/// sequence column (the intervals' type), and the files (for the commit).
pub(crate) struct Changes<'a> {
    pub(crate) sets: &'a [ChangeSet],
    pub(crate) kind: SeqKind,
    pub(crate) files: &'a [String],
    /// For a table that keeps only its history: what its commit records.
    pub(crate) record: Option<Record>,
}

/// What the history table of a table without a current table records, as the current
/// table would: the batch's sequence kinds (once, on a table that has none) and its
/// full-load files (application transactions in the commit that applies them; reload
/// detection reads them).
pub(crate) struct Record {
    pub(crate) kinds: Option<Vec<SeqKind>>,
    pub(crate) txns: Vec<deltalake::kernel::Transaction>,
}

/// Apply a batch of admitted change sets to the table's history (one commit), then its
/// manifests.
pub(crate) async fn apply(
    cfg: &TableConfig,
    h: &HistoryConfig,
    storage: &Storage,
    options: &HashMap<String, String>,
    catalog: &crate::catalog::Catalog,
    changes: &Changes<'_>,
) -> Result<HistoryReport> {
    let columns = data_columns(changes.sets);
    check_names(cfg, h, &columns)?;
    let rows = log::rows(changes.sets, &columns)?;
    let mut log_table = log::append(cfg, h, options, rows, changes.files).await?;
    let label = format!("{} history", cfg.name);
    let mut retry = Retry::new(&label, cfg.max_commit_attempts);
    loop {
        let ctx = Attempt {
            cfg,
            h,
            options,
            catalog,
            changes,
            columns: &columns,
            log_table: &log_table,
        };
        match ctx.run().await {
            Ok((mut r, w)) => {
                r.commit_attempts = retry.attempt();
                let for_catalog = cfg.catalog.is_some().then(|| w.after.clone());
                let (mut behind, mut pending) = (crate::manifest::Behind::No, None);
                if cfg.manifests {
                    (behind, pending) = manifests(cfg, storage, &w, &mut r).await;
                }
                if let Some(after) = for_catalog {
                    if let Some(b) = &w.before {
                        let c = catalog
                            .after_commit(cfg, true, b.schema.as_ref(), &b.files, &after)
                            .await;
                        add_catalog(&mut r, c);
                    }
                    add_catalog(&mut r, catalog.catch_up(cfg, true, &behind, &after).await);
                }
                // Last: until it is written, the next call redoes manifests and catalog.
                if let Some(p) = pending {
                    if let Err(e) = p.record(storage).await {
                        tracing::error!(table = %cfg.name, error = %e, "history manifest version marker not written; the next call rewrites the manifests of this commit");
                        r.manifest_error = Some(e.to_string());
                    }
                }
                return Ok(r);
            }
            Err(e) => {
                retry.on_error(e, "history merge").await?;
                log_table
                    .update_incremental(None)
                    .await
                    .map_err(|e| Error::delta(&label, e))?;
            }
        }
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

/// The history's own columns, in table order after the data columns.
fn own_columns(cfg: &TableConfig, h: &HistoryConfig, kind: SeqKind) -> Vec<Field> {
    let interval = interval::interval_type(kind);
    let mut f = vec![
        Field::new(&h.start_column, interval.clone(), true),
        Field::new(&h.end_column, interval, true),
    ];
    if let Some(c) = &h.current_column {
        f.push(Field::new(c, DataType::Boolean, true));
    }
    if let HistoryDeletes::Flag(c) = &h.deletes {
        f.push(Field::new(c, DataType::Boolean, true));
    }
    for n in [
        cfg.sequence_column.as_str(),
        LAST_SEQ_COLUMN,
        END_SEQ_COLUMN,
    ] {
        f.push(Field::new(n, DataType::Utf8, true));
    }
    f
}

fn check_names(cfg: &TableConfig, h: &HistoryConfig, columns: &[Field]) -> Result<()> {
    let own = own_columns(cfg, h, SeqKind::Text);
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

/// Bring the history's manifests to the table after the call ([`crate::manifest::catch_up`]):
/// the partitions its commit touched, and those of earlier commits the manifests are
/// behind (a crash after a history commit: the retry commits nothing). A failure is logged
/// and reported; the next call or the maintenance run catches up. Returns what the
/// manifests were behind (the catalog follows it) and the marker write still owed.
async fn manifests(
    cfg: &TableConfig,
    storage: &Storage,
    w: &Written,
    r: &mut HistoryReport,
) -> (crate::manifest::Behind, Option<crate::manifest::Pending>) {
    let since = w.before.as_ref().map(|b| crate::manifest::Since {
        version: b.version,
        files: &b.files,
    });
    match crate::manifest::catch_up(storage, w.after.clone(), since).await {
        Ok((_, behind, pending)) => {
            r.manifests_caught_up = behind != crate::manifest::Behind::No;
            (behind, pending)
        }
        Err(e) => {
            tracing::error!(table = %cfg.name, error = %e, "history manifests not updated; the next call or the maintenance run rewrites them");
            r.manifest_error = Some(e.to_string());
            (crate::manifest::Behind::No, None)
        }
    }
}

/// What one attempt works with.
struct Attempt<'a> {
    cfg: &'a TableConfig,
    h: &'a HistoryConfig,
    options: &'a HashMap<String, String>,
    catalog: &'a crate::catalog::Catalog,
    changes: &'a Changes<'a>,
    columns: &'a [Field],
    log_table: &'a DeltaTable,
}

/// A history call's table after it and, when it committed, before it.
struct Written {
    before: Option<Before>,
    after: DeltaTable,
}

/// The history table as a call first read it (live files only when manifests are on).
struct Before {
    version: Option<u64>,
    schema: Option<arrow::datatypes::SchemaRef>,
    files: Vec<crate::manifest::LiveFile>,
}

impl Written {
    /// `after`, with `before` kept when a commit happened since.
    fn new(before: Before, after: DeltaTable) -> Self {
        let committed = after.version() != before.version;
        Written {
            before: committed.then_some(before),
            after,
        }
    }
}

fn add_catalog(r: &mut HistoryReport, c: Option<crate::catalog::CatalogReport>) {
    if let Some(c) = c {
        r.catalog.get_or_insert_with(Default::default).absorb(&c);
    }
}

impl Attempt<'_> {
    /// Read the keys' versions, fold, MERGE.
    async fn run(&self) -> Result<(HistoryReport, Written)> {
        let (cfg, h, kind) = (self.cfg, self.h, self.changes.kind);
        let label = format!("{} history", cfg.name);
        let mut schema_fields = self.columns.to_vec();
        schema_fields.extend(own_columns(cfg, h, kind));
        let record = self.changes.record.as_ref();
        let props = match record {
            Some(r) => {
                let kinds: Vec<Option<SeqKind>> = match &r.kinds {
                    Some(k) => k.iter().copied().map(Some).collect(),
                    None => vec![None; cfg.sequence_by.len()],
                };
                crate::props::TableProps::for_new_table(&kinds)
            }
            None => Default::default(),
        };
        let (table, created) = delta::open_or_create(
            &h.target,
            self.options,
            &format!("{}_history", cfg.name),
            &Schema::new(schema_fields),
            &h.partition_by,
            props,
        )
        .await?;
        let mut created_report = None;
        if created {
            created_report = self.catalog.created(cfg, true, &table).await;
        }
        let before = Before {
            version: table.version(),
            schema: delta::arrow_schema(&table),
            files: if cfg.manifests {
                crate::manifest::live_files(&table)?
            } else {
                Vec::new()
            },
        };
        let table = match record {
            Some(r) => crate::engine::record_kinds(table, r.kinds.as_deref()).await?,
            None => table,
        };
        crate::plan::recheck_kinds(
            self.changes.sets,
            delta::props(&table).sequence_kinds.as_deref(),
        )?;
        let data = history_data_columns(cfg, h, &table, self.columns, kind)?;
        let keys = key_batch(cfg, self.changes.sets, &data)?;
        let existing = delta::rows_with_keys(&table, &label, &cfg.primary_key, &keys).await?;
        let mut work = Work::new(cfg, h, kind, &data)?;
        work.add_versions(&existing)?;
        work.add_changes(self.changes.sets)?;
        let late = work.late_keys();
        if !late.is_empty() {
            let late_keys = work.keys_batch(&late)?;
            let logged =
                delta::rows_with_keys(self.log_table, &label, &cfg.primary_key, &late_keys).await?;
            work.add_log(&logged, &late)?;
        }
        let out = work.fold()?;
        let mut report = HistoryReport {
            version: table.version(),
            versions_written: out.written,
            versions_removed: out.removed,
            late_keys: late.len(),
            ..Default::default()
        };
        add_catalog(&mut report, created_report);
        let txns = record.map(|r| r.txns.as_slice()).unwrap_or_default();
        if out.batch.num_rows() == 0 {
            let read_version = table.version();
            let table = crate::engine::record_unrecorded_loads(table, txns, read_version).await?;
            report.version = table.version();
            return Ok((report, Written::new(before, table)));
        }
        let read_version = table.version();
        let table = merge_versions(cfg, table, &out.batch, self.changes.files, txns).await?;
        let table = crate::engine::record_unrecorded_loads(table, txns, read_version).await?;
        report.version = table.version();
        Ok((report, Written::new(before, table)))
    }
}

/// The history's data columns: the table's (in its types), then the batch's new ones.
fn history_data_columns(
    cfg: &TableConfig,
    h: &HistoryConfig,
    table: &DeltaTable,
    columns: &[Field],
    kind: SeqKind,
) -> Result<Vec<Field>> {
    let own: Vec<String> = own_columns(cfg, h, kind)
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
    kind: SeqKind,
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
        kind: SeqKind,
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
            let typed = |name: &str| -> Result<Vec<Option<String>>> {
                let c = b
                    .column_by_name(name)
                    .ok_or_else(|| Error::internal(format!("history has no column {name}")))?;
                interval::from_typed(self.kind, c)
            };
            let (seq, last, end_seq) = (
                text(&self.cfg.sequence_column)?,
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
                        start: start[i].clone(),
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
                        start: cs.starts[i].clone(),
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

    fn add_log(&mut self, batches: &[RecordBatch], late: &HashSet<OwnedRow>) -> Result<()> {
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
                    Meta {
                        origin: Origin::Log,
                        version: None,
                        step: keep.then(|| Step {
                            seq: l.seq().unwrap_or_default(),
                            start: l.start(),
                            delete: l.is_delete(),
                            row: base + i,
                            absent,
                        }),
                    }
                })
                .collect();
            self.push(p, meta)?;
        }
        Ok(())
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
        let wanted = if late { Origin::Log } else { Origin::Change };
        let steps: Vec<Step> = cand
            .iter()
            .filter(|r| self.meta[**r].origin == wanted)
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
            rows.write(out);
        } else {
            let current = self
                .newest_version(cand)
                .filter(|v| v.end_seq.is_none())
                .cloned();
            rows.write(fold.run(current, &steps));
        }
    }
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
        let mut out = vec![
            interval::to_typed(w.kind, &starts)?,
            interval::to_typed(w.kind, &ends)?,
        ];
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

fn qcol(alias: &str, name: &str) -> Expr {
    Expr::Column(Column::new(Some(alias), name))
}

/// MERGE versions on (key, first order key): remove, update or insert.
async fn merge_versions(
    cfg: &TableConfig,
    table: DeltaTable,
    source: &RecordBatch,
    files: &[String],
    txns: &[deltalake::kernel::Transaction],
) -> Result<DeltaTable> {
    let label = format!("{} history", cfg.name);
    let delta_err = |e| Error::delta(&label, e);
    let seq = cfg.sequence_column.as_str();
    let on = conjunction(
        cfg.primary_key
            .iter()
            .map(|k| qcol("t", k).eq(qcol("s", k)))
            .chain([qcol("t", seq).eq(qcol("s", seq))]),
    )
    .ok_or_else(|| Error::internal("empty primary key"))?;
    let columns: Vec<String> = source
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| n != OP)
        .collect();
    let new_columns = match delta::arrow_schema(&table) {
        Some(ts) => columns.iter().any(|c| ts.field_with_name(c).is_err()),
        None => true,
    };
    let df = SessionContext::new()
        .read_batch(source.clone())
        .map_err(|e| Error::datafusion(format!("{label}: MERGE source"), e))?;
    let is_write = qcol("s", OP).eq(lit(PlanOp::Upsert.marker()));
    let (table, _) = table
        .merge(df, on)
        .with_source_alias("s")
        .with_target_alias("t")
        .with_merge_schema(new_columns)
        .with_writer_properties(delta::writer_properties(cfg))
        .with_commit_properties(
            delta::tributary_commit(files).with_application_transactions(txns.to_vec()),
        )
        .when_matched_delete(|d| d.predicate(qcol("s", OP).eq(lit(PlanOp::Delete.marker()))))
        .map_err(delta_err)?
        .when_matched_update(|u| {
            columns.iter().fold(u.predicate(is_write.clone()), |u, c| {
                u.update(Column::new_unqualified(c), qcol("s", c))
            })
        })
        .map_err(delta_err)?
        .when_not_matched_insert(|i| {
            columns.iter().fold(i.predicate(is_write.clone()), |i, c| {
                i.set(Column::new_unqualified(c), qcol("s", c))
            })
        })
        .map_err(delta_err)?
        .await
        .map_err(delta_err)?;
    delta::settle(table).await
}

#[cfg(test)]
mod tests;
