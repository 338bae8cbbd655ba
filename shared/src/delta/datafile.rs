//! A table's data files read directly (compaction, copy-on-write rewrites, scans): a file's
//! rows in the table's schema, partition values as columns, the rows its deletion vector
//! deletes left out. Not for tables with column mapping (callers refuse them).

use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Schema, SchemaRef};
use deltalake::kernel::LogicalFileView;
use deltalake::ObjectStore;
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};

use crate::delta::manifest::Partition;

/// Why a data file could not be read.
#[derive(Debug)]
pub(crate) struct ReadError {
    pub(crate) file: String,
    pub(crate) message: String,
}

impl ReadError {
    /// As the engine's error for a data file of `table`.
    pub(crate) fn into_error(self, table: &str) -> crate::error::Error {
        crate::error::Error::DataFile {
            table: table.to_string(),
            file: self.file,
            message: self.message,
        }
    }
}

type Result<T> = std::result::Result<T, ReadError>;

/// Where a table's data files and deletion vectors are read from.
#[derive(Clone)]
pub(crate) struct TableFiles {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// For the kernel engine that reads deletion vectors (made only when a file has one).
    log_store: deltalake::logstore::LogStoreRef,
    root: url::Url,
}

impl TableFiles {
    pub(crate) fn of(table: &deltalake::DeltaTable) -> TableFiles {
        let log_store = table.log_store();
        let mut root = log_store.root_url().clone();
        if !root.path().ends_with('/') {
            root.set_path(&format!("{}/", root.path()));
        }
        TableFiles {
            store: log_store.object_store(None),
            log_store: log_store.clone(),
            root,
        }
    }

    /// The rows of `f` its deletion vector deletes (by position in the file), read with the
    /// Delta kernel (inline, or a `deletion_vector_*.bin` file: magic number, size and
    /// checksum checked); none without a vector.
    pub(crate) async fn deleted(&self, f: &LogicalFileView) -> Result<Deleted> {
        let Some(dv) = f.deletion_vector_descriptor() else {
            return Ok(None);
        };
        let file = f.path().to_string();
        let err = |message: String| ReadError {
            file: file.clone(),
            message: format!("its deletion vector: {message}"),
        };
        let dv = delta_kernel::actions::deletion_vector::DeletionVectorDescriptor::try_from(dv)
            .map_err(|e| err(e.to_string()))?;
        let storage = self.log_store.engine(None).storage_handler();
        let root = self.root.clone();
        let read = tokio::task::spawn_blocking(move || dv.read(storage, &root))
            .await
            .map_err(|e| err(e.to_string()))?
            .map_err(|e| err(e.to_string()))?;
        Ok(Some(Arc::new(read)))
    }

    /// [`stream`] with the file's deletion vector applied.
    pub(crate) async fn stream(
        &self,
        f: &LogicalFileView,
        schema: &SchemaRef,
        partition: &Partition,
    ) -> Result<impl futures::Stream<Item = Result<RecordBatch>> + Send + use<>> {
        use futures::StreamExt;
        let deleted = self.deleted(f).await?;
        let rows = stream(self.store.clone(), f, schema, partition).await?;
        let label = f.path().to_string();
        let mut at = 0u64;
        Ok(rows.map(move |b| {
            let b = b?;
            let first = at;
            at += b.num_rows() as u64;
            without_deleted(b, first, deleted.as_deref()).map_err(|message| ReadError {
                file: label.clone(),
                message,
            })
        }))
    }

    /// A data file opened for reading more than once, with its deletion vector.
    pub(crate) async fn open(&self, f: &LogicalFileView) -> Result<OpenFile> {
        let deleted = self.deleted(f).await?;
        OpenFile::open(self.store.clone(), f, WHOLE_FILE, deleted).await
    }

    /// [`read`] with the file's deletion vector applied.
    pub(crate) async fn read(
        &self,
        f: &LogicalFileView,
        schema: &SchemaRef,
        partition: &Partition,
    ) -> Result<Vec<RecordBatch>> {
        let deleted = self.deleted(f).await?;
        let batches = read(self.store.clone(), f, schema, partition).await?;
        let mut at = 0u64;
        batches
            .into_iter()
            .map(|b| {
                let first = at;
                at += b.num_rows() as u64;
                without_deleted(b, first, deleted.as_deref()).map_err(|message| ReadError {
                    file: f.path().to_string(),
                    message,
                })
            })
            .collect()
    }
}

/// A batch of a data file's rows (deleted rows left out) with their positions in the file.
pub(crate) struct Positioned {
    pub(crate) batch: RecordBatch,
    /// The position in the file of the batch's first row read.
    first: u64,
    /// Per row of `batch`, its position in the file, when its deletion vector left rows of
    /// it out (else row `i` is at `first + i`).
    kept: Option<Vec<u64>>,
}

impl Positioned {
    /// The position in the file of row `i` of the batch.
    pub(crate) fn position(&self, i: usize) -> u64 {
        match &self.kept {
            Some(kept) => kept[i],
            None => self.first + i as u64,
        }
    }
}

/// The rows a deletion vector deletes, by position in the file.
pub(crate) type Deleted = Option<Arc<roaring::RoaringTreemap>>;

/// The rows of `b` (rows `first..` of its file) that `deleted` does not hold.
fn without_deleted(
    b: RecordBatch,
    first: u64,
    deleted: Option<&roaring::RoaringTreemap>,
) -> std::result::Result<RecordBatch, String> {
    let end = first + b.num_rows() as u64;
    let Some(deleted) = deleted.filter(|d| d.range_cardinality(first..end) > 0) else {
        return Ok(b);
    };
    let keep = arrow::array::BooleanArray::from(kept_mask(first, end, deleted));
    arrow::compute::filter_record_batch(&b, &keep).map_err(|e| e.to_string())
}

/// Per row `first..end` of a file, whether `deleted` does not hold it: the vector's rows in
/// the range visited once (asking the treemap row by row was a sixth of a merge-on-read
/// merge's time once most files had a vector).
fn kept_mask(first: u64, end: u64, deleted: &roaring::RoaringTreemap) -> Vec<bool> {
    let mut keep = vec![true; (end - first) as usize];
    let mut rows = deleted.iter();
    rows.advance_to(first);
    for d in rows.take_while(|d| *d < end) {
        keep[(d - first) as usize] = false;
    }
    keep
}

/// Bytes read from the end of a data file for its metadata in the first request.
const FOOTER_HINT: usize = 64 * 1024;

/// Files up to this size are fetched whole in one GET, metadata and row groups together.
/// Between maintenance runs a table's files are mostly the few-KB files of single merges,
/// and a rewrite reads every column of a file it reads, so the second request (the row
/// groups after the footer) would fetch almost the whole file anyway. Bounded: a rewrite
/// reads four files at a time (`rewrite::PARALLEL_FILES`), a widening one, so at most
/// 16 MiB is held this way.
const WHOLE_FILE: u64 = 4 * 1024 * 1024;

/// Reads a data file for the Parquet decoder. delta-rs's `ParquetObjectReader` fetches a
/// row group's column chunks one GET after the other and the footer in two; on S3 that is
/// 2 + one request per column for each small file, each a round trip. This one fetches a
/// file up to [`WHOLE_FILE`] in one GET and serves every range from it; a larger file's
/// footer with a hint (one GET: tributary's footers are a few KB) and a row group's chunks
/// with one `get_ranges` (nearby ranges coalesced, fetched concurrently).
#[derive(Clone)]
struct Reader {
    store: Arc<dyn ObjectStore>,
    path: object_store::path::Path,
    size: u64,
    /// Fetch the file whole when `size` is at most this.
    whole_file: u64,
    /// The whole file, when it was fetched whole.
    whole: Option<bytes::Bytes>,
}

impl Reader {
    /// `range` of the file fetched whole, or why it is not in it.
    fn cut(
        whole: &bytes::Bytes,
        range: std::ops::Range<u64>,
    ) -> parquet::errors::Result<bytes::Bytes> {
        let len = whole.len() as u64;
        if range.start > range.end || range.end > len {
            return Err(parquet::errors::ParquetError::EOF(format!(
                "bytes {}..{} asked of a file of {len} bytes",
                range.start, range.end
            )));
        }
        Ok(whole.slice(range.start as usize..range.end as usize))
    }
}

impl parquet::arrow::async_reader::AsyncFileReader for Reader {
    fn get_bytes(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> futures::future::BoxFuture<'_, parquet::errors::Result<bytes::Bytes>> {
        Box::pin(async move {
            if let Some(whole) = &self.whole {
                return Self::cut(whole, range);
            }
            self.store
                .get_range(&self.path, range)
                .await
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))
        })
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<std::ops::Range<u64>>,
    ) -> futures::future::BoxFuture<'_, parquet::errors::Result<Vec<bytes::Bytes>>> {
        Box::pin(async move {
            if let Some(whole) = &self.whole {
                return ranges.into_iter().map(|r| Self::cut(whole, r)).collect();
            }
            self.store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))
        })
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a parquet::arrow::arrow_reader::ArrowReaderOptions>,
    ) -> futures::future::BoxFuture<
        'a,
        parquet::errors::Result<Arc<parquet::file::metadata::ParquetMetaData>>,
    > {
        Box::pin(async move {
            let size = self.size;
            if size <= self.whole_file {
                let external = |e| parquet::errors::ParquetError::External(Box::new(e));
                let whole = self
                    .store
                    .get(&self.path)
                    .await
                    .map_err(external)?
                    .bytes()
                    .await
                    .map_err(external)?;
                let metadata = parquet::file::metadata::ParquetMetaDataReader::new()
                    .parse_and_finish(&whole)?;
                self.whole = Some(whole);
                return Ok(Arc::new(metadata));
            }
            let metadata = parquet::file::metadata::ParquetMetaDataReader::new()
                .with_prefetch_hint(Some(FOOTER_HINT))
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        })
    }
}

/// A data file's rows in the table's schema (as [`read`]), streamed a batch at a time: only
/// the row group being decoded is in memory (the whole file, up to [`WHOLE_FILE`]). Every
/// row of the file: [`TableFiles::stream`] leaves out those its deletion vector deletes.
async fn stream(
    store: Arc<dyn ObjectStore>,
    f: &LogicalFileView,
    schema: &SchemaRef,
    partition: &Partition,
) -> Result<impl futures::Stream<Item = Result<RecordBatch>> + Send + use<>> {
    stream_fetching_whole(store, f, schema, partition, WHOLE_FILE).await
}

/// [`stream`], fetching the file whole when it is at most `whole_file` bytes.
async fn stream_fetching_whole(
    store: Arc<dyn ObjectStore>,
    f: &LogicalFileView,
    schema: &SchemaRef,
    partition: &Partition,
    whole_file: u64,
) -> Result<impl futures::Stream<Item = Result<RecordBatch>> + Send + use<>> {
    OpenFile::open(store, f, whole_file, None)
        .await?
        .stream(schema, schema, partition, None)
}

/// A data file opened to be read more than once (merge-on-read reads its key columns, then
/// the rows they pick): its metadata read and, up to [`WHOLE_FILE`], its bytes fetched once.
pub(crate) struct OpenFile {
    reader: Reader,
    metadata: ArrowReaderMetadata,
    /// The rows its deletion vector deletes.
    pub(crate) deleted: Deleted,
    label: String,
}

impl OpenFile {
    async fn open(
        store: Arc<dyn ObjectStore>,
        f: &LogicalFileView,
        whole_file: u64,
        deleted: Deleted,
    ) -> Result<OpenFile> {
        let path = f.object_store_path();
        let label = path.to_string();
        let mut reader = Reader {
            store,
            path,
            size: f.size().max(0) as u64,
            whole_file,
            whole: None,
        };
        let unreadable = |e: parquet::errors::ParquetError| ReadError {
            file: label.clone(),
            message: e.to_string(),
        };
        let metadata = ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::new())
            .await
            .map_err(unreadable)?;
        let metadata = int96_as_micros(metadata).map_err(unreadable)?;
        Ok(OpenFile {
            reader,
            metadata,
            deleted,
            label,
        })
    }

    /// The file's rows (all of them, or those `selection` picks) in `schema`, a batch at a
    /// time: only the columns of `read` decoded, the others null.
    fn stream(
        &self,
        read: &SchemaRef,
        schema: &SchemaRef,
        partition: &Partition,
        selection: Option<parquet::arrow::arrow_reader::RowSelection>,
    ) -> Result<impl futures::Stream<Item = Result<RecordBatch>> + Send + use<>> {
        use futures::StreamExt;
        use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
        let label = self.label.clone();
        let mask = projection(&self.metadata, read);
        let mut builder = ParquetRecordBatchStreamBuilder::new_with_metadata(
            self.reader.clone(),
            self.metadata.clone(),
        )
        .with_projection(mask)
        .with_batch_size(8192);
        if let Some(selection) = selection {
            builder = builder.with_row_selection(selection);
        }
        let stream = builder.build().map_err(|e| ReadError {
            file: label.clone(),
            message: e.to_string(),
        })?;
        let (schema, partition) = (schema.clone(), partition.clone());
        Ok(stream.map(move |b| {
            let err = |message: String| ReadError {
                file: label.clone(),
                message,
            };
            let b = b.map_err(|e| err(e.to_string()))?;
            to_table_schema(&b, &schema, &partition).map_err(err)
        }))
    }

    /// The file's rows in `schema` with their positions in the file, the rows its deletion
    /// vector deletes left out.
    pub(crate) fn positioned(
        &self,
        schema: &SchemaRef,
        partition: &Partition,
    ) -> Result<impl futures::Stream<Item = Result<Positioned>> + Send + use<>> {
        use futures::StreamExt;
        let rows = self.stream(schema, schema, partition, None)?;
        let label = self.label.clone();
        let mut at = 0u64;
        let held = self.deleted.clone();
        Ok(rows.map(move |b| {
            let b = b?;
            let first = at;
            at += b.num_rows() as u64;
            let Some(d) = held
                .as_deref()
                .filter(|d| d.range_cardinality(first..at) > 0)
            else {
                return Ok(Positioned {
                    batch: b,
                    first,
                    kept: None,
                });
            };
            let mask = kept_mask(first, at, d);
            let kept: Vec<u64> = (first..at)
                .zip(&mask)
                .filter(|(_, k)| **k)
                .map(|(i, _)| i)
                .collect();
            let batch =
                arrow::compute::filter_record_batch(&b, &arrow::array::BooleanArray::from(mask))
                    .map_err(|e| ReadError {
                        file: label.clone(),
                        message: e.to_string(),
                    })?;
            Ok(Positioned {
                batch,
                first,
                kept: Some(kept),
            })
        }))
    }

    /// The file's rows (its deletion vector's included).
    pub(crate) fn rows(&self) -> u64 {
        self.metadata.metadata().file_metadata().num_rows().max(0) as u64
    }

    /// The rows at `positions` (ascending, none deleted) in `schema`, only the columns of
    /// `read` read (the others null): the pages that hold none of them are skipped.
    pub(crate) async fn rows_at(
        &self,
        read: &SchemaRef,
        schema: &SchemaRef,
        partition: &Partition,
        positions: &[u64],
    ) -> Result<Vec<RecordBatch>> {
        use futures::TryStreamExt;
        use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
        let total = self.rows();
        let mut selectors = Vec::new();
        let mut at = 0u64;
        for &p in positions {
            if p < at || p >= total {
                return Err(ReadError {
                    file: self.label.clone(),
                    message: format!("row {p} asked of a file of {total} rows, after row {at}"),
                });
            }
            if p > at {
                selectors.push(RowSelector::skip((p - at) as usize));
            }
            selectors.push(RowSelector::select(1));
            at = p + 1;
        }
        if total > at {
            selectors.push(RowSelector::skip((total - at) as usize));
        }
        self.stream(read, schema, partition, Some(RowSelection::from(selectors)))?
            .try_collect()
            .await
    }
}

/// A data file's rows in the table's schema: columns added after it was written are null,
/// partition columns carry the partition's values. The file is read whole, every row of it
/// ([`TableFiles::read`] leaves out those its deletion vector deletes).
async fn read(
    store: Arc<dyn ObjectStore>,
    f: &LogicalFileView,
    schema: &SchemaRef,
    partition: &Partition,
) -> Result<Vec<RecordBatch>> {
    let path = f.object_store_path();
    let label = path.to_string();
    let err = |message: String| ReadError {
        file: label.clone(),
        message,
    };
    let bytes = store
        .get(&path)
        .await
        .map_err(|e| err(e.to_string()))?
        .bytes()
        .await
        .map_err(|e| err(e.to_string()))?;
    let metadata = ArrowReaderMetadata::load(&bytes, ArrowReaderOptions::new())
        .and_then(int96_as_micros)
        .map_err(|e| err(e.to_string()))?;
    let mask = projection(&metadata, schema);
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(bytes, metadata)
        .with_projection(mask)
        .build()
        .map_err(|e| err(e.to_string()))?;
    let batches: Vec<RecordBatch> = reader
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| err(e.to_string()))?;
    batches
        .iter()
        .map(|b| to_table_schema(b, schema, partition))
        .collect::<std::result::Result<_, String>>()
        .map_err(err)
}

/// The file's top-level columns that `schema` has (a scan of a few columns decodes only
/// those).
fn projection(
    metadata: &ArrowReaderMetadata,
    schema: &SchemaRef,
) -> parquet::arrow::ProjectionMask {
    let roots = metadata
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| schema.field_with_name(f.name()).is_ok())
        .map(|(i, _)| i);
    parquet::arrow::ProjectionMask::roots(metadata.parquet_schema(), roots)
}

/// The file's metadata for reading top-level INT96 timestamps (Spark's) as microseconds,
/// the unit of Delta's `timestamp` (`coerce::int96_as_micros`): read as nanoseconds, the
/// reader's default, a date past 2262 wraps and the file could not be read.
fn int96_as_micros(metadata: ArrowReaderMetadata) -> parquet::errors::Result<ArrowReaderMetadata> {
    match crate::coerce::int96_as_micros(&metadata) {
        Some(schema) => ArrowReaderMetadata::try_new(
            metadata.metadata().clone(),
            ArrowReaderOptions::new().with_schema(schema),
        ),
        None => Ok(metadata),
    }
}

fn to_table_schema(
    b: &RecordBatch,
    schema: &SchemaRef,
    partition: &Partition,
) -> std::result::Result<RecordBatch, String> {
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let part = partition.0.iter().find(|(c, _)| c == field.name());
        let col = match (part, b.column_by_name(field.name())) {
            (Some((_, value)), _) => {
                partition_column(value.as_deref(), field.data_type(), b.num_rows())?
            }
            (None, Some(c)) if c.data_type() == field.data_type() => c.clone(),
            (None, Some(c)) => crate::coerce::exact_cast(c, field.data_type()).map_err(|e| {
                format!(
                    "column `{}`: {}",
                    field.name(),
                    e.describe(c.data_type(), field.data_type())
                )
            })?,
            (None, None) => new_null_array(field.data_type(), b.num_rows()),
        };
        columns.push(col);
    }
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new(schema.fields().clone())),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(b.num_rows())),
    )
    .map_err(|e| e.to_string())
}

/// A constant column of a partition value (as written in the log) in the column's type.
fn partition_column(
    value: Option<&str>,
    dt: &DataType,
    rows: usize,
) -> std::result::Result<ArrayRef, String> {
    let text: ArrayRef = Arc::new(arrow::array::StringArray::from(vec![
        value.filter(
            |v| !v.is_empty()
        );
        rows
    ]));
    crate::coerce::exact_cast(&text, dt).map_err(|e| {
        format!(
            "partition value {value:?}: {}",
            e.describe(&DataType::Utf8, dt)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::testing::Counting;

    /// The mask of the rows a vector keeps, in a range that starts inside the vector's rows
    /// and ends before its last.
    #[test]
    fn the_kept_mask_leaves_out_exactly_the_vectors_rows_in_range() {
        let deleted: roaring::RoaringTreemap = [1u64, 5, 9, 10, 70_000, 5_000_000_000]
            .into_iter()
            .collect();
        let mask = kept_mask(5, 12, &deleted);
        assert_eq!(mask, [false, true, true, true, false, false, true]);
        let far = kept_mask(4_999_999_999, 5_000_000_001, &deleted);
        assert_eq!(far, [true, false]);
        assert_eq!(kept_mask(11, 11, &deleted), Vec::<bool>::new());
    }
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use futures::TryStreamExt;

    /// Streaming a small data file of eight columns costs one GET, a larger one two
    /// (footer, one row group), not one per column: every GET is a round trip to S3 in the
    /// merge's critical path. The rows are the same either way.
    #[tokio::test]
    async fn a_data_file_is_streamed_in_one_request_when_small_and_two_when_large() {
        let dir = tempfile::tempdir().unwrap();
        let mut fields = vec![
            Field::new("Op", DataType::Utf8, true),
            Field::new("ts", DataType::Utf8, true),
            Field::new("id", DataType::Int64, true),
        ];
        fields.extend((0..5).map(|i| Field::new(format!("c{i}"), DataType::Utf8, true)));
        let n = 1000;
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec!["I"; n])),
            Arc::new(StringArray::from(vec!["2024-01-01 00:00:00"; n])),
            Arc::new(Int64Array::from_iter_values(0..n as i64)),
        ];
        for i in 0..5 {
            columns.push(Arc::new(StringArray::from_iter_values(
                (0..n).map(|r| format!("value {i} of row {r}")),
            )));
        }
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
        let (_, table) = crate::delta::testing::merged_table(dir.path(), &batch).await;
        let snapshot = table.snapshot().unwrap();
        let schema = snapshot.snapshot().arrow_schema();
        let f = snapshot.log_data().iter().next().unwrap();
        assert!(schema.fields().len() >= 8, "{schema:?}");
        assert!(
            (f.size() as u64) < WHOLE_FILE,
            "a merge's file is fetched whole: {}",
            f.size()
        );
        let mut read = Vec::new();
        for (whole_file, gets) in [(WHOLE_FILE, 1), (0, 2)] {
            let store = Arc::new(Counting::new(table.log_store().object_store(None)));
            let batches: Vec<RecordBatch> = stream_fetching_whole(
                store.clone(),
                &f,
                &schema,
                &Partition::default(),
                whole_file,
            )
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
            assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), n);
            assert_eq!(store.gets(), gets, "fetched whole up to {whole_file} bytes");
            read.push(arrow::compute::concat_batches(&schema, &batches).unwrap());
        }
        assert_eq!(read[0], read[1]);
    }
}
