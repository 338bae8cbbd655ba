//! Compaction of small files, committed by tributary itself.
//!
//! delta-rs's OPTIMIZE cannot be used here: it commits without the application transaction
//! ids of the commit properties, and its conflict checker ignores removes that do not change
//! data — so two OPTIMIZEs of the same files both commit and every compacted row is there
//! twice (docs/design.md, "Concurrency"). This module reads a partition's small files,
//! writes them again through delta-rs's `DeltaWriter` (the same Parquet writer and file
//! statistics as every other write), and commits removes and adds with `dataChange = false`
//! and the [`super::MAINTENANCE_APP_ID`] transaction id, so that two compactions based on
//! the same version conflict, and a compaction that lost a file to a merge conflicts too.

use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Schema, SchemaRef};
use deltalake::datafile::writer::DeltaWriter;
use deltalake::kernel::transaction::CommitBuilder;
use deltalake::kernel::{Action, LogicalFileView};
use deltalake::protocol::DeltaOperation;
use deltalake::{DeltaTable, ObjectStore};
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::error::{Error, Result};
use crate::manifest::Partition;

/// Files of one partition to compact together (each bin becomes files near the target).
pub(super) struct CompactionPlan {
    pub(super) partition: Partition,
    pub(super) bins: Vec<Vec<LogicalFileView>>,
}

/// The partition's files smaller than `target`, binned greedily (in log order) up to
/// `target` bytes; bins of one file are dropped (nothing to gain).
pub(super) fn plan(
    table: &DeltaTable,
    partition: &Partition,
    target: u64,
) -> Result<CompactionPlan> {
    let label = table.table_url().to_string();
    let snapshot = table.snapshot().map_err(|e| Error::delta(&label, e))?;
    let columns = snapshot.metadata().partition_columns().to_vec();
    let mut bins: Vec<Vec<LogicalFileView>> = vec![vec![]];
    let mut bin_size = 0u64;
    for f in snapshot.log_data().iter() {
        let mut values = f.partition_values_map();
        let p = Partition(
            columns
                .iter()
                .map(|c| (c.clone(), values.remove(c).flatten()))
                .collect(),
        );
        let size = f.size().max(0) as u64;
        if &p != partition || size >= target {
            continue;
        }
        if bin_size + size > target && !bins.last().is_some_and(Vec::is_empty) {
            bins.push(vec![]);
            bin_size = 0;
        }
        bin_size += size;
        if let Some(b) = bins.last_mut() {
            b.push(f);
        }
    }
    bins.retain(|b| b.len() >= 2);
    Ok(CompactionPlan {
        partition: partition.clone(),
        bins,
    })
}

/// Rewrite the plan's bins and commit: returns the number of files removed.
pub(super) async fn execute(
    table: &DeltaTable,
    plan: CompactionPlan,
    (target, props): (u64, parquet::file::properties::WriterProperties),
    commit: deltalake::kernel::transaction::CommitProperties,
) -> Result<u64> {
    if plan.bins.is_empty() {
        return Ok(0);
    }
    let label = table.table_url().to_string();
    let delta_err = |e| Error::delta(&label, e);
    let snapshot = table.snapshot().map_err(delta_err)?;
    let store = table.log_store().object_store(None);
    let schema = snapshot.snapshot().arrow_schema();
    let mut actions = Vec::new();
    let mut removed = 0u64;
    for bin in &plan.bins {
        let config = crate::delta::writer_config(
            snapshot,
            Some(props.clone()),
            std::num::NonZeroU64::new(target),
        );
        let mut writer = DeltaWriter::new(store.clone(), config);
        for f in bin {
            for batch in read_file(store.clone(), f, &schema, &plan.partition).await? {
                writer.write(&batch).await.map_err(delta_err)?;
            }
            actions.push(Action::Remove(f.remove_action(false)));
            removed += 1;
        }
        for mut add in writer.close().await.map_err(delta_err)? {
            add.data_change = false;
            actions.push(Action::Add(add));
        }
    }
    CommitBuilder::from(commit)
        .with_actions(actions)
        .build(
            Some(snapshot),
            table.log_store(),
            DeltaOperation::Optimize {
                predicate: Some(plan.partition.folder()),
                target_size: target as i64,
            },
        )
        .await
        .map_err(delta_err)?;
    Ok(removed)
}

/// A data file's rows in the table's schema: columns added after it was written are null,
/// partition columns carry the partition's values.
async fn read_file(
    store: Arc<dyn ObjectStore>,
    f: &LogicalFileView,
    schema: &SchemaRef,
    partition: &Partition,
) -> Result<Vec<RecordBatch>> {
    let path = f.object_store_path();
    let label = path.to_string();
    let pq = |e: parquet::errors::ParquetError| Error::Compaction {
        file: label.clone(),
        message: e.to_string(),
    };
    // Only files below the target size are compacted: read each whole.
    let bytes = store
        .get(&path)
        .await
        .map_err(|e| Error::storage(label.clone(), e))?
        .bytes()
        .await
        .map_err(|e| Error::storage(label.clone(), e))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(pq)?
        .build()
        .map_err(pq)?;
    let batches: Vec<RecordBatch> =
        reader
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::Compaction {
                file: label.clone(),
                message: e.to_string(),
            })?;
    batches
        .iter()
        .map(|b| to_table_schema(b, schema, partition))
        .collect()
}

fn to_table_schema(
    b: &RecordBatch,
    schema: &SchemaRef,
    partition: &Partition,
) -> Result<RecordBatch> {
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let part = partition.0.iter().find(|(c, _)| c == field.name());
        let col = match (part, b.column_by_name(field.name())) {
            (Some((_, value)), _) => {
                partition_column(value.as_deref(), field.data_type(), b.num_rows())?
            }
            (None, Some(c)) if c.data_type() == field.data_type() => c.clone(),
            (None, Some(c)) => {
                crate::coerce::exact_cast(c, field.data_type()).map_err(|e| Error::Compaction {
                    file: field.name().clone(),
                    message: e.describe(c.data_type(), field.data_type()),
                })?
            }
            (None, None) => new_null_array(field.data_type(), b.num_rows()),
        };
        columns.push(col);
    }
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new(schema.fields().clone())),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(b.num_rows())),
    )
    .map_err(Error::arrow)
}

/// A constant column of a partition value (as written in the log) in the column's type.
fn partition_column(value: Option<&str>, dt: &DataType, rows: usize) -> Result<ArrayRef> {
    let text: ArrayRef = Arc::new(arrow::array::StringArray::from(vec![
        value.filter(
            |v| !v.is_empty()
        );
        rows
    ]));
    crate::coerce::exact_cast(&text, dt).map_err(|e| Error::Compaction {
        file: format!("partition value {value:?}"),
        message: e.describe(&DataType::Utf8, dt),
    })
}
