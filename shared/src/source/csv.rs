//! DMS CSV files, plain or gzip-compressed (`CompressionType=GZIP` writes `*.csv.gz`).

use std::io::Read;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema};

use super::{at_least_one, Batches, Body};
use crate::config::{CsvOptions, TableConfig};
use crate::error::{Error, Location, Result};
use crate::source::{convert, FileKind};

/// A reader over the file's text: gunzipped when the name ends in `.gz`.
fn text(name: &str, file_name: &str, body: &Body) -> Result<Box<dyn Read + Send>> {
    let r = body.reader(name)?;
    if file_name.to_ascii_lowercase().ends_with(".gz") {
        Ok(Box::new(flate2::read::MultiGzDecoder::new(r)))
    } else {
        Ok(r)
    }
}

/// The column names of the file: from the header, or `Op` (when the file carries it) and the
/// configured columns.
fn column_names(
    name: &str,
    text: impl Read,
    opts: &CsvOptions,
    kind: FileKind,
    table: &TableConfig,
) -> Result<Vec<String>> {
    if opts.header(kind) {
        let format = arrow::csv::reader::Format::default()
            .with_header(true)
            .with_delimiter(opts.delimiter)
            .with_quote(opts.quote);
        let (inferred, _) = format.infer_schema(text, Some(0)).map_err(|e| {
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

/// The file's batches: every field read as text (so that a value that does not parse can be
/// reported with its row, column and text), then each column typed exactly: configured
/// type, else the table's type, else text.
/// A CSV object to read.
pub(super) struct Input<'a> {
    /// For messages.
    pub(super) name: &'a str,
    /// `*.gz` is gunzipped.
    pub(super) file_name: &'a str,
    pub(super) body: &'a Body,
}

/// Each column's type: configured, else the table's, else text.
fn target_types(
    names: &[String],
    opts: &CsvOptions,
    table_schema: Option<&Schema>,
) -> Vec<DataType> {
    names
        .iter()
        .map(|n| {
            opts.columns
                .iter()
                .find(|c| &c.name == n)
                .map(|c| c.data_type.clone())
                .or_else(|| {
                    table_schema
                        .and_then(|s| s.field_with_name(n).ok())
                        .map(|f| f.data_type().clone())
                })
                .unwrap_or(DataType::Utf8)
        })
        .collect()
}

/// The error text of a batch the CSV reader could not decode.
fn read_error(gz: bool, e: arrow::error::ArrowError, names: &[String]) -> String {
    let m = e.to_string();
    if gz && (m.contains("gzip") || m.contains("deflate") || m.contains("invalid")) {
        format!("not a readable gzip file: {m}")
    } else {
        format!(
            "malformed CSV (expected {} fields per line: {}): {m}",
            names.len(),
            names.join(", ")
        )
    }
}

pub(super) fn batches(
    input: Input<'_>,
    opts: &CsvOptions,
    kind: FileKind,
    table: &TableConfig,
    table_schema: Option<&Schema>,
    decode_rows: usize,
) -> Result<Batches> {
    let Input {
        name,
        file_name,
        body,
    } = input;
    let gz = file_name.to_ascii_lowercase().ends_with(".gz");
    let bad = |m: String| Error::bad_input(name, Location::File, m);
    let names = column_names(name, text(name, file_name, body)?, opts, kind, table).map_err(
        |e| match e {
            Error::BadInput { message, .. } if gz => bad(format!(
                "not a readable gzip file, or no CSV header: {message}"
            )),
            e => e,
        },
    )?;
    let text_schema = Arc::new(Schema::new(
        names
            .iter()
            .map(|n| Field::new(n, DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ));
    let null_regex = regex::Regex::new(&format!("^{}$", regex::escape(&opts.null_value)))
        .map_err(|e| bad(format!("the null marker cannot be matched: {e}")))?;
    let reader = arrow::csv::ReaderBuilder::new(text_schema.clone())
        .with_header(opts.header(kind))
        .with_delimiter(opts.delimiter)
        .with_quote(opts.quote)
        .with_null_regex(null_regex)
        .with_batch_size(decode_rows)
        .build(text(name, file_name, body)?)
        .map_err(|e| bad(format!("cannot read CSV: {e}")))?;
    let targets = target_types(&names, opts, table_schema);
    let typed_schema = Arc::new(Schema::new(
        names
            .iter()
            .zip(&targets)
            .map(|(n, t)| Field::new(n, t.clone(), true))
            .collect::<Vec<_>>(),
    ));
    let empty_schema = typed_schema.clone();
    let name = name.to_string();
    let mut offset = 0usize;
    let typed = reader.map(move |b| {
        let text =
            b.map_err(|e| Error::bad_input(&name, Location::File, read_error(gz, e, &names)))?;
        let rows = text.num_rows();
        let columns = names
            .iter()
            .zip(&targets)
            .enumerate()
            .map(|(i, (n, t))| convert(&name, n, text.column(i), t))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| e.shift_rows(offset))?;
        offset += rows;
        RecordBatch::try_new_with_options(
            typed_schema.clone(),
            columns,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .map_err(|e| {
            Error::bad_input(
                &name,
                Location::File,
                format!("cannot assemble columns: {e}"),
            )
        })
    });
    Ok(at_least_one(empty_schema, Box::new(typed)))
}
