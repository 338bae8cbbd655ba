//! A table's rows read by tributary itself (no SQL engine): the live data files, pruned by
//! the first key column's statistics where a key range is given, each read with its
//! deletion vector applied (`datafile::TableFiles`), only the columns asked for. What the
//! tombstone reads, the history's row lookups, the append check, `status`, maintenance and
//! the demo read.

use std::collections::HashSet;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow::datatypes::{Schema, SchemaRef};
use deltalake::kernel::LogicalFileView;
use deltalake::DeltaTable;
use futures::StreamExt;

use crate::delta::manifest::Partition;
use crate::error::{Error, Result};

/// What a scan reads.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// The columns, in this order (all of the table's when `None`).
    pub columns: Option<Vec<String>>,
    /// Only files whose statistics for this column can hold a value in the range (the
    /// rows of those files are all returned: callers filter).
    pub(crate) range: Option<(String, KeyRange)>,
}

impl Scan {
    /// Every row, these columns.
    pub fn columns<S: AsRef<str>>(columns: &[S]) -> Scan {
        Scan {
            columns: Some(columns.iter().map(|c| c.as_ref().to_string()).collect()),
            range: None,
        }
    }

    /// The schema of what the scan returns: the table's columns asked for, in its types.
    fn schema(&self, table: &SchemaRef, label: &str) -> Result<SchemaRef> {
        let Some(columns) = &self.columns else {
            return Ok(table.clone());
        };
        let fields = columns
            .iter()
            .map(|c| {
                table
                    .field_with_name(c)
                    .cloned()
                    .map_err(|_| Error::Schema {
                        table: label.to_string(),
                        message: format!("the table has no column `{c}`"),
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(std::sync::Arc::new(Schema::new(fields)))
    }

    /// Whether `f` may hold a row in the range (no statistics: yes).
    fn may_hold(&self, f: &LogicalFileView) -> bool {
        let Some((column, range)) = &self.range else {
            return true;
        };
        match file_bounds(f, column, &range.lo) {
            Some((lo, hi)) => range.overlaps(&KeyRange { lo, hi }),
            None => true,
        }
    }

    /// The table's rows (at its loaded version) the scan selects, batch by batch; none for
    /// a table without a version.
    pub async fn rows(&self, table: &DeltaTable) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        self.each(table, |b| {
            out.push(b);
            Ok(true)
        })
        .await?;
        Ok(out)
    }

    /// Hand each batch to `f` until it returns false.
    pub async fn each(
        &self,
        table: &DeltaTable,
        mut f: impl FnMut(RecordBatch) -> Result<bool>,
    ) -> Result<()> {
        let label = table.table_url().to_string();
        let Ok(snapshot) = table.snapshot() else {
            return Ok(());
        };
        let schema = self.schema(&snapshot.snapshot().arrow_schema(), &label)?;
        let partition_columns = snapshot.metadata().partition_columns().to_vec();
        let files = crate::delta::datafile::TableFiles::of(table);
        let selected: Vec<LogicalFileView> = snapshot
            .log_data()
            .iter()
            .filter(|v| self.may_hold(v))
            .collect();
        // Small files (a tombstone table's between maintenance runs: one per merge with
        // deletes) are read several at a time — on S3 each is a round trip — and larger ones
        // streamed one after the other, a batch at a time.
        let (small, large): (Vec<_>, Vec<_>) = selected
            .into_iter()
            .partition(|v| v.size() <= PREFETCH_FILE);
        let mut reads = futures::stream::iter(small.into_iter().map(|v| {
            let (files, schema) = (files.clone(), schema.clone());
            let partition = Partition::of(&v, &partition_columns);
            async move {
                use futures::TryStreamExt;
                let batches = files.stream(&v, &schema, &partition).await?;
                batches.try_collect::<Vec<_>>().await
            }
        }))
        .buffer_unordered(PREFETCH);
        while let Some(read) = reads.next().await {
            for b in read.map_err(|e| e.into_error(&label))? {
                if !f(b)? {
                    return Ok(());
                }
            }
        }
        for v in &large {
            let partition = Partition::of(v, &partition_columns);
            let mut batches = files
                .stream(v, &schema, &partition)
                .await
                .map_err(|e| e.into_error(&label))?;
            while let Some(b) = batches.next().await {
                if !f(b.map_err(|e| e.into_error(&label))?)? {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// Files up to this size are read [`PREFETCH`] at a time, whole.
const PREFETCH_FILE: i64 = 4 * 1024 * 1024;
/// Small files read at once (at most 32 MiB held).
const PREFETCH: usize = 8;

/// A file's minimum and maximum of `column` from its statistics, as bounds of the kind of
/// `like`; none without them.
pub(crate) fn file_bounds(
    f: &LogicalFileView,
    column: &str,
    like: &KeyBound,
) -> Option<(KeyBound, KeyBound)> {
    let stats = f.stats()?;
    let v = serde_json::from_str::<serde_json::Value>(&stats).ok()?;
    let bound = |which: &str| -> Option<KeyBound> {
        match (like, v.get(which)?.get(column)?) {
            (KeyBound::Int(_), serde_json::Value::Number(n)) => n.as_i64().map(KeyBound::Int),
            (KeyBound::Text(_), serde_json::Value::String(s)) => Some(KeyBound::Text(s.clone())),
            _ => None,
        }
    };
    Some((bound("minValues")?, bound("maxValues")?))
}

/// The rows of `table` whose primary key (columns `key`) is one of the rows of `keys`,
/// all columns in the table's types. Files are pruned by the range of the first key column
/// (statistics); the exact keys are kept in memory.
pub(crate) async fn rows_with_keys(
    table: &DeltaTable,
    label: &str,
    key: &[String],
    keys: &RecordBatch,
) -> Result<Vec<RecordBatch>> {
    use arrow::compute::filter_record_batch;
    if table.snapshot().is_err() {
        return Ok(vec![]);
    }
    let range = match keys.column_by_name(&key[0]) {
        Some(k0) => KeyRange::of(k0)?.map(|r| (key[0].clone(), r)),
        None => None,
    };
    let scan = Scan {
        columns: None,
        range,
    };
    let enc = crate::plan::KeyEncoder::new(&keys.schema(), key)?;
    let wanted: HashSet<_> = enc.encode(keys)?.into_iter().collect();
    let mut out = Vec::new();
    scan.each(table, |b| {
        let key_cols = key
            .iter()
            .map(|k| {
                let t = keys
                    .schema()
                    .field_with_name(k)
                    .map_err(Error::arrow)?
                    .data_type()
                    .clone();
                let c = b
                    .column_by_name(k)
                    .ok_or_else(|| Error::internal(format!("{label}: no key column {k}")))?;
                crate::coerce::exact_cast(c, &t).map_err(|e| Error::Schema {
                    table: label.to_string(),
                    message: format!("key column `{k}`: {}", e.describe(c.data_type(), &t)),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let key_batch = RecordBatch::try_new(keys.schema(), key_cols).map_err(Error::arrow)?;
        let mask: BooleanArray = enc
            .encode(&key_batch)?
            .iter()
            .map(|k| Some(wanted.contains(k)))
            .collect();
        out.push(filter_record_batch(&b, &mask).map_err(Error::arrow)?);
        Ok(true)
    })
    .await?;
    Ok(out)
}

/// Whether the table has a row whose `key` is in `range` (integer and string keys).
pub(crate) async fn rows_in_range(table: &DeltaTable, key: &str, range: &KeyRange) -> Result<bool> {
    let scan = Scan {
        columns: Some(vec![key.to_string()]),
        range: Some((key.to_string(), range.clone())),
    };
    let mut found = false;
    scan.each(table, |b| {
        found = any_in_range(b.column(0), range)?;
        Ok(!found)
    })
    .await?;
    Ok(found)
}

/// Whether a value of `a` (an integer or string column) is in `range`.
fn any_in_range(a: &ArrayRef, range: &KeyRange) -> Result<bool> {
    use arrow::array::AsArray;
    use arrow::datatypes::{DataType, Int64Type};
    Ok(match (&range.lo, &range.hi) {
        (KeyBound::Int(lo), KeyBound::Int(hi)) => {
            let a = arrow::compute::cast(a, &DataType::Int64).map_err(Error::arrow)?;
            a.as_primitive::<Int64Type>()
                .iter()
                .flatten()
                .any(|v| (*lo..=*hi).contains(&v))
        }
        (KeyBound::Text(lo), KeyBound::Text(hi)) => {
            let a = arrow::compute::cast(a, &DataType::Utf8).map_err(Error::arrow)?;
            a.as_string::<i32>()
                .iter()
                .flatten()
                .any(|v| v >= lo.as_str() && v <= hi.as_str())
        }
        _ => a.null_count() < a.len(),
    })
}

/// A bound of a key range: integer and string keys.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum KeyBound {
    Int(i64),
    Text(String),
}

impl KeyBound {
    fn literal(&self) -> String {
        match self {
            KeyBound::Int(v) => v.to_string(),
            KeyBound::Text(s) => format!("'{}'", s.replace('\'', "''")),
        }
    }
}

/// The smallest and largest key of a batch (integer and string keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyRange {
    pub(crate) lo: KeyBound,
    pub(crate) hi: KeyBound,
}

/// The range of an integer key column (`None` when it has no value).
fn int_range<T>(a: &arrow::array::PrimitiveArray<T>) -> Option<KeyRange>
where
    T: arrow::datatypes::ArrowNumericType,
    T::Native: Into<i64>,
{
    match (arrow::compute::min(a), arrow::compute::max(a)) {
        (Some(lo), Some(hi)) => Some(KeyRange {
            lo: KeyBound::Int(lo.into()),
            hi: KeyBound::Int(hi.into()),
        }),
        _ => None,
    }
}

impl KeyRange {
    /// The range of `keys`; none for other types or no keys.
    pub(crate) fn of(keys: &ArrayRef) -> Result<Option<KeyRange>> {
        use arrow::array::AsArray;
        use arrow::datatypes::{DataType, Int16Type, Int32Type, Int64Type, Int8Type};
        Ok(match keys.data_type() {
            DataType::Int8 => int_range(keys.as_primitive::<Int8Type>()),
            DataType::Int16 => int_range(keys.as_primitive::<Int16Type>()),
            DataType::Int32 => int_range(keys.as_primitive::<Int32Type>()),
            DataType::Int64 => int_range(keys.as_primitive::<Int64Type>()),
            DataType::Utf8 => {
                let a = keys.as_string::<i32>();
                match (arrow::compute::min_string(a), arrow::compute::max_string(a)) {
                    (Some(lo), Some(hi)) => Some(KeyRange {
                        lo: KeyBound::Text(lo.to_string()),
                        hi: KeyBound::Text(hi.to_string()),
                    }),
                    _ => None,
                }
            }
            _ => None,
        })
    }

    /// `key >= lo AND key <= hi` (SQL).
    pub(crate) fn predicate(&self, key: &str) -> String {
        let ident = format!("\"{}\"", key.replace('"', "\"\""));
        format!(
            "{ident} >= {} AND {ident} <= {}",
            self.lo.literal(),
            self.hi.literal()
        )
    }

    pub(crate) fn overlaps(&self, other: &KeyRange) -> bool {
        self.lo <= other.hi && other.lo <= self.hi
    }

    /// The smallest range holding both.
    pub(crate) fn union(&self, other: &KeyRange) -> KeyRange {
        KeyRange {
            lo: self.lo.clone().min(other.lo.clone()),
            hi: self.hi.clone().max(other.hi.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_in_range_is_found_in_integer_and_string_columns() {
        let ints: ArrayRef =
            std::sync::Arc::new(arrow::array::Int32Array::from(vec![Some(1), None, Some(9)]));
        let range = |lo: i64, hi: i64| KeyRange {
            lo: KeyBound::Int(lo),
            hi: KeyBound::Int(hi),
        };
        assert!(any_in_range(&ints, &range(5, 9)).unwrap());
        assert!(!any_in_range(&ints, &range(2, 8)).unwrap());
        let text: ArrayRef = std::sync::Arc::new(arrow::array::StringArray::from(vec!["b", "x"]));
        let trange = KeyRange {
            lo: KeyBound::Text("c".into()),
            hi: KeyBound::Text("w".into()),
        };
        assert!(!any_in_range(&text, &trange).unwrap());
    }

    #[test]
    fn a_key_columns_range_is_its_smallest_and_largest_value_of_any_integer_width() {
        use arrow::array::{Int16Array, Int32Array, Int64Array, Int8Array};
        use std::sync::Arc;
        let bounds = |a: ArrayRef| {
            KeyRange::of(&a).unwrap().map(|r| match (r.lo, r.hi) {
                (KeyBound::Int(lo), KeyBound::Int(hi)) => (lo, hi),
                _ => panic!("integer bounds expected"),
            })
        };
        assert_eq!(
            bounds(Arc::new(Int8Array::from(vec![Some(-128), None, Some(127)]))),
            Some((-128, 127))
        );
        assert_eq!(
            bounds(Arc::new(Int16Array::from(vec![7, -300, 2]))),
            Some((-300, 7))
        );
        assert_eq!(
            bounds(Arc::new(Int32Array::from(vec![i32::MAX, 0, i32::MIN]))),
            Some((i64::from(i32::MIN), i64::from(i32::MAX)))
        );
        assert_eq!(
            bounds(Arc::new(Int64Array::from(vec![i64::MIN, 1]))),
            Some((i64::MIN, 1))
        );
        assert_eq!(
            bounds(Arc::new(Int32Array::from(vec![None::<i32>, None]))),
            None
        );
    }
}
