//! DMS Parquet files.

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::error::{Error, Location, Result};

/// Read a whole Parquet file into one batch.
pub(super) fn read(name: &str, bytes: Bytes) -> Result<RecordBatch> {
    let bad = |m: String| Error::bad_input(name, Location::File, m);
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(|e| bad(format!("not a readable Parquet file: {e}")))?;
    let schema = builder.schema().clone();
    let reader = builder
        .with_batch_size(64 * 1024)
        .build()
        .map_err(|e| bad(format!("cannot read Parquet data: {e}")))?;
    let mut batches = Vec::new();
    for b in reader {
        batches.push(b.map_err(|e| bad(format!("corrupt Parquet data: {e}")))?);
    }
    concat_batches(&schema, &batches).map_err(|e| bad(format!("cannot combine row groups: {e}")))
}
