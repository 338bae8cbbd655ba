//! One write path (#43): the merges that went to delta-rs's MERGE — columns the table lacks,
//! table columns a file lacks, sparse columns, reloads, keys without a key range — go
//! through tributary's copy-on-write rewrite, and leave the table as the source.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Decimal128Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Int64Type};
use proptest::prelude::*;
use tributary::deltalake::arrow;
use tributary::WritePath;
use tributary_tests::*;

/// `items` changes with the `note` column the source gained part-way (`None`: a file from
/// before, without the column).
fn items_with_note(changes: &[Change], notes: Option<&[Option<&str>]>) -> RecordBatch {
    let b = items_batch(changes, true);
    match notes {
        None => b,
        Some(n) => with_note(&b, n.iter().map(|v| v.map(str::to_string)).collect()),
    }
}

/// `b` with a `note` column.
fn with_note(b: &RecordBatch, notes: Vec<Option<String>>) -> RecordBatch {
    let schema = b.schema();
    let mut cols: Vec<(&str, ArrayRef)> = schema
        .fields()
        .iter()
        .zip(b.columns())
        .map(|(f, c)| (f.name().as_str(), c.clone()))
        .collect();
    cols.push(("note", Arc::new(StringArray::from(notes))));
    batch(cols)
}

/// (id, part, val, note) of the items table, by id.
async fn rows_with_note(fx: &Fixture) -> Vec<(i64, String, i64, Option<String>)> {
    let columns = ["id", "part", "val", "note"];
    let b = [fx.batch("curated/items", &columns, &["id"]).await];
    let mut out = Vec::new();
    for b in &b {
        let id = arrow::compute::cast(b.column(0), &DataType::Int64).unwrap();
        let val = arrow::compute::cast(b.column(2), &DataType::Int64).unwrap();
        let part = arrow::compute::cast(b.column(1), &DataType::Utf8).unwrap();
        let note = arrow::compute::cast(b.column(3), &DataType::Utf8).unwrap();
        let (id, val) = (
            id.as_primitive::<Int64Type>(),
            val.as_primitive::<Int64Type>(),
        );
        let (part, note) = (part.as_string::<i32>(), note.as_string::<i32>());
        for i in 0..b.num_rows() {
            out.push((
                id.value(i),
                part.value(i).to_string(),
                val.value(i),
                arrow::array::Array::is_valid(note, i).then(|| note.value(i).to_string()),
            ));
        }
    }
    out
}

fn path_of(r: &tributary::ProcessReport) -> Option<WritePath> {
    r.tables[0].write_path
}

/// A column the source added (files after it carry it), a file from before it (the column
/// kept from the row, also on a row that moves to another partition), and both in one call
/// (a sparse column): each merged by the rewrite, the table equal to the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_missing_and_sparse_columns_merge_through_the_rewrite() {
    let fx = Fixture::items();
    let ts = |s: u32| format!("2024-01-01 00:00:{s:02}.000000");
    let load = fx.put_items(
        "LOAD00000001.parquet",
        &(1..=4)
            .map(|id| c('I', &ts(0), id, "a", id))
            .collect::<Vec<_>>(),
    );
    fx.merge_ok(&[load]).await;
    // The column appears: updates and an insert carry it.
    let wide = fx.put_batch(
        "shop/items",
        "2024/01/01/20240101-0000000001.parquet",
        &items_with_note(
            &[
                c('U', &ts(1), 1, "a", 10),
                c('U', &ts(1), 3, "a", 3),
                c('I', &ts(1), 5, "a", 50),
            ],
            Some(&[Some("one"), Some("three"), Some("five")]),
        ),
    );
    let r = fx.merge_ok(&[wide]).await;
    assert_eq!(path_of(&r), Some(WritePath::Rewrite), "{:?}", r.tables);
    // A file without the column (written before it existed, delivered late, but newer for
    // key 1): the row keeps its note, also when it moves to partition b.
    let narrow = fx.put_batch(
        "shop/items",
        "2024/01/01/20240101-0000000002.parquet",
        &items_with_note(&[c('U', &ts(2), 1, "b", 11)], None),
    );
    let r = fx.merge_ok(&[narrow]).await;
    assert_eq!(path_of(&r), Some(WritePath::Rewrite), "{:?}", r.tables);
    // One call, a file with the column and a later one without: key 2 takes the note of
    // the first and the value of the second; key 3 is only in the second (keeps its note).
    let with = fx.put_batch(
        "shop/items",
        "2024/01/01/20240101-0000000003.parquet",
        &items_with_note(&[c('U', &ts(3), 2, "a", 20)], Some(&[Some("two")])),
    );
    let without = fx.put_batch(
        "shop/items",
        "2024/01/01/20240101-0000000004.parquet",
        &items_with_note(
            &[c('U', &ts(4), 2, "a", 21), c('U', &ts(4), 3, "a", 30)],
            None,
        ),
    );
    let r = fx.merge_ok(&[with, without]).await;
    assert_eq!(path_of(&r), Some(WritePath::Rewrite), "{:?}", r.tables);
    let s = |v: &str| Some(v.to_string());
    assert_eq!(
        rows_with_note(&fx).await,
        vec![
            (1, "b".into(), 11, s("one")),
            (2, "a".into(), 21, s("two")),
            (3, "a".into(), 30, s("three")),
            (4, "a".into(), 4, None),
            (5, "a".into(), 50, s("five")),
        ]
    );
}

/// A reload (rows absent from the new load deleted) merged by the rewrite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_merges_through_the_rewrite() {
    use std::time::{Duration, SystemTime};
    let fx = Fixture::items();
    let load = fx.put_items(
        "LOAD00000001.parquet",
        &(1..=6)
            .map(|id| {
                c(
                    'I',
                    "2024-01-01 00:00:00.000000",
                    id,
                    if id % 2 == 0 { "a" } else { "b" },
                    id,
                )
            })
            .collect::<Vec<_>>(),
    );
    let f = std::fs::File::options()
        .write(true)
        .open(load.to_file_path().unwrap())
        .unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    fx.merge_ok(std::slice::from_ref(&load)).await;
    fx.put_items(
        "LOAD00000001.parquet",
        &[
            c('I', "2099-01-01 00:00:00.000000", 1, "b", 100),
            c('I', "2099-01-01 00:00:00.000000", 2, "b", 2),
            c('I', "2099-01-01 00:00:00.000000", 7, "a", 7),
        ],
    );
    let r = tributary::reload::reload(&fx.engine, "items")
        .await
        .unwrap();
    assert_eq!(
        r.merge.write_path,
        Some(WritePath::Rewrite),
        "{:?}",
        r.merge
    );
    assert_eq!(
        fx.items_rows().await,
        vec![(1, "b".into(), 100), (2, "b".into(), 2), (7, "a".into(), 7)]
    );
}

/// A decimal key (no key range to prune files or declare): merged by the rewrite, every
/// file read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decimal_key_merges_through_the_rewrite() {
    let fx = Fixture::new(T_TABLE);
    let file = |name: &str, ts: &str, ops: &[&str], ids: &[i128], vals: &[i64]| {
        let ids = Decimal128Array::from(ids.to_vec())
            .with_precision_and_scale(38, 0)
            .unwrap();
        let b = batch(vec![
            ("Op", strings(ops)),
            ("ts", strings(&vec![ts; ops.len()])),
            ("id", Arc::new(ids)),
            ("v", Arc::new(Int64Array::from(vals.to_vec()))),
        ]);
        fx.put_batch("t", name, &b)
    };
    let big = 12345678901234567890123456789012345678_i128;
    let f1 = file(
        "20240101-0000000001.parquet",
        "2024-01-01 00:00:01",
        &["I", "I", "I"],
        &[1, big, -big],
        &[1, 2, 3],
    );
    fx.merge_ok(&[f1]).await;
    let f2 = file(
        "20240101-0000000002.parquet",
        "2024-01-01 00:00:02",
        &["U", "D", "I"],
        &[1, big, 5],
        &[10, 0, 5],
    );
    let r = fx.merge_ok(&[f2]).await;
    assert_eq!(path_of(&r), Some(WritePath::Rewrite), "{:?}", r.tables);
    let got: Vec<String> = fx
        .rows("curated/t", &["id", "v"], &["id"])
        .await
        .into_iter()
        .map(|r| r.join(":"))
        .collect();
    assert_eq!(
        got,
        vec![format!("{}:3", -big), "1:10".into(), "5:5".into()]
    );
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(200)
        / 4
}

/// Every file delivered once, some twice, shuffled, in calls of one to three files.
fn deliveries(urls: &[url::Url], seed: u64) -> Vec<Vec<url::Url>> {
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut all: Vec<url::Url> = Vec::new();
    for u in urls {
        all.push(u.clone());
        if rng.random_bool(0.4) {
            all.push(u.clone());
        }
    }
    all.shuffle(&mut rng);
    let mut calls = Vec::new();
    while !all.is_empty() {
        let n = rng.random_range(1..=3).min(all.len());
        calls.push(all.drain(..n).collect());
    }
    calls
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases().max(1), max_shrink_iters: 20, ..ProptestConfig::default() })]

    /// The source gains a column part-way (files before the cut lack it), delivered
    /// shuffled, duplicated and grouped at random (calls mixing files with and without it
    /// make it sparse): the table converges to the source's final state.
    #[test]
    fn a_column_added_part_way_converges(
        seed in any::<u64>(),
        keys in 1i64..8,
        changes in 1usize..20,
        max_file in 1usize..5,
        cut in 0usize..8,
        dup_seed in any::<u64>(),
    ) {
        let rt = runtime();
        let fx = Fixture::items();
        let (load, files) = history(seed, keys, changes, max_file);
        let note = |c: &Change| format!("{}@{}", c.val, c.ts);
        // Position 0 is the load, 1.. the CDC files; from `cut` on they carry `note`.
        let mut urls = Vec::new();
        let mut expected: std::collections::BTreeMap<i64, (String, i64, Option<String>)> = Default::default();
        let mut all: Vec<(usize, &Change)> = load.iter().map(|c| (0, c)).collect();
        all.extend(files.iter().enumerate().flat_map(|(n, f)| f.iter().map(move |c| (n + 1, c))));
        for (pos, c) in all {
            match c.op {
                'D' => { expected.remove(&c.id); }
                _ => { expected.insert(c.id, (c.part.clone(), c.val, (pos >= cut).then(|| note(c)))); }
            }
        }
        let wide = |pos: usize, f: &[Change], with_op: bool| {
            let b = items_batch(f, with_op);
            if pos < cut {
                return b;
            }
            with_note(&b, f.iter().map(|c| Some(note(c))).collect())
        };
        if !load.is_empty() {
            urls.push(fx.put_batch("shop/items", "LOAD00000001.parquet", &wide(0, &load, false)));
        }
        for (n, f) in files.iter().enumerate() {
            let name = format!("2024/01/01/20240101-{:010}.parquet", n + 1);
            urls.push(fx.put_batch("shop/items", &name, &wide(n + 1, f, true)));
        }
        for call in deliveries(&urls, dup_seed) {
            let r = rt.block_on(fx.engine.process(&call));
            prop_assert!(r.failures().next().is_none(), "{:?}", r.files);
        }
        let expected: Vec<(i64, String, i64, Option<String>)> =
            expected.into_iter().map(|(id, (p, v, n))| (id, p, v, n)).collect();
        if expected.is_empty() {
            return Ok(());
        }
        let has_note = rt.block_on(async {
            let t = tributary::delta::open(&fx.url("curated/items"), &Default::default()).await.unwrap();
            t.snapshot().is_ok_and(|s| s.schema().field("note").is_some())
        });
        if has_note {
            prop_assert_eq!(rt.block_on(rows_with_note(&fx)), expected);
        } else {
            prop_assert!(expected.iter().all(|r| r.3.is_none()));
            let plain: Vec<Row> = expected.into_iter().map(|(id, p, v, _)| (id, p, v)).collect();
            prop_assert_eq!(rt.block_on(fx.items_rows()), plain);
        }
    }

    /// A table whose rows another writer deleted with deletion vectors (as Spark's DELETE
    /// does), then CDC files delivered shuffled, duplicated and grouped at random: the
    /// table converges to the load less those rows with every change applied in order —
    /// a deleted row comes back only when a change sets it — all by the rewrite.
    #[test]
    fn a_table_with_deletion_vectors_converges(
        seed in any::<u64>(),
        keys in 1i64..8,
        changes in 1usize..20,
        max_file in 1usize..5,
        vector_seed in any::<u64>(),
        dup_seed in any::<u64>(),
    ) {
        use rand::{Rng, SeedableRng};
        let rt = runtime();
        let fx = Fixture::items();
        let (load, files) = history(seed, keys, changes, max_file);
        if load.is_empty() {
            return Ok(());
        }
        let mut expected: std::collections::BTreeMap<i64, (String, i64)> = Default::default();
        for c in &load {
            match c.op {
                'D' => { expected.remove(&c.id); }
                _ => { expected.insert(c.id, (c.part.clone(), c.val)); }
            }
        }
        let url = fx.put_batch("shop/items", "LOAD00000001.parquet", &items_batch(&load, false));
        rt.block_on(fx.merge_ok(&[url]));
        let mut rng = rand::rngs::StdRng::seed_from_u64(vector_seed);
        let mut gone: Vec<i64> = expected.keys().copied().filter(|_| rng.random_bool(0.5)).collect();
        if gone.is_empty() {
            gone.extend(expected.keys().next().copied());
        }
        if gone.is_empty() {
            return Ok(());
        }
        delete_with_a_vector(&fx, &gone);
        for id in &gone {
            expected.remove(id);
        }
        for c in files.iter().flatten() {
            match c.op {
                'D' => { expected.remove(&c.id); }
                _ => { expected.insert(c.id, (c.part.clone(), c.val)); }
            }
        }
        let urls: Vec<url::Url> = files
            .iter()
            .enumerate()
            .map(|(n, f)| {
                let name = format!("2024/01/01/20240101-{:010}.parquet", n + 1);
                fx.put_batch("shop/items", &name, &items_batch(f, true))
            })
            .collect();
        for call in deliveries(&urls, dup_seed) {
            let r = rt.block_on(fx.engine.process(&call));
            prop_assert!(r.failures().next().is_none(), "{:?}", r.files);
        }
        let expected: Vec<Row> = expected.into_iter().map(|(id, (p, v))| (id, p, v)).collect();
        prop_assert_eq!(rt.block_on(fx.items_rows()), expected);
    }
}

/// A deletion vector on the data files holding `ids`, written as Spark writes one: the
/// protocol's format (the kernel's writer: version byte, size, magic number, bitmap,
/// checksum) in a `deletion_vector_*.bin` file, an `add` of the same path with its
/// descriptor, and the protocol raised to reader 3 / writer 7 with `deletionVectors`.
pub(crate) fn delete_with_a_vector(fx: &Fixture, ids: &[i64]) {
    use delta_kernel::actions::deletion_vector_writer::{
        KernelDeletionVector, StreamingDeletionVectorWriter,
    };
    let root = fx.path("curated/items");
    let log = root.join("_delta_log");
    let mut versions: Vec<_> = std::fs::read_dir(&log)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".json"))
        .collect();
    versions.sort();
    let adds: Vec<serde_json::Value> = versions
        .iter()
        .flat_map(|v| {
            std::fs::read_to_string(log.join(v))
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .filter_map(|v| v.get("add").cloned())
        .collect();
    let mut actions = vec![
        serde_json::json!({"commitInfo": {"timestamp": 1, "operation": "DELETE"}}),
        serde_json::json!({"protocol": {
            "minReaderVersion": 3, "minWriterVersion": 7,
            "readerFeatures": ["deletionVectors"], "writerFeatures": ["deletionVectors"],
        }}),
    ];
    let mut deleted = 0;
    // Every data file on disk is live: only the load was merged before.
    for (n, file) in parquet_files(&root).iter().enumerate() {
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(file).unwrap(),
        )
        .unwrap()
        .build()
        .unwrap();
        let mut positions = Vec::new();
        let mut at = 0u64;
        for b in reader {
            let b = b.unwrap();
            let id =
                arrow::compute::cast(b.column_by_name("id").unwrap(), &DataType::Int64).unwrap();
            for (i, v) in id.as_primitive::<Int64Type>().iter().enumerate() {
                if ids.contains(&v.unwrap()) {
                    positions.push(at + i as u64);
                }
            }
            at += b.num_rows() as u64;
        }
        if positions.is_empty() {
            continue;
        }
        deleted += positions.len();
        let mut dv = KernelDeletionVector::new();
        dv.add_deleted_row_indexes(positions.iter().copied());
        let mut bytes = Vec::new();
        let mut w = StreamingDeletionVectorWriter::new(&mut bytes);
        let written = w.write_deletion_vector(dv).unwrap();
        w.finalize().unwrap();
        let dv_path = root.join(format!(
            "deletion_vector_5c0d1f0e-7a3b-4a52-9d7e-0f6c2b1a{n:04}.bin"
        ));
        std::fs::write(&dv_path, &bytes).unwrap();
        let rel = file
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .to_string();
        let add = adds
            .iter()
            .find(|a| percent_decode(a["path"].as_str().unwrap()) == rel)
            .expect("the file's add");
        let mut with_dv = add.clone();
        with_dv["deletionVector"] = serde_json::json!({
            "storageType": "p",
            "pathOrInlineDv": url::Url::from_file_path(&dv_path).unwrap().to_string(),
            "offset": written.offset,
            "sizeInBytes": written.size_in_bytes,
            "cardinality": written.cardinality,
        });
        actions.push(serde_json::json!({"remove": {
            "path": add["path"], "dataChange": true, "deletionTimestamp": 1,
            "extendedFileMetadata": true, "partitionValues": add["partitionValues"],
            "size": add["size"],
        }}));
        actions.push(serde_json::json!({"add": with_dv}));
    }
    assert_eq!(deleted, ids.len(), "every id found once");
    let last: u64 = versions.last().unwrap()[..20].parse().unwrap();
    let lines = actions
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(log.join(format!("{:020}.json", last + 1)), lines + "\n").unwrap();
}

fn percent_decode(p: &str) -> String {
    url::Url::parse(&format!("file:///{p}"))
        .ok()
        .and_then(|u| u.to_file_path().ok())
        .map(|p| p.to_string_lossy().trim_start_matches('/').to_string())
        .unwrap_or_else(|| p.to_string())
}

/// A table with deletion vectors (one Spark's DELETE left): a merge goes through the rewrite,
/// which reads the rows the vector deletes as deleted — a change to such a key inserts it
/// once, the file it rewrites leaves without them, and no deleted row comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_with_deletion_vectors_merges_through_the_rewrite_and_deleted_rows_stay_deleted() {
    let fx = Fixture::items();
    let ts = |s: u32| format!("2024-01-01 00:00:{s:02}.000000");
    let load = fx.put_items(
        "LOAD00000001.parquet",
        &(1..=6)
            .map(|id| c('I', &ts(0), id, "a", id))
            .collect::<Vec<_>>(),
    );
    fx.merge_ok(&[load]).await;
    delete_with_a_vector(&fx, &[2, 5]);
    let before = fx.items_rows().await;
    assert_eq!(
        before.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![1, 3, 4, 6],
        "the vector deletes 2 and 5"
    );
    // An insert leaves the file with its vector: the manifests, which cannot leave its
    // deleted rows out, are refused by name (the commit stands).
    let insert = fx.put_items(
        "2024/01/01/20240101-0000000000.parquet",
        &[c('I', &ts(1), 7, "b", 7)],
    );
    let r = fx.merge_ok(&[insert]).await;
    let refused = r.tables[0].manifest_error.as_deref().unwrap_or_default();
    assert!(refused.contains("deletion vectors"), "{:?}", r.tables);
    let f = fx.put_items(
        "2024/01/01/20240101-0000000001.parquet",
        &[
            c('U', &ts(1), 1, "a", 10),
            c('U', &ts(1), 2, "a", 20),
            c('D', &ts(1), 3, "a", 3),
        ],
    );
    let r = fx.merge_ok(&[f]).await;
    assert_eq!(path_of(&r), Some(WritePath::Rewrite), "{:?}", r.tables);
    let rows: Vec<(i64, i64)> = fx.items_rows().await.iter().map(|r| (r.0, r.2)).collect();
    assert_eq!(rows, vec![(1, 10), (2, 20), (4, 4), (6, 6), (7, 7)]);
    assert_eq!(r.tables[0].manifest_error, None, "{:?}", r.tables);
    let t = tributary::delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap();
    let snapshot = t.snapshot().unwrap();
    assert!(
        snapshot
            .log_data()
            .iter()
            .all(|f| f.deletion_vector_descriptor().is_none()),
        "the rewritten file left without its vector"
    );
}

/// Maintenance materialises deletion vectors: a file with one is compacted (even alone in
/// its partition) without its deleted rows, after which the manifests, refused while it
/// had one, list the live files again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_rewrites_a_file_with_a_deletion_vector_without_its_deleted_rows() {
    let fx = Fixture::items();
    let ts = |s: u32| format!("2024-01-01 00:00:{s:02}.000000");
    let load = fx.put_items(
        "LOAD00000001.parquet",
        &(1..=6)
            .map(|id| c('I', &ts(0), id, "a", id))
            .collect::<Vec<_>>(),
    );
    fx.merge_ok(&[load]).await;
    delete_with_a_vector(&fx, &[2, 5]);
    let r = fx.maintain().await;
    assert!(r.files_compacted >= 1, "{r:?}");
    let rows: Vec<i64> = fx.items_rows().await.iter().map(|r| r.0).collect();
    assert_eq!(rows, vec![1, 3, 4, 6]);
    let t = tributary::delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap();
    let files = tributary::manifest::live_files(&t).unwrap();
    assert!(files.iter().all(|f| !f.deletion_vector), "{files:?}");
    let manifests = tributary::manifest::read_manifests(fx.engine.storage(), &t)
        .await
        .unwrap();
    assert_eq!(
        manifests,
        tributary::manifest::expected_manifests(&t).unwrap()
    );
}
