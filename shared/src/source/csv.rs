//! DMS CSV files, plain or gzip-compressed (`CompressionType=GZIP` writes `*.csv.gz`).

use std::io::Read;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::Spec;
use super::{at_least_one, Batches, Body, ABSENT_COLUMN, ABSENT_SEPARATOR, RESERVED_PREFIX};
use crate::config::CsvOptions;
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
    table: &Spec,
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

/// A file with no bytes, or only whitespace (also once decompressed) is refused by name.
fn refuse_empty(name: &str, file_name: &str, body: &Body, header: bool) -> Result<()> {
    let gz = file_name.to_ascii_lowercase().ends_with(".gz");
    let raw_blank = is_blank(body.reader(name)?);
    let blank = raw_blank || (gz && is_blank(text(name, file_name, body)?));
    if !blank {
        return Ok(());
    }
    Err(Error::bad_input(
        name,
        Location::File,
        format!(
            "the file is empty ({}); a DMS CSV file has {} — remove the object from the source, or put back the file DMS wrote",
            if raw_blank {
                "zero bytes, or only whitespace"
            } else {
                "its decompressed text is zero bytes, or only whitespace"
            },
            if header {
                "a header and at least one row"
            } else {
                "at least one row"
            }
        ),
    ))
}

/// The schema of the decoded batches: each column in its target type, then the column of
/// values absent from the source's log when `no_sup_value` is set.
fn typed_schema(names: &[String], targets: &[DataType], absent: bool) -> SchemaRef {
    Arc::new(Schema::new(
        names
            .iter()
            .zip(targets)
            .map(|(n, t)| Field::new(n, t.clone(), true))
            .chain(absent.then(|| Field::new(ABSENT_COLUMN, DataType::Utf8, true)))
            .collect::<Vec<_>>(),
    ))
}

pub(super) fn batches(
    input: Input<'_>,
    opts: &CsvOptions,
    kind: FileKind,
    table: &Spec,
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
    refuse_empty(name, file_name, body, opts.header(kind))?;
    let names = column_names(name, text(name, file_name, body)?, opts, kind, table).map_err(
        |e| match e {
            Error::BadInput { message, .. } if gz => bad(format!(
                "not a readable gzip file, or no CSV header: {message}"
            )),
            e => e,
        },
    )?;
    if opts.header(kind) {
        headerless_data(name, &names, kind, table)?;
    }
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
    let checks = NoSupChecks::new(opts, &names, table);
    if checks.value.is_some() && names.iter().any(|n| n == ABSENT_COLUMN) {
        return Err(Error::bad_input(
            name,
            Location::Column(ABSENT_COLUMN.to_string()),
            format!("column names starting with `{RESERVED_PREFIX}` are reserved for tributary's own columns; rename the column at the source"),
        ));
    }
    let typed_schema = typed_schema(&names, &targets, checks.value.is_some());
    let empty_schema = typed_schema.clone();
    let header = opts.header(kind);
    let name = name.to_string();
    let mut offset = 0usize;
    let typed = reader.map(move |b| {
        let text =
            b.map_err(|e| Error::bad_input(&name, Location::File, read_error(gz, e, &names)))?;
        let rows = text.num_rows();
        if offset == 0 && !header {
            header_row(&name, &text, &names, kind)?;
        }
        let (text, absent) = no_sup(&name, text, &checks).map_err(|e| e.shift_rows(offset))?;
        let mut columns = names
            .iter()
            .zip(&targets)
            .enumerate()
            .map(|(i, (n, t))| convert(&name, n, text.column(i), t))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| e.shift_rows(offset))?;
        columns.extend(absent);
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

/// Whether the text is empty or only whitespace (reads up to the first other byte). A text
/// that cannot be read is not called blank: reading it fails with its own error.
fn is_blank(mut text: impl Read) -> bool {
    let mut buf = [0u8; 8192];
    loop {
        match text.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => {
                if !buf[..n].iter().all(u8::is_ascii_whitespace) {
                    return false;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// A CDC file read with a header whose "header" has no operation column but starts with
/// an operation: its first line is a change (`U,100462,…`), the file has no header.
fn headerless_data(name: &str, names: &[String], kind: FileKind, table: &Spec) -> Result<()> {
    let looks_like_op = names
        .first()
        .is_some_and(|n| matches!(n.trim(), "I" | "U" | "D" | "i" | "u" | "d"));
    if kind == FileKind::Cdc && looks_like_op && !names.contains(&table.op_column) {
        return Err(Error::bad_input(
            name,
            Location::Row {
                row: 1,
                column: None,
            },
            format!(
                "the first line (`{}`) reads as a change, not a header (it has no `{}` column and starts with an operation): set csv.cdc_header = false and list csv.columns for this table",
                preview(names),
                table.op_column
            ),
        ));
    }
    Ok(())
}

/// A header row in a file read without one: row 1's values are the file's column names
/// (ignoring case and surrounding spaces). Without this check it fails as a type error on
/// row 1, or, in text columns, merges as a row.
fn header_row(name: &str, text: &RecordBatch, names: &[String], kind: FileKind) -> Result<()> {
    if text.num_rows() == 0 || names.is_empty() {
        return Ok(());
    }
    let first: Vec<Option<&str>> = text
        .columns()
        .iter()
        .map(|c| {
            let c = c.as_string::<i32>();
            (!c.is_null(0)).then(|| c.value(0))
        })
        .collect();
    let same = first
        .iter()
        .zip(names)
        .all(|(v, n)| v.is_some_and(|v| v.trim().eq_ignore_ascii_case(n.trim())));
    if !same {
        return Ok(());
    }
    let field = match kind {
        FileKind::FullLoad => "csv.full_load_header",
        FileKind::Cdc => "csv.cdc_header",
    };
    Err(Error::bad_input(
        name,
        Location::Row {
            row: 1,
            column: None,
        },
        format!(
            "row 1 looks like a header (`{}`) but the file is read without one: set {field} = true (or csv.header = true when every file of the table has one) for this table",
            preview(names)
        ),
    ))
}

/// Column names as a CSV line, cut after a few.
fn preview(names: &[String]) -> String {
    let mut s = names.iter().take(8).cloned().collect::<Vec<_>>().join(",");
    if names.len() > 8 {
        s.push_str(",…");
    }
    s
}

/// What the DMS "not in the supplemental log" placeholder (`csv.no_sup_value`) is looked
/// for in: every column but the operation.
struct NoSupChecks {
    value: Option<String>,
    /// (index, name, role) of each column looked at.
    columns: Vec<(usize, String, Role)>,
}

/// What a column is to the table: what its placeholder means.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A primary key column: a change without its key cannot be applied.
    Key,
    /// A `sequence_by` column: a change without it cannot be ordered.
    Sequence,
    /// A `partition_by` column: a change without it cannot be placed (as a file without
    /// it cannot).
    Partition,
    /// A column of the table: the value is not known, the column keeps its value.
    Value,
    /// A dropped column: the placeholder is only kept from failing its type.
    Dropped,
}

impl NoSupChecks {
    fn new(opts: &CsvOptions, names: &[String], table: &Spec) -> NoSupChecks {
        let columns = names
            .iter()
            .enumerate()
            .filter(|(_, n)| **n != table.op_column)
            .map(|(i, n)| {
                let role = if table.primary_key.contains(n) {
                    Role::Key
                } else if table.sequence_by.contains(n) {
                    Role::Sequence
                } else if table.partition_by.contains(n) {
                    Role::Partition
                } else if table.keeps_column(n) {
                    Role::Value
                } else {
                    Role::Dropped
                };
                (i, n.clone(), role)
            })
            .collect();
        NoSupChecks {
            value: opts.no_sup_value.clone(),
            columns,
        }
    }
}

/// The placeholder DMS writes for a column that is not in the supplemental log
/// (`UseCsvNoSupValue`) is not a value. In a column of the table it becomes null and the
/// row's entry in [`ABSENT_COLUMN`] names the column (the change leaves it as it was:
/// [`super::ChangeSet::absent`]); in a key, sequence or partition column it fails the file
/// (the first row holding it, its column named); in a dropped column it is null.
fn no_sup(
    name: &str,
    text: RecordBatch,
    checks: &NoSupChecks,
) -> Result<(RecordBatch, Option<ArrayRef>)> {
    let Some(ns) = checks.value.as_deref() else {
        return Ok((text, None));
    };
    let rows = text.num_rows();
    let mut columns = text.columns().to_vec();
    let mut absent: Vec<Vec<&str>> = Vec::new();
    let mut failure: Option<(usize, &str, Role)> = None;
    for (i, n, role) in &checks.columns {
        let c = text.column(*i).as_string::<i32>();
        let hits: BooleanArray = (0..rows)
            .map(|r| Some(!c.is_null(r) && c.value(r) == ns))
            .collect();
        let Some(first) = (0..rows).find(|&r| hits.value(r)) else {
            continue;
        };
        match role {
            Role::Key | Role::Sequence | Role::Partition => {
                if failure.is_none_or(|(r, _, _)| first < r) {
                    failure = Some((first, n, *role));
                }
                continue;
            }
            Role::Value => {
                absent.resize_with(rows, Vec::new);
                for r in (first..rows).filter(|&r| hits.value(r)) {
                    absent[r].push(n);
                }
            }
            Role::Dropped => {}
        }
        columns[*i] = arrow::compute::nullif(&columns[*i], &hits).map_err(|e| {
            Error::bad_input(
                name,
                Location::Column(n.clone()),
                format!("cannot null csv.no_sup_value: {e}"),
            )
        })?;
    }
    if let Some((row, column, role)) = failure {
        let what = format!(
            "holds csv.no_sup_value {ns:?}: DMS (UseCsvNoSupValue) writes its CsvNoSupValue for a column the source did not log for this change, so the value is not known"
        );
        let how = match role {
            Role::Key => "a change cannot be applied without its primary key: add the key columns to the source table's supplemental logging, and replay the file",
            Role::Partition => "a change cannot be placed without its partition value: log that column at the source (or partition by another), and replay the file",
            _ => "a change cannot be ordered without its `sequence_by` value: log that column at the source (or order by DMS's own column), and replay the file",
        };
        return Err(Error::bad_input(
            name,
            Location::Row {
                row: row + 1,
                column: Some(column.to_string()),
            },
            format!("{what}; {how}"),
        ));
    }
    let absent: ArrayRef = Arc::new(if absent.is_empty() {
        StringArray::new_null(rows)
    } else {
        absent
            .iter()
            .map(|a| (!a.is_empty()).then(|| a.join(ABSENT_SEPARATOR)))
            .collect::<StringArray>()
    });
    let text = RecordBatch::try_new_with_options(
        text.schema(),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(rows)),
    )
    .map_err(|e| {
        Error::bad_input(
            name,
            Location::File,
            format!("cannot assemble columns: {e}"),
        )
    })?;
    Ok((text, Some(absent)))
}
