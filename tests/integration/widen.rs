//! #26: a source column widened while replication runs (`int` → `bigint`, `real` → `double
//! precision`, `numeric(10,2)` → `numeric(12,3)`, an integer into a decimal) arrives in
//! wider types. The table takes the wider type — its data files rewritten in it, in one
//! commit — and so do the history, its change log and the tombstones' keys; every value,
//! old and new, reads back exactly. A change that is not a lossless widening fails the file
//! by name (kind `type_change`), with the way forward, and leaves the table as it was.

use std::sync::Arc;

use tributary::deltalake::arrow::array::{
    ArrayRef, Decimal128Array, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array,
};
use tributary::deltalake::arrow::datatypes::DataType;
use tributary::{delta, manifest};
use tributary_tests::*;

/// The table `t`, keyed by `id`, partitioned by `p`, ordered by `ts`; each test adds to it.
macro_rules! table_t {
    () => {
        r#"
[[table]]
name = "t"
source = "raw/t/"
target = "curated/t"
primary_key = ["id"]
partition_by = ["p"]
sequence_by = ["ts"]
drop_columns = ["ts"]
"#
    };
}

const TABLE: &str = concat!(
    table_t!(),
    r#"change_data_feed = true
[table.history]
target = "curated/t_history"
"#
);

fn ts(s: u32) -> String {
    format!("2024-01-01 00:00:{s:02}.000000")
}

fn dec(v: &[i128], p: u8, s: i8) -> ArrayRef {
    Arc::new(
        Decimal128Array::from(v.to_vec())
            .with_precision_and_scale(p, s)
            .expect("decimal"),
    )
}

/// The types of the table's columns, as `column: type` (sorted).
async fn types(fx: &Fixture, rel: &str, columns: &[&str]) -> Vec<String> {
    let t = delta::open(&fx.url(rel), &Default::default())
        .await
        .expect("open");
    let schema = t.snapshot().expect("snapshot").snapshot().arrow_schema();
    columns
        .iter()
        .map(|c| {
            let f = schema.field_with_name(c).expect("column");
            format!("{c}: {}", f.data_type())
        })
        .collect()
}

/// The Arrow type of `column` in every live data file of the table (as written in Parquet).
async fn file_types(fx: &Fixture, rel: &str, column: &str) -> Vec<DataType> {
    let t = delta::open(&fx.url(rel), &Default::default())
        .await
        .expect("open");
    let mut out = Vec::new();
    for f in manifest::live_files(&t).expect("files") {
        let path = fx.path(rel).join(&f.path);
        let file = std::fs::File::open(&path).expect("data file");
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("parquet");
        if let Ok(field) = reader.schema().field_with_name(column) {
            out.push(field.data_type().clone());
        }
    }
    out
}

/// Every live data file of each `(table, column)` has the column, in a type `ok` accepts.
async fn every_file_has(fx: &Fixture, columns: &[(&str, &str)], ok: impl Fn(&DataType) -> bool) {
    for (rel, column) in columns {
        let found = file_types(fx, rel, column).await;
        assert!(!found.is_empty(), "{rel}");
        assert!(found.iter().all(&ok), "{rel} {column}: {found:?}");
    }
}

/// `tributary status` of the fixture's table.
async fn status(fx: &Fixture) -> tributary::status::TableStatus {
    tributary::status::table_status(
        &fx.engine.config().tables[0],
        &Default::default(),
        fx.engine.storage(),
        None,
        chrono::Utc::now(),
    )
    .await
    .expect("status")
}

/// The current table's change data feed from its first version, one text per change: its
/// `columns`' values joined by `|`, nulls left out (SQL's `concat_ws`).
async fn change_feed(fx: &Fixture, columns: &[&str]) -> Vec<String> {
    let feed = change_data_feed(&fx.url("curated/t"), 0).await;
    let at: Vec<usize> = columns
        .iter()
        .map(|c| feed.schema().index_of(c).expect("column"))
        .collect();
    let rows = text_values(&feed.project(&at).expect("project"));
    rows.iter().map(|r| concat_ws("|", r)).collect()
}

/// The table `rel`'s rows, each as its `columns`' values joined by `|`, nulls left out
/// (SQL's `concat_ws`), sorted by `order_by`.
async fn text(fx: &Fixture, rel: &str, columns: &[&str], order_by: &[&str]) -> Vec<String> {
    let rows = fx.values(rel, columns, order_by).await;
    rows.iter().map(|r| concat_ws("|", r)).collect()
}

/// The history's versions of key `id`, each as `id|n` (nulls left out), by start.
async fn versions_of(fx: &Fixture, id: &str) -> Vec<String> {
    let rows = fx
        .values("curated/t_history", &["id", "n"], &["__START_AT"])
        .await;
    let of_id = rows.iter().filter(|r| r[0].as_deref() == Some(id));
    of_id.map(|r| concat_ws("|", r)).collect()
}

/// The issue's reproduction, for every widening at once: a full load in the narrow types
/// (`id`, `n` int, `f` float, `d` decimal(10,2), `i` smallint), then a CDC file in the wide
/// ones with values only they hold (`n = 2^40`, a key past 2^31) and a delete. Before #26 the
/// CDC file failed ("cannot be represented exactly as Int32"), and so did every later one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn widened_source_columns_widen_the_table_history_and_tombstones_exactly() {
    widening(TABLE).await;
}

/// #46: the same with deletion vectors: the merges before and after the widening mark rows
/// in vectors (the change feed's images as without), the widening's rewrite drops them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn widening_a_table_with_deletion_vectors_drops_them_and_stays_exact() {
    widening(&TABLE.replace(
        "change_data_feed = true\n",
        "change_data_feed = true\ndeletion_vectors = true\nmanifests = false\n",
    ))
    .await;
}

async fn widening(config: &str) {
    let fx = Fixture::new(config);
    let load = fx.put_batch(
        "t",
        "LOAD00000001.parquet",
        &batch(vec![
            ("ts", strings(&[&ts(0), &ts(0), &ts(0)])),
            ("id", Arc::new(Int32Array::from(vec![1, 2, 3]))),
            ("p", strings(&["a", "b", "a"])),
            ("n", Arc::new(Int32Array::from(vec![10, 20, i32::MAX]))),
            ("f", Arc::new(Float32Array::from(vec![0.1f32, 2.5, -1e30]))),
            ("d", dec(&[123, -9_999_999_999, 0], 10, 2)),
            ("i", Arc::new(Int16Array::from(vec![1, i16::MIN, i16::MAX]))),
        ]),
    );
    fx.merge_ok(&[load]).await;
    let before = delta::open(&fx.url("curated/t"), &Default::default())
        .await
        .expect("open")
        .version();
    let big = 1i64 << 40;
    let wide = fx.put_batch(
        "t",
        "20240101-0000000001.parquet",
        &batch(vec![
            ("Op", strings(&["U", "I", "D"])),
            ("ts", strings(&[&ts(1), &ts(1), &ts(1)])),
            ("id", Arc::new(Int64Array::from(vec![2, big, 3]))),
            ("p", strings(&["b", "a", "a"])),
            ("n", Arc::new(Int64Array::from(vec![big, -big, 0]))),
            ("f", Arc::new(Float64Array::from(vec![0.1f64, 1e300, 0.0]))),
            ("d", dec(&[12_345, 999_999_999_999, 0], 12, 3)),
            ("i", dec(&[123_456_789_012, 1, 0], 12, 0)),
        ]),
    );
    let r = fx.merge_ok(std::slice::from_ref(&wide)).await;
    let t = &r.tables[0];
    let mut widened = t.widened.clone();
    widened.sort();
    assert_eq!(
        widened,
        vec![
            "d: Decimal128(10, 2) -> Decimal128(12, 3)",
            "f: Float32 -> Float64",
            "i: Int16 -> Decimal128(12, 0)",
            "id: Int32 -> Int64",
            "n: Int32 -> Int64",
        ]
    );
    assert!(t.files_rewritten_to_widen >= 2, "{t:?}");
    let h = t.history.as_ref().expect("history report");
    assert_eq!(h.widened.len(), 5, "{h:?}");
    assert_eq!(
        t.version,
        before.map(|v| v + 2),
        "one commit widens, one merges"
    );

    // Every value exactly: the loaded ones in the wider type, the new ones as they came.
    assert_eq!(
        text(&fx, "curated/t", &["id", "p", "n", "f", "d", "i"], &["id"]).await,
        vec![
            format!("1|a|10|{}|1.230|1", 0.1f32 as f64),
            format!("2|b|{big}|0.1|12.345|123456789012"),
            format!("{big}|a|{}|1e300|999999999.999|1", -big),
        ]
    );
    let cols = ["id", "n", "f", "d", "i"];
    let want = vec![
        "id: Int64",
        "n: Int64",
        "f: Float64",
        "d: Decimal128(12, 3)",
        "i: Decimal128(12, 0)",
    ];
    assert_eq!(types(&fx, "curated/t", &cols).await, want);
    assert_eq!(types(&fx, "curated/t_history", &cols).await, want);
    assert_eq!(
        types(&fx, "curated/t_history/_tributary_changes", &cols).await,
        want
    );
    assert_eq!(
        types(&fx, "curated/t/_tributary_tombstones", &["id"]).await,
        vec!["id: Int64"]
    );
    // No data file of the old type stays behind (readers without Delta's type widening
    // read the files' own types).
    every_file_has(
        &fx,
        &[
            ("curated/t", "n"),
            ("curated/t", "id"),
            ("curated/t_history", "n"),
        ],
        |t| t == &DataType::Int64,
    )
    .await;
    // The history keeps the old version in the wide type.
    assert_eq!(
        versions_of(&fx, "2").await,
        vec!["2|20".to_string(), format!("2|{big}")]
    );

    // The change data feed reads across the widening, every change in the new type (the
    // widening commit itself changes no row: `dataChange = false`).
    let mut feed = change_feed(&fx, &["_change_type", "id", "n"]).await;
    feed.sort();
    let mut want_feed = vec![
        "insert|1|10".to_string(),
        "insert|2|20".to_string(),
        format!("insert|3|{}", i32::MAX),
        "update_preimage|2|20".to_string(),
        format!("update_postimage|2|{big}"),
        format!("insert|{big}|{}", -big),
        format!("delete|3|{}", i32::MAX),
    ];
    want_feed.sort();
    assert_eq!(feed, want_feed);

    // A late file in the old types converts into the wide ones; a tombstone in the wide key
    // type still blocks a late insert of the deleted key.
    let late = fx.put_batch(
        "t",
        "20240101-0000000000.parquet",
        &batch(vec![
            ("Op", strings(&["I", "I"])),
            ("ts", strings(&[&ts(0), &ts(0)])),
            ("id", Arc::new(Int32Array::from(vec![4, 3]))),
            ("p", strings(&["a", "a"])),
            ("n", Arc::new(Int32Array::from(vec![40, 30]))),
            ("f", Arc::new(Float32Array::from(vec![4.0f32, 3.0]))),
            ("d", dec(&[400, 300], 10, 2)),
            ("i", Arc::new(Int16Array::from(vec![4, 3]))),
        ]),
    );
    let r = fx.merge_ok(&[late]).await;
    assert!(r.tables[0].widened.is_empty());
    assert_eq!(
        text(&fx, "curated/t", &["id", "n", "d"], &["id"]).await,
        vec![
            "1|10|1.230".to_string(),
            format!("2|{big}|12.345"),
            "4|40|4.000".to_string(),
            format!("{big}|{}|999999999.999", -big),
        ]
    );
    assert_eq!(types(&fx, "curated/t", &cols).await, want);
    assert_eq!(
        log_mentions(&fx, "curated/t", "\"deletionVector\":{"),
        config.contains("deletion_vectors = true"),
        "vectors written exactly when on"
    );
}

/// A change that is not a lossless widening — a fraction into an integer column, a decimal
/// with fewer digits before the point — fails the file by name (`type_change`: the column,
/// both types, the row, the way forward), not retryable, and nothing of the file is applied.
/// A narrower file whose values fit is merged into the wider column as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_change_that_is_not_a_widening_fails_by_name_and_leaves_the_table() {
    let fx = Fixture::new(TABLE);
    let base = fx.put_batch(
        "t",
        "20240101-0000000001.parquet",
        &batch(vec![
            ("Op", strings(&["I"])),
            ("ts", strings(&[&ts(1)])),
            ("id", Arc::new(Int64Array::from(vec![1]))),
            ("p", strings(&["a"])),
            ("n", Arc::new(Int64Array::from(vec![7]))),
            ("d", dec(&[1234], 10, 2)),
        ]),
    );
    fx.merge_ok(&[base]).await;
    let table = fx.url("curated/t");
    let version = || async {
        delta::open(&table, &Default::default())
            .await
            .expect("open")
            .version()
    };
    let v = version().await;
    let file = |name: &str, n: ArrayRef, d: ArrayRef| {
        fx.put_batch(
            "t",
            name,
            &batch(vec![
                ("Op", strings(&["U", "U"])),
                ("ts", strings(&[&ts(2), &ts(2)])),
                ("id", Arc::new(Int64Array::from(vec![1, 1]))),
                ("p", strings(&["a", "a"])),
                ("n", n),
                ("d", d),
            ]),
        )
    };
    let fraction = file(
        "20240101-0000000002.parquet",
        Arc::new(Float64Array::from(vec![8.0, 8.5])),
        dec(&[1234, 1234], 10, 2),
    );
    let fewer_digits = file(
        "20240101-0000000003.parquet",
        Arc::new(Int64Array::from(vec![8, 8])),
        dec(&[12_300, 12_345_678_901], 11, 4),
    );
    let r = fx
        .engine
        .process(&[fraction.clone(), fewer_digits.clone()])
        .await;
    assert_eq!(r.failures().count(), 2, "{:?}", r.files);
    for (f, column, from, to, row) in [
        (&fraction, "n", "Int64", "Float64", "row 2"),
        (
            &fewer_digits,
            "d",
            "Decimal128(10, 2)",
            "Decimal128(11, 4)",
            "row 2",
        ),
    ] {
        let e = Fixture::failure(&r, f);
        assert_eq!(e.kind(), "type_change", "{e}");
        assert!(!e.is_retryable());
        let m = e.to_string();
        for want in [
            format!("column `{column}` is {from} in the table but {to} in the file"),
            row.to_string(),
            "reload the table".to_string(),
            tributary::storage::display(f),
        ] {
            assert!(m.contains(&want), "{want:?} missing from: {m}");
        }
    }
    assert_eq!(version().await, v, "nothing committed");

    // Narrower than the table, values that fit: merged, the table keeps its types.
    let narrow = fx.put_batch(
        "t",
        "20240101-0000000004.parquet",
        &batch(vec![
            ("Op", strings(&["U"])),
            ("ts", strings(&[&ts(4)])),
            ("id", Arc::new(Int32Array::from(vec![1]))),
            ("p", strings(&["a"])),
            ("n", Arc::new(Int32Array::from(vec![9]))),
            ("d", dec(&[99], 4, 1)),
        ]),
    );
    let r = fx.merge_ok(&[narrow]).await;
    assert!(r.tables[0].widened.is_empty());
    assert_eq!(
        text(&fx, "curated/t", &["id", "n", "d"], &[]).await,
        vec!["1|9|9.90"]
    );
    assert_eq!(
        types(&fx, "curated/t", &["id", "n", "d"]).await,
        vec!["id: Int64", "n: Int64", "d: Decimal128(10, 2)"]
    );
}

/// A widening rewrites every live data file of a table with many (several partitions,
/// several commits) in one commit, and the rows are the same rows after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_widening_rewrites_every_data_file_in_one_commit() {
    let fx = Fixture::new(TABLE);
    let parts = ["a", "b", "c", "d"];
    for k in 0..6i32 {
        let ids: Vec<i32> = (0..50).map(|i| k * 50 + i).collect();
        let n = ids.len();
        fx.merge_ok(&[fx.put_batch(
            "t",
            &format!("20240101-00000000{k:02}.parquet"),
            &batch(vec![
                ("Op", strings(&vec!["I"; n])),
                ("ts", strings(&vec![ts(k as u32).as_str(); n])),
                ("id", Arc::new(Int32Array::from(ids.clone()))),
                (
                    "p",
                    strings(
                        &ids.iter()
                            .map(|i| parts[*i as usize % 4])
                            .collect::<Vec<_>>(),
                    ),
                ),
                ("n", Arc::new(Int32Array::from(ids.clone()))),
            ]),
        )])
        .await;
    }
    let url = fx.url("curated/t");
    let live = live_files(&url).await;
    assert!(live >= 8, "{live} files");
    // count(*):sum(n)
    let sum = || async {
        let n = fx.batch("curated/t", &["n"], &[]).await;
        let n = tributary::deltalake::arrow::compute::cast(n.column(0), &DataType::Int64)
            .expect("int64");
        let n = n.as_any().downcast_ref::<Int64Array>().expect("int64");
        format!("{}:{}", n.len(), n.iter().flatten().sum::<i64>())
    };
    let rows_before = sum().await;
    let r = fx
        .merge_ok(&[fx.put_batch(
            "t",
            "20240101-0000000099.parquet",
            &batch(vec![
                ("Op", strings(&["U"])),
                ("ts", strings(&[&ts(59)])),
                ("id", Arc::new(Int32Array::from(vec![0]))),
                ("p", strings(&["a"])),
                ("n", Arc::new(Int64Array::from(vec![0]))),
            ]),
        )])
        .await;
    assert_eq!(r.tables[0].widened, vec!["n: Int32 -> Int64"]);
    assert_eq!(r.tables[0].files_rewritten_to_widen, live);
    assert_eq!(sum().await, rows_before);
    let found = file_types(&fx, "curated/t", "n").await;
    assert!(found.iter().all(|t| t == &DataType::Int64), "{found:?}");
}

/// #26 item 3: a column renamed at the source arrives under its new name, a dropped one stops
/// arriving. Without a setting, the table gains the new column and keeps the old one — and
/// `tributary status` names both (`drift`). With `rename_columns = { amount = "amt" }` the
/// table, its history and its change log keep one column; a file with both names fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_and_dropped_columns_show_as_drift_and_rename_columns_keeps_one_column() {
    let files = |fx: &Fixture| {
        let load = fx.put_batch(
            "t",
            "LOAD00000001.parquet",
            &batch(vec![
                ("ts", strings(&[&ts(0)])),
                ("id", Arc::new(Int64Array::from(vec![1]))),
                ("p", strings(&["a"])),
                ("amt", Arc::new(Int64Array::from(vec![10]))),
                ("gone", strings(&["x"])),
            ]),
        );
        let renamed = fx.put_batch(
            "t",
            "20240101-0000000001.parquet",
            &batch(vec![
                ("Op", strings(&["U"])),
                ("ts", strings(&[&ts(1)])),
                ("id", Arc::new(Int64Array::from(vec![1]))),
                ("p", strings(&["a"])),
                ("amount", Arc::new(Int64Array::from(vec![11]))),
            ]),
        );
        [load, renamed]
    };

    // No setting: two columns, and the status says so.
    let plain = Fixture::new(TABLE);
    for f in files(&plain) {
        plain.merge_ok(&[f]).await;
    }
    assert_eq!(
        text(&plain, "curated/t", &["id", "amt", "amount", "gone"], &[]).await,
        vec!["1|10|11|x"]
    );
    let drift = status(&plain).await.drift.expect("drift");
    assert_eq!(drift.files.len(), 2, "{drift:?}");
    assert_eq!(drift.missing_from_recent_files, Vec::<String>::new());
    assert_eq!(
        drift.added_since_created,
        Some(vec!["amount".to_string()]),
        "{drift:?}"
    );
    // Once the recent files are all from after the change, the old columns show as missing.
    for k in 2..7u32 {
        let later = plain.put_batch(
            "t",
            &format!("20240101-000000000{k}.parquet"),
            &batch(vec![
                ("Op", strings(&["U"])),
                ("ts", strings(&[&ts(k)])),
                ("id", Arc::new(Int64Array::from(vec![1]))),
                ("p", strings(&["a"])),
                ("amount", Arc::new(Int64Array::from(vec![10 + k as i64]))),
            ]),
        );
        plain.merge_ok(&[later]).await;
    }
    let drift = status(&plain).await.drift.expect("drift");
    assert_eq!(drift.files.len(), 5, "{drift:?}");
    assert!(drift.files.iter().all(|f| !f.contains("LOAD")), "{drift:?}");
    assert_eq!(
        drift.missing_from_recent_files,
        vec!["amt".to_string(), "gone".to_string()]
    );
    let cfg = TABLE.replace(
        "change_data_feed = true",
        "change_data_feed = true\nrename_columns = { amount = \"amt\" }",
    );

    // rename_columns: one column, in the table, the history and the change log.
    let renamed = Fixture::new(&cfg);
    for f in files(&renamed) {
        renamed.merge_ok(&[f]).await;
    }
    assert_eq!(
        text(&renamed, "curated/t", &["id", "amt", "gone"], &[]).await,
        vec!["1|11|x"]
    );
    for rel in [
        "curated/t",
        "curated/t_history",
        "curated/t_history/_tributary_changes",
    ] {
        let t = delta::open(&renamed.url(rel), &Default::default())
            .await
            .expect("open");
        let schema = t.snapshot().expect("snapshot").snapshot().arrow_schema();
        assert!(
            schema.field_with_name("amount").is_err(),
            "{rel}: {schema:?}"
        );
    }
    let drift = status(&renamed).await.drift.expect("drift");
    assert_eq!(drift.added_since_created, Some(vec![]), "{drift:?}");
    let both = renamed.put_batch(
        "t",
        "20240101-0000000003.parquet",
        &batch(vec![
            ("Op", strings(&["U"])),
            ("ts", strings(&[&ts(3)])),
            ("id", Arc::new(Int64Array::from(vec![1]))),
            ("p", strings(&["a"])),
            ("amt", Arc::new(Int64Array::from(vec![13]))),
            ("amount", Arc::new(Int64Array::from(vec![14]))),
        ]),
    );
    let r = renamed.engine.process(std::slice::from_ref(&both)).await;
    let e = Fixture::failure(&r, &both).to_string();
    assert!(
        e.contains("both `amount` and `amt`") && e.contains("rename_columns"),
        "{e}"
    );
}

/// A `DATE` column altered to `DATETIME` / `TIMESTAMP` at the source (here a key column `day`
/// and a plain one `born`) arrives as a timestamp, which tributary stores as `timestamp`
/// (UTC): the table widens `date` → `timestamp`, each old date becoming its midnight, the
/// value the source now holds and a reload would write — in the table, the history, its
/// change log, the tombstones' keys and the change feed. A late file in dates converts; a
/// tombstone in the wide key still blocks a late insert of the deleted key. A partition column
/// is not widened (its folder names would change): that fails by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_date_column_altered_to_a_timestamp_widens_to_each_dates_midnight() {
    use tributary::deltalake::arrow::array::{Date32Array, TimestampMicrosecondArray};
    let cfg = TABLE.replace("primary_key = [\"id\"]", "primary_key = [\"id\", \"day\"]");
    let fx = Fixture::new(&cfg);
    // 2024-03-01 is day 19783 since 1970-01-01.
    let day = |d: i32| -> ArrayRef { Arc::new(Date32Array::from(vec![d; 3])) };
    let load = fx.put_batch(
        "t",
        "LOAD00000001.parquet",
        &batch(vec![
            ("ts", strings(&[&ts(0), &ts(0), &ts(0)])),
            ("id", Arc::new(Int64Array::from(vec![1, 2, 3]))),
            ("day", day(19_783)),
            ("p", strings(&["a", "b", "a"])),
            (
                "born",
                Arc::new(Date32Array::from(vec![Some(-25_567), Some(0), None])),
            ),
        ]),
    );
    fx.merge_ok(&[load]).await;
    let us = |days: i64, secs: i64| days * 86_400_000_000 + secs * 1_000_000;
    // As DMS writes a timestamp column: no time zone.
    let stamps = |v: Vec<Option<i64>>| -> ArrayRef { Arc::new(TimestampMicrosecondArray::from(v)) };
    let wide = fx.put_batch(
        "t",
        "20240101-0000000001.parquet",
        &batch(vec![
            ("Op", strings(&["U", "I", "D"])),
            ("ts", strings(&[&ts(1), &ts(1), &ts(1)])),
            ("id", Arc::new(Int64Array::from(vec![2, 4, 3]))),
            (
                "day",
                stamps(vec![
                    Some(us(19_783, 0)),
                    Some(us(19_784, 3_723)),
                    Some(us(19_783, 0)),
                ]),
            ),
            ("p", strings(&["b", "a", "a"])),
            (
                "born",
                stamps(vec![Some(us(1, 1)), Some(us(-1, 86_399) + 999_999), None]),
            ),
        ]),
    );
    let before = delta::open(&fx.url("curated/t"), &Default::default())
        .await
        .expect("open")
        .version();
    let r = fx.merge_ok(std::slice::from_ref(&wide)).await;
    let t = &r.tables[0];
    let mut widened = t.widened.clone();
    widened.sort();
    assert_eq!(widened.len(), 2, "{widened:?}");
    assert!(
        widened[0].starts_with("born: Date32 -> Timestamp")
            && widened[1].starts_with("day: Date32 -> Timestamp"),
        "{widened:?}"
    );
    assert_eq!(t.history.as_ref().expect("history").widened.len(), 2);
    assert_eq!(
        t.version,
        before.map(|v| v + 2),
        "one commit widens, one merges"
    );

    // id|day|born (`null` for a null born), by id
    let rows = || async {
        let rows = fx
            .values("curated/t", &["id", "day", "born"], &["id"])
            .await;
        rows.into_iter()
            .map(|mut r| {
                r[2].get_or_insert_with(|| "null".into());
                concat_ws("|", &r)
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        rows().await,
        vec![
            "1|2024-03-01T00:00:00Z|1900-01-01T00:00:00Z",
            "2|2024-03-01T00:00:00Z|1970-01-02T00:00:01Z",
            "4|2024-03-02T01:02:03Z|1969-12-31T23:59:59.999999Z",
        ]
    );
    let want = vec![
        "day: Timestamp(µs, \"UTC\")".to_string(),
        "born: Timestamp(µs, \"UTC\")".to_string(),
    ];
    let got = types(&fx, "curated/t", &["day", "born"]).await;
    assert_eq!(got, want);
    for rel in ["curated/t_history", "curated/t_history/_tributary_changes"] {
        assert_eq!(types(&fx, rel, &["day", "born"]).await, want, "{rel}");
    }
    assert_eq!(
        types(&fx, "curated/t/_tributary_tombstones", &["day"]).await,
        want[..1].to_vec()
    );
    every_file_has(
        &fx,
        &[
            ("curated/t", "day"),
            ("curated/t", "born"),
            ("curated/t_history", "born"),
        ],
        |t| matches!(t, DataType::Timestamp(_, Some(_))),
    )
    .await;
    // The history keeps row 2's old version, its date at midnight.
    assert_eq!(
        fx.rows("curated/t_history", &["id", "born"], &["__START_AT"])
            .await
            .into_iter()
            .filter(|r| r[0] == "2")
            .map(|r| r[1].clone())
            .collect::<Vec<_>>(),
        vec!["1970-01-01T00:00:00Z", "1970-01-02T00:00:01Z"]
    );
    let mut feed = change_feed(&fx, &["_change_type", "id", "day"]).await;
    feed.sort();
    assert_eq!(
        feed,
        vec![
            "delete|3|2024-03-01T00:00:00Z",
            "insert|1|2024-03-01T00:00:00Z",
            "insert|2|2024-03-01T00:00:00Z",
            "insert|3|2024-03-01T00:00:00Z",
            "insert|4|2024-03-02T01:02:03Z",
            "update_postimage|2|2024-03-01T00:00:00Z",
            "update_preimage|2|2024-03-01T00:00:00Z",
        ]
    );

    // A late file in dates: converted to midnight; the deleted key (3, 2024-03-01) stays
    // deleted, a new one is inserted.
    let late = fx.put_batch(
        "t",
        "20240101-0000000000.parquet",
        &batch(vec![
            ("Op", strings(&["I", "I"])),
            ("ts", strings(&[&ts(0), &ts(0)])),
            ("id", Arc::new(Int64Array::from(vec![3, 5]))),
            ("day", Arc::new(Date32Array::from(vec![19_783, 19_790]))),
            ("p", strings(&["a", "a"])),
            ("born", Arc::new(Date32Array::from(vec![1, 2]))),
        ]),
    );
    let r = fx.merge_ok(&[late]).await;
    assert!(r.tables[0].widened.is_empty());
    assert_eq!(
        rows().await,
        vec![
            "1|2024-03-01T00:00:00Z|1900-01-01T00:00:00Z",
            "2|2024-03-01T00:00:00Z|1970-01-02T00:00:01Z",
            "4|2024-03-02T01:02:03Z|1969-12-31T23:59:59.999999Z",
            "5|2024-03-08T00:00:00Z|1970-01-03T00:00:00Z",
        ]
    );
    assert_eq!(types(&fx, "curated/t", &["day", "born"]).await, want);

    // A date partition column is not widened: the file fails by name, nothing committed.
    let cfg = TABLE.replace("partition_by = [\"p\"]", "partition_by = [\"day\"]");
    let fx = Fixture::new(&cfg);
    let load = fx.put_batch(
        "t",
        "LOAD00000001.parquet",
        &batch(vec![
            ("ts", strings(&[&ts(0)])),
            ("id", Arc::new(Int64Array::from(vec![1]))),
            ("day", Arc::new(Date32Array::from(vec![19_783]))),
            ("p", strings(&["a"])),
        ]),
    );
    fx.merge_ok(&[load]).await;
    let v = delta::open(&fx.url("curated/t"), &Default::default())
        .await
        .expect("open")
        .version();
    let wide = fx.put_batch(
        "t",
        "20240101-0000000001.parquet",
        &batch(vec![
            ("Op", strings(&["U"])),
            ("ts", strings(&[&ts(1)])),
            ("id", Arc::new(Int64Array::from(vec![1]))),
            ("day", stamps(vec![Some(us(19_783, 0))])),
            ("p", strings(&["b"])),
        ]),
    );
    let r = fx.engine.process(std::slice::from_ref(&wide)).await;
    let m = Fixture::failure(&r, &wide).to_string();
    assert!(
        m.contains("partition column `day` changed type from Date32 to Timestamp")
            && m.contains("Reload the table"),
        "{m}"
    );
    let after = delta::open(&fx.url("curated/t"), &Default::default())
        .await
        .expect("open")
        .version();
    assert_eq!(after, v, "nothing committed");
}

/// #26, item 4: a widening whose rewrite does not fit in one invocation. Each attempt
/// rewrites what its time allows (here: a deadline already passed, so one slice — one
/// partition's file — per attempt) and stages it; the table stays as it was (no commit, no
/// partial result) until the attempt that rewrites the last file commits them all at once.
/// A commit between two attempts (a late file in the old type, updating a row of a file
/// already staged) makes that slice stale: it is rewritten again, and the commit covers the
/// late file's row too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_widening_longer_than_an_invocation_is_staged_and_committed_at_the_attempt_that_finishes()
{
    let fx = Fixture::new(concat!(table_t!(), "slice_mb = 0.000001\n"));
    let int32 = |v: &[i32]| -> ArrayRef { Arc::new(Int32Array::from(v.to_vec())) };
    let load = fx.put_batch(
        "t",
        "LOAD00000001.parquet",
        &batch(vec![
            ("ts", strings(&[ts(0).as_str(); 8])),
            ("id", int32(&[1, 2, 3, 4, 5, 6, 7, 8])),
            ("p", strings(&["a", "a", "b", "b", "c", "c", "d", "d"])),
            ("n", int32(&[10, 20, 30, 40, 50, 60, 70, 80])),
        ]),
    );
    fx.merge_ok(&[load]).await;
    let version = || async {
        delta::open(&fx.url("curated/t"), &Default::default())
            .await
            .expect("open")
            .version()
    };
    let loaded = version().await;
    let big = 1i64 << 40;
    let wide = fx.put_batch(
        "t",
        "20240101-0000000002.parquet",
        &batch(vec![
            ("Op", strings(&["U"])),
            ("ts", strings(&[&ts(2)])),
            ("id", int32(&[5])),
            ("p", strings(&["c"])),
            ("n", Arc::new(Int64Array::from(vec![big]))),
        ]),
    );
    let staged_record = fx.path("curated/t/_tributary_widening.json");
    let attempt = || async {
        tributary::budget::within(
            std::time::Instant::now(),
            fx.engine.process(std::slice::from_ref(&wide)),
        )
        .await
    };

    // First attempt: one partition's file rewritten and staged, nothing committed.
    let r = attempt().await;
    let e = Fixture::failure(&r, &wide);
    assert_eq!(e.kind(), "widening", "{e}");
    assert!(e.is_retryable());
    let message = e.to_string();
    assert!(
        message.contains("n: Int32 -> Int64") && message.contains("1 of 4 data files"),
        "{message}"
    );
    assert!(exists(&staged_record), "the staged slices are recorded");
    assert_eq!(version().await, loaded, "nothing committed");
    assert_eq!(
        types(&fx, "curated/t", &["n"]).await,
        vec!["n: Int32"],
        "readers see the table as it was"
    );
    every_file_has(&fx, &[("curated/t", "n")], |t| t == &DataType::Int32).await;

    // Late files in the old type merge meanwhile (no widening needed for them).
    let late = |name: &str, id: i32, p: &str, n: i32| {
        fx.put_batch(
            "t",
            name,
            &batch(vec![
                ("Op", strings(&["U"])),
                ("ts", strings(&[&ts(1)])),
                ("id", int32(&[id])),
                ("p", strings(&[p])),
                ("n", int32(&[n])),
            ]),
        )
    };
    let staged_after = |r: &tributary::ProcessReport| {
        let e = Fixture::failure(r, &wide);
        assert_eq!(e.kind(), "widening", "{e}");
        e.to_string()
    };
    // One updates a partition not staged yet: the staged slice stands.
    fx.merge_ok(&[late("20240101-0000000001.parquet", 7, "d", 71)])
        .await;
    let r = attempt().await;
    assert!(staged_after(&r).contains("2 of 4"), "{}", staged_after(&r));
    // One updates a row of a staged file: that slice is stale and is rewritten again.
    fx.merge_ok(&[late("20240101-0000000003.parquet", 1, "a", 11)])
        .await;
    let after_late = version().await;
    let r = attempt().await;
    assert!(staged_after(&r).contains("2 of 4"), "{}", staged_after(&r));
    let r = attempt().await;
    assert!(staged_after(&r).contains("3 of 4"), "{}", staged_after(&r));
    assert_eq!(version().await, after_late, "nothing committed");
    // The attempt that rewrites the last file commits every file at once.
    let report = attempt().await;
    assert!(
        matches!(report.files[0].status, tributary::FileStatus::Merged { .. }),
        "{:?}",
        report.files[0].status
    );
    let t = &report.tables[0];
    assert_eq!(t.widened, vec!["n: Int32 -> Int64"]);
    assert_eq!(t.files_rewritten_to_widen, 4);
    assert_eq!(
        t.version,
        after_late.map(|v| v + 2),
        "one commit widens, one merges"
    );
    assert!(!exists(&staged_record), "the record is gone once committed");
    assert_eq!(types(&fx, "curated/t", &["n"]).await, vec!["n: Int64"]);
    every_file_has(&fx, &[("curated/t", "n")], |t| t == &DataType::Int64).await;
    assert_eq!(
        text(&fx, "curated/t", &["id", "p", "n"], &["id"]).await,
        vec![
            "1|a|11".to_string(),
            "2|a|20".into(),
            "3|b|30".into(),
            "4|b|40".into(),
            format!("5|c|{big}"),
            "6|c|60".into(),
            "7|d|71".into(),
            "8|d|80".into(),
        ]
    );
}
