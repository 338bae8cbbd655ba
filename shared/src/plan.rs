//! Merge planning: admit a batch's change sets (one type per column, one kind per sequence
//! column), combine them, keep the latest change per primary key, and shape the result as
//! the MERGE source (curated columns + order key + operation).
//!
//! A batch behaves exactly like its files merged one at a time in canonical order
//! ([`ChangeSet::canonical_key`]): a column's type is the table's, or else the type the first
//! file that has it gives it; a file whose values do not fit fails alone. A column that some
//! files of the batch lack is a *sparse* column: the plan carries, per key, the order key of
//! the change that last set it, so that a file without the column leaves it as it was —
//! exactly what that file merged alone does — however the files are grouped.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray, UInt32Array};
use arrow::compute::{concat, take};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{OwnedRow, RowConverter, SortField};
use url::Url;

use crate::config::TableConfig;
use crate::error::{Error, Location, Result};
use crate::source::{self, string_array, ChangeOp, ChangeSet, FileKind, SeqKind};
use crate::storage;

/// Column of the MERGE source that says what to do with the key.
pub(crate) const OP_COLUMN: &str = "_tributary_op";
/// Prefix of the per-column order keys of sparse columns.
const SPARSE_SEQ_PREFIX: &str = "_tributary_cseq_";

/// What the MERGE does with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlanOp {
    /// Insert or update the row (DMS `I` and `U` are full after-images).
    Upsert,
    Delete,
}

impl PlanOp {
    pub(crate) const fn marker(self) -> &'static str {
        match self {
            PlanOp::Upsert => "U",
            PlanOp::Delete => "D",
        }
    }

    /// The marker of a change (a delete, or a write).
    pub(crate) const fn marker_of(delete: bool) -> &'static str {
        if delete {
            PlanOp::Delete.marker()
        } else {
            PlanOp::Upsert.marker()
        }
    }

    fn of(marker: &str) -> PlanOp {
        if marker == PlanOp::Delete.marker() {
            PlanOp::Delete
        } else {
            PlanOp::Upsert
        }
    }
}

/// A column some files of the batch lack, and the plan column holding, per key, the order
/// key of the change that set it (null: no change of the batch set it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SparseColumn {
    pub column: String,
    pub seq_column: String,
}

/// The MERGE source for one table: at most one row per primary key.
#[derive(Debug, Clone)]
pub(crate) struct MergePlan {
    /// Curated columns, then the sequence column, the sparse columns' order keys, and
    /// [`OP_COLUMN`].
    pub batch: RecordBatch,
    pub upserts: usize,
    pub deletes: usize,
    /// Rows dropped because a later change of the same key was in the same plan.
    pub superseded: usize,
    pub sparse: Vec<SparseColumn>,
}

impl MergePlan {
    /// The columns the table stores (curated columns plus the sequence column).
    pub(crate) fn table_schema(&self) -> SchemaRef {
        let s = self.batch.schema();
        Arc::new(Schema::new(
            s.fields()
                .iter()
                .filter(|f| !is_internal(f.name()))
                .cloned()
                .collect::<Vec<_>>(),
        ))
    }

    /// The operation of each row.
    pub(crate) fn ops(&self) -> Result<Vec<PlanOp>> {
        let a = self.column(OP_COLUMN)?;
        Ok(a.as_string::<i32>()
            .iter()
            .map(|v| PlanOp::of(v.unwrap_or_default()))
            .collect())
    }

    pub(crate) fn column(&self, name: &str) -> Result<&ArrayRef> {
        self.batch
            .column_by_name(name)
            .ok_or_else(|| Error::internal(format!("the merge plan has no column `{name}`")))
    }
}

/// Whether a plan column is tributary's own (not stored in the table).
pub(crate) fn is_internal(name: &str) -> bool {
    name == OP_COLUMN || name.starts_with(SPARSE_SEQ_PREFIX)
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
                    .map_err(|_| Error::internal(format!("key column {k} missing from plan")))
            })
            .collect::<Result<Vec<_>>>()?;
        let converter = RowConverter::new(fields).map_err(Error::arrow)?;
        Ok(Self {
            converter,
            columns: key.to_vec(),
        })
    }

    /// Encoded keys of every row of `batch`, in one buffer.
    pub(crate) fn rows(&self, batch: &RecordBatch) -> Result<arrow::row::Rows> {
        let cols = self
            .columns
            .iter()
            .map(|k| {
                batch
                    .column_by_name(k)
                    .cloned()
                    .ok_or_else(|| Error::internal(format!("key column {k} missing")))
            })
            .collect::<Result<Vec<_>>>()?;
        self.converter.convert_columns(&cols).map_err(Error::arrow)
    }

    /// Encoded keys of every row of `batch` (which must have the key columns).
    pub(crate) fn encode(&self, batch: &RecordBatch) -> Result<Vec<OwnedRow>> {
        Ok(self.rows(batch)?.iter().map(|r| r.owned()).collect())
    }
}

// ---- admission ---------------------------------------------------------------------------

/// Change sets admitted to one plan (in canonical order, converted to one type per column),
/// and the files refused, each with its error.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    pub admitted: Vec<ChangeSet>,
    pub rejected: Vec<(Url, Error)>,
    /// Sequence kinds the batch establishes (the table's, or the first CDC file's).
    pub kinds: Option<Vec<SeqKind>>,
}

/// Admit change sets in canonical order. `key` is the table's primary key;
/// `table_schema`/`table_kinds` describe the Delta table when it exists.
pub(crate) fn admit(
    mut changes: Vec<ChangeSet>,
    key: &[String],
    table_schema: Option<&Schema>,
    table_kinds: Option<&[SeqKind]>,
) -> Admission {
    changes.sort_by_key(ChangeSet::canonical_key);
    let mut out = Admission {
        kinds: table_kinds.map(<[SeqKind]>::to_vec),
        ..Default::default()
    };
    let mut types: Vec<Field> = table_schema
        .map(|s| s.fields().iter().map(|f| f.as_ref().clone()).collect())
        .unwrap_or_default();
    let table_columns = types.len();
    let mut widened = Vec::new();
    for cs in changes {
        // Rows in errors are the file's (a slice of a large file starts further on).
        let (file, offset) = (cs.file.clone(), cs.first_row);
        match check_kinds(&cs, &mut out.kinds)
            .and_then(|()| unify(cs, key, &mut types, table_columns, &mut widened))
        {
            Ok(cs) => out.admitted.push(cs),
            Err(e) => out.rejected.push((file, e.shift_rows(offset))),
        }
    }
    if !widened.is_empty() {
        // Files admitted before a column widened carry its narrower type: every set in the
        // batch's final types (widening casts keep every value). The table's data files
        // follow before the commit (`widen`).
        let admitted = std::mem::take(&mut out.admitted);
        for cs in admitted {
            let (file, offset) = (cs.file.clone(), cs.first_row);
            match in_types(cs, &types) {
                Ok(cs) => out.admitted.push(cs),
                Err(e) => out.rejected.push((file, e.shift_rows(offset))),
            }
        }
    }
    out
}

/// A column of the table whose type a batch widens (see [`crate::coerce::is_widening`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Widening {
    pub column: String,
    pub from: DataType,
    pub to: DataType,
}

impl std::fmt::Display for Widening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} -> {}", self.column, self.from, self.to)
    }
}

/// A change set's columns in the batch's final types (only widenings remain to apply).
fn in_types(cs: ChangeSet, types: &[Field]) -> Result<ChangeSet> {
    let schema = cs.data.schema();
    if schema.fields().iter().all(|f| {
        types
            .iter()
            .find(|t| t.name() == f.name())
            .is_none_or(|t| t.data_type() == f.data_type())
    }) {
        return Ok(cs);
    }
    let name = storage::display(&cs.file);
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (i, f) in schema.fields().iter().enumerate() {
        let to = types
            .iter()
            .find(|t| t.name() == f.name())
            .map_or(f.data_type(), |t| t.data_type());
        columns.push(source::convert(&name, f.name(), cs.data.column(i), to)?);
        fields.push(Field::new(f.name(), to.clone(), true));
    }
    let data = RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(cs.data.num_rows())),
    )
    .map_err(Error::arrow)?;
    Ok(ChangeSet { data, ..cs })
}

/// Check admitted change sets again against the sequence kinds `recorded` on the table a
/// commit is about to be based on: a concurrent writer may have recorded other kinds after
/// this batch was admitted (against a table that had none, or no table). The first
/// mismatching CDC file's error (full-load files only tell a kind, as in [`admit`]).
pub(crate) fn recheck_kinds(changes: &[ChangeSet], recorded: Option<&[SeqKind]>) -> Result<()> {
    let Some(recorded) = recorded else {
        return Ok(());
    };
    for cs in changes {
        check_kinds(cs, &mut Some(recorded.to_vec()))?;
    }
    Ok(())
}

fn check_kinds(cs: &ChangeSet, expected: &mut Option<Vec<SeqKind>>) -> Result<()> {
    if cs.seq_kinds.iter().any(Option::is_none) {
        return Ok(());
    }
    let kinds: Vec<SeqKind> = cs.seq_kinds.iter().flatten().copied().collect();
    if cs.kind == FileKind::FullLoad {
        // Full-load rows are not ordered by sequence values: they only tell the kind.
        expected.get_or_insert(kinds);
        return Ok(());
    }
    match expected {
        None => {
            *expected = Some(kinds);
            Ok(())
        }
        Some(want) if *want == kinds => Ok(()),
        Some(want) => Err(Error::bad_input(
                &storage::display(&cs.file),
                Location::File,
                format!(
                    "the sequence columns hold {} values but the table orders changes by {} values; values of different kinds do not compare (fix the DMS column type, or write to a new table)",
                    kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", "),
                    want.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
                ),
            )),
    }
}

/// Convert a change set's columns to the batch's types; new columns take this file's type.
/// A key column converted here is checked again in its new type (text `NaN` into the float
/// key another file of the batch set). A column whose name differs from a known one only by
/// case fails the file (the first `table_columns` of `types` are the table's).
fn unify(
    cs: ChangeSet,
    key: &[String],
    types: &mut Vec<Field>,
    table_columns: usize,
    widened: &mut Vec<Widening>,
) -> Result<ChangeSet> {
    let name = storage::display(&cs.file);
    let schema = cs.data.schema();
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(schema.fields().len());
    let mut new = Vec::new();
    let mut wider = Vec::new();
    for (i, f) in schema.fields().iter().enumerate() {
        let lower = f.name().to_lowercase();
        if let Some(at) = types
            .iter()
            .position(|t| t.name() != f.name() && t.name().to_lowercase() == lower)
        {
            let whose = if at < table_columns {
                "the table's column"
            } else {
                "the column of another file of this batch"
            };
            return Err(Error::bad_input(
                &name,
                Location::Column(f.name().clone()),
                format!(
                    "column `{}` of the file collides with {whose} `{}`: Delta column names are case-insensitive, so they cannot be two columns; rename it at the source (a DMS transformation rule), or list it in `drop_columns`",
                    f.name(),
                    types[at].name()
                ),
            ));
        }
        let target = match types.iter().position(|t| t.name() == f.name()) {
            // A lossless widening (`int` to `bigint`, …): the column takes the file's type,
            // the table's data files are rewritten in it before the commit.
            // Taken into `types` only once the whole file is admitted: a file refused
            // widens nothing.
            Some(at) if crate::coerce::is_widening(types[at].data_type(), f.data_type()) => {
                wider.push((
                    at,
                    Widening {
                        column: f.name().clone(),
                        from: types[at].data_type().clone(),
                        to: f.data_type().clone(),
                    },
                ));
                f.data_type().clone()
            }
            Some(at) => types[at].data_type().clone(),
            None => {
                new.push(f.as_ref().clone());
                f.data_type().clone()
            }
        };
        let mut c = source::convert(&name, f.name(), cs.data.column(i), &target)
            .map_err(|e| source::type_change(e, f.data_type(), &target))?;
        if &target != f.data_type() && key.contains(f.name()) {
            c = source::key_column(&name, f.name(), c)?;
        }
        fields.push(Field::new(f.name(), target, true));
        columns.push(c);
    }
    let data = RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(cs.data.num_rows())),
    )
    .map_err(Error::arrow)?;
    types.extend(new);
    for (at, w) in wider {
        types[at] = Field::new(&w.column, w.to.clone(), true);
        widened.push(w);
    }
    Ok(ChangeSet { data, ..cs })
}

// ---- planning ----------------------------------------------------------------------------

/// All rows of the admitted change sets, with each row's operation, order key and the sparse
/// columns it carries.
struct Rows<'a> {
    all: RecordBatch,
    ops: std::borrow::Cow<'a, [ChangeOp]>,
    changes: &'a [ChangeSet],
    /// Each row's order key, listed when first needed (a full load planned as it is never
    /// needs them: its own order-key column is the plan's).
    order: std::cell::OnceCell<Vec<&'a str>>,
    /// Per sparse column: whether each row's file had it.
    present: Vec<(String, Vec<bool>)>,
}

impl<'a> Rows<'a> {
    /// Each row's order key.
    fn order(&self) -> &[&'a str] {
        self.order.get_or_init(|| {
            self.changes
                .iter()
                .flat_map(|c| (0..c.order.len()).map(|i| c.order.value(i)))
                .collect()
        })
    }
}

/// Build the plan from admitted change sets (same type per column, see [`admit`]).
pub(crate) fn plan(table: &TableConfig, changes: &[ChangeSet]) -> Result<MergePlan> {
    let rows = combine(changes)?;
    let enc = KeyEncoder::new(&rows.all.schema(), &table.primary_key)?;
    let n = rows.all.num_rows();
    let chosen = match ascending(&rows.all, &table.primary_key) {
        true => None,
        false => latest_per_key(&rows, &enc.rows(&rows.all)?),
    };
    // `None`: every row chosen, in row order (a full load, a file of distinct keys): no copy.
    let idx: Option<Vec<u32>> = chosen
        .as_ref()
        .map(|c| c.iter().map(|(i, _)| *i as u32).collect())
        .filter(|idx: &Vec<u32>| idx.len() != n);
    let chosen_rows = idx.as_ref().map_or(n, Vec::len);
    // With sparse columns, a key's rows (every row its own key when each is chosen).
    let chosen = match (chosen, rows.present.is_empty()) {
        (Some(c), _) => c,
        (None, true) => Vec::new(),
        (None, false) => (0..n).map(|i| (i, vec![i])).collect(),
    };
    let indices = idx.as_ref().map(|idx| UInt32Array::from(idx.clone()));
    let mut fields: Vec<Field> = rows
        .all
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut cols = Vec::with_capacity(fields.len() + 2 + rows.present.len());
    for (c, f) in rows.all.columns().iter().zip(&fields) {
        match &indices {
            Some(indices) if !rows.present.iter().any(|(n, _)| n == f.name()) => {
                cols.push(take(c, indices, None).map_err(Error::arrow)?);
            }
            _ => cols.push(c.clone()), // every row, or sparse: replaced below
        }
    }
    fields.push(Field::new(
        &table.writing.sequence_column,
        DataType::Utf8,
        false,
    ));
    match (changes, &idx) {
        ([one], None) => cols.push(Arc::new(one.order.clone())),
        (_, None) => cols.push(string_array(rows.order().iter().copied())),
        (_, Some(idx)) => {
            let order = rows.order();
            cols.push(string_array(idx.iter().map(|&i| order[i as usize])));
        }
    }
    let mut sparse = Vec::new();
    for (n, (column, present)) in rows.present.iter().enumerate() {
        let (values, seqs) = fold_sparse(&rows, present, &chosen)?;
        let pos = fields
            .iter()
            .position(|f| f.name() == column)
            .ok_or_else(|| Error::internal(format!("sparse column {column} vanished")))?;
        cols[pos] = take(rows.all.column(pos), &values, None).map_err(Error::arrow)?;
        let seq_column = format!("{SPARSE_SEQ_PREFIX}{n}");
        fields.push(Field::new(&seq_column, DataType::Utf8, true));
        cols.push(Arc::new(seqs));
        sparse.push(SparseColumn {
            column: column.clone(),
            seq_column,
        });
    }
    let (ops, deletes) = match &idx {
        None => op_column(rows.ops.iter().copied()),
        Some(idx) => op_column(idx.iter().map(|&i| rows.ops[i as usize])),
    };
    fields.push(Field::new(OP_COLUMN, DataType::Utf8, false));
    cols.push(ops);
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(Error::arrow)?;
    Ok(MergePlan {
        upserts: chosen_rows - deletes,
        deletes,
        superseded: n - chosen_rows,
        batch,
        sparse,
    })
}

/// The plan's operation column for the chosen rows' changes, and how many are deletes.
fn op_column(changes: impl Iterator<Item = ChangeOp>) -> (ArrayRef, usize) {
    let ops: Vec<PlanOp> = changes
        .map(|c| match c {
            ChangeOp::Delete => PlanOp::Delete,
            _ => PlanOp::Upsert,
        })
        .collect();
    let deletes = ops.iter().filter(|o| **o == PlanOp::Delete).count();
    let column = match deletes {
        // Every row an upsert (a full load): one marker repeated.
        0 => Arc::new(StringArray::new_repeated(
            PlanOp::Upsert.marker(),
            ops.len(),
        )),
        _ => string_array(ops.iter().map(|o| o.marker())),
    };
    (column, deletes)
}

/// Whether the batch's keys strictly ascend, told from the key column itself when it is one
/// column of integers or strings without nulls (a full load in the source's primary-key
/// order): then every row is its own key, without encoding the keys as rows. `false` when
/// they do not, or when it cannot be told this way.
fn ascending(batch: &RecordBatch, key: &[String]) -> bool {
    use arrow::datatypes::{Int16Type, Int32Type, Int64Type};
    let [key] = key else {
        return false;
    };
    let Some(c) = batch.column_by_name(key).filter(|c| c.null_count() == 0) else {
        return false;
    };
    fn rising<T: PartialOrd>(v: &[T]) -> bool {
        v.windows(2).all(|w| w[0] < w[1])
    }
    match c.data_type() {
        DataType::Int16 => rising(c.as_primitive::<Int16Type>().values()),
        DataType::Int32 => rising(c.as_primitive::<Int32Type>().values()),
        DataType::Int64 => rising(c.as_primitive::<Int64Type>().values()),
        DataType::Utf8 => {
            let s = c.as_string::<i32>();
            (1..s.len()).all(|i| s.value(i - 1) < s.value(i))
        }
        _ => false,
    }
}

/// Latest change per key (the largest order key; order keys are unique in a batch) with, when
/// sparse columns need their history, all the key's rows; in row order of the batch
/// (deterministic output). `None`: every row is its own key, so each is chosen — told
/// without a map when the keys ascend, as a full load's usually do (the source's
/// primary-key order), or when the map has a key per row.
fn latest_per_key(rows: &Rows<'_>, keys: &arrow::row::Rows) -> Option<Vec<(usize, Vec<usize>)>> {
    use std::collections::hash_map::Entry;
    let n = keys.num_rows();
    if (1..n).all(|i| keys.row(i - 1) < keys.row(i)) {
        return None;
    }
    let order = rows.order();
    let later = |a: usize, b: usize| order[a] > order[b];
    let mut chosen: Vec<(usize, Vec<usize>)> = if rows.present.is_empty() {
        let mut best: HashMap<arrow::row::Row<'_>, usize, foldhash::fast::RandomState> =
            HashMap::with_capacity_and_hasher(n, Default::default());
        for i in 0..n {
            match best.entry(keys.row(i)) {
                Entry::Occupied(mut e) if later(i, *e.get()) => {
                    e.insert(i);
                }
                Entry::Occupied(_) => {}
                Entry::Vacant(e) => {
                    e.insert(i);
                }
            }
        }
        if best.len() == n {
            return None;
        }
        best.into_values().map(|i| (i, Vec::new())).collect()
    } else {
        let mut groups: HashMap<arrow::row::Row<'_>, Vec<usize>, foldhash::fast::RandomState> =
            HashMap::with_capacity_and_hasher(n, Default::default());
        for i in 0..n {
            groups.entry(keys.row(i)).or_default().push(i);
        }
        groups
            .into_values()
            .map(|g| {
                let last = g
                    .iter()
                    .copied()
                    .reduce(|a, b| if later(b, a) { b } else { a })
                    .unwrap_or(g[0]);
                (last, g)
            })
            .collect()
    };
    chosen.sort_unstable_by_key(|(i, _)| *i);
    Some(chosen)
}

/// Concatenate the change sets (columns in first-seen order; a file without a column gets
/// nulls there and the column is marked sparse, and so is a column some rows do not carry:
/// [`ChangeSet::absent`]).
fn combine(changes: &[ChangeSet]) -> Result<Rows<'_>> {
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
    let mut present = Vec::new();
    for f in &fields {
        let mut parts: Vec<ArrayRef> = Vec::with_capacity(changes.len());
        // Whether each row's file has the column: listed only when one lacks it for a row.
        let sparse = changes.iter().any(|c| {
            c.data.column_by_name(f.name()).is_none() || c.absent.iter().any(|(n, _)| n == f.name())
        });
        let mut has = Vec::with_capacity(if sparse { total } else { 0 });
        for c in changes {
            let part = match c.data.column_by_name(f.name()) {
                Some(a) if a.data_type() == f.data_type() => a.clone(),
                Some(a) => {
                    return Err(Error::internal(format!(
                        "column `{}` is {} in one file and {} in another after admission",
                        f.name(),
                        f.data_type(),
                        a.data_type()
                    )))
                }
                None => arrow::array::new_null_array(f.data_type(), c.data.num_rows()),
            };
            parts.push(part);
            if !sparse {
                continue;
            }
            let start = has.len();
            has.extend(std::iter::repeat_n(
                c.data.column_by_name(f.name()).is_some(),
                c.data.num_rows(),
            ));
            // Rows whose value the file does not carry (a DMS no-sup placeholder) lack the
            // column as a file without it would.
            if let Some((_, rows)) = c.absent.iter().find(|(n, _)| n == f.name()) {
                for (h, a) in has[start..].iter_mut().zip(rows) {
                    *h &= !*a;
                }
            }
        }
        if sparse && has.iter().any(|p| !p) {
            present.push((f.name().clone(), has));
        }
        match parts.as_slice() {
            [one] => columns.push(one.clone()), // one file: no copy
            _ => {
                let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
                columns.push(concat(&refs).map_err(Error::arrow)?);
            }
        }
    }
    let all = RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(total)),
    )
    .map_err(Error::arrow)?;
    Ok(Rows {
        all,
        ops: match changes {
            [one] => std::borrow::Cow::Borrowed(&one.ops[..]),
            _ => changes.iter().flat_map(|c| c.ops.iter().copied()).collect(),
        },
        changes,
        order: std::cell::OnceCell::new(),
        present,
    })
}

/// For one sparse column: per chosen key, the row whose value it takes (null: none) and the
/// order key of the change that set it. Walking a key's changes in order: a change that has
/// the column sets it; a delete sets it to null (a row inserted after it starts empty); a
/// change without the column leaves it as it was.
fn fold_sparse(
    rows: &Rows<'_>,
    present: &[bool],
    chosen: &[(usize, Vec<usize>)],
) -> Result<(UInt32Array, StringArray)> {
    let mut take_rows: Vec<Option<u32>> = Vec::with_capacity(chosen.len());
    let mut seqs: Vec<Option<&str>> = Vec::with_capacity(chosen.len());
    for (_, group) in chosen {
        let mut g: Vec<usize> = group.clone();
        let order = rows.order();
        g.sort_by(|a, b| order[*a].cmp(order[*b]));
        let mut value: Option<u32> = None;
        let mut set_by: Option<&str> = None;
        for i in g {
            if rows.ops[i] == ChangeOp::Delete {
                value = None;
                set_by = Some(order[i]);
            } else if present[i] {
                value = Some(i as u32);
                set_by = Some(order[i]);
            }
        }
        take_rows.push(value);
        seqs.push(set_by);
    }
    Ok((UInt32Array::from(take_rows), StringArray::from(seqs)))
}

/// Turn upserts that a newer tombstone supersedes into deletes carrying the tombstone's
/// order key (so the MERGE removes any older copy of the row). Upserts newer than their
/// key's tombstone stay, but the tombstone's delete comes before them in the key's history:
/// sparse columns no later change of the batch set are cleared as of the tombstone.
/// Returns how many upserts became deletes.
pub(crate) fn apply_tombstones(
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
    let seq_idx = index_of(&schema, &table.writing.sequence_column)?;
    let op_idx = index_of(&schema, OP_COLUMN)?;
    let seqs = plan.batch.column(seq_idx).as_string::<i32>().clone();
    let ops = plan.ops()?;
    let mut new_seq: Vec<String> = Vec::with_capacity(keys.len());
    let mut new_ops: Vec<PlanOp> = Vec::with_capacity(keys.len());
    let mut clear: Vec<(usize, &str)> = Vec::new();
    let mut changed = 0;
    for (i, k) in keys.iter().enumerate() {
        match tombstones.get(k) {
            Some(t) if t.as_str() > seqs.value(i) => {
                changed += usize::from(ops[i] == PlanOp::Upsert);
                new_seq.push(t.clone());
                new_ops.push(PlanOp::Delete);
            }
            Some(t) if ops[i] == PlanOp::Upsert => {
                clear.push((i, t.as_str()));
                new_seq.push(seqs.value(i).to_string());
                new_ops.push(ops[i]);
            }
            _ => {
                new_seq.push(seqs.value(i).to_string());
                new_ops.push(ops[i]);
            }
        }
    }
    let mut cols = plan.batch.columns().to_vec();
    cols[seq_idx] = string_array(new_seq.iter().map(String::as_str));
    cols[op_idx] = string_array(new_ops.iter().map(|o| o.marker()));
    for s in &plan.sparse {
        clear_before(&schema, &mut cols, s, &clear)?;
    }
    plan.deletes = new_ops.iter().filter(|o| **o == PlanOp::Delete).count();
    plan.upserts = new_ops.len() - plan.deletes;
    plan.batch = RecordBatch::try_new(schema, cols).map_err(Error::arrow)?;
    Ok(changed)
}

/// Hold back the plan's upserts older than their key's pending tombstone — a delete recorded
/// whose MERGE is not known to be in the table (in flight, or cut short by a crash or a
/// contention give-up: its retry comes). Applying such an upsert could bring back the row
/// that MERGE deleted, and turning it into the delete would apply the delete before the
/// rest of its file: either shows a state the source never had. The delete's own merge
/// settles the key. Returns how many upserts were held back.
pub(crate) fn hold_back(
    plan: &mut MergePlan,
    table: &TableConfig,
    pending: &HashMap<OwnedRow, String>,
) -> Result<usize> {
    if pending.is_empty() {
        return Ok(0);
    }
    let enc = KeyEncoder::new(&plan.batch.schema(), &table.primary_key)?;
    let keys = enc.encode(&plan.batch)?;
    let seq_idx = index_of(&plan.batch.schema(), &table.writing.sequence_column)?;
    let seqs = plan.batch.column(seq_idx).as_string::<i32>().clone();
    let ops = plan.ops()?;
    let keep: arrow::array::BooleanArray = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let older = pending.get(k).is_some_and(|t| t.as_str() > seqs.value(i));
            Some(!(ops[i] == PlanOp::Upsert && older))
        })
        .collect();
    let held = keep.false_count();
    if held == 0 {
        return Ok(0);
    }
    plan.batch = arrow::compute::filter_record_batch(&plan.batch, &keep).map_err(Error::arrow)?;
    plan.upserts = plan.upserts.saturating_sub(held);
    Ok(held)
}

/// Null a sparse column (and set its order key to the tombstone's) on the rows whose value
/// was set before their key's tombstone.
fn clear_before(
    schema: &SchemaRef,
    cols: &mut [ArrayRef],
    s: &SparseColumn,
    clear: &[(usize, &str)],
) -> Result<()> {
    if clear.is_empty() {
        return Ok(());
    }
    let vi = index_of(schema, &s.column)?;
    let si = index_of(schema, &s.seq_column)?;
    let seqs = cols[si].as_string::<i32>().clone();
    let mut new_seqs: Vec<Option<String>> = seqs.iter().map(|v| v.map(str::to_string)).collect();
    let mut keep = vec![true; seqs.len()];
    for (row, t) in clear {
        if seqs.is_null(*row) || seqs.value(*row) < *t {
            new_seqs[*row] = Some((*t).to_string());
            keep[*row] = false;
        }
    }
    let mask = arrow::array::BooleanArray::from(keep);
    cols[vi] = arrow::compute::nullif(
        &cols[vi],
        &arrow::compute::not(&mask).map_err(Error::arrow)?,
    )
    .map_err(Error::arrow)?;
    cols[si] = Arc::new(StringArray::from(new_seqs));
    Ok(())
}

fn index_of(schema: &SchemaRef, name: &str) -> Result<usize> {
    schema
        .index_of(name)
        .map_err(|_| Error::internal(format!("the merge plan has no column `{name}`")))
}

#[cfg(test)]
mod tests;
