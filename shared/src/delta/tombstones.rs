//! Delete tombstones: a hidden Delta table `<target>/_tributary_tombstones` holding, per
//! deleted key, the order key of the delete and when it was recorded.
//!
//! A tombstone states a fact of the source ("this key was deleted at this point"). It is
//! recorded twice: pending before the MERGE that applies it, applied after. Upserts older
//! than an applied tombstone become deletes, so a late or re-delivered insert never revives
//! a deleted row; upserts older than a pending one are held back until its merge (or that
//! merge's retry) settles the key, so a tombstone whose MERGE never committed is never
//! applied early by another commit (#28).
//!
//! The table is append-only: recording is a blind append (concurrent appends never
//! conflict), and readers keep the newest order key per key. Duplicates (a re-delivered
//! delete file) cost a few bytes until maintenance expires them.
//!
//! One [`Tombstones`] handle serves one merge: it is opened once, records the merge's
//! deletes, is read for the plan, and re-checked after the commit; the re-check scans only
//! when the tombstone table has moved since the read.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, TimestampMicrosecondArray,
};
use arrow::compute::{cast, filter_record_batch};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::row::OwnedRow;
use deltalake::DeltaTable;

use crate::config::TableConfig;
use crate::delta;
use crate::delta::retry::Retry;
use crate::error::{Error, Result};
use crate::plan::{KeyEncoder, MergePlan, PlanOp};

pub(crate) use crate::model::DELETED_AT_COLUMN;

/// Column of the tombstone table saying whether the delete is in the main table: `false`
/// when recorded before its MERGE (pending), `true` when confirmed after it; null in rows
/// written before the column existed (confirmed: they were applied the old way).
pub(crate) const APPLIED_COLUMN: &str = "_tributary_applied";

/// Newest tombstone order key per primary key (row-encoded with the plan's key types).
pub(crate) type TombstoneMap = HashMap<OwnedRow, String>;

/// The tombstone table of one Delta table, opened once per merge.
pub(crate) struct Tombstones<'a> {
    cfg: &'a TableConfig,
    table: DeltaTable,
    label: String,
    /// Version of the tombstone table at the last [`Tombstones::read`].
    read_version: Option<u64>,
    /// Pending tombstones of the last read (newer than the key's applied one).
    pending: TombstoneMap,
}

impl<'a> Tombstones<'a> {
    /// Open the tombstone table, creating it (empty) when missing, so that later opens
    /// never hit a missing table. A concurrent creator winning the race is fine.
    pub(crate) async fn open(
        cfg: &'a TableConfig,
        options: &HashMap<String, String>,
        plan_schema: &Schema,
    ) -> Result<Self> {
        let schema = schema(cfg, plan_schema)?;
        let name = cfg.label(crate::config::Managed::Tombstones);
        let url = cfg
            .tombstones
            .as_ref()
            .ok_or_else(|| Error::internal(format!("table `{}` keeps no tombstones", cfg.name)))?;
        // Read whole by every merge, appended to by every merge with deletes: a warm
        // instance fetches each of its files once.
        delta::keep_data_files(url, options)?;
        let table = delta::open_or_create(url, options, &name, &schema, &[], Default::default())
            .await?
            .0;
        let label = format!("{} tombstones", cfg.name);
        // A key column the batch widens (`int` to `bigint`): the recorded keys follow.
        let (table, _) = Self::widen(cfg, &label, table, &schema).await?;
        Ok(Self {
            cfg,
            table,
            label,
            read_version: None,
            pending: TombstoneMap::new(),
        })
    }

    /// The tombstone table with its key columns widened to `schema`'s (retried on a
    /// concurrent commit: tombstones are appended blindly, so only a concurrent widening or
    /// creation can conflict).
    async fn widen(
        cfg: &TableConfig,
        label: &str,
        table: DeltaTable,
        schema: &Schema,
    ) -> Result<(DeltaTable, crate::delta::widen::Widened)> {
        let table = &table;
        let widen = |n: u32| {
            let mut table = table.clone();
            async move {
                if n > 1 {
                    delta::refresh(&mut table, label).await?;
                }
                let props = parquet::file::properties::WriterProperties::default();
                crate::delta::widen::widen(cfg, label, table, schema, props, &[]).await
            }
        };
        Ok(Retry::new(label, cfg.limits.max_commit_attempts)
            .run("widen tombstone keys", widen)
            .await?
            .0)
    }

    /// Append the plan's deletes as pending, before the MERGE that applies them. Returns
    /// how many tombstones the plan carried.
    pub(crate) async fn record(&mut self, plan: &MergePlan, files: &[String]) -> Result<usize> {
        self.append(plan, files, false).await
    }

    /// Append the plan's deletes as applied, once the MERGE that applies them is in the
    /// table: from now on other writers turn older upserts of these keys into deletes.
    pub(crate) async fn confirm(&mut self, plan: &MergePlan, files: &[String]) -> Result<usize> {
        self.append(plan, files, true).await
    }

    async fn append(&mut self, plan: &MergePlan, files: &[String], applied: bool) -> Result<usize> {
        let deletes = deletes_of(plan)?;
        if deletes.num_rows() == 0 {
            return Ok(0);
        }
        let batch = self.tombstone_rows(&deletes, applied)?;
        // A blind append: delta-rs rebases it over concurrent appends. Only a concurrent
        // metadata commit (two writers creating the table at once) conflicts: refresh, retry.
        let (label, attempts) = (self.label.as_str(), self.cfg.limits.max_commit_attempts);
        let (base, batch) = (&self.table, &batch);
        let append = |n: u32| {
            let mut table = base.clone();
            let batch = batch.clone();
            async move {
                if n > 1 {
                    delta::refresh(&mut table, label).await?;
                }
                // Tables from before APPLIED_COLUMN get it.
                delta::append_rows(label, table, &batch, None, files).await
            }
        };
        let (table, _) = Retry::new(label, attempts)
            .run("record tombstones", append)
            .await?;
        self.table = table;
        Ok(deletes.num_rows())
    }

    /// The deletes in the tombstone table's own columns and types (the first file may have
    /// written the keys with another integer width than today's file: convert exactly).
    fn tombstone_rows(&self, deletes: &RecordBatch, applied: bool) -> Result<RecordBatch> {
        let table_schema = delta::arrow_schema(&self.table)
            .ok_or_else(|| Error::internal(format!("{}: table not loaded", self.label)))?;
        let now = chrono::Utc::now().timestamp_micros();
        let n = deletes.num_rows();
        let mut fields = Vec::new();
        let mut cols: Vec<ArrayRef> = Vec::new();
        for f in table_schema.fields() {
            let col: ArrayRef = if f.name() == DELETED_AT_COLUMN {
                Arc::new(TimestampMicrosecondArray::from(vec![now; n]).with_timezone("UTC"))
            } else if f.name() == APPLIED_COLUMN {
                Arc::new(BooleanArray::from(vec![applied; n]))
            } else {
                let c = deletes.column_by_name(f.name()).ok_or_else(|| Error::Schema {
                    table: self.cfg.name.clone(),
                    message: format!(
                        "the tombstone table has a column `{}` the files do not carry; the primary key or sequence column changed: delete {} and replay the table's files",
                        f.name(),
                        self.table.table_url()
                    ),
                })?;
                crate::coerce::exact_cast(c, f.data_type())
                    .map_err(|e| self.type_error(f, c, e.describe(c.data_type(), f.data_type())))?
            };
            fields.push(Field::new(f.name(), f.data_type().clone(), true));
            cols.push(col);
        }
        if table_schema.field_with_name(APPLIED_COLUMN).is_err() {
            fields.push(Field::new(APPLIED_COLUMN, DataType::Boolean, true));
            cols.push(Arc::new(BooleanArray::from(vec![applied; n])));
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(Error::arrow)
    }

    fn type_error(&self, f: &Field, c: &ArrayRef, e: impl std::fmt::Display) -> Error {
        Error::Schema {
            table: self.cfg.name.clone(),
            message: format!(
                "key column `{}` is {} in the tombstone table but {} in the files ({e})",
                f.name(),
                f.data_type(),
                c.data_type()
            ),
        }
    }

    /// Applied tombstones for the plan's upsert keys, from the newest tombstone table
    /// version (the pending ones: [`Tombstones::pending`]).
    pub(crate) async fn read(&mut self, plan: &MergePlan) -> Result<TombstoneMap> {
        self.refresh().await?;
        self.read_version = self.table.version();
        let (applied, pending) = self.scan(plan).await?;
        self.pending = pending;
        Ok(applied)
    }

    /// Pending tombstones of the last [`Tombstones::read`] newer than their key's applied
    /// one: deletes recorded whose MERGE is not (known to be) in the table.
    pub(crate) fn pending(&self) -> &TombstoneMap {
        &self.pending
    }

    /// The tombstone table's version at the last [`Tombstones::read`].
    pub(crate) fn read_version(&self) -> Option<u64> {
        self.read_version
    }

    /// Whether the tombstone table has moved since version `v` (re-reading its log).
    pub(crate) async fn moved_since(&mut self, v: Option<u64>) -> Result<bool> {
        self.refresh().await?;
        Ok(self.table.version() != v)
    }

    /// Forget the last read: the next [`Tombstones::read_if_changed`] reads.
    pub(crate) fn forget_read(&mut self) {
        self.read_version = None;
    }

    /// After a commit: the tombstones for the plan's upsert keys if the tombstone table
    /// moved since the last [`Tombstones::read`] (a concurrent delete may have been
    /// recorded), `None` when it has not (nothing new can be there).
    pub(crate) async fn read_if_changed(
        &mut self,
        plan: &MergePlan,
    ) -> Result<Option<TombstoneMap>> {
        self.refresh().await?;
        if self.read_version.is_some() && self.table.version() == self.read_version {
            return Ok(None);
        }
        self.read(plan).await.map(Some)
    }

    async fn refresh(&mut self) -> Result<()> {
        self.table
            .update_incremental(None)
            .await
            .map_err(|e| Error::delta(&self.label, e))
    }

    /// The newest applied and the newest pending tombstone of each of the plan's upsert
    /// keys (a pending one only when newer than the applied one).
    async fn scan(&self, plan: &MergePlan) -> Result<(TombstoneMap, TombstoneMap)> {
        let mut out = HashMap::new();
        let mut pending: TombstoneMap = HashMap::new();
        if plan.upserts == 0 {
            return Ok((out, pending));
        }
        let cfg = self.cfg;
        let label = &self.label;
        // Only files whose first key column's statistics overlap the plan's keys.
        let k0 = &cfg.primary_key[0];
        let range = match plan.batch.column_by_name(k0) {
            Some(keys) => crate::delta::scan::KeyRange::of(keys)?.map(|r| (k0.clone(), r)),
            None => None,
        };
        let mut cols: Vec<String> = cfg.primary_key.clone();
        cols.push(cfg.writing.sequence_column.clone());
        let has_applied = delta::arrow_schema(&self.table)
            .is_some_and(|s| s.field_with_name(APPLIED_COLUMN).is_ok());
        if has_applied {
            cols.push(APPLIED_COLUMN.to_string());
        }
        let batches = crate::delta::scan::Scan {
            columns: Some(cols),
            range,
        }
        .rows(&self.table)
        .await?;
        // Encode keys with the plan's key types.
        let plan_schema = plan.batch.schema();
        let enc = KeyEncoder::new(&plan_schema, &cfg.primary_key)?;
        for b in &batches {
            let mut fields = Vec::new();
            let mut cols = Vec::new();
            for (i, k) in cfg.primary_key.iter().enumerate() {
                let f = plan_schema.field_with_name(k).map_err(|e| Error::Arrow {
                    context: format!("{label}: key column"),
                    source: e,
                })?;
                cols.push(cast(b.column(i), f.data_type()).map_err(|e| Error::Schema {
                    table: cfg.name.clone(),
                    message: format!(
                        "tombstone key column `{k}` does not match the table's type: {e}"
                    ),
                })?);
                fields.push(Field::new(k, f.data_type().clone(), true));
            }
            let keys_batch =
                RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(Error::arrow)?;
            let keys = enc.encode(&keys_batch)?;
            let seqs = b.column(cfg.primary_key.len());
            let seqs = cast(seqs, &DataType::Utf8).map_err(Error::arrow)?;
            let seqs = seqs.as_string::<i32>();
            let applied = match has_applied {
                true => Some(
                    cast(b.column(cfg.primary_key.len() + 1), &DataType::Boolean)
                        .map_err(Error::arrow)?,
                ),
                false => None,
            };
            let applied = applied.as_ref().map(|a| a.as_boolean());
            for (i, k) in keys.into_iter().enumerate() {
                if seqs.is_valid(i) {
                    let s = seqs.value(i);
                    let is_pending = applied.is_some_and(|a| a.is_valid(i) && !a.value(i));
                    let map = if is_pending { &mut pending } else { &mut out };
                    match map.get(&k) {
                        Some(old) if old.as_str() >= s => {}
                        _ => {
                            map.insert(k, s.to_string());
                        }
                    }
                }
            }
        }
        // A pending tombstone is held only while no applied one is as new (its own
        // confirmation carries the same order key).
        pending.retain(|k, p| out.get(k).is_none_or(|a| a.as_str() < p.as_str()));
        Ok((out, pending))
    }
}

/// Schema of the tombstone table for a plan: key columns, order key, deletion time.
fn schema(cfg: &TableConfig, plan_schema: &Schema) -> Result<Schema> {
    let mut fields = Vec::new();
    for k in &cfg.primary_key {
        let f = plan_schema
            .field_with_name(k)
            .map_err(|_| Error::internal(format!("key {k} missing from plan")))?;
        fields.push(Field::new(k, f.data_type().clone(), true));
    }
    fields.push(Field::new(
        &cfg.writing.sequence_column,
        DataType::Utf8,
        true,
    ));
    fields.push(Field::new(
        DELETED_AT_COLUMN,
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        true,
    ));
    fields.push(Field::new(APPLIED_COLUMN, DataType::Boolean, true));
    Ok(Schema::new(fields))
}

/// The plan's deletes alone, as a plan (to apply them again).
pub(crate) fn deletes_only(plan: &MergePlan) -> Result<MergePlan> {
    let batch = deletes_of(plan)?;
    let n = batch.num_rows();
    Ok(MergePlan {
        batch,
        upserts: 0,
        deletes: n,
        superseded: 0,
        sparse: plan.sparse.clone(),
    })
}

fn deletes_of(plan: &MergePlan) -> Result<RecordBatch> {
    let mask: arrow::array::BooleanArray = plan
        .ops()?
        .iter()
        .map(|o| Some(*o == PlanOp::Delete))
        .collect();
    filter_record_batch(&plan.batch, &mask).map_err(Error::arrow)
}

/// A plan of deletes for the upserts of `plan` that tombstones written since have
/// superseded (found after our commit). `None` when there are none.
pub(crate) fn superseded_upserts(
    cfg: &TableConfig,
    plan: &MergePlan,
    tombstones: &TombstoneMap,
) -> Result<Option<MergePlan>> {
    if tombstones.is_empty() {
        return Ok(None);
    }
    let mut p = plan.clone();
    let changed = crate::plan::apply_tombstones(&mut p, cfg, tombstones)?;
    if changed == 0 {
        return Ok(None);
    }
    // Keep only rows that turned from upsert into delete.
    let (before, after) = (plan.ops()?, p.ops()?);
    let mask: arrow::array::BooleanArray = before
        .iter()
        .zip(&after)
        .map(|(b, a)| Some(*b == PlanOp::Upsert && *a == PlanOp::Delete))
        .collect();
    let batch = filter_record_batch(&p.batch, &mask).map_err(Error::arrow)?;
    let n = batch.num_rows();
    Ok(Some(MergePlan {
        batch,
        upserts: 0,
        deletes: n,
        superseded: 0,
        sparse: p.sparse,
    }))
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray};

    use super::*;
    use crate::config::Config;

    fn plan(cfg: &TableConfig, rows: &[(i64, &str, &str)]) -> MergePlan {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new(&cfg.writing.sequence_column, DataType::Utf8, true),
            Field::new(crate::plan::OP_COLUMN, DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
            ],
        )
        .unwrap();
        let deletes = rows.iter().filter(|r| r.2 == "D").count();
        MergePlan {
            batch,
            upserts: rows.len() - deletes,
            deletes,
            superseded: 0,
            sparse: vec![],
        }
    }

    /// Appends keep the newest order key per key (duplicates and older deletes included),
    /// pending tombstones are apart from applied ones until confirmed, and the post-commit
    /// re-check only scans when another writer appended since.
    #[tokio::test]
    async fn appends_keep_the_newest_and_recheck_scans_only_after_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let text = crate::config::test_table("t", "raw/t/", "curated/t", "sequence_by = [\"ts\"]");
        let config = Config::from_toml(&text, "test", Some(dir.path())).unwrap();
        let cfg = &config.tables[0];
        let opts = HashMap::new();
        let deletes = plan(cfg, &[(1, "1 b", "D"), (2, "1 a", "D")]);
        let schema = deletes.batch.schema();
        let mut ours = Tombstones::open(cfg, &opts, &schema).await.unwrap();
        assert_eq!(ours.record(&deletes, &[]).await.unwrap(), 2);
        assert_eq!(ours.confirm(&deletes, &[]).await.unwrap(), 2);
        // the same file again, and an older delete of key 1: duplicates, not changes
        assert_eq!(ours.confirm(&deletes, &[]).await.unwrap(), 2);
        let older = plan(cfg, &[(1, "1 a", "D")]);
        assert_eq!(ours.confirm(&older, &[]).await.unwrap(), 1);

        let upserts = plan(cfg, &[(1, "1 c", "U"), (2, "1 c", "U"), (3, "1 c", "U")]);
        let read = ours.read(&upserts).await.unwrap();
        let enc = KeyEncoder::new(&schema, &cfg.primary_key).unwrap();
        let keys = enc.encode(&upserts.batch).unwrap();
        assert_eq!(read.len(), 2);
        assert_eq!(read.get(&keys[0]).map(String::as_str), Some("1 b"));
        assert_eq!(read.get(&keys[1]).map(String::as_str), Some("1 a"));
        assert!(ours.pending().is_empty(), "confirmed: not pending");
        assert!(ours.read_if_changed(&upserts).await.unwrap().is_none());

        // another writer records a delete of key 3: pending until it confirms it
        let mut theirs = Tombstones::open(cfg, &opts, &schema).await.unwrap();
        let theirs_plan = plan(cfg, &[(3, "1 d", "D")]);
        theirs.record(&theirs_plan, &[]).await.unwrap();
        let again = ours
            .read_if_changed(&upserts)
            .await
            .unwrap()
            .expect("changed");
        assert_eq!(again.get(&keys[2]), None, "pending is not applied");
        assert_eq!(
            ours.pending().get(&keys[2]).map(String::as_str),
            Some("1 d")
        );
        theirs.confirm(&theirs_plan, &[]).await.unwrap();
        let again = ours
            .read_if_changed(&upserts)
            .await
            .unwrap()
            .expect("changed");
        assert_eq!(again.get(&keys[2]).map(String::as_str), Some("1 d"));
        assert!(ours.pending().is_empty());
        assert!(ours.read_if_changed(&upserts).await.unwrap().is_none());
    }

    /// A tombstone table written before `_tributary_applied` existed: its rows count as
    /// applied, and the next record adds the column.
    #[tokio::test]
    async fn a_tombstone_table_from_before_the_applied_column_keeps_working() {
        let dir = tempfile::tempdir().unwrap();
        let text = crate::config::test_table("t", "raw/t/", "curated/t", "sequence_by = [\"ts\"]");
        let config = Config::from_toml(&text, "test", Some(dir.path())).unwrap();
        let cfg = &config.tables[0];
        let opts = HashMap::new();
        let old = plan(cfg, &[(1, "1 b", "D")]);
        let schema = old.batch.schema();
        // the old layout: keys, order key, deletion time
        let mut fields = super::schema(cfg, &schema).unwrap().fields().to_vec();
        fields.retain(|f| f.name() != APPLIED_COLUMN);
        let old_schema = Schema::new(fields);
        let url = cfg.tombstones.clone().unwrap();
        let (table, _) = delta::open_or_create(
            &url,
            &opts,
            "t_tombstones",
            &old_schema,
            &[],
            Default::default(),
        )
        .await
        .unwrap();
        let rows = RecordBatch::try_new(
            Arc::new(old_schema.clone()),
            vec![
                Arc::new(Int64Array::from(vec![1])),
                Arc::new(StringArray::from(vec!["1 b"])),
                Arc::new(TimestampMicrosecondArray::from(vec![0]).with_timezone("UTC")),
            ],
        )
        .unwrap();
        delta::append_rows("t_tombstones", table, &rows, None, &[])
            .await
            .unwrap();
        let mut t = Tombstones::open(cfg, &opts, &schema).await.unwrap();
        let upserts = plan(cfg, &[(1, "1 a", "U"), (2, "1 a", "U")]);
        let enc = KeyEncoder::new(&schema, &cfg.primary_key).unwrap();
        let keys = enc.encode(&upserts.batch).unwrap();
        let read = t.read(&upserts).await.unwrap();
        assert_eq!(read.get(&keys[0]).map(String::as_str), Some("1 b"));
        t.record(&plan(cfg, &[(2, "1 c", "D")]), &[]).await.unwrap();
        let read = t.read(&upserts).await.unwrap();
        assert_eq!(read.get(&keys[0]).map(String::as_str), Some("1 b"));
        assert_eq!(read.get(&keys[1]), None);
        assert_eq!(t.pending().get(&keys[1]).map(String::as_str), Some("1 c"));
    }
}
