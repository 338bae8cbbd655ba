//! AWS DMS, the CDC convention of the product: the operation in the `Op` column
//! (`op_column`: I, U, D), full loads in `LOAD*` files without it, CDC files named by the
//! time they were written (`YYYYMMDD-HHMMSSfff…`) or ordered by `sequence_by` (DMS's
//! `TimestampColumnName`, `AR_H_CHANGE_SEQ`), columns DMS did not log (`CsvNoSupValue`),
//! and before-image columns (`add-before-image-columns`): an update of the key moves the
//! row. See [`super::convention`].

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Schema};
use chrono::{DateTime, Utc};
use std::sync::Arc;

use super::convention::{Changes, Convention, Curated};
use super::{
    check_column_names, column, column_list, convert, order, plain_columns, ChangeOp, FileInfo,
    Ordering, Spec, ABSENT_COLUMN, ABSENT_SEPARATOR,
};
use crate::config::Format;
use crate::error::{Error, Location, Result};
use crate::model::FileKind;

/// The DMS convention.
pub(super) struct Dms;

impl Convention for Dms {
    fn kind(&self, file_name: &str) -> FileKind {
        FileKind::of(file_name)
    }

    fn name_time(&self, file_name: &str) -> Option<DateTime<Utc>> {
        order::dms_file_time(file_name)
    }

    fn check_orderable(
        &self,
        name: &str,
        file_name: &str,
        kind: FileKind,
        cfg: &Spec,
    ) -> Result<()> {
        if kind == FileKind::Cdc
            && cfg.sequence_by.is_empty()
            && order::dms_file_time(file_name).is_none()
        {
            // Without `sequence_by`, CDC changes are ordered by their files' names: one that
            // is not DMS's time-stamped name would rank after every DMS file, for good.
            return Err(Error::bad_input(
                name,
                Location::File,
                format!(
                    "`{file_name}` is not a DMS CDC file name (`YYYYMMDD-HHMMSSfff…`), and table `{}` has no `sequence_by`: its changes are ordered by file name, so this file would rank after every DMS file whatever its time. Rename it to the time its changes were made (e.g. 20240101-120000000.parquet), or configure `sequence_by` (DMS's TimestampColumnName) for the table",
                    cfg.table
                ),
            ));
        }
        Ok(())
    }

    fn changes(&self, f: &FileInfo<'_>, raw: RecordBatch, cfg: &Spec) -> Result<Changes> {
        let raw = renamed_columns(f.name, raw, cfg)?;
        let (raw, absent) = take_absent(raw, cfg)?;
        // Every rule below judges values, not their layout.
        let raw = plain_columns(f.name, raw)?;
        check_column_names(f.name, &raw.schema(), cfg)?;
        let ops = parse_ops(f, &raw, cfg)?;
        let mut absent = absent_rows(f, &absent, &ops)?;
        for (column, _) in &mut absent {
            if let Some(to) = cfg.rename_columns.get(column.as_str()) {
                column.clone_from(to);
            }
        }
        Ok(Changes {
            rows: raw,
            ops,
            absent,
            sequence: cfg.sequence_by.clone(),
            own: Vec::new(),
        })
    }

    fn implied(&self, file: &str, rows: &RecordBatch, cfg: &Spec, c: Curated) -> Result<Curated> {
        let (data, ops, ordering) = key_moves(file, rows, cfg, c.data, c.ops, c.ordering)?;
        Ok(Curated {
            data,
            ops,
            ordering,
        })
    }
}

/// DMS writes an update that changes the primary key as one `U` row with the new key. With
/// the table-mapping rule `add-before-image-columns` the row also carries the old key in
/// `<before_image_prefix><key column>` (`BI_id`): where that differs from the key, the
/// change is two — the old key deleted, the new one upserted — at the row's place in the
/// order (the delete gets the update's order key: a later change of the old key still
/// wins). The deletes are appended after the file's rows. Without a configured prefix, a
/// file with such columns fails: merged by key alone, the old row would stay as a ghost.
fn key_moves(
    file: &str,
    raw: &RecordBatch,
    cfg: &Spec,
    data: RecordBatch,
    mut ops: Vec<ChangeOp>,
    ordering: Ordering,
) -> Result<(RecordBatch, Vec<ChangeOp>, Ordering)> {
    let Some(prefix) = cfg.before_image_prefix.as_deref() else {
        if let Some(k) = cfg
            .primary_key
            .iter()
            .find(|k| raw.schema().field_with_name(&format!("BI_{k}")).is_ok())
        {
            return Err(Error::bad_input(
                file,
                Location::Column(format!("BI_{k}")),
                format!("the file carries DMS before-image columns (`BI_{k}`, from the table-mapping rule add-before-image-columns) but the table has no `before_image_prefix`: set before_image_prefix = \"BI_\" so that an update of the key moves the row (merged by key alone, the old row would stay), or list the columns in drop_columns"),
            ));
        }
        return Ok((data, ops, ordering));
    };
    let mut before = Vec::with_capacity(cfg.primary_key.len());
    for k in &cfg.primary_key {
        let name = format!("{prefix}{k}");
        let Some(b) = raw.column_by_name(&name) else {
            // No before-images in this file (or not for every key column): keys as they are.
            return Ok((data, ops, ordering));
        };
        let key = data.column_by_name(k).ok_or_else(|| {
            Error::internal(format!("key column `{k}` missing from the curated columns"))
        })?;
        let b = convert(file, &name, b, key.data_type())?;
        before.push((k, b, key.clone()));
    }
    let mut moved: Vec<u32> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        if *op != ChangeOp::Update {
            continue;
        }
        // All before-image values present, and one differs from the key.
        if before.iter().any(|(_, b, _)| b.is_null(i)) {
            continue;
        }
        let differs = before.iter().try_fold(false, |acc, (_, b, key)| {
            let cmp = arrow::array::make_comparator(
                b.as_ref(),
                key.as_ref(),
                arrow::compute::SortOptions::default(),
            )
            .map_err(Error::arrow)?;
            Ok::<bool, Error>(acc || cmp(i, i) != std::cmp::Ordering::Equal)
        })?;
        if differs {
            moved.push(i as u32);
        }
    }
    if moved.is_empty() {
        return Ok((data, ops, ordering));
    }
    let idx = arrow::array::UInt32Array::from(moved.clone());
    let mut columns = Vec::with_capacity(data.num_columns());
    for (f, c) in data.schema().fields().iter().zip(data.columns()) {
        let col = match before.iter().find(|(k, _, _)| *k == f.name()) {
            Some((_, b, _)) => arrow::compute::take(b.as_ref(), &idx, None),
            None => arrow::compute::take(c.as_ref(), &idx, None),
        }
        .map_err(Error::arrow)?;
        columns.push(col);
    }
    let deletes = RecordBatch::try_new(data.schema(), columns).map_err(Error::arrow)?;
    let data =
        arrow::compute::concat_batches(&data.schema(), [&data, &deletes]).map_err(Error::arrow)?;
    ops.extend(moved.iter().map(|_| ChangeOp::Delete));
    Ok((data, ops, ordering.with_repeated(&moved)?))
}

/// The reader's [`ABSENT_COLUMN`] taken out of the batch (CSV with `csv.no_sup_value` only:
/// any other file's column of that name is the file's, and refused as reserved).
fn take_absent(raw: RecordBatch, cfg: &Spec) -> Result<(RecordBatch, Option<ArrayRef>)> {
    let added = matches!(&cfg.format, Format::Csv(o) if o.no_sup_value.is_some());
    let Some(i) = added
        .then(|| raw.schema().index_of(ABSENT_COLUMN).ok())
        .flatten()
    else {
        return Ok((raw, None));
    };
    let column = raw.column(i).clone();
    let mut raw = raw;
    raw.remove_column(i);
    Ok((raw, Some(column)))
}

/// Per column, the rows the reader found no value for; an insert without a value fails the
/// file (DMS writes the no-sup placeholder in updates only: an insert with it is not a
/// change tributary can apply as DMS meant it).
fn absent_rows(
    f: &FileInfo<'_>,
    absent: &Option<ArrayRef>,
    ops: &[ChangeOp],
) -> Result<Vec<(String, Vec<bool>)>> {
    let Some(a) = absent else {
        return Ok(Vec::new());
    };
    let a = a.as_string::<i32>();
    let mut out: Vec<(String, Vec<bool>)> = Vec::new();
    for r in (0..a.len()).filter(|&r| !a.is_null(r)) {
        for column in a.value(r).split(ABSENT_SEPARATOR) {
            if ops[r] == ChangeOp::Insert {
                return Err(Error::bad_input(
                    f.name,
                    Location::Row {
                        row: r + 1,
                        column: Some(column.to_string()),
                    },
                    format!(
                        "holds csv.no_sup_value (DMS's CsvNoSupValue: the source did not log the column) in {}: DMS writes it in updates only, an insert carries every column — check the DMS endpoint's UseCsvNoSupValue and the source's supplemental logging, and replay the file",
                        match f.kind {
                            FileKind::FullLoad => "a full-load row",
                            FileKind::Cdc => "an insert",
                        }
                    ),
                ));
            }
            let i = match out.iter().position(|(n, _)| n == column) {
                Some(i) => i,
                None => {
                    out.push((column.to_string(), vec![false; a.len()]));
                    out.len() - 1
                }
            };
            out[i].1[r] = true;
        }
    }
    Ok(out)
}

/// The file's columns under the table's names (`rename_columns`). A file that carries both
/// a renamed column and the column it is renamed to fails: one of the two would be lost.
fn renamed_columns(file: &str, raw: RecordBatch, cfg: &Spec) -> Result<RecordBatch> {
    if cfg.rename_columns.is_empty() {
        return Ok(raw);
    }
    let schema = raw.schema();
    if !schema
        .fields()
        .iter()
        .any(|f| cfg.rename_columns.contains_key(f.name()))
    {
        return Ok(raw);
    }
    let mut fields = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        match cfg.rename_columns.get(f.name()) {
            Some(to) => {
                if schema
                    .fields()
                    .iter()
                    .any(|g| g.name().eq_ignore_ascii_case(to))
                {
                    return Err(Error::bad_input(
                        file,
                        Location::Column(f.name().clone()),
                        format!("the file has both `{}` and `{to}`, and `rename_columns` reads `{}` as the table's column `{to}`: one of the two would be lost; fix the file or the setting", f.name(), f.name()),
                    ));
                }
                fields.push(f.as_ref().clone().with_name(to));
            }
            None => fields.push(f.as_ref().clone()),
        }
    }
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        raw.columns().to_vec(),
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(raw.num_rows())),
    )
    .map_err(Error::arrow)
}

fn parse_ops(f: &FileInfo<'_>, raw: &RecordBatch, cfg: &Spec) -> Result<Vec<ChangeOp>> {
    let rows = raw.num_rows();
    let Some(a) = column(raw, &cfg.op_column) else {
        if f.kind == FileKind::FullLoad {
            return Ok(vec![ChangeOp::Insert; rows]);
        }
        return Err(Error::bad_input(
            f.name,
            Location::Column(cfg.op_column.clone()),
            format!(
                "CDC file has no `{}` column (columns: {}); DMS CDC files carry the operation (I/U/D) first — check `op_column`, or name full-load files LOAD*",
                cfg.op_column,
                column_list(&raw.schema())
            ),
        ));
    };
    let a = crate::coerce::exact_cast(&a, &DataType::Utf8).map_err(|e| {
        Error::bad_input(
            f.name,
            Location::Column(cfg.op_column.clone()),
            e.describe(a.data_type(), &DataType::Utf8),
        )
    })?;
    let a = a.as_string::<i32>();
    let at = |i: usize| Location::Row {
        row: i + 1,
        column: Some(cfg.op_column.clone()),
    };
    (0..rows)
        .map(|i| {
            if a.is_null(i) {
                return Err(Error::bad_input(
                    f.name,
                    at(i),
                    "operation is null (expected I, U or D)",
                ));
            }
            match a.value(i).trim() {
                "I" | "i" => Ok(ChangeOp::Insert),
                "U" | "u" => Ok(ChangeOp::Update),
                "D" | "d" => Ok(ChangeOp::Delete),
                other => Err(Error::bad_input(
                    f.name,
                    at(i),
                    format!("unknown operation {other:?} (expected I, U or D)"),
                )),
            }
        })
        .collect()
}
