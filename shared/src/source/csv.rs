//! DMS CSV files, plain or gzip-compressed (`CompressionType=GZIP` writes `*.csv.gz`).

use std::io::Read;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
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
    if is_blank(text(name, file_name, body)?) {
        return Err(bad(format!(
            "the file is empty ({}: zero bytes, or only whitespace); a DMS CSV file has at least one row{} — remove the object from the source, or put back the file DMS wrote",
            if gz { "its decompressed text" } else { "no data" },
            if opts.header(kind) { " after its header" } else { "" }
        )));
    }
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
    let typed_schema = Arc::new(Schema::new(
        names
            .iter()
            .zip(&targets)
            .map(|(n, t)| Field::new(n, t.clone(), true))
            .collect::<Vec<_>>(),
    ));
    let empty_schema = typed_schema.clone();
    let header = opts.header(kind);
    let checks = NoSupChecks::new(opts, &names, table);
    let name = name.to_string();
    let mut offset = 0usize;
    let typed = reader.map(move |b| {
        let text =
            b.map_err(|e| Error::bad_input(&name, Location::File, read_error(gz, e, &names)))?;
        let rows = text.num_rows();
        if offset == 0 && !header {
            header_row(&name, &text, &names, kind)?;
        }
        check_no_sup(&name, &text, &checks).map_err(|e| e.shift_rows(offset))?;
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
fn headerless_data(
    name: &str,
    names: &[String],
    kind: FileKind,
    table: &TableConfig,
) -> Result<()> {
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
/// for in: the columns that reach the table or order its changes.
struct NoSupChecks {
    value: Option<String>,
    /// Index of the operation column, when the file has it.
    op: Option<usize>,
    /// (index, name, role) of each column checked.
    columns: Vec<(usize, String, Role)>,
}

/// What a column is to the table, for the placeholder's message.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Key,
    Sequence,
    Value,
}

impl NoSupChecks {
    fn new(opts: &CsvOptions, names: &[String], table: &TableConfig) -> NoSupChecks {
        let columns = names
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                let role = if table.primary_key.contains(n) {
                    Role::Key
                } else if table.sequence_by.contains(n) {
                    Role::Sequence
                } else if table.keeps_column(n) {
                    Role::Value
                } else {
                    return None;
                };
                Some((i, n.clone(), role))
            })
            .collect();
        NoSupChecks {
            value: opts.no_sup_value.clone(),
            op: names.iter().position(|n| *n == table.op_column),
            columns,
        }
    }
}

/// The placeholder DMS writes for a column that is not in the supplemental log
/// (`UseCsvNoSupValue`) is not a value: a file holding it fails (the first row holding it,
/// its column named), it is never stored. Per-row "unchanged" values are not applied yet.
fn check_no_sup(name: &str, text: &RecordBatch, checks: &NoSupChecks) -> Result<()> {
    let Some(ns) = checks.value.as_deref() else {
        return Ok(());
    };
    let first = checks
        .columns
        .iter()
        .filter_map(|(i, n, role)| {
            let c = text.column(*i).as_string::<i32>();
            (0..c.len())
                .find(|&r| !c.is_null(r) && c.value(r) == ns)
                .map(|r| (r, n, *role))
        })
        .min_by_key(|(r, _, _)| *r);
    let Some((row, column, role)) = first else {
        return Ok(());
    };
    let op = checks.op.and_then(|i| {
        let c = text.column(i).as_string::<i32>();
        (!c.is_null(row)).then(|| c.value(row).trim().to_ascii_uppercase())
    });
    let what = format!(
        "holds csv.no_sup_value {ns:?}: DMS (UseCsvNoSupValue) writes its CsvNoSupValue for a column the source did not log for this change, so the value is not known"
    );
    let message = match role {
        Role::Key => format!(
            "{what}; a change cannot be applied without its primary key: add the key columns to the source table's supplemental logging, and replay the file"
        ),
        Role::Sequence => format!(
            "{what}; a change cannot be ordered without its `sequence_by` value: log that column at the source (or order by DMS's own column), and replay the file"
        ),
        Role::Value => format!(
            "{what}{}; tributary does not apply per-row unchanged values yet, so the file fails rather than store the placeholder: log every column at the source (full supplemental logging, e.g. Oracle ADD SUPPLEMENTAL LOG DATA (ALL) COLUMNS), then replay the file or reload the table",
            match op.as_deref() {
                Some("I") => " (in an insert, which DMS should write whole: the placeholder is expected in updates only)",
                Some("D") => " (in a delete: its image is what a history table keeps of the deleted row)",
                _ => "",
            }
        ),
    };
    Err(Error::bad_input(
        name,
        Location::Row {
            row: row + 1,
            column: Some(column.clone()),
        },
        message,
    ))
}
