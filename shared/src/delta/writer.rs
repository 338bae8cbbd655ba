//! delta-rs's data-file writer, fed one partition at a time. delta-rs splits a batch by
//! partition itself (every row's partition values encoded as a row, hashed, then every column
//! taken in partition order): a fifth of a full load's CPU. Here the rows of each partition
//! are found from the partition columns' bytes with the previous row's partition remembered
//! (rows come in runs: a file, a slice sorted by key), the partition columns are not copied
//! (the files do not hold them), a batch that is all one partition is passed on whole, and a
//! text column whose every value is the same (a full load's order keys, one per file) is
//! sliced for each partition rather than copied row by row.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{downcast_primitive_array, Array, ArrayRef, AsArray, RecordBatch, UInt32Array};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};
use delta_kernel::expressions::Scalar;
use deltalake::datafile::writer::{DeltaWriter, WriterConfig};
use deltalake::kernel::scalars::ScalarExt;
use deltalake::kernel::Add;
use deltalake::logstore::ObjectStoreRef;
use deltalake::{DeltaResult, DeltaTableError};
use indexmap::IndexMap;

/// How data files of a table are written: delta-rs's writer settings and the table's
/// partition columns.
#[derive(Clone)]
pub(crate) struct FileLayout {
    pub(crate) config: WriterConfig,
    pub(crate) partition_columns: Arc<[String]>,
}

/// A data-file writer ([`DeltaWriter`]) that splits batches by partition itself.
pub(crate) struct Writer {
    inner: DeltaWriter,
    partition_columns: Arc<[String]>,
    file_schema: SchemaRef,
}

impl Writer {
    pub(crate) fn new(store: ObjectStoreRef, layout: FileLayout) -> Writer {
        let file_schema = layout.config.file_schema();
        Writer {
            inner: DeltaWriter::new(store, layout.config),
            partition_columns: layout.partition_columns,
            file_schema,
        }
    }

    /// Buffer `batch` (the table's columns, partition columns included) in the files of its
    /// partitions; full files are written out as they fill.
    pub(crate) async fn write(&mut self, batch: &RecordBatch) -> DeltaResult<()> {
        if self.partition_columns.is_empty() {
            return self.inner.write(batch).await;
        }
        let parts = Partitioned::of(batch, &self.partition_columns)?;
        self.write_partitioned(&parts).await
    }

    /// [`Self::write`] for the partitions of a batch already split ([`Partitioned`]; of a
    /// table with these partition columns).
    pub(crate) async fn write_partitioned(&mut self, parts: &Partitioned) -> DeltaResult<()> {
        if self.partition_columns.is_empty() {
            return self.inner.write(&parts.batch).await;
        }
        // The batch's column of each file column, looked up once for every partition.
        let schema = parts.batch.schema();
        let sources = self
            .file_schema
            .fields()
            .iter()
            .map(|f| {
                schema.index_of(f.name()).map_err(|_| {
                    DeltaTableError::generic(format!("column `{}` missing from batch", f.name()))
                })
            })
            .collect::<DeltaResult<Vec<usize>>>()?;
        for rows in &parts.groups {
            let values = rows.values(&self.partition_columns, &parts.partition)?;
            let columns = sources
                .iter()
                .map(|&i| {
                    let c = parts.batch.column(i);
                    let constant = parts.constant.get(i).copied().unwrap_or(false);
                    match &rows.rows {
                        None => Ok(c.clone()),
                        Some(idx) if constant => Ok(c.slice(0, idx.len())),
                        Some(idx) => Ok(arrow::compute::take(c.as_ref(), idx, None)?),
                    }
                })
                .collect::<DeltaResult<Vec<_>>>()?;
            let part = RecordBatch::try_new(self.file_schema.clone(), columns)?;
            self.inner.write_partition(part, &values).await?;
        }
        Ok(())
    }

    /// Write what is buffered; the files written, as `add` actions.
    pub(crate) async fn close(self) -> DeltaResult<Vec<Add>> {
        self.inner.close().await
    }

    /// Abandon the writer (files already written are left for VACUUM).
    pub(crate) async fn abort(self) -> DeltaResult<()> {
        self.inner.abort().await
    }
}

/// A batch's rows split by partition (see the module documentation), to be written by one
/// writer or shared among several ([`Partitioned::shares`]).
#[derive(Clone)]
pub(crate) struct Partitioned {
    batch: RecordBatch,
    /// The partition columns (none: an unpartitioned table).
    partition: Vec<ArrayRef>,
    groups: Vec<Group>,
    /// Per column of the batch: whether every value is the same text ([`constant_text`]),
    /// known only when the batch has several partitions.
    constant: Arc<[bool]>,
}

impl Partitioned {
    /// `batch`'s rows grouped by the values of `partition_columns`.
    pub(crate) fn of(batch: &RecordBatch, partition_columns: &[String]) -> DeltaResult<Self> {
        let partition: Vec<ArrayRef> = partition_columns
            .iter()
            .map(|c| {
                batch.column_by_name(c).cloned().ok_or_else(|| {
                    DeltaTableError::generic(format!("partition column `{c}` missing from batch"))
                })
            })
            .collect::<DeltaResult<_>>()?;
        let groups = match (partition.is_empty(), batch.num_rows()) {
            (_, 0) => Vec::new(),
            (true, _) => vec![Group {
                first: 0,
                rows: None,
            }],
            (false, _) => groups(&partition)?,
        };
        let constant = match groups.len() > 1 {
            true => batch.columns().iter().map(constant_text).collect(),
            false => Arc::from([]),
        };
        Ok(Partitioned {
            batch: batch.clone(),
            partition,
            groups,
            constant,
        })
    }

    /// The partitions dealt into at most `n` shares of about the same number of rows (the
    /// largest partition first, each to the share with the fewest rows so far), for `n`
    /// writers to write at once: each partition whole in one share, so a batch makes the
    /// same files however many write it. No empty share.
    pub(crate) fn shares(self, n: usize) -> Vec<Partitioned> {
        let rows = |g: &Group| g.rows.as_ref().map_or(self.batch.num_rows(), |r| r.len());
        let n = n.clamp(1, self.groups.len().max(1));
        let mut order: Vec<usize> = (0..self.groups.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(rows(&self.groups[i])));
        let mut dealt: Vec<(usize, Vec<usize>)> = vec![(0, Vec::new()); n];
        for i in order {
            let Some(least) = dealt.iter_mut().min_by_key(|(r, _)| *r) else {
                break;
            };
            least.0 += rows(&self.groups[i]);
            least.1.push(i);
        }
        dealt
            .into_iter()
            .filter(|(_, members)| !members.is_empty())
            .map(|(_, mut members)| {
                // Partitions keep the batch's order within a share.
                members.sort_unstable();
                Partitioned {
                    batch: self.batch.clone(),
                    partition: self.partition.clone(),
                    groups: members.iter().map(|&i| self.groups[i].clone()).collect(),
                    constant: self.constant.clone(),
                }
            })
            .collect()
    }

    /// The rows of the batch in the share.
    #[cfg(test)]
    fn num_rows(&self) -> usize {
        self.groups
            .iter()
            .map(|g| g.rows.as_ref().map_or(self.batch.num_rows(), |r| r.len()))
            .sum()
    }
}

/// Whether every value of `c` is the same text, none null: then any `n` of its rows are its
/// first `n`. Checked from the ends in: a column whose first and last values differ (an
/// order key of a CDC change, any ordinary column) costs two comparisons.
fn constant_text(c: &ArrayRef) -> bool {
    let Some(s) = c.as_string_opt::<i32>() else {
        return false;
    };
    let n = s.len();
    if n < 2 || s.null_count() > 0 || s.value(0) != s.value(n - 1) {
        return false;
    }
    let width = s.value(0).len();
    let offsets = s.value_offsets();
    if !offsets
        .windows(2)
        .all(|w| usize::try_from(w[1] - w[0]).is_ok_and(|l| l == width))
    {
        return false;
    }
    // Equal widths: the values are one run of bytes, each equal to the one before it.
    let start = usize::try_from(offsets[0]).unwrap_or(0);
    let Some(bytes) = s.value_data().get(start..start + n * width) else {
        return false;
    };
    bytes[width..] == bytes[..bytes.len() - width]
}

/// The rows of one partition.
#[derive(Clone)]
struct Group {
    /// A row of the partition (its values).
    first: usize,
    /// Its rows in batch order; `None`: every row of the batch.
    rows: Option<UInt32Array>,
}

impl Group {
    /// The partition's values, as delta-rs's writer takes them.
    fn values(
        &self,
        names: &[String],
        columns: &[ArrayRef],
    ) -> DeltaResult<IndexMap<String, Scalar>> {
        names
            .iter()
            .zip(columns)
            .map(|(n, c)| {
                let v = Scalar::from_array(c.as_ref(), self.first).ok_or_else(|| {
                    DeltaTableError::generic(format!(
                        "partition column `{n}`: type {} cannot be a partition value",
                        c.data_type()
                    ))
                })?;
                Ok((n.clone(), v))
            })
            .collect()
    }
}

/// Partitions looked up in a list rather than a map (most tables have a few per batch).
const FEW_PARTITIONS: usize = 16;

/// The batch's rows grouped by partition, partitions in the order of their first row.
fn groups(columns: &[ArrayRef]) -> DeltaResult<Vec<Group>> {
    let rows = columns.first().map_or(0, |c| c.len());
    let keys = RowKeys::of(columns)?;
    // One partition column of short values (the usual case): each row's value as a number.
    let (ids, firsts) = match keys.short() {
        // A null is `u128::MAX`: a value's last byte is its length, at most 15.
        Some((short, nulls)) => assign(rows, 0u128, |row, k| {
            *k = match nulls.is_some_and(|n| n.is_null(row)) {
                true => u128::MAX,
                false => short.key(row),
            }
        })?,
        None => assign(rows, Vec::with_capacity(columns.len()), |row, k| {
            k.clear();
            keys.fill(row, k);
        })?,
    };
    if firsts.len() <= 1 {
        return Ok(firsts
            .into_iter()
            .map(|first| Group { first, rows: None })
            .collect());
    }
    let mut counts = vec![0usize; firsts.len()];
    for &id in &ids {
        counts[id as usize] += 1;
    }
    let mut members: Vec<Vec<u32>> = counts.iter().map(|&n| Vec::with_capacity(n)).collect();
    for (row, &id) in ids.iter().enumerate() {
        members[id as usize].push(row as u32);
    }
    Ok(firsts
        .into_iter()
        .zip(members)
        .map(|(first, m)| Group {
            first,
            rows: Some(UInt32Array::from(m)),
        })
        .collect())
}

/// Each row's partition number (partitions numbered in the order of their first row) and
/// each partition's first row; `key` tells a row's partition.
fn assign<K: Eq + std::hash::Hash + Clone>(
    rows: usize,
    empty: K,
    mut key: impl FnMut(usize, &mut K),
) -> DeltaResult<(Vec<u32>, Vec<usize>)> {
    let mut ids: Vec<u32> = Vec::with_capacity(rows);
    let mut firsts: Vec<usize> = Vec::new();
    // A few partitions are looked up in a list, more in a map.
    let mut few: Vec<(K, u32)> = Vec::new();
    let mut seen: HashMap<K, u32, foldhash::fast::RandomState> = HashMap::default();
    // The previous row's partition: rows often come in runs (a slice in key order).
    let (mut previous, mut previous_id) = (empty.clone(), None);
    let mut k = empty;
    for row in 0..rows {
        key(row, &mut k);
        let id = match previous_id {
            Some(id) if k == previous => id,
            _ => {
                let found = match seen.is_empty() {
                    true => few.iter().find(|(f, _)| *f == k).map(|(_, id)| *id),
                    false => seen.get(&k).copied(),
                };
                let id = match found {
                    Some(id) => id,
                    None => {
                        let id = u32::try_from(firsts.len()).map_err(|_| {
                            DeltaTableError::generic("more than 2^32 partitions in one batch")
                        })?;
                        firsts.push(row);
                        if seen.is_empty() && few.len() < FEW_PARTITIONS {
                            few.push((k.clone(), id));
                        } else {
                            seen.extend(few.drain(..));
                            seen.insert(k.clone(), id);
                        }
                        id
                    }
                };
                previous.clone_from(&k);
                previous_id = Some(id);
                id
            }
        };
        ids.push(id);
    }
    Ok((ids, firsts))
}

/// The partition columns' values as bytes (`None`: null), row by row: two rows are in the
/// same partition exactly when their bytes are equal, column by column.
enum ColumnBytes<'a> {
    /// Fixed-width values (numbers, dates, timestamps, decimals): the values and the width.
    Fixed(&'a [u8], usize),
    /// Strings or binary: offsets into the values.
    Small(&'a [i32], &'a [u8]),
    Large(&'a [i64], &'a [u8]),
}

impl ColumnBytes<'_> {
    fn bytes(&self, row: usize) -> &[u8] {
        match self {
            ColumnBytes::Fixed(values, w) => &values[row * w..(row + 1) * w],
            ColumnBytes::Small(o, v) => &v[o[row] as usize..o[row + 1] as usize],
            ColumnBytes::Large(o, v) => &v[o[row] as usize..o[row + 1] as usize],
        }
    }

    /// A value of at most 15 bytes as a number: its bytes, then its length.
    fn key(&self, row: usize) -> u128 {
        let b = self.bytes(row);
        // Byte by byte: a copy of a few bytes of unknown length is a call to `memcpy`.
        b.iter()
            .enumerate()
            .fold((b.len() as u128) << 120, |k, (i, &v)| {
                k | u128::from(v) << (8 * i)
            })
    }
}

/// How each row's partition is told.
enum RowKeys<'a> {
    /// Column by column, from the arrays' own buffers.
    Columns(Vec<(ColumnBytes<'a>, Option<&'a NullBuffer>)>),
    /// Other types (booleans, views…): every column encoded as one row (as delta-rs does).
    Rows(Rows),
}

impl<'a> RowKeys<'a> {
    fn of(columns: &'a [ArrayRef]) -> DeltaResult<RowKeys<'a>> {
        let direct: Option<Vec<_>> = columns
            .iter()
            .map(|c| {
                let bytes = match c.data_type() {
                    DataType::Utf8 => {
                        let s = c.as_string::<i32>();
                        ColumnBytes::Small(s.value_offsets(), s.value_data())
                    }
                    DataType::LargeUtf8 => {
                        let s = c.as_string::<i64>();
                        ColumnBytes::Large(s.value_offsets(), s.value_data())
                    }
                    DataType::Binary => {
                        let s = c.as_binary::<i32>();
                        ColumnBytes::Small(s.value_offsets(), s.value_data())
                    }
                    DataType::LargeBinary => {
                        let s = c.as_binary::<i64>();
                        ColumnBytes::Large(s.value_offsets(), s.value_data())
                    }
                    t => {
                        let width = t.primitive_width()?;
                        downcast_primitive_array!(
                            c => ColumnBytes::Fixed(c.values().inner().as_slice(), width),
                            _ => return None
                        )
                    }
                };
                Some((bytes, c.nulls()))
            })
            .collect();
        Ok(match direct {
            Some(d) => RowKeys::Columns(d),
            None => {
                let fields = columns
                    .iter()
                    .map(|a| SortField::new(a.data_type().clone()))
                    .collect();
                RowKeys::Rows(RowConverter::new(fields)?.convert_columns(columns)?)
            }
        })
    }

    /// The one partition column (and its nulls), when every value is at most 15 bytes.
    fn short(&self) -> Option<(&ColumnBytes<'a>, Option<&'a NullBuffer>)> {
        let RowKeys::Columns(columns) = self else {
            return None;
        };
        let [(c, nulls)] = columns.as_slice() else {
            return None;
        };
        let short = match c {
            ColumnBytes::Fixed(_, w) => *w <= 15,
            ColumnBytes::Small(o, _) => o.windows(2).all(|w| w[1] - w[0] <= 15),
            ColumnBytes::Large(o, _) => o.windows(2).all(|w| w[1] - w[0] <= 15),
        };
        short.then_some((c, *nulls))
    }

    fn fill<'b>(&'b self, row: usize, key: &mut Vec<Option<&'b [u8]>>) {
        match self {
            RowKeys::Rows(rows) => key.push(Some(rows.row(row).data())),
            RowKeys::Columns(columns) => {
                for (c, nulls) in columns {
                    if nulls.is_some_and(|n| n.is_null(row)) {
                        key.push(None);
                        continue;
                    }
                    key.push(Some(c.bytes(row)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow::array::{BooleanArray, Date32Array, Int32Array, StringArray};

    use super::*;

    /// Rows grouped naively: by each row's values as text, partitions by first row.
    fn naive(columns: &[ArrayRef]) -> Vec<Vec<u32>> {
        let rows = columns[0].len();
        let mut order: Vec<String> = Vec::new();
        let mut by: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for r in 0..rows {
            let key = columns
                .iter()
                .map(|c| match c.is_null(r) {
                    true => "∅".to_string(),
                    false => arrow::util::display::array_value_to_string(c, r).unwrap(),
                })
                .collect::<Vec<_>>()
                .join("|");
            if !by.contains_key(&key) {
                order.push(key.clone());
            }
            by.entry(key).or_default().push(r as u32);
        }
        order.into_iter().map(|k| by.remove(&k).unwrap()).collect()
    }

    fn grouped(columns: &[ArrayRef]) -> Vec<Vec<u32>> {
        let rows = columns[0].len() as u32;
        groups(columns)
            .unwrap()
            .into_iter()
            .map(|g| match g.rows {
                Some(r) => r.values().to_vec(),
                None => (0..rows).collect(),
            })
            .collect()
    }

    #[test]
    fn rows_are_grouped_by_partition_whatever_the_types() {
        let long = |i: usize| format!("a partition value longer than fifteen bytes {}", i % 3);
        let cases: Vec<Vec<ArrayRef>> = vec![
            // Interleaved short strings, with nulls (the number path).
            vec![Arc::new(StringArray::from_iter((0..100).map(|i| {
                (i % 7 != 3).then(|| ["A", "B", "C", ""][i % 4].to_string())
            })))],
            // More partitions than the list holds (the map path).
            vec![Arc::new(Int32Array::from_iter_values(
                (0..500).map(|i| i % 37),
            ))],
            // Long values (the bytes path), and two columns.
            vec![Arc::new(StringArray::from_iter_values((0..60).map(long)))],
            vec![
                Arc::new(StringArray::from_iter_values(
                    (0..60).map(|i| ["x", "y"][i % 2]),
                )),
                Arc::new(Date32Array::from_iter(
                    (0..60).map(|i| (i % 5 != 0).then_some(i % 3)),
                )),
            ],
            // A type compared as encoded rows.
            vec![Arc::new(BooleanArray::from_iter(
                (0..30).map(|i| (i % 4 != 0).then_some(i % 3 == 0)),
            ))],
            // One partition: the batch is passed on whole.
            vec![Arc::new(StringArray::from_iter_values(
                (0..10).map(|_| "only"),
            ))],
        ];
        for columns in cases {
            assert_eq!(
                grouped(&columns),
                naive(&columns),
                "{:?}",
                columns[0].data_type()
            );
        }
        let one = vec![Arc::new(StringArray::from_iter_values(["a", "a"])) as ArrayRef];
        assert!(groups(&one).unwrap()[0].rows.is_none());
    }

    #[test]
    fn partitions_are_dealt_whole_into_shares_of_about_equal_rows() {
        use arrow::datatypes::{Field, Schema};
        let batch = |parts: &[(&str, usize)]| {
            let values: Vec<&str> = (0..parts.iter().map(|p| p.1).max().unwrap_or(0))
                .flat_map(|i| parts.iter().filter(move |p| i < p.1).map(|p| p.0))
                .collect();
            let n = values.len() as i32;
            RecordBatch::try_new(
                Arc::new(Schema::new(vec![
                    Field::new("id", DataType::Int32, false),
                    Field::new("p", DataType::Utf8, true),
                ])),
                vec![
                    Arc::new(Int32Array::from_iter_values(0..n)),
                    Arc::new(StringArray::from(values)),
                ],
            )
            .unwrap()
        };
        let names = |p: &Partitioned| -> Vec<String> {
            p.groups
                .iter()
                .map(|g| p.partition[0].as_string::<i32>().value(g.first).to_string())
                .collect()
        };
        let parts = ["p".to_string()];
        // Interleaved rows of partitions of 50, 30, 20, 20 and 5 rows, dealt to two writers.
        let b = batch(&[("a", 5), ("b", 50), ("c", 20), ("d", 30), ("e", 20)]);
        let shares = Partitioned::of(&b, &parts).unwrap().shares(2);
        let dealt: Vec<(Vec<String>, usize)> =
            shares.iter().map(|s| (names(s), s.num_rows())).collect();
        assert_eq!(
            dealt,
            vec![
                (vec!["b".to_string(), "e".to_string()], 70),
                (vec!["a".into(), "c".into(), "d".into()], 55)
            ]
        );
        // Each partition's rows whole, in batch order, in exactly one share.
        let whole = Partitioned::of(&b, &parts).unwrap();
        for share in &shares {
            for g in &share.groups {
                let all = whole.groups.iter().find(|w| w.first == g.first).unwrap();
                assert_eq!(g.rows, all.rows);
            }
        }
        // More writers than partitions: one partition each; one partition or no partition
        // column: one share, the batch whole; no rows: nothing to write.
        let few = batch(&[("a", 3), ("b", 1)]);
        assert_eq!(Partitioned::of(&few, &parts).unwrap().shares(4).len(), 2);
        let one = batch(&[("a", 3)]);
        let shares = Partitioned::of(&one, &parts).unwrap().shares(2);
        assert_eq!((shares.len(), shares[0].num_rows()), (1, 3));
        assert!(shares[0].groups[0].rows.is_none());
        let unpartitioned = Partitioned::of(&b, &[]).unwrap().shares(2);
        assert_eq!(unpartitioned.len(), 1);
        assert_eq!(unpartitioned[0].num_rows(), 125);
        assert!(Partitioned::of(&b.slice(0, 0), &parts)
            .unwrap()
            .shares(2)
            .is_empty());
    }

    #[test]
    fn a_column_of_one_text_is_sliced_and_any_other_taken() {
        use arrow::datatypes::{Field, Schema};
        let key = "0 LOAD00000001.parquet";
        let texts = |v: Vec<Option<&str>>| Arc::new(StringArray::from(v)) as ArrayRef;
        assert!(constant_text(&texts(vec![Some(key); 5])));
        // A slice of a longer column (offsets not from zero) is judged by its own rows.
        let mut v = vec![Some("x"), Some(key), Some(key), Some(key)];
        assert!(constant_text(&texts(v.clone()).slice(1, 3)));
        assert!(!constant_text(&texts(v.clone())));
        // The same ends but another value within, of the same or another width; a null; an
        // empty text everywhere; one row; not text.
        v = vec![Some(key), Some("0 LOAD00000002.parquet"), Some(key)];
        assert!(!constant_text(&texts(v)));
        assert!(!constant_text(&texts(vec![
            Some(key),
            Some("0"),
            Some(key)
        ])));
        assert!(!constant_text(&texts(vec![Some(key), None, Some(key)])));
        assert!(constant_text(&texts(vec![Some(""); 3])));
        assert!(!constant_text(&texts(vec![Some(key)])));
        assert!(!constant_text(
            &(Arc::new(Int32Array::from(vec![1, 1, 1])) as ArrayRef)
        ));
        // Written by partition, a constant column and a taken one hold the same rows.
        let schema = Arc::new(Schema::new(vec![
            Field::new("p", DataType::Utf8, false),
            Field::new("seq", DataType::Utf8, false),
            Field::new("id", DataType::Int32, false),
        ]));
        let n = 40;
        let batch = RecordBatch::try_new(
            schema,
            vec![
                texts((0..n).map(|i| Some(["a", "b", "c"][i % 3])).collect()),
                texts(vec![Some(key); n]),
                Arc::new(Int32Array::from_iter_values(0..n as i32)),
            ],
        )
        .unwrap();
        let parts = Partitioned::of(&batch, &["p".to_string()]).unwrap();
        assert_eq!(&*parts.constant, &[false, true, false]);
        for g in &parts.groups {
            let idx = g.rows.as_ref().unwrap();
            let taken = arrow::compute::take(batch.column(1).as_ref(), idx, None).unwrap();
            assert_eq!(batch.column(1).slice(0, idx.len()).as_ref(), taken.as_ref());
        }
        // One partition: nothing is split, nothing checked.
        let one = Partitioned::of(&batch, &["seq".to_string()]).unwrap();
        assert!(one.constant.is_empty());
    }

    #[test]
    fn a_short_value_and_a_null_are_different_partitions() {
        // A value's number ends with its length: "" and a null, "a" and "a\0" differ.
        let columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from(vec![
            Some(""),
            None,
            Some("a"),
            Some("a\0"),
            Some(""),
        ]))];
        assert_eq!(
            grouped(&columns),
            vec![vec![0, 4], vec![1], vec![2], vec![3]]
        );
    }
}
