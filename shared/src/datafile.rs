//! A table's data files read directly (compaction, copy-on-write rewrites): a file's rows
//! in the table's schema, partition values as columns. Only for tables whose files are
//! plain Parquet, with no deletion vectors and no column mapping (callers check).

use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Schema, SchemaRef};
use deltalake::kernel::LogicalFileView;
use deltalake::ObjectStore;
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::manifest::Partition;

/// Why a data file could not be read.
#[derive(Debug)]
pub(crate) struct ReadError {
    pub(crate) file: String,
    pub(crate) message: String,
}

impl ReadError {
    /// As the engine's error for a data file of `table`.
    pub(crate) fn into_error(self, table: &str) -> crate::error::Error {
        crate::error::Error::DataFile {
            table: table.to_string(),
            file: self.file,
            message: self.message,
        }
    }
}

type Result<T> = std::result::Result<T, ReadError>;

/// A data file's rows in the table's schema (as [`read`]), streamed a batch at a time: only
/// the row group being decoded is in memory.
pub(crate) async fn stream(
    store: Arc<dyn ObjectStore>,
    f: &LogicalFileView,
    schema: &SchemaRef,
    partition: &Partition,
) -> Result<impl futures::Stream<Item = Result<RecordBatch>> + Send + use<>> {
    use deltalake::logstore::parquet_reader::ParquetObjectReader;
    use futures::StreamExt;
    use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
    let path = f.object_store_path();
    let label = path.to_string();
    let reader = ParquetObjectReader::new(store, path).with_file_size(f.size().max(0) as u64);
    let stream = ParquetRecordBatchStreamBuilder::new(reader)
        .await
        .map_err(|e| ReadError {
            file: label.clone(),
            message: e.to_string(),
        })?
        .with_batch_size(8192)
        .build()
        .map_err(|e| ReadError {
            file: label.clone(),
            message: e.to_string(),
        })?;
    let (schema, partition) = (schema.clone(), partition.clone());
    Ok(stream.map(move |b| {
        let err = |message: String| ReadError {
            file: label.clone(),
            message,
        };
        let b = b.map_err(|e| err(e.to_string()))?;
        to_table_schema(&b, &schema, &partition).map_err(err)
    }))
}

/// A data file's rows in the table's schema: columns added after it was written are null,
/// partition columns carry the partition's values. The file is read whole.
pub(crate) async fn read(
    store: Arc<dyn ObjectStore>,
    f: &LogicalFileView,
    schema: &SchemaRef,
    partition: &Partition,
) -> Result<Vec<RecordBatch>> {
    let path = f.object_store_path();
    let label = path.to_string();
    let err = |message: String| ReadError {
        file: label.clone(),
        message,
    };
    let bytes = store
        .get(&path)
        .await
        .map_err(|e| err(e.to_string()))?
        .bytes()
        .await
        .map_err(|e| err(e.to_string()))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(|e| err(e.to_string()))?
        .build()
        .map_err(|e| err(e.to_string()))?;
    let batches: Vec<RecordBatch> = reader
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| err(e.to_string()))?;
    batches
        .iter()
        .map(|b| to_table_schema(b, schema, partition))
        .collect::<std::result::Result<_, String>>()
        .map_err(err)
}

fn to_table_schema(
    b: &RecordBatch,
    schema: &SchemaRef,
    partition: &Partition,
) -> std::result::Result<RecordBatch, String> {
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let part = partition.0.iter().find(|(c, _)| c == field.name());
        let col = match (part, b.column_by_name(field.name())) {
            (Some((_, value)), _) => {
                partition_column(value.as_deref(), field.data_type(), b.num_rows())?
            }
            (None, Some(c)) if c.data_type() == field.data_type() => c.clone(),
            (None, Some(c)) => crate::coerce::exact_cast(c, field.data_type()).map_err(|e| {
                format!(
                    "column `{}`: {}",
                    field.name(),
                    e.describe(c.data_type(), field.data_type())
                )
            })?,
            (None, None) => new_null_array(field.data_type(), b.num_rows()),
        };
        columns.push(col);
    }
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new(schema.fields().clone())),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(b.num_rows())),
    )
    .map_err(|e| e.to_string())
}

/// A constant column of a partition value (as written in the log) in the column's type.
fn partition_column(
    value: Option<&str>,
    dt: &DataType,
    rows: usize,
) -> std::result::Result<ArrayRef, String> {
    let text: ArrayRef = Arc::new(arrow::array::StringArray::from(vec![
        value.filter(
            |v| !v.is_empty()
        );
        rows
    ]));
    crate::coerce::exact_cast(&text, dt).map_err(|e| {
        format!(
            "partition value {value:?}: {}",
            e.describe(&DataType::Utf8, dt)
        )
    })
}
