//! The engine on the in-memory sink: its pipeline (routing, reading, screening, admission,
//! grouping, large files, bad-file isolation) tested without any table format — these run
//! in the build without the `delta` feature too.

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};

use super::*;
use crate::sink::memory::MemorySink;

/// #24: the engine's pipeline on another table format. Routing, reading, screening,
/// admission, grouping and bad-file isolation are the engine's; the commit is the sink's.
/// Through the in-memory test double, shuffled and duplicated delivery converges to the
/// source's state, a bad file fails alone, and no Delta table is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_merges_into_another_table_format() {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let dir = tempfile::tempdir().unwrap();
    let text = crate::config::test_table("t", "raw/t/", "curated/t", "sequence_by = [\"ts\"]");
    let config = Config::from_toml(&text, "test", Some(dir.path())).unwrap();
    let engine = Engine::on(config.clone(), &Tuning::default(), |_| {
        MemorySink::default()
    });
    let storage = Storage::new();
    let source = &config.tables[0].source;
    // Keys 0..6: inserted, some updated (a second row per file), some deleted.
    let mut files = Vec::new();
    let mut model: BTreeMap<i64, i64> = BTreeMap::new();
    for n in 0..12i64 {
        let id = n % 6;
        let (op, val) = match n {
            0..=5 => ("I", n * 10),
            6 | 9 => ("D", 0),
            _ => ("U", n * 100),
        };
        match op {
            "D" => model.remove(&id),
            _ => model.insert(id, val),
        };
        let ts = format!("2024-01-01 00:00:{n:02}.000000");
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("Op", DataType::Utf8, true),
                Field::new("ts", DataType::Utf8, true),
                Field::new("id", DataType::Int64, true),
                Field::new("val", DataType::Int64, true),
            ])),
            vec![
                Arc::new(StringArray::from(vec![op])),
                Arc::new(StringArray::from(vec![ts.as_str()])),
                Arc::new(Int64Array::from(vec![id])),
                Arc::new(Int64Array::from(vec![val])),
            ],
        )
        .unwrap();
        let url = source
            .join(&format!("20240101-00000000{n:02}.parquet"))
            .unwrap();
        storage
            .put(&url, crate::demo::to_parquet(&batch).unwrap())
            .await
            .unwrap();
        files.push(url);
    }
    let bad = source.join("20240101-0000000099.parquet").unwrap();
    storage
        .put(&bad, bytes::Bytes::from_static(b"not parquet"))
        .await
        .unwrap();
    let mut deliveries: Vec<Url> = files.iter().chain(files.iter()).cloned().collect();
    deliveries.push(bad.clone());
    deliveries.shuffle(&mut rand::rngs::StdRng::seed_from_u64(24));
    let mut failed = Vec::new();
    for chunk in deliveries.chunks(3) {
        let r = engine.process_into(&engine.sink, chunk).await;
        failed.extend(r.failures().map(|f| f.file.clone()));
    }
    assert_eq!(failed, vec![bad], "only the bad file fails");
    let want: Vec<Vec<String>> = model
        .iter()
        .map(|(k, v)| vec![k.to_string(), v.to_string()])
        .collect();
    assert_eq!(engine.sink.rows("t", &["id", "val"]), want);
    assert!(engine.sink.commits("t") >= 1);
    assert!(
        !dir.path().join("curated/t/_delta_log").exists(),
        "no Delta table written"
    );
}

/// A Parquet file of `rows` (op, ts, id, val) in row groups of `group` rows (DMS writes
/// row groups; a slice is made of whole decode batches, which end at a row group).
fn parquet_rows(rows: &[(Option<&str>, &str, i64, i64)], group: usize) -> bytes::Bytes {
    let mut fields = vec![
        Field::new("ts", DataType::Utf8, true),
        Field::new("id", DataType::Int64, true),
        Field::new("val", DataType::Int64, true),
    ];
    let mut columns: Vec<arrow::array::ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.3))),
    ];
    if rows.iter().any(|r| r.0.is_some()) {
        fields.insert(0, Field::new("Op", DataType::Utf8, true));
        columns.insert(
            0,
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.0))),
        );
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(group))
        .build();
    let mut out = Vec::new();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    out.into()
}

fn memory_engine(dir: &std::path::Path, extra: &str) -> Engine<MemorySink> {
    let text = crate::config::test_table("t", "raw/t/", "curated/t", extra);
    let config = Config::from_toml(&text, "test", Some(dir)).unwrap();
    Engine::on(config, &Tuning::default(), |_| MemorySink::default())
}

/// A full-load file larger than a slice and a CDC file delivered together, the CDC file
/// first: the engine reads the full load slice by slice (the memory sink appends nothing
/// whole), one commit per slice, at its place in the order — before the CDC file, whose
/// update and delete then apply to the loaded rows.
#[tokio::test]
async fn a_full_load_larger_than_a_slice_is_merged_in_slices_before_the_cdc_files() {
    let dir = tempfile::tempdir().unwrap();
    let engine = memory_engine(dir.path(), "sequence_by = [\"ts\"]\nslice_rows = 1024");
    let source = engine.config().tables[0].source.clone();
    let load: Vec<_> = (0..5000)
        .map(|id| (None, "2024-01-01 00:00:00", id, id * 10))
        .collect();
    let cdc = [
        (Some("U"), "2024-01-02 00:00:00", 7, -1),
        (Some("D"), "2024-01-02 00:00:01", 8, 0),
    ];
    let (load_url, cdc_url) = (
        source.join("LOAD00000001.parquet").unwrap(),
        source.join("20240102-000000000.parquet").unwrap(),
    );
    let storage = Storage::new();
    storage
        .put(&load_url, parquet_rows(&load, 1000))
        .await
        .unwrap();
    storage
        .put(&cdc_url, parquet_rows(&cdc, 1000))
        .await
        .unwrap();

    let report = engine
        .process_into(&engine.sink, &[cdc_url, load_url])
        .await;

    assert_eq!(report.failures().count(), 0, "{:?}", report.files);
    let slices: usize = report.tables.iter().map(|t| t.slices).sum();
    assert!(
        slices >= 3,
        "5000 rows in slices of at least 1024: {slices}"
    );
    assert_eq!(
        engine.sink.commits("t"),
        slices as u64 + 1,
        "one commit per slice, one for the CDC file"
    );
    let rows = engine.sink.rows("t", &["id", "val"]);
    assert_eq!(rows.len(), 4999);
    let row = |id: i64| rows.iter().find(|r| r[0] == id.to_string()).cloned();
    assert_eq!(row(7), Some(vec!["7".into(), "-1".into()]));
    assert_eq!(row(8), None, "deleted after the load");
    assert_eq!(row(4999), Some(vec!["4999".into(), "49990".into()]));
}

/// Only a CDC file's contents are hashed when read (the digest is what records it as
/// applied); a full load is told by its last-modified time, and hashing a large one
/// delayed its first slice.
#[tokio::test]
async fn only_cdc_files_are_hashed_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let engine = memory_engine(dir.path(), "sequence_by = [\"ts\"]");
    let table = engine.config().tables[0].clone();
    let storage = Storage::new();
    for (name, op, hashed) in [
        ("LOAD00000001.parquet", None, false),
        ("20240102-000000000.parquet", Some("I"), true),
    ] {
        let url = table.source.join(name).unwrap();
        let rows = [(op, "2024-01-01 00:00:00", 1, 10)];
        storage.put(&url, parquet_rows(&rows, 10)).await.unwrap();
        let props = crate::props::TableProps::default();
        let (_, raw) = engine
            .read_file(&table, &url, None, &props, true)
            .await
            .unwrap();
        assert_eq!(raw.digest.is_some(), hashed, "{name}");
    }
}

/// Routing: a file outside every table's source is ignored, and a folder marker too; an
/// engine told to fail unowned files (a newer configuration does not load) fails the first
/// with `unowned`, retryably, and still ignores the marker. Nothing reaches the sink.
#[tokio::test]
async fn files_no_table_owns_are_ignored_or_failed_as_the_engine_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let engine = memory_engine(dir.path(), "");
    let root = Url::from_directory_path(dir.path()).unwrap();
    let (stray, marker) = (
        root.join("raw/other/20240101-000000001.parquet").unwrap(),
        root.join("raw/t/2024/").unwrap(),
    );

    let files = [stray.clone(), marker.clone()];
    let ignoring = engine.process_into(&engine.sink, &files).await;
    let strict =
        memory_engine(dir.path(), "").failing_unowned("a newer configuration does not load");
    let failing = strict.process_into(&strict.sink, &files).await;

    for r in [&ignoring, &failing] {
        let marker_status = r.files.iter().find(|f| f.file == marker).map(|f| &f.status);
        assert!(
            matches!(marker_status, Some(FileStatus::Ignored { .. })),
            "{:?}",
            r.files
        );
    }
    fn status<'a>(r: &'a ProcessReport, file: &Url) -> Option<&'a FileStatus> {
        r.files.iter().find(|f| &f.file == file).map(|f| &f.status)
    }
    assert!(matches!(
        status(&ignoring, &stray),
        Some(FileStatus::Ignored { .. })
    ));
    match status(&failing, &stray) {
        Some(FileStatus::Failed { error, .. }) => {
            assert!(matches!(**error, Error::Unowned { .. }), "{error}");
            assert!(error.is_retryable(), "{error}");
        }
        other => panic!("the stray file fails: {other:?}"),
    }
    assert_eq!(engine.sink.commits("t") + strict.sink.commits("t"), 0);
}
