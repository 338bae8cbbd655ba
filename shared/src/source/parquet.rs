//! DMS Parquet files, decoded a batch at a time (row groups are read as they are needed).

use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::reader::ChunkReader;

use super::{at_least_one, Batches, Body};
use crate::error::{Error, Location, Result};

/// The file's batches and its row count.
pub(super) fn batches(
    name: &str,
    body: &Body,
    decode_rows: usize,
    decode_bytes: usize,
) -> Result<(Batches, Option<usize>)> {
    match body {
        Body::Memory(b) => build(name, Bytes::clone(b), decode_rows, decode_bytes),
        Body::Disk { path, .. } => {
            let f = std::fs::File::open(path).map_err(|e| Error::Io {
                path: name.to_string(),
                source: e,
            })?;
            build(name, f, decode_rows, decode_bytes)
        }
    }
}

fn build<T: ChunkReader + 'static>(
    name: &str,
    src: T,
    decode_rows: usize,
    decode_bytes: usize,
) -> Result<(Batches, Option<usize>)> {
    let bad = |m: String| Error::bad_input(name, Location::File, m);
    let builder = ParquetRecordBatchReaderBuilder::try_new(src)
        .map_err(|e| bad(format!("not a readable Parquet file: {e}")))?;
    let schema = builder.schema().clone();
    let rows = usize::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
    // Rows per batch from the uncompressed size the row groups declare (wide rows, fewer).
    let bytes: i64 = builder
        .metadata()
        .row_groups()
        .iter()
        .map(|rg| rg.total_byte_size())
        .sum();
    let per_row = (usize::try_from(bytes).unwrap_or(0) / rows.max(1)).max(1);
    let by_bytes = (decode_bytes / per_row).max(1024);
    let reader = builder
        .with_batch_size(decode_rows.min(by_bytes).min(rows.max(1)))
        .build()
        .map_err(|e| bad(format!("cannot read Parquet data: {e}")))?;
    let name = name.to_string();
    let batches: Batches = Box::new(reader.map(move |b| {
        b.map_err(|e| Error::bad_input(&name, Location::File, format!("corrupt Parquet data: {e}")))
    }));
    Ok((at_least_one(schema, batches), Some(rows)))
}
