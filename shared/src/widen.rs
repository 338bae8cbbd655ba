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

use arrow::datatypes::{Field, Schema, SchemaRef};
use deltalake::datafile::writer::DeltaWriter;
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::{Action, MetadataExt, StructField, StructType};
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::DeltaTable;
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::manifest::Partition;
use crate::plan::Widening;

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
    label: &'a str,
    table: DeltaTable,
    wanted: &'a Schema,
    properties: parquet::file::properties::WriterProperties,
    files: &'a [String],
) -> futures::future::BoxFuture<'a, Result<(DeltaTable, Widened)>> {
    Box::pin(widen_table(label, table, wanted, properties, files))
}

async fn widen_table(
    label: &str,
    table: DeltaTable,
    wanted: &Schema,
    properties: parquet::file::properties::WriterProperties,
    files: &[String],
) -> Result<(DeltaTable, Widened)> {
    let Some(current) = crate::delta::arrow_schema(&table) else {
        return Ok((table, Widened::default()));
    };
    let columns = needed(&current, wanted);
    if columns.is_empty() {
        return Ok((table, Widened::default()));
    }
    let delta_err = |e| Error::delta(label, e);
    let snapshot = table.snapshot().map_err(delta_err)?;
    let partition_columns = snapshot.metadata().partition_columns().to_vec();
    // A partition column's values are text in the log and folder names in the manifests and
    // the Glue partitions: only an integer keeps its text (`5` is `5` in `bigint`; `1.5` in
    // decimal(10,2) would become `1.50`, a second partition for the same value).
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
                "Reload the table (README, \"Table reloads\") or write to a new table"
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
    let mut actions = vec![Action::Metadata(metadata)];
    let rewrite = columns
        .iter()
        .any(|w| !partition_columns.contains(&w.column));
    let mut files_rewritten = 0;
    if rewrite {
        let store = table.log_store().object_store(None);
        // One partition at a time, its writer closed before the next: what is held is one
        // partition's unwritten output, not the table's.
        let mut by_partition: std::collections::BTreeMap<Partition, Vec<_>> = Default::default();
        for f in snapshot.log_data().iter() {
            by_partition
                .entry(Partition::of(&f, &partition_columns))
                .or_default()
                .push(f);
        }
        for (partition, files) in by_partition {
            let config = crate::delta::writer_config_for(
                snapshot,
                new_arrow.clone(),
                Some(properties.clone()),
                None,
            );
            let mut writer = DeltaWriter::new(store.clone(), config);
            for f in files {
                let mut batches =
                    crate::datafile::stream(store.clone(), &f, &new_arrow, &partition)
                        .await
                        .map_err(|e| e.into_error(label))?;
                while let Some(b) = batches.next().await {
                    let b = b.map_err(|e| e.into_error(label))?;
                    writer.write(&b).await.map_err(delta_err)?;
                }
                actions.push(Action::Remove(f.remove_action(false)));
                files_rewritten += 1;
            }
            for mut add in writer.close().await.map_err(delta_err)? {
                add.data_change = false;
                actions.push(Action::Add(add));
            }
        }
    }
    let operation = DeltaOperation::Write {
        mode: SaveMode::Overwrite,
        partition_by: (!partition_columns.is_empty()).then_some(partition_columns),
        // The whole table: every concurrent add or remove conflicts (its files would keep
        // the old type).
        predicate: Some("true".to_string()),
    };
    let changes = columns
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let table =
        crate::delta::commit_actions_as(label, table, actions, operation, files, &[]).await?;
    tracing::info!(table = %label, columns = %changes, files_rewritten, version = ?table.version(), "widened column types");
    Ok((
        table,
        Widened {
            columns,
            files_rewritten,
        },
    ))
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
