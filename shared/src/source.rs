//! CDC readers: turn one DMS file (Parquet or CSV, full load or CDC) into a [`ChangeSet`]:
//! the rows with only the curated columns, each row's operation, and each row's order key.
//!
//! Every problem names the file and, where it applies, the row and column.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray, StringBuilder};
use arrow::compute::{cast_with_options, concat_batches, CastOptions};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::util::display::FormatOptions;
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use url::Url;

use crate::config::{CsvOptions, Format, TableConfig};
use crate::error::{Error, Location, Result};
use crate::storage;

/// Whether a file is part of the full load (`LOAD*`) or a CDC file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    FullLoad,
    Cdc,
}

impl FileKind {
    /// DMS names full-load files `LOAD00000001.*`; everything else is CDC.
    pub fn of(file_name: &str) -> FileKind {
        if file_name.starts_with("LOAD") {
            FileKind::FullLoad
        } else {
            FileKind::Cdc
        }
    }
}

/// What a row does to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeOp {
    Insert,
    Update,
    Delete,
}

/// Counts of one file's rows by operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FileCounts {
    pub rows: usize,
    pub inserts: usize,
    pub updates: usize,
    pub deletes: usize,
}

/// One file's changes, ready for merge planning.
#[derive(Debug, Clone)]
pub struct ChangeSet {
    pub file: Url,
    pub kind: FileKind,
    /// Curated columns only (op and dropped columns removed), cast to the table's types.
    pub data: RecordBatch,
    pub ops: Vec<ChangeOp>,
    /// Order key per row: larger means later. See `docs/design.md`.
    pub order: Vec<String>,
    pub counts: FileCounts,
}

/// Whether an object is a data file of this format (DMS also writes folder markers etc.).
pub fn is_data_file(url: &Url, format: &Format) -> bool {
    let name = storage::file_name(url).to_ascii_lowercase();
    match format {
        Format::Parquet => name.ends_with(".parquet"),
        Format::Csv(_) => name.ends_with(".csv"),
    }
}

/// Parse one file's bytes. `table_schema` is the Delta table's current Arrow schema, when
/// the table exists: columns it has are cast to its types.
pub fn read_changes(
    file: &Url,
    bytes: Bytes,
    table: &TableConfig,
    table_schema: Option<&Schema>,
) -> Result<ChangeSet> {
    let name = storage::display(file);
    let kind = FileKind::of(&storage::file_name(file));
    let raw = match &table.format {
        Format::Parquet => read_parquet(&name, bytes)?,
        Format::Csv(opts) => read_csv(&name, bytes, opts, kind, table, table_schema)?,
    };
    to_change_set(file, &name, kind, raw, table, table_schema)
}

fn read_parquet(name: &str, bytes: Bytes) -> Result<RecordBatch> {
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

fn read_csv(
    name: &str,
    bytes: Bytes,
    opts: &CsvOptions,
    kind: FileKind,
    table: &TableConfig,
    table_schema: Option<&Schema>,
) -> Result<RecordBatch> {
    let bad = |m: String| Error::bad_input(name, Location::File, m);
    let format = arrow::csv::reader::Format::default()
        .with_header(opts.header)
        .with_delimiter(opts.delimiter)
        .with_quote(opts.quote);
    let names: Vec<String> = if opts.header {
        let (inferred, _) = format
            .infer_schema(std::io::Cursor::new(&bytes), Some(0))
            .map_err(|e| bad(format!("cannot read the CSV header: {e}")))?;
        inferred.fields().iter().map(|f| f.name().clone()).collect()
    } else {
        let with_op = kind == FileKind::Cdc || opts.include_op_for_full_load;
        with_op
            .then(|| table.op_column.clone())
            .into_iter()
            .chain(opts.columns.iter().map(|c| c.name.clone()))
            .collect()
    };
    // Everything is read as text first, so that a value that does not parse can be reported
    // with its row, column and text.
    let text_schema = Arc::new(Schema::new(
        names
            .iter()
            .map(|n| Field::new(n, DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ));
    let null_regex = regex::Regex::new(&format!("^{}$", regex::escape(&opts.null_value)))
        .map_err(|e| Error::Internal(format!("null marker regex: {e}")))?;
    let reader = arrow::csv::ReaderBuilder::new(text_schema.clone())
        .with_header(opts.header)
        .with_delimiter(opts.delimiter)
        .with_quote(opts.quote)
        .with_null_regex(null_regex)
        .with_batch_size(64 * 1024)
        .build(std::io::Cursor::new(bytes))
        .map_err(|e| bad(format!("cannot read CSV: {e}")))?;
    let mut batches = Vec::new();
    for b in reader {
        batches.push(b.map_err(|e| {
            bad(format!(
                "malformed CSV (expected {} fields per line: {}): {e}",
                names.len(),
                names.join(", ")
            ))
        })?);
    }
    let text = concat_batches(&text_schema, &batches)
        .map_err(|e| bad(format!("cannot combine CSV batches: {e}")))?;
    // Now type each column: configured type, else the table's type, else text.
    let mut fields = Vec::with_capacity(names.len());
    let mut columns = Vec::with_capacity(names.len());
    for (i, n) in names.iter().enumerate() {
        let target = opts
            .columns
            .iter()
            .find(|c| &c.name == n)
            .map(|c| c.data_type.clone())
            .or_else(|| {
                table_schema
                    .and_then(|s| s.field_with_name(n).ok())
                    .map(|f| f.data_type().clone())
            })
            .unwrap_or(DataType::Utf8);
        let col = cast_reporting(name, n, text.column(i), &target)?;
        fields.push(Field::new(n, target, true));
        columns.push(col);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| bad(format!("cannot assemble columns: {e}")))
}

/// Cast a column; on failure report the first row whose value does not convert.
fn cast_reporting(file: &str, column: &str, array: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
    if array.data_type() == to {
        return Ok(array.clone());
    }
    let strict = CastOptions {
        safe: false,
        format_options: FormatOptions::default(),
    };
    match cast_with_options(array, to, &strict) {
        Ok(a) => Ok(a),
        Err(e) => {
            let lenient = cast_with_options(array, to, &CastOptions::default()).ok();
            let row = lenient
                .as_ref()
                .and_then(|l| (0..array.len()).find(|&i| array.is_valid(i) && l.is_null(i)));
            let location = match row {
                Some(r) => Location::Row {
                    row: r + 1,
                    column: Some(column.to_string()),
                },
                None => Location::Column(column.to_string()),
            };
            let value = row
                .and_then(|r| arrow::util::display::array_value_to_string(array, r).ok())
                .map(|v| format!("value {v:?} "))
                .unwrap_or_default();
            Err(Error::bad_input(
                file,
                location,
                format!(
                    "{value}cannot be converted from {} to {to}: {e}",
                    array.data_type()
                ),
            ))
        }
    }
}

/// The type a new column gets in the Delta table (Delta has no unsigned, time-of-day or
/// nanosecond types; timestamps become `timestamp` (UTC), as Spark writes them).
pub fn delta_type(dt: &DataType) -> Option<DataType> {
    Some(match dt {
        DataType::Null | DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        DataType::Time32(_) | DataType::Time64(_) => DataType::Utf8,
        DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_) => {
            DataType::Binary
        }
        DataType::UInt8 => DataType::Int16,
        DataType::UInt16 => DataType::Int32,
        DataType::UInt32 => DataType::Int64,
        DataType::UInt64 => DataType::Decimal128(20, 0),
        DataType::Float16 => DataType::Float32,
        DataType::Date64 => DataType::Date32,
        DataType::Timestamp(_, _) => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        DataType::Dictionary(_, v) => return delta_type(v),
        DataType::Boolean
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::Float32
        | DataType::Float64
        | DataType::Utf8
        | DataType::Binary
        | DataType::Date32
        | DataType::Decimal128(_, _) => dt.clone(),
        _ => return None,
    })
}

fn to_change_set(
    file: &Url,
    name: &str,
    kind: FileKind,
    raw: RecordBatch,
    table: &TableConfig,
    table_schema: Option<&Schema>,
) -> Result<ChangeSet> {
    let schema = raw.schema();
    let col = |n: &str| schema.index_of(n).ok().map(|i| raw.column(i).clone());
    let rows = raw.num_rows();

    if schema.index_of(&table.sequence_column).is_ok() {
        return Err(Error::bad_input(
            name,
            Location::Column(table.sequence_column.clone()),
            "the file has a column with the name of tributary's internal sequence column; set `sequence_column` in the table config to another name",
        ));
    }

    // Operations.
    let mut counts = FileCounts {
        rows,
        ..Default::default()
    };
    let ops: Vec<ChangeOp> = match col(&table.op_column) {
        Some(a) => {
            let a = cast_reporting(name, &table.op_column, &a, &DataType::Utf8)?;
            let a = a.as_string::<i32>();
            let mut ops = Vec::with_capacity(rows);
            for i in 0..rows {
                if a.is_null(i) {
                    return Err(Error::bad_input(
                        name,
                        Location::Row { row: i + 1, column: Some(table.op_column.clone()) },
                        "operation is null (expected I, U or D)",
                    ));
                }
                let op = match a.value(i).trim() {
                    "I" | "i" => ChangeOp::Insert,
                    "U" | "u" => ChangeOp::Update,
                    "D" | "d" => ChangeOp::Delete,
                    other => {
                        return Err(Error::bad_input(
                            name,
                            Location::Row { row: i + 1, column: Some(table.op_column.clone()) },
                            format!("unknown operation {other:?} (expected I, U or D)"),
                        ))
                    }
                };
                ops.push(op);
            }
            ops
        }
        None if kind == FileKind::FullLoad => vec![ChangeOp::Insert; rows],
        None => {
            return Err(Error::bad_input(
                name,
                Location::Column(table.op_column.clone()),
                format!(
                    "CDC file has no `{}` column (columns: {}); DMS CDC files carry the operation (I/U/D) first — check `op_column`, or name full-load files LOAD*",
                    table.op_column,
                    column_list(&schema)
                ),
            ))
        }
    };
    for op in &ops {
        match op {
            ChangeOp::Insert => counts.inserts += 1,
            ChangeOp::Update => counts.updates += 1,
            ChangeOp::Delete => counts.deletes += 1,
        }
    }

    // Keys must be present and non-null.
    for k in &table.primary_key {
        let a = col(k).ok_or_else(|| {
            Error::bad_input(
                name,
                Location::Column(k.clone()),
                format!(
                    "primary key column is missing (columns: {})",
                    column_list(&schema)
                ),
            )
        })?;
        if a.null_count() > 0 {
            let r = (0..rows).find(|&i| a.is_null(i)).unwrap_or(0);
            return Err(Error::bad_input(
                name,
                Location::Row {
                    row: r + 1,
                    column: Some(k.clone()),
                },
                "primary key is null",
            ));
        }
    }

    // Order keys.
    let file_name = storage::file_name(file);
    let order = match kind {
        FileKind::FullLoad => (0..rows)
            .map(|i| format!("0 {file_name} {:010}", i + 1))
            .collect(),
        FileKind::Cdc => {
            let mut parts: Vec<Vec<String>> = Vec::with_capacity(table.sequence_by.len());
            for s in &table.sequence_by {
                let a = col(s).ok_or_else(|| {
                    Error::bad_input(
                        name,
                        Location::Column(s.clone()),
                        format!(
                            "sequence column (from `sequence_by`) is missing (columns: {})",
                            column_list(&schema)
                        ),
                    )
                })?;
                parts.push(sequence_strings(name, s, &a)?);
            }
            (0..rows)
                .map(|i| {
                    let mut o = String::with_capacity(64);
                    o.push('1');
                    for p in &parts {
                        o.push(' ');
                        o.push_str(&p[i]);
                    }
                    o.push(' ');
                    o.push_str(&file_name);
                    o.push_str(&format!(" {:010}", i + 1));
                    o
                })
                .collect()
        }
    };

    // Curated columns, cast to the table's types (or to Delta types for new columns).
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (i, f) in schema.fields().iter().enumerate() {
        if !table.keeps_column(f.name()) {
            continue;
        }
        let target = match table_schema.and_then(|s| s.field_with_name(f.name()).ok()) {
            Some(tf) => tf.data_type().clone(),
            None => delta_type(f.data_type()).ok_or_else(|| {
                Error::bad_input(
                    name,
                    Location::Column(f.name().clone()),
                    format!(
                        "type {} has no Delta Lake equivalent; drop the column with `drop_columns`",
                        f.data_type()
                    ),
                )
            })?,
        };
        let c = cast_reporting(name, f.name(), raw.column(i), &target)?;
        fields.push(Field::new(f.name(), target, true));
        columns.push(c);
    }
    for p in &table.partition_by {
        if !fields.iter().any(|f| f.name() == p) {
            return Err(Error::bad_input(
                name,
                Location::Column(p.clone()),
                format!(
                    "partition column is missing (columns: {})",
                    column_list(&schema)
                ),
            ));
        }
    }
    let data = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| {
        Error::bad_input(
            name,
            Location::File,
            format!("cannot assemble columns: {e}"),
        )
    })?;
    Ok(ChangeSet {
        file: file.clone(),
        kind,
        data,
        ops,
        order,
        counts,
    })
}

fn column_list(schema: &SchemaRef) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Render a sequence column so that string order equals value order.
fn sequence_strings(file: &str, column: &str, a: &ArrayRef) -> Result<Vec<String>> {
    if let Some(r) = (0..a.len()).find(|&i| a.is_null(i)) {
        return Err(Error::bad_input(
            file,
            Location::Row {
                row: r + 1,
                column: Some(column.to_string()),
            },
            "sequence value is null; every CDC row needs it to be ordered",
        ));
    }
    let int_key = |v: i128| format!("{:020}", v + (1i128 << 63));
    let out = match a.data_type() {
        DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Date32
        | DataType::Date64 => {
            let s = cast_reporting(file, column, a, &DataType::Utf8)?;
            let s: &StringArray = s.as_string::<i32>();
            (0..s.len()).map(|i| s.value(i).to_string()).collect()
        }
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32 => {
            let s = cast_reporting(file, column, a, &DataType::Int64)?;
            let s = s.as_primitive::<arrow::datatypes::Int64Type>();
            (0..s.len()).map(|i| int_key(s.value(i) as i128)).collect()
        }
        DataType::UInt64 => {
            let s = a.as_primitive::<arrow::datatypes::UInt64Type>();
            (0..s.len()).map(|i| int_key(s.value(i) as i128)).collect()
        }
        DataType::Timestamp(_, _) => {
            let s = cast_reporting(
                file,
                column,
                a,
                &DataType::Timestamp(TimeUnit::Microsecond, None),
            )?;
            let s = s.as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
            (0..s.len())
                .map(
                    |i| match chrono::DateTime::from_timestamp_micros(s.value(i)) {
                        Some(t) => t.format("%Y-%m-%d %H:%M:%S%.6f").to_string(),
                        None => int_key(s.value(i) as i128),
                    },
                )
                .collect()
        }
        other => {
            return Err(Error::bad_input(
                file,
                Location::Column(column.to_string()),
                format!(
                "sequence column has type {other}; use a string, integer, date or timestamp column"
            ),
            ))
        }
    };
    Ok(out)
}

/// Build a Utf8 array from strings (helper for planning).
pub(crate) fn string_array<'a>(values: impl Iterator<Item = &'a str>) -> ArrayRef {
    let mut b = StringBuilder::new();
    for v in values {
        b.append_value(v);
    }
    Arc::new(b.finish())
}
