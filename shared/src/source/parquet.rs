//! DMS Parquet files, decoded a batch at a time (row groups are read as they are needed).
//!
//! INT96 timestamps (Spark, Hive and Impala write them; DMS does not) are read as
//! microseconds, the table's unit, so that every instant a microsecond timestamp holds reads
//! exactly (the reader's default, nanoseconds, wraps outside 1677-09-21..2262-04-11:
//! `9999-12-31` read as `1816-03-30`). The microsecond read drops the digits below the
//! microsecond, so the raw values are checked first ([`check_int96`]): such digits fail the
//! file, as any timestamp they would be truncated from does.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::basic::Type as PhysicalType;
use parquet::column::reader::ColumnReader;
use parquet::data_type::Int96;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::ReaderProperties;
use parquet::file::reader::{ChunkReader, RowGroupReader};
use parquet::file::serialized_reader::SerializedRowGroupReader;

use super::{at_least_one, Batches, Body};
use crate::error::{Error, Location, Result};

/// The file's batches, its row count and the sampled columns' first values ([`Opened`]).
pub(super) fn batches(name: &str, body: &Body, decode: &Decode<'_>) -> Result<Opened> {
    let open = |path: &std::path::Path| {
        std::fs::File::open(path).map_err(|e| Error::Io {
            path: name.to_string(),
            source: e,
        })
    };
    let empty = match body {
        Body::Memory(b) => b.is_empty(),
        Body::Disk { path, .. } => {
            open(path)?
                .metadata()
                .map_err(|e| Error::Io {
                    path: name.to_string(),
                    source: e,
                })?
                .len()
                == 0
        }
    };
    if empty {
        return Err(Error::bad_input(
            name,
            Location::File,
            "the file is empty (zero bytes), so not a Parquet file (one ends with its footer and `PAR1`) — remove the object from the source, or put back the file DMS wrote",
        ));
    }
    match body {
        Body::Memory(b) => build(name, || Ok(Bytes::clone(b)), decode),
        Body::Disk { path, .. } => build(name, || open(path), decode),
    }
}

/// How a file is decoded: batches of at most `rows` rows and about `bytes` decoded bytes,
/// without the top-level columns `skip` names (dropped columns nothing else reads: they are
/// never decoded).
pub(super) struct Decode<'a> {
    pub(super) rows: usize,
    pub(super) bytes: usize,
    pub(super) skip: &'a dyn Fn(&str) -> bool,
    /// Top-level columns decoded only until their first value (not in the batches).
    pub(super) sample: &'a [String],
}

/// A file's batches, its row count (when the footer says) and the first non-null value of
/// each [`Decode::sample`] column that has one (a one-row array, by the file's column name).
pub(super) type Opened = (Batches, Option<usize>, Vec<(String, ArrayRef)>);

/// Rows decoded to measure how wide the file's rows are once decoded.
const PROBE_ROWS: usize = 4096;

/// The file's batches (`src` opens it; it is read once, and its first rows once more when
/// [`PROBE_ROWS`] are decoded to measure them).
fn build<T: ChunkReader + 'static>(
    name: &str,
    src: impl Fn() -> Result<T>,
    decode: &Decode<'_>,
) -> Result<Opened> {
    let bad = |m: String| Error::bad_input(name, Location::File, m);
    let unreadable =
        |e: parquet::errors::ParquetError| bad(format!("not a readable Parquet file: {e}"));
    let metadata =
        ArrowReaderMetadata::load(&src()?, ArrowReaderOptions::new()).map_err(unreadable)?;
    check_int96(name, &src, metadata.metadata())?;
    let metadata = match crate::coerce::int96_as_micros(&metadata) {
        Some(schema) => ArrowReaderMetadata::try_new(
            metadata.metadata().clone(),
            ArrowReaderOptions::new().with_schema(schema),
        )
        .map_err(unreadable)?,
        None => metadata,
    };
    let fields = metadata.schema().fields().len();
    let name_of = |i: usize| metadata.schema().field(i).name().as_str();
    let sampled = |c: &str| decode.sample.iter().any(|s| s == c);
    let read: Vec<usize> = (0..fields)
        .filter(|&i| !(decode.skip)(name_of(i)) && !sampled(name_of(i)))
        .collect();
    let sample: Vec<usize> = (0..fields).filter(|&i| sampled(name_of(i))).collect();
    let mask = ProjectionMask::roots(metadata.metadata().file_metadata().schema_descr(), read);
    let rows = usize::try_from(metadata.metadata().file_metadata().num_rows()).unwrap_or(0);
    // A reader of the columns `mask` selects, in batches of `batch` rows, of the row groups
    // `groups` (all when `None`), the first `limit` rows (all when `None`).
    let reader =
        |mask: &ProjectionMask, batch: usize, groups: Option<Vec<usize>>, limit: Option<usize>| {
            let mut b =
                ParquetRecordBatchReaderBuilder::new_with_metadata(src()?, metadata.clone())
                    .with_projection(mask.clone())
                    .with_batch_size(batch.max(1));
            if let Some(g) = groups {
                b = b.with_row_groups(g);
            }
            if let Some(l) = limit {
                b = b.with_limit(l);
            }
            b.build()
                .map_err(|e| bad(format!("cannot read Parquet data: {e}")))
        };
    // Bytes per row once decoded: the larger of the widest row group's uncompressed size per
    // row (an encoded size: a dictionary of short strings is far smaller than its decoded
    // column) and the decoded size of the first rows. A slice is then one decode batch, not
    // batches copied together.
    let mut per_row = widest_row(&metadata);
    if rows > PROBE_ROWS && decode.rows > PROBE_ROWS {
        if let Some(Ok(b)) = reader(&mask, PROBE_ROWS, None, Some(PROBE_ROWS))?.next() {
            per_row = per_row.max(b.get_array_memory_size() / b.num_rows().max(1));
        }
    }
    let by_bytes = (decode.bytes / per_row.max(1)).max(1024);
    let batch = decode.rows.min(by_bytes).min(rows.max(1));
    let groups: Vec<usize> = metadata
        .metadata()
        .row_groups()
        .iter()
        .map(|rg| usize::try_from(rg.num_rows()).unwrap_or(0))
        .collect();
    let readers = reading_order(&groups, rows, batch)
        .into_iter()
        .map(|(part, size)| reader(&mask, size, Some(part.collect()), None))
        .collect::<Result<Vec<_>>>()?;
    let schema = match readers.first() {
        Some(r) => arrow::record_batch::RecordBatchReader::schema(r),
        None => return Err(Error::internal("no Parquet reader built")),
    };
    let first = match sample.is_empty() {
        true => Vec::new(),
        false => {
            let schema = metadata.metadata().file_metadata().schema_descr();
            let r = reader(
                &ProjectionMask::roots(schema, sample),
                PROBE_ROWS,
                None,
                None,
            )?;
            first_values(r).map_err(|e| bad(format!("corrupt Parquet data: {e}")))?
        }
    };
    let name = name.to_string();
    let batches: Batches = Box::new(readers.into_iter().flatten().map(move |b| {
        b.map_err(|e| Error::bad_input(&name, Location::File, format!("corrupt Parquet data: {e}")))
    }));
    Ok((at_least_one(schema, batches), Some(rows), first))
}

/// The widest row group's uncompressed bytes per row.
fn widest_row(metadata: &ArrowReaderMetadata) -> usize {
    metadata
        .metadata()
        .row_groups()
        .iter()
        .map(|rg| {
            let bytes = usize::try_from(rg.total_byte_size()).unwrap_or(0);
            bytes / usize::try_from(rg.num_rows()).unwrap_or(0).max(1)
        })
        .max()
        .unwrap_or(0)
}

/// The first non-null value of each of the reader's columns that has one (a one-row
/// array, with its column's name), reading no further than needed.
fn first_values(
    reader: ParquetRecordBatchReader,
) -> std::result::Result<Vec<(String, ArrayRef)>, arrow::error::ArrowError> {
    let schema = arrow::record_batch::RecordBatchReader::schema(&reader);
    let mut first: Vec<Option<ArrayRef>> = vec![None; schema.fields().len()];
    for batch in reader {
        let batch = batch?;
        for (slot, column) in first.iter_mut().zip(batch.columns()) {
            if slot.is_none() {
                *slot = (0..column.len())
                    .find(|&i| column.is_valid(i))
                    .map(|i| column.slice(i, 1));
            }
        }
        if first.iter().all(Option::is_some) {
            break;
        }
    }
    Ok(schema
        .fields()
        .iter()
        .zip(first)
        .filter_map(|(f, v)| Some((f.name().clone(), v?)))
        .collect())
}

/// Files of at least this many slices start with smaller ones ([`ramp`]).
const RAMP_SLICES: usize = 4;

/// The row groups of a large file's first, smaller slices: about a quarter of a slice, then
/// half, each whole row groups. The first slice is read, planned and only then written
/// while the next is read: a quarter-size one starts both cores working sooner (measured
/// on a 5M-row full load: 0.865 → 0.81 s, docs/benchmarks.md), at the cost of two more
/// slices' files. None when a row group is larger than the part it would start.
fn ramp(groups: &[usize], batch: usize) -> Vec<std::ops::Range<usize>> {
    let mut parts = Vec::new();
    let mut next = 0;
    for target in [batch / 4, batch / 2] {
        let (start, mut rows) = (next, 0);
        while next < groups.len() && rows + groups[next] <= target {
            rows += groups[next];
            next += 1;
        }
        if next == start {
            break;
        }
        parts.push(start..next);
    }
    parts
}

/// The file read as readers of consecutive row groups, each with its batch size: the
/// [`ramp`]'s smaller leading slices (a file of at least [`RAMP_SLICES`] slices), then the
/// rest in slices of `batch` rows.
fn reading_order(
    groups: &[usize],
    rows: usize,
    batch: usize,
) -> Vec<(std::ops::Range<usize>, usize)> {
    let leading = match rows >= RAMP_SLICES * batch {
        true => ramp(groups, batch),
        false => Vec::new(),
    };
    let rest = leading.last().map_or(0, |r| r.end);
    leading
        .into_iter()
        .map(|part| {
            let size = groups[part.clone()].iter().sum();
            (part, size)
        })
        .chain(std::iter::once((rest..groups.len(), batch)))
        .collect()
}

/// Julian day of 1970-01-01.
const JULIAN_DAY_OF_EPOCH: i128 = 2_440_588;
const NANOS_PER_DAY: i128 = 86_400 * 1_000_000_000;

/// An INT96 value as nanoseconds since the epoch, exactly.
fn int96_nanos(v: &Int96) -> i128 {
    let d = v.data();
    // As the parquet crate reads them: the day (signed) and the nanoseconds into it.
    let day = i128::from(d[2] as i32);
    let nanos = i128::from(((u64::from(d[1]) << 32) | u64::from(d[0])) as i64);
    (day - JULIAN_DAY_OF_EPOCH) * NANOS_PER_DAY + nanos
}

/// An instant in nanoseconds since the epoch, as text (or as the number when chrono cannot
/// write it).
fn instant(nanos: i128) -> String {
    let secs = nanos.div_euclid(1_000_000_000);
    let sub = nanos.rem_euclid(1_000_000_000);
    i64::try_from(secs)
        .ok()
        .and_then(|s| chrono::DateTime::from_timestamp(s, u32::try_from(sub).ok()?))
        .map(|t| t.format("%Y-%m-%d %H:%M:%S%.9f").to_string())
        .unwrap_or_else(|| format!("{nanos} ns from 1970-01-01"))
}

/// Why an INT96 value cannot be read exactly, if it cannot: a top-level column is read as
/// microseconds (digits below the microsecond would be dropped; the range is ±292,000
/// years), a nested one as nanoseconds (1677-09-21..2262-04-11).
fn int96_problem(v: &Int96, top_level: bool) -> Option<String> {
    let nanos = int96_nanos(v);
    if top_level {
        if nanos % 1_000 != 0 {
            return Some(format!(
                "INT96 timestamp {} has digits below the microsecond; the table stores microseconds and nothing is truncated",
                instant(nanos)
            ));
        }
        if i64::try_from(nanos / 1_000).is_err() {
            return Some(format!(
                "INT96 timestamp {} is outside the range of a microsecond timestamp",
                instant(nanos)
            ));
        }
    } else if i64::try_from(nanos).is_err() {
        return Some(format!(
            "INT96 timestamp {} in a nested column is outside 1677-09-21..2262-04-11, the range of the nanoseconds such values are read as (top-level INT96 columns are read in microseconds)",
            instant(nanos)
        ));
    }
    None
}

/// Values read at a time by [`check_int96`].
const INT96_CHUNK: usize = 64 * 1024;

/// Every INT96 value of the file can be read exactly ([`int96_problem`]); else the file
/// fails, naming the row (of a top-level column) and the column. Reads only the INT96
/// columns' raw values, and only in files that have such columns.
fn check_int96<T: ChunkReader + 'static>(
    name: &str,
    src: impl Fn() -> Result<T>,
    metadata: &ParquetMetaData,
) -> Result<()> {
    let bad = |location: Location, m: String| Error::bad_input(name, location, m);
    // The footer already parsed (`metadata`): the file is opened again only for the values
    // of its INT96 columns, which DMS never writes.
    let descr = metadata.file_metadata().schema_descr_ptr();
    let columns: Vec<usize> = (0..descr.num_columns())
        .filter(|&i| descr.column(i).physical_type() == PhysicalType::INT96)
        .collect();
    if columns.is_empty() {
        return Ok(());
    }
    let file = Arc::new(src()?);
    let props = Arc::new(ReaderProperties::builder().build());
    let corrupt = |e: parquet::errors::ParquetError| {
        bad(Location::File, format!("corrupt Parquet data: {e}"))
    };
    let mut first_row = 0usize;
    for rg in metadata.row_groups() {
        let group = SerializedRowGroupReader::new(Arc::clone(&file), rg, None, Arc::clone(&props))
            .map_err(corrupt)?;
        for &c in &columns {
            let column = descr.column(c);
            let top_level = column.path().parts().len() == 1;
            let column_name = column.path().string();
            let max_def = column.max_def_level();
            let ColumnReader::Int96ColumnReader(mut values_reader) =
                group.get_column_reader(c).map_err(corrupt)?
            else {
                return Err(Error::internal("an INT96 column without an INT96 reader"));
            };
            let mut row = first_row;
            let mut defs: Vec<i16> = Vec::with_capacity(INT96_CHUNK);
            let mut reps: Vec<i16> = Vec::with_capacity(INT96_CHUNK);
            let mut values: Vec<Int96> = Vec::with_capacity(INT96_CHUNK);
            loop {
                defs.clear();
                reps.clear();
                values.clear();
                let (records, _, levels) = values_reader
                    .read_records(
                        INT96_CHUNK,
                        (max_def > 0).then_some(&mut defs),
                        (column.max_rep_level() > 0).then_some(&mut reps),
                        &mut values,
                    )
                    .map_err(corrupt)?;
                if records == 0 && levels == 0 {
                    break;
                }
                // Each value's row (top level: one level per row, a value where it is
                // defined).
                let rows_of_values: Vec<usize> = if max_def == 0 {
                    (0..values.len()).map(|i| row + i).collect()
                } else {
                    defs.iter()
                        .enumerate()
                        .filter(|(_, d)| **d == max_def)
                        .map(|(i, _)| row + i)
                        .collect()
                };
                for (v, r) in values.iter().zip(rows_of_values) {
                    if let Some(why) = int96_problem(v, top_level) {
                        let location = if top_level {
                            Location::Row {
                                row: r + 1,
                                column: Some(column_name.clone()),
                            }
                        } else {
                            Location::Column(column_name.clone())
                        };
                        return Err(bad(location, why));
                    }
                }
                row += records;
            }
        }
        first_row += usize::try_from(group.metadata().num_rows()).unwrap_or(0);
    }
    Ok(())
}
