//! DMS CSV files, plain or gzip-compressed (`CompressionType=GZIP` writes `*.csv.gz`).

use std::io::Read;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Field, Schema};
use bytes::Bytes;

use crate::config::{CsvOptions, TableConfig};
use crate::error::{Error, Location, Result};
use crate::source::{convert, FileKind};

/// The file's text: gunzipped when the name ends in `.gz` (a corrupt stream is an error).
pub(super) fn decompress(name: &str, file_name: &str, bytes: Bytes) -> Result<Bytes> {
    if !file_name.to_ascii_lowercase().ends_with(".gz") {
        return Ok(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len() * 4);
    flate2::read::MultiGzDecoder::new(bytes.as_ref())
        .read_to_end(&mut out)
        .map_err(|e| {
            Error::bad_input(
                name,
                Location::File,
                format!("not a readable gzip file: {e}"),
            )
        })?;
    Ok(Bytes::from(out))
}

/// The column names of the file: from the header, or `Op` (when the file carries it) and the
/// configured columns.
fn column_names(
    name: &str,
    bytes: &Bytes,
    opts: &CsvOptions,
    kind: FileKind,
    table: &TableConfig,
) -> Result<Vec<String>> {
    if opts.header {
        let format = arrow::csv::reader::Format::default()
            .with_header(true)
            .with_delimiter(opts.delimiter)
            .with_quote(opts.quote);
        let (inferred, _) = format
            .infer_schema(std::io::Cursor::new(bytes), Some(0))
            .map_err(|e| {
                Error::bad_input(
                    name,
                    Location::File,
                    format!("cannot read the CSV header: {e}"),
                )
            })?;
        return Ok(inferred.fields().iter().map(|f| f.name().clone()).collect());
    }
    let with_op = kind == FileKind::Cdc || opts.include_op_for_full_load;
    Ok(with_op
        .then(|| table.op_column.clone())
        .into_iter()
        .chain(opts.columns.iter().map(|c| c.name.clone()))
        .collect())
}

/// Read every field as text (so that a value that does not parse can be reported with its
/// row, column and text), then type each column exactly: configured type, else the table's
/// type, else text.
pub(super) fn read(
    name: &str,
    bytes: Bytes,
    opts: &CsvOptions,
    kind: FileKind,
    table: &TableConfig,
    table_schema: Option<&Schema>,
) -> Result<RecordBatch> {
    let bad = |m: String| Error::bad_input(name, Location::File, m);
    let names = column_names(name, &bytes, opts, kind, table)?;
    let text_schema = Arc::new(Schema::new(
        names
            .iter()
            .map(|n| Field::new(n, DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ));
    let null_regex = regex::Regex::new(&format!("^{}$", regex::escape(&opts.null_value)))
        .map_err(|e| bad(format!("the null marker cannot be matched: {e}")))?;
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
        columns.push(convert(name, n, text.column(i), &target)?);
        fields.push(Field::new(n, target, true));
    }
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(text.num_rows())),
    )
    .map_err(|e| bad(format!("cannot assemble columns: {e}")))
}
