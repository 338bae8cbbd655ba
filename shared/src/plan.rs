//! Merge planning: combine the change sets of one table, keep the latest change per primary
//! key, and shape the result as the MERGE source (curated columns + order key + operation).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt32Array};
use arrow::compute::{cast, concat, take};
use arrow::datatypes::{Field, Schema, SchemaRef};
use arrow::row::{OwnedRow, RowConverter, SortField};

use crate::config::TableConfig;
use crate::error::{Error, Result};
use crate::source::{string_array, ChangeOp, ChangeSet};

/// Column of the MERGE source that says what to do with the key: `U` (upsert) or `D`.
pub const OP_COLUMN: &str = "_tributary_op";

/// The MERGE source for one table: at most one row per primary key.
#[derive(Debug, Clone)]
pub struct MergePlan {
    /// Curated columns, then the sequence column, then [`OP_COLUMN`].
    pub batch: RecordBatch,
    pub upserts: usize,
    pub deletes: usize,
    /// Rows dropped because a later change of the same key was in the same plan.
    pub superseded: usize,
}

impl MergePlan {
    /// The curated columns plus the sequence column (what the table stores).
    pub fn table_schema(&self) -> SchemaRef {
        let s = self.batch.schema();
        Arc::new(Schema::new(
            s.fields()
                .iter()
                .filter(|f| f.name() != OP_COLUMN)
                .cloned()
                .collect::<Vec<_>>(),
        ))
    }
}

/// Encodes primary keys into comparable, hashable rows.
pub(crate) struct KeyEncoder {
    converter: RowConverter,
    columns: Vec<String>,
}

impl KeyEncoder {
    pub(crate) fn new(schema: &Schema, key: &[String]) -> Result<Self> {
        let fields = key
            .iter()
            .map(|k| {
                schema
                    .field_with_name(k)
                    .map(|f| SortField::new(f.data_type().clone()))
                    .map_err(|_| Error::Internal(format!("key column {k} missing from plan")))
            })
            .collect::<Result<Vec<_>>>()?;
        let converter = RowConverter::new(fields)
            .map_err(|e| Error::Internal(format!("cannot encode key columns: {e}")))?;
        Ok(Self {
            converter,
            columns: key.to_vec(),
        })
    }

    /// Encoded keys of every row of `batch` (which must have the key columns).
    pub(crate) fn encode(&self, batch: &RecordBatch) -> Result<Vec<OwnedRow>> {
        let cols = self
            .columns
            .iter()
            .map(|k| {
                batch
                    .column_by_name(k)
                    .cloned()
                    .ok_or_else(|| Error::Internal(format!("key column {k} missing")))
            })
            .collect::<Result<Vec<_>>>()?;
        let rows = self
            .converter
            .convert_columns(&cols)
            .map_err(|e| Error::Internal(format!("cannot encode keys: {e}")))?;
        Ok(rows.iter().map(|r| r.owned()).collect())
    }
}

/// Build the plan from change sets (any order; order keys decide).
pub fn plan(table: &TableConfig, changes: &[ChangeSet]) -> Result<MergePlan> {
    // Union of the curated columns, in first-seen order; the first type seen wins and
    // later files are cast to it.
    let mut fields: Vec<Field> = Vec::new();
    for c in changes {
        for f in c.data.schema().fields() {
            if !fields.iter().any(|x| x.name() == f.name()) {
                fields.push(f.as_ref().clone().with_nullable(true));
            }
        }
    }
    let total: usize = changes.iter().map(|c| c.data.num_rows()).sum();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(fields.len());
    for f in &fields {
        let mut parts: Vec<ArrayRef> = Vec::with_capacity(changes.len());
        for c in changes {
            let part = match c.data.column_by_name(f.name()) {
                Some(a) if a.data_type() == f.data_type() => a.clone(),
                Some(a) => cast(a, f.data_type()).map_err(|e| Error::BadInput {
                    file: crate::storage::display(&c.file),
                    location: crate::error::Location::Column(f.name().clone()),
                    message: format!(
                        "type {} conflicts with {} in another file of the same batch: {e}",
                        a.data_type(),
                        f.data_type()
                    ),
                })?,
                None => arrow::array::new_null_array(f.data_type(), c.data.num_rows()),
            };
            parts.push(part);
        }
        let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
        columns.push(concat(&refs).map_err(|e| Error::Internal(format!("concat: {e}")))?);
    }
    let schema = Arc::new(Schema::new(fields.clone()));
    let all = RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(total)),
    )
    .map_err(|e| Error::Internal(format!("assemble plan: {e}")))?;
    let ops: Vec<ChangeOp> = changes.iter().flat_map(|c| c.ops.iter().copied()).collect();
    let order: Vec<&str> = changes
        .iter()
        .flat_map(|c| c.order.iter().map(String::as_str))
        .collect();

    // Latest change per key.
    let enc = KeyEncoder::new(&schema, &table.primary_key)?;
    let keys = enc.encode(&all)?;
    let mut latest: HashMap<&OwnedRow, usize> = HashMap::with_capacity(keys.len());
    for (i, k) in keys.iter().enumerate() {
        latest
            .entry(k)
            .and_modify(|j| {
                if order[i] > order[*j] {
                    *j = i;
                }
            })
            .or_insert(i);
    }
    let mut idx: Vec<u32> = latest.into_values().map(|i| i as u32).collect();
    idx.sort_unstable();
    let superseded = total - idx.len();
    let indices = UInt32Array::from(idx.clone());
    let mut out_cols = Vec::with_capacity(all.num_columns() + 2);
    for c in all.columns() {
        out_cols.push(take(c, &indices, None).map_err(|e| Error::Internal(format!("take: {e}")))?);
    }
    out_cols.push(string_array(idx.iter().map(|&i| order[i as usize])));
    let mut deletes = 0;
    out_cols.push(string_array(idx.iter().map(|&i| {
        if ops[i as usize] == ChangeOp::Delete {
            deletes += 1;
            "D"
        } else {
            "U"
        }
    })));
    let mut out_fields = fields;
    out_fields.push(Field::new(
        &table.sequence_column,
        arrow::datatypes::DataType::Utf8,
        false,
    ));
    out_fields.push(Field::new(
        OP_COLUMN,
        arrow::datatypes::DataType::Utf8,
        false,
    ));
    let batch = RecordBatch::try_new(Arc::new(Schema::new(out_fields)), out_cols)
        .map_err(|e| Error::Internal(format!("assemble plan: {e}")))?;
    Ok(MergePlan {
        upserts: idx.len() - deletes,
        deletes,
        superseded,
        batch,
    })
}

/// Turn upserts that a newer tombstone supersedes into deletes carrying the tombstone's
/// order key (so the MERGE removes any older copy of the row). Returns how many changed.
pub fn apply_tombstones(
    plan: &mut MergePlan,
    table: &TableConfig,
    tombstones: &HashMap<OwnedRow, String>,
) -> Result<usize> {
    if tombstones.is_empty() {
        return Ok(0);
    }
    let enc = KeyEncoder::new(&plan.batch.schema(), &table.primary_key)?;
    let keys = enc.encode(&plan.batch)?;
    let schema = plan.batch.schema();
    let seq_idx = schema
        .index_of(&table.sequence_column)
        .map_err(|e| Error::Internal(e.to_string()))?;
    let op_idx = schema
        .index_of(OP_COLUMN)
        .map_err(|e| Error::Internal(e.to_string()))?;
    let seqs = plan.batch.column(seq_idx).as_string::<i32>();
    let ops = plan.batch.column(op_idx).as_string::<i32>();
    let mut new_seq: Vec<&str> = Vec::with_capacity(keys.len());
    let mut new_ops: Vec<&str> = Vec::with_capacity(keys.len());
    let mut changed = 0;
    for (i, k) in keys.iter().enumerate() {
        match tombstones.get(k) {
            Some(t) if t.as_str() > seqs.value(i) => {
                if ops.value(i) == "U" {
                    changed += 1;
                }
                new_seq.push(t.as_str());
                new_ops.push("D");
            }
            _ => {
                new_seq.push(seqs.value(i));
                new_ops.push(ops.value(i));
            }
        }
    }
    if changed == 0 && new_seq.iter().zip(0..).all(|(s, i)| *s == seqs.value(i)) {
        return Ok(0);
    }
    let mut cols = plan.batch.columns().to_vec();
    cols[seq_idx] = string_array(new_seq.into_iter());
    cols[op_idx] = string_array(new_ops.iter().copied());
    plan.deletes = new_ops.iter().filter(|o| **o == "D").count();
    plan.upserts = new_ops.len() - plan.deletes;
    plan.batch = RecordBatch::try_new(schema, cols).map_err(|e| Error::Internal(e.to_string()))?;
    Ok(changed)
}
