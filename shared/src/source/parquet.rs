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
) -> Result<(Batches, Option<usize>)> {
    match body {
        Body::Memory(b) => build(name, Bytes::clone(b), decode_rows),
        Body::Disk { path, .. } => {
            let f = std::fs::File::open(path).map_err(|e| Error::Io {
                path: name.to_string(),
                source: e,
            })?;
            build(name, f, decode_rows)
        }
    }
}

fn build<T: ChunkReader + 'static>(
    name: &str,
    src: T,
    decode_rows: usize,
) -> Result<(Batches, Option<usize>)> {
    let bad = |m: String| Error::bad_input(name, Location::File, m);
    let builder = ParquetRecordBatchReaderBuilder::try_new(src)
        .map_err(|e| bad(format!("not a readable Parquet file: {e}")))?;
    let schema = builder.schema().clone();
    let rows = usize::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
    let reader = builder
        .with_batch_size(decode_rows.min(rows.max(1)))
        .build()
        .map_err(|e| bad(format!("cannot read Parquet data: {e}")))?;
    let name = name.to_string();
    let batches: Batches = Box::new(reader.map(move |b| {
        b.map_err(|e| Error::bad_input(&name, Location::File, format!("corrupt Parquet data: {e}")))
    }));
    Ok((at_least_one(schema, batches), Some(rows)))
}
