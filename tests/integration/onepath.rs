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
    let b = fx
        .query(
            "curated/items",
            "SELECT id, part, val, note FROM t ORDER BY id",
        )
        .await;
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
    let got = column_text(
        &fx.query(
            "curated/t",
            "SELECT CONCAT(CAST(id AS VARCHAR), ':', CAST(v AS VARCHAR)) FROM t ORDER BY id",
        )
        .await,
    );
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
    /// make it sparse): the table converges to the source's final state, on either write
    /// path; on the rewrite's, no merge falls back to delta-rs's MERGE.
    #[test]
    fn a_column_added_part_way_converges(
        seed in any::<u64>(),
        keys in 1i64..8,
        changes in 1usize..20,
        max_file in 1usize..5,
        cut in 0usize..8,
        dup_seed in any::<u64>(),
        delta_rs_merge in any::<bool>(),
    ) {
        let rt = runtime();
        let fx = Fixture::items_merged_by(delta_rs_merge);
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
        let mut merge_paths = 0;
        for call in deliveries(&urls, dup_seed) {
            let r = rt.block_on(fx.engine.process(&call));
            prop_assert!(r.failures().next().is_none(), "{:?}", r.files);
            merge_paths += r.tables.iter().filter(|t| t.write_path == Some(WritePath::Merge)).count();
        }
        if !delta_rs_merge {
            prop_assert_eq!(merge_paths, 0);
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
}
