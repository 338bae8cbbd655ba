//! Lossless type widening of a managed Delta table (docs/configuration.md, "Types in the
//! Delta table"): when the columns a commit writes have a wider type than the table's
//! (`int` → `bigint`, `float` → `double`, an integer or a decimal into a wider decimal:
//! [`crate::coerce::is_widening`]), the table takes the wider type first, in one commit of
//! its own: the new schema (a `metaData` action) and every data file rewritten in it
//! (`remove` + `add`, `dataChange = false`). Every reader — one that knows Delta's
//! `typeWidening` feature or not, and the manifests' plain Parquet readers — then reads old
//! and new rows in the new type; no file of the old type stays behind.
//!
//! The commit declares a read of the whole table, so it conflicts with any concurrent commit
//! that added or removed files (whose files it would not have rewritten); the caller's retry
//! reads the table again. A partition column needs no rewrite (its values live in the log).
//! The rewrite streams one data file at a time, a batch at a time, one partition at a time
//! (memory: a row group and one partition's unwritten output), into files of the table's
//! usual size.
//!
//! A large table's rewrite goes in slices (a partition's files, up to the table's
//! `slice_mb` of data files each) that are staged: written as new data files that no commit
//! references yet (readers see the table as it was), and recorded after each slice in
//! `_tributary_widening.json` at the table's root. When the invocation's time is nearly up
//! ([`crate::budget`]), the widening stops with [`Error::Widening`] (retryable) and the next
//! attempt — of any file that needs it — goes on from the staged slices: only the files not
//! rewritten yet, or changed by a commit since, are rewritten. The one commit comes when
//! every live file is rewritten. Staged files no commit took (a slice of a file removed
//! since, a crash before its record was written) are unreferenced files for VACUUM; a
//! staging older than half the table's `vacuum_retention_hours` is started again, so that
//! VACUUM cannot have removed a staged file the commit would add.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use crate::delta::writer::Writer;
use arrow::datatypes::{Field, Schema, SchemaRef};
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::{Action, Add, MetadataExt, StructField, StructType};
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::{DeltaTable, ObjectStore};
use futures::StreamExt;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use serde::{Deserialize, Serialize};

use crate::config::TableConfig;
use crate::delta::manifest::Partition;
use crate::delta::Read;
use crate::error::{Error, Result};
use crate::plan::Widening;

/// Where a table's staged rewrite is recorded, under its root.
pub(crate) const STAGED: &str = "_tributary_widening.json";

/// What a widening commit did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Widened {
    /// The columns widened, from the table's type to the new one.
    pub(crate) columns: Vec<Widening>,
    /// Data files rewritten in the new types.
    pub(crate) files_rewritten: usize,
}

/// The columns of `table` that `wanted` (the columns a commit writes) widens: a column of the
/// table whose type the wanted type is a lossless widening of. Columns the table lacks, and
/// equal or narrower types (a concurrent writer widened first), need nothing.
pub(crate) fn needed(table: &Schema, wanted: &Schema) -> Vec<Widening> {
    wanted
        .fields()
        .iter()
        .filter(|w| !crate::plan::is_internal(w.name()))
        .filter_map(|w| {
            let t = table.field_with_name(w.name()).ok()?;
            crate::coerce::is_widening(t.data_type(), w.data_type()).then(|| Widening {
                column: w.name().clone(),
                from: t.data_type().clone(),
                to: w.data_type().clone(),
            })
        })
        .collect()
}

/// Widen the table's columns to the types `wanted` has where that is a widening ([`needed`]),
/// in one commit (see the module documentation). Returns the table at the new version and
/// what was widened (empty: nothing to do, no commit). `label` names the table in errors and
/// logs; `files` are the source files the caller is about to merge (the commit info).
///
/// Boxed: it sits deep in every commit's future (a reload's in the maintenance function
/// reaches rustc's layout depth limit otherwise), and it is the rare path.
pub(crate) fn widen<'a>(
    cfg: &'a TableConfig,
    label: &'a str,
    table: DeltaTable,
    wanted: &'a Schema,
    properties: parquet::file::properties::WriterProperties,
    files: &'a [String],
) -> futures::future::BoxFuture<'a, Result<(DeltaTable, Widened)>> {
    Box::pin(widen_table(cfg, label, table, wanted, properties, files))
}

async fn widen_table(
    cfg: &TableConfig,
    label: &str,
    table: DeltaTable,
    wanted: &Schema,
    properties: parquet::file::properties::WriterProperties,
    files: &[String],
) -> Result<(DeltaTable, Widened)> {
    let Some(plan) = WidenPlan::of(label, &table, wanted)? else {
        return Ok((table, Widened::default()));
    };
    let mut actions = vec![Action::Metadata(plan.metadata.clone())];
    let store = table.log_store().object_store(None);
    let staging = Staging {
        path: Path::from(STAGED),
        label: format!("{}{STAGED}", table.table_url()),
    };
    let mut files_rewritten = 0;
    if plan.rewrite {
        let rewritten = plan
            .rewrite(cfg, label, &table, &store, &staging, properties)
            .await?;
        files_rewritten = rewritten.removes.len();
        actions.extend(rewritten.removes.into_iter().map(Action::Remove));
        actions.extend(rewritten.adds.into_iter().map(Action::Add));
    }
    let operation = DeltaOperation::Write {
        mode: SaveMode::Overwrite,
        partition_by: (!plan.partition_columns.is_empty()).then(|| plan.partition_columns.clone()),
        // The whole table: every concurrent add or remove conflicts (its files would keep
        // the old type).
        predicate: Some("true".to_string()),
    };
    let changes = describe(&plan.columns);
    let table =
        crate::delta::commit_actions(label, table, actions, operation, Read::Table, files, &[])
            .await?;
    tracing::info!(table = %label, columns = %changes, files_rewritten, version = ?table.version(), "widened column types");
    if plan.rewrite {
        // Committed: the record has done its work (left behind, the next widening of other
        // columns ignores it; of the same ones cannot come, the table has the types now).
        if let Err(e) = store.delete(&staging.path).await {
            if !matches!(e, object_store::Error::NotFound { .. }) {
                tracing::warn!(table = %label, state = %staging.label, error = %e, "widening committed; its staging record not deleted");
            }
        }
    }
    let widened = Widened {
        columns: plan.columns,
        files_rewritten,
    };
    Ok((table, widened))
}

/// A widening's plan: the columns, the table's new schema (Arrow, and its `metaData`), and
/// whether data files are rewritten (not when only partition columns widen).
struct WidenPlan {
    columns: Vec<Widening>,
    partition_columns: Vec<String>,
    new_arrow: SchemaRef,
    metadata: deltalake::kernel::Metadata,
    rewrite: bool,
}

/// Where a table's staged rewrite is recorded, and that object's name in messages.
struct Staging {
    path: Path,
    label: String,
}

/// A rewrite's actions: every live file removed, and the files that replace them.
struct Rewritten {
    removes: Vec<deltalake::kernel::Remove>,
    adds: Vec<Add>,
}

impl WidenPlan {
    /// The widening `wanted` needs on `table` (`None`: none), refused when a partition
    /// column's values would be written differently.
    fn of(label: &str, table: &DeltaTable, wanted: &Schema) -> Result<Option<WidenPlan>> {
        let Some(current) = crate::delta::arrow_schema(table) else {
            return Ok(None);
        };
        let columns = needed(&current, wanted);
        if columns.is_empty() {
            return Ok(None);
        }
        let snapshot = table.snapshot().map_err(|e| Error::delta(label, e))?;
        let partition_columns = snapshot.metadata().partition_columns().to_vec();
        // A partition column's values are text in the log and folder names in the manifests
        // and the Glue partitions: only an integer keeps its text (`5` is `5` in `bigint`;
        // `1.5` in decimal(10,2) would become `1.50`, a second partition for the same value).
        if let Some(w) = columns.iter().find(|w| {
            partition_columns.contains(&w.column) && !(is_integer(&w.from) && is_integer(&w.to))
        }) {
            return Err(Error::Schema {
                table: label.to_string(),
                message: format!(
                    "partition column `{}` changed type from {} to {}: its values would be written differently in partition folders (the manifests, the Glue partitions) than the rows already in the table; only a larger integer is applied to a partition column. {}",
                    w.column,
                    w.from,
                    w.to,
                    "Reload the table (docs/operations.md, \"Table reloads\") or write to a new table"
                ),
            });
        }
        let new_arrow = widened_arrow(&current, &columns);
        let new_kernel = widened_kernel(label, snapshot.schema().as_ref(), &columns)?;
        let metadata = snapshot
            .metadata()
            .clone()
            .with_schema(&new_kernel)
            .map_err(|e| Error::Schema {
                table: label.to_string(),
                message: format!("the widened schema: {e}"),
            })?;
        let rewrite = columns
            .iter()
            .any(|w| !partition_columns.contains(&w.column));
        Ok(Some(WidenPlan {
            columns,
            partition_columns,
            new_arrow,
            metadata,
            rewrite,
        }))
    }

    /// Every live data file rewritten in the new types, slice by slice, each slice staged
    /// (see the module documentation); [`Error::Widening`] when the invocation's time runs
    /// out before the last.
    async fn rewrite(
        &self,
        cfg: &TableConfig,
        label: &str,
        table: &DeltaTable,
        store: &std::sync::Arc<dyn ObjectStore>,
        staging: &Staging,
        properties: parquet::file::properties::WriterProperties,
    ) -> Result<Rewritten> {
        let snapshot = table.snapshot().map_err(|e| Error::delta(label, e))?;
        let live: Vec<_> = snapshot.log_data().iter().collect();
        let live_paths: HashSet<String> = live.iter().map(|f| f.path().into_owned()).collect();
        let mut staged =
            Staged::load(store, &staging.path, &staging.label, &self.columns, cfg).await?;
        // A slice stands while every file it rewrote is still live (a commit since may have
        // removed one: that slice's files are left to VACUUM, its live ones rewritten again).
        staged
            .slices
            .retain(|s| s.removed.iter().all(|p| live_paths.contains(p)));
        let done: HashSet<String> = staged
            .slices
            .iter()
            .flat_map(|s| s.removed.iter().cloned())
            .collect();
        let todo: Vec<_> = live
            .iter()
            .filter(|f| !done.contains(f.path().as_ref()))
            .collect();
        let slices = slices_of(todo, &self.partition_columns, cfg.limits.slice_bytes as u64);
        let table_files = crate::delta::datafile::TableFiles::of(table);
        let mut longest = Duration::ZERO;
        let remaining = slices.len();
        for (i, (partition, files)) in slices.into_iter().enumerate() {
            let t = Instant::now();
            let config = crate::delta::writer_config_for(
                snapshot,
                self.new_arrow.clone(),
                Some(properties.clone()),
                None,
            );
            let writer = Writer::new(store.clone(), config);
            let slice = self
                .rewrite_slice(label, &table_files, writer, &partition, files)
                .await?;
            staged.slices.push(slice);
            staged.save(store, &staging.path, &staging.label).await?;
            longest = longest.max(t.elapsed());
            let rewritten: usize = staged.slices.iter().map(|s| s.removed.len()).sum();
            if i + 1 < remaining
                // The next slice may take as long as the longest so far; twice that is left
                // for it and the commit and merge after the last.
                && crate::budget::left().is_some_and(|left| left < 2 * longest)
            {
                let total = live.len();
                tracing::warn!(table = %label, staged = rewritten, total, state = %staging.label, "widening staged, not finished: the invocation's time is nearly up; the next attempt goes on");
                return Err(Error::Widening {
                    table: label.to_string(),
                    columns: describe(&self.columns),
                    staged: rewritten,
                    total,
                    state: staging.label.clone(),
                });
            }
        }
        Ok(Rewritten {
            removes: live.iter().map(|f| f.remove_action(false)).collect(),
            adds: std::mem::take(&mut staged.slices)
                .into_iter()
                .flat_map(|s| s.added)
                .collect(),
        })
    }

    /// One slice's files read (deletion vectors applied) and written in the new types.
    async fn rewrite_slice(
        &self,
        label: &str,
        table_files: &crate::delta::datafile::TableFiles,
        mut writer: Writer,
        partition: &Partition,
        files: Vec<&deltalake::kernel::LogicalFileView>,
    ) -> Result<Slice> {
        let delta_err = |e| Error::delta(label, e);
        let mut removed = Vec::with_capacity(files.len());
        for f in files {
            let mut batches = table_files
                .stream(f, &self.new_arrow, partition)
                .await
                .map_err(|e| e.into_error(label))?;
            while let Some(b) = batches.next().await {
                let b = b.map_err(|e| e.into_error(label))?;
                writer.write(&b).await.map_err(delta_err)?;
            }
            removed.push(f.path().into_owned());
        }
        let mut added = writer.close().await.map_err(delta_err)?;
        for add in &mut added {
            add.data_change = false;
        }
        Ok(Slice { removed, added })
    }
}

/// Slices of a rewrite: a partition's files, up to `slice_bytes` of them (at least one
/// file).
fn slices_of<'f>(
    files: Vec<&'f deltalake::kernel::LogicalFileView>,
    partition_columns: &[String],
    slice_bytes: u64,
) -> Vec<(Partition, Vec<&'f deltalake::kernel::LogicalFileView>)> {
    let mut by_partition: BTreeMap<Partition, Vec<_>> = Default::default();
    for f in files {
        by_partition
            .entry(Partition::of(f, partition_columns))
            .or_default()
            .push(f);
    }
    let mut slices = Vec::new();
    for (partition, files) in by_partition {
        let mut slice: Vec<_> = Vec::new();
        let mut bytes = 0u64;
        for f in files {
            let size = f.size().max(0) as u64;
            if !slice.is_empty() && bytes + size > slice_bytes {
                slices.push((partition.clone(), std::mem::take(&mut slice)));
                bytes = 0;
            }
            bytes += size;
            slice.push(f);
        }
        if !slice.is_empty() {
            slices.push((partition, slice));
        }
    }
    slices
}

/// `a: Int32 -> Int64, b: …` (errors and logs).
fn describe(columns: &[Widening]) -> String {
    columns
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A staged rewrite (see the module documentation): the slices rewritten so far.
#[derive(Debug, Serialize, Deserialize)]
struct Staged {
    /// The widening it is for: `column: from -> to` each.
    columns: Vec<String>,
    /// When its first slice was written (milliseconds since the epoch).
    started_ms: i64,
    slices: Vec<Slice>,
}

/// Data files of the table (their paths in the log) and the files that replace them.
#[derive(Debug, Serialize, Deserialize)]
struct Slice {
    removed: Vec<String>,
    added: Vec<Add>,
}

impl Staged {
    /// The staged rewrite of this widening, or a new one: a record of another widening, or
    /// one older than half the vacuum retention, is started again.
    async fn load(
        store: &std::sync::Arc<dyn ObjectStore>,
        state: &Path,
        label: &str,
        columns: &[Widening],
        cfg: &TableConfig,
    ) -> Result<Self> {
        let now = chrono::Utc::now().timestamp_millis();
        let fresh = Staged {
            columns: columns.iter().map(ToString::to_string).collect(),
            started_ms: now,
            slices: Vec::new(),
        };
        let bytes = match store.get(state).await {
            Ok(r) => r.bytes().await.map_err(|e| Error::storage(label, e))?,
            Err(object_store::Error::NotFound { .. }) => return Ok(fresh),
            Err(e) => return Err(Error::storage(label, e)),
        };
        let max_age = cfg.maintenance.vacuum_retention.as_millis() as i64 / 2;
        match serde_json::from_slice::<Staged>(&bytes) {
            Ok(s) if s.columns == fresh.columns && now - s.started_ms < max_age => {
                tracing::info!(table = %cfg.name, state = %label, slices = s.slices.len(), "widening: going on from the staged rewrite");
                Ok(s)
            }
            Ok(_) => Ok(fresh),
            Err(e) => {
                tracing::warn!(table = %cfg.name, state = %label, error = %e, "widening: staging record not readable; starting again");
                Ok(fresh)
            }
        }
    }

    async fn save(
        &self,
        store: &std::sync::Arc<dyn ObjectStore>,
        state: &Path,
        label: &str,
    ) -> Result<()> {
        let body = serde_json::to_vec(self).map_err(|e| Error::internal(e.to_string()))?;
        store
            .put(state, body.into())
            .await
            .map_err(|e| Error::storage(label, e))?;
        Ok(())
    }
}

fn is_integer(dt: &arrow::datatypes::DataType) -> bool {
    use arrow::datatypes::DataType::*;
    matches!(dt, Int8 | Int16 | Int32 | Int64)
}

fn widened_arrow(current: &Schema, columns: &[Widening]) -> SchemaRef {
    std::sync::Arc::new(Schema::new(
        current
            .fields()
            .iter()
            .map(|f| match columns.iter().find(|w| &w.column == f.name()) {
                Some(w) => Field::new(f.name(), w.to.clone(), f.is_nullable())
                    .with_metadata(f.metadata().clone()),
                None => f.as_ref().clone(),
            })
            .collect::<Vec<_>>(),
    ))
}

/// The table's Delta schema with the columns' new types (field metadata, nullability kept).
fn widened_kernel(label: &str, current: &StructType, columns: &[Widening]) -> Result<StructType> {
    let fields = current
        .fields()
        .map(|f| match columns.iter().find(|w| &w.column == f.name()) {
            Some(w) => {
                let dt: deltalake::kernel::DataType =
                    (&w.to).try_into_kernel().map_err(|e| Error::Schema {
                        table: label.to_string(),
                        message: format!("column `{}`: no Delta type for {}: {e}", w.column, w.to),
                    })?;
                Ok(StructField::new(f.name(), dt, f.is_nullable())
                    .with_metadata(f.metadata().clone()))
            }
            None => Ok(f.clone()),
        })
        .collect::<Result<Vec<_>>>()?;
    StructType::try_new(fields).map_err(|e| Error::Schema {
        table: label.to_string(),
        message: format!("the widened schema: {e}"),
    })
}

impl crate::report::TableReport {
    /// A widening commit's columns and files into the report.
    pub(crate) fn widen(&mut self, w: &Widened) {
        self.widened
            .extend(w.columns.iter().map(ToString::to_string));
        self.files_rewritten_to_widen += w.files_rewritten;
    }
}
