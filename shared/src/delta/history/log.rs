//! The change log of a history table (`<history>/_tributary_changes`): every change applied,
//! once (a change already logged, same key and order key, is not appended again), appended
//! blindly before the MERGE that applies it. A key's versions are recomputed from
//! it when a change arrives late (before the key's newest known change), because versions
//! keep only what the last change of a run said.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use deltalake::DeltaTable;

use crate::config::{HistoryConfig, TableConfig};
use crate::delta;
use crate::delta::retry::Retry;
use crate::error::{Error, Result};
use crate::source::{ChangeOp, ChangeSet};

/// How the change log stores a change's operation. Written to storage and read back by
/// later invocations: a format of its own, not the MERGE's in-memory markers.
const LOGGED_DELETE: &str = "D";
const LOGGED_WRITE: &str = "U";

fn logged_op(delete: bool) -> &'static str {
    if delete {
        LOGGED_DELETE
    } else {
        LOGGED_WRITE
    }
}

pub(super) const SEQ: &str = "_tributary_seq";
pub(super) const START: &str = "_tributary_start";
pub(super) const OP: &str = "_tributary_op";
/// Comma-separated names of the columns the change carried (a column added to the log later
/// was not carried by older changes, so the list names what is there, not what is missing).
pub(super) const PRESENT: &str = "_tributary_present";

/// The log's rows for a batch's change sets: their columns, then order key, start, op and
/// the columns each change carried. `columns` are the data columns of the history (every file's columns).
pub(super) fn rows(changes: &[ChangeSet], columns: &[Field]) -> Result<RecordBatch> {
    let mut parts: Vec<RecordBatch> = Vec::with_capacity(changes.len());
    for cs in changes {
        let n = cs.data.num_rows();
        let present: Vec<&str> = columns
            .iter()
            .filter(|f| cs.data.column_by_name(f.name()).is_some())
            .map(|f| f.name().as_str())
            .collect();
        // Per row, without the columns the row does not carry (ChangeSet::absent).
        let per_row: Vec<String> = if cs.absent.is_empty() {
            Vec::new()
        } else {
            (0..n)
                .map(|r| {
                    present
                        .iter()
                        .filter(|c| !cs.absent.iter().any(|(a, rows)| a == *c && rows[r]))
                        .copied()
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .collect()
        };
        let present = present.join(",");
        let mut cols: Vec<ArrayRef> = columns
            .iter()
            .map(|f| match cs.data.column_by_name(f.name()) {
                Some(c) => crate::coerce::exact_cast(c, f.data_type()).map_err(|e| Error::Schema {
                    table: crate::storage::display(&cs.file),
                    message: format!(
                        "column `{}`: {}",
                        f.name(),
                        e.describe(c.data_type(), f.data_type())
                    ),
                }),
                None => Ok(arrow::array::new_null_array(f.data_type(), n)),
            })
            .collect::<Result<_>>()?;
        cols.push(Arc::new(cs.order.clone()));
        cols.push(Arc::new(StringArray::from(cs.starts.clone())));
        cols.push(Arc::new(StringArray::from_iter_values(
            cs.ops.iter().map(|o| logged_op(*o == ChangeOp::Delete)),
        )));
        cols.push(Arc::new(if per_row.is_empty() {
            StringArray::from_iter_values(std::iter::repeat_n(present.as_str(), n))
        } else {
            StringArray::from_iter_values(per_row)
        }));
        parts.push(RecordBatch::try_new(Arc::new(schema(columns)), cols).map_err(Error::arrow)?);
    }
    arrow::compute::concat_batches(&Arc::new(schema(columns)), &parts).map_err(Error::arrow)
}

fn schema(columns: &[Field]) -> Schema {
    let mut fields: Vec<Field> = columns
        .iter()
        .map(|f| f.clone().with_nullable(true))
        .collect();
    for n in [SEQ, START, OP, PRESENT] {
        fields.push(Field::new(n, DataType::Utf8, true));
    }
    Schema::new(fields)
}

/// Append the rows (creating the log, and adding new columns, as needed).
pub(super) async fn append(
    cfg: &TableConfig,
    h: &HistoryConfig,
    options: &HashMap<String, String>,
    rows: RecordBatch,
    files: &[String],
) -> Result<DeltaTable> {
    let label = cfg.label(crate::config::Managed::ChangeLog);
    let (label_ref, rows) = (&label, &rows);
    let append = move |_: u32| async move {
        let (label, rows) = (label_ref, rows.clone());
        let table = delta::open_or_create(
            &h.changes,
            options,
            label,
            &rows.schema(),
            &[],
            Default::default(),
        )
        .await?
        .0;
        // A column the batch widens: the log takes the wider type first.
        let (table, _) = crate::delta::widen::widen(
            cfg,
            label,
            table,
            &rows.schema(),
            delta::writer_properties(cfg),
            files,
        )
        .await?;
        delta::append_rows(
            label,
            table,
            &rows,
            Some(delta::writer_properties(cfg)),
            files,
        )
        .await
    };
    Ok(Retry::new(&label, cfg.limits.max_commit_attempts)
        .run("record history changes", append)
        .await?
        .0)
}

/// A logged change: its row in a batch of log rows.
pub(super) struct Logged<'a> {
    pub(super) batch: &'a RecordBatch,
    pub(super) row: usize,
}

impl Logged<'_> {
    fn text(&self, column: &str) -> Option<String> {
        let c = self.batch.column_by_name(column)?;
        let c = c.as_string_opt::<i32>()?;
        c.is_valid(self.row).then(|| c.value(self.row).to_string())
    }

    pub(super) fn seq(&self) -> Option<String> {
        self.text(SEQ)
    }

    pub(super) fn start(&self) -> Option<String> {
        self.text(START)
    }

    pub(super) fn is_delete(&self) -> bool {
        self.text(OP).as_deref() == Some(LOGGED_DELETE)
    }

    /// The columns the change carried.
    pub(super) fn present(&self) -> Vec<String> {
        self.text(PRESENT)
            .map(|a| {
                a.split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }
}
