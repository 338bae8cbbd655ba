//! #23 item 5: a CDC file overwritten in place after it was merged. Its rows would be
//! ordered as the old version's (the same file, the same row numbers), so merging it would
//! apply only the rows the old version lacked. It must fail by name with nothing applied —
//! whichever path would have merged it (a batch, a large file appended whole or merged in
//! slices, a history-only table) — while the same contents delivered again stay a no-op.

use tributary::delta;
use tributary_tests::*;

fn ts(i: usize) -> String {
    format!("2024-01-01 10:{:02}:{:02}.000000", i / 60 % 60, i % 60)
}

async fn version(table: &url::Url) -> Option<u64> {
    delta::open(table, &Default::default())
        .await
        .expect("open")
        .version()
}

fn assert_reuploaded(r: &tributary::ProcessReport, file: &url::Url) {
    let e = Fixture::failure(r, file);
    assert_eq!(e.kind(), "reuploaded", "{e}");
    assert!(!e.is_retryable(), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("20240101-0100000000.parquet")
            && text.contains("merged before with other contents")
            && text.contains("new CDC file"),
        "the error names the file and the way forward: {text}"
    );
}

/// The issue's reproduction: merged as `(1 WRONG, 2 b)`, overwritten with `(1 right, 2 b,
/// 3 c)`. Before the fix: id 1 stayed WRONG, id 3 was added, exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdc_file_overwritten_with_other_contents_fails_by_name_and_changes_nothing() {
    let fx = Fixture::items();
    let t = "2024-01-01 01:00:00.000000";
    let first = [
        c('I', t, 1, "a", 666), // WRONG
        c('I', t, 2, "a", 2),
    ];
    let file = fx.put_items("20240101-0100000000.parquet", &first);
    fx.merge_ok(std::slice::from_ref(&file)).await;
    let rows = fx.items_rows().await;
    let table = fx.url("curated/items");
    let v = version(&table).await;

    // The same contents again (a duplicate event, or the object copied onto itself to
    // send its event again): nothing to do, no commit.
    fx.put_items("20240101-0100000000.parquet", &first);
    fx.merge_ok(std::slice::from_ref(&file)).await;
    assert_eq!(version(&table).await, v, "a re-delivery commits nothing");

    // Corrected in place, alone and in a batch with a good file: refused, nothing of it
    // applied; the good file is merged.
    let corrected = [
        c('I', t, 1, "a", 1),
        c('I', t, 2, "a", 2),
        c('I', t, 3, "a", 3),
    ];
    fx.put_items("20240101-0100000000.parquet", &corrected);
    let r = fx.engine.process(std::slice::from_ref(&file)).await;
    assert_reuploaded(&r, &file);
    assert_eq!(
        fx.items_rows().await,
        rows,
        "nothing of the new version applied"
    );
    let good = fx.put_items(
        "20240101-0200000000.parquet",
        &[c('I', "2024-01-01 02:00:00.000000", 4, "b", 4)],
    );
    let r = fx.engine.process(&[file.clone(), good.clone()]).await;
    assert_reuploaded(&r, &file);
    assert_eq!(r.failures().count(), 1, "{:?}", r.files);
    let mut want = rows.clone();
    want.push((4, "b".into(), 4));
    assert_eq!(fx.items_rows().await, want);

    // Another instance (a cold start) refuses it the same way: the record is in the table.
    let r = fx
        .another_engine()
        .process(std::slice::from_ref(&file))
        .await;
    assert_reuploaded(&r, &file);

    // The way forward the error gives: the corrections as a new CDC file.
    let fix = fx.put_items(
        "20240101-0300000000.parquet",
        &[
            c('U', "2024-01-01 03:00:00.000000", 1, "a", 1),
            c('I', "2024-01-01 03:00:00.000000", 3, "a", 3),
        ],
    );
    fx.merge_ok(&[fix]).await;
    assert_eq!(
        fx.items_rows().await,
        vec![
            (1, "a".into(), 1),
            (2, "a".into(), 2),
            (3, "a".into(), 3),
            (4, "b".into(), 4)
        ]
    );
}

/// A file larger than a slice, appended whole (new keys) or merged slice by slice (updates
/// of existing keys): overwritten after it was applied, refused the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_file_overwritten_with_other_contents_is_refused_on_either_path() {
    let fx = Fixture::new(&format!("{ITEMS_TABLE}slice_rows = 1024\n"));
    let load: Vec<Change> = (1..=3000)
        .map(|id| c('I', "2024-01-01 09:00:00.000000", id, "a", id))
        .collect();
    let inserts = fx.put_items("LOAD00000001.parquet", &load);
    let r = fx.merge_ok(std::slice::from_ref(&inserts)).await;
    assert!(
        r.tables[0].appended(),
        "a full load into a new table is appended"
    );
    // New keys: appended whole.
    let new_keys = |val: i64| -> Vec<Change> {
        (5001..=8000)
            .map(|id| c('I', &ts(id as usize % 3600), id, "b", val))
            .collect()
    };
    let file = fx.put_items("20240101-0100000000.parquet", &new_keys(1));
    let r = fx.merge_ok(std::slice::from_ref(&file)).await;
    assert!(r.tables[0].appended(), "{:?}", r.tables);
    let rows = fx.items_rows().await;
    fx.put_items("20240101-0100000000.parquet", &new_keys(2));
    let r = fx.engine.process(std::slice::from_ref(&file)).await;
    assert_reuploaded(&r, &file);
    assert_eq!(fx.items_rows().await, rows);

    // Updates of loaded keys: merged slice by slice.
    let updates = |val: i64| -> Vec<Change> {
        (1..=3000)
            .map(|id| c('U', &ts(id as usize % 3600), id, "a", val))
            .collect()
    };
    let file = fx.put_items("20240101-0200000000.parquet", &updates(7));
    let r = fx.merge_ok(std::slice::from_ref(&file)).await;
    assert!(r.tables[0].slices >= 3, "{:?}", r.tables);
    let rows = fx.items_rows().await;
    // The same contents again: nothing changes.
    fx.merge_ok(std::slice::from_ref(&file)).await;
    assert_eq!(fx.items_rows().await, rows);
    let mut changed = updates(7);
    changed[2500].val = 8;
    let file = fx.put_items("20240101-0200000000.parquet", &changed);
    let r = fx.engine.process(std::slice::from_ref(&file)).await;
    let e = Fixture::failure(&r, &file);
    assert_eq!(e.kind(), "reuploaded", "{e}");
    assert_eq!(fx.items_rows().await, rows);
}

/// A table that keeps only its history records its files in the history table's commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_only_table_refuses_an_overwritten_file_too() {
    let fx = Fixture::new(
        r#"
[[table]]
name = "items"
source = "raw/shop/items/"
primary_key = ["id"]
sequence_by = ["ts"]
drop_columns = ["ts"]
[table.history]
target = "curated/items_history"
"#,
    );
    let t = "2024-01-01 01:00:00.000000";
    let file = fx.put_items(
        "20240101-0100000000.parquet",
        &[c('I', t, 1, "a", 666), c('I', t, 2, "a", 2)],
    );
    fx.merge_ok(std::slice::from_ref(&file)).await;
    let history = fx.url("curated/items_history");
    let v = version(&history).await;
    fx.merge_ok(std::slice::from_ref(&file)).await;
    assert_eq!(version(&history).await, v, "a re-delivery commits nothing");
    fx.put_items(
        "20240101-0100000000.parquet",
        &[c('I', t, 1, "a", 1), c('I', t, 3, "a", 3)],
    );
    let r = fx.engine.process(std::slice::from_ref(&file)).await;
    assert_reuploaded(&r, &file);
    assert_eq!(version(&history).await, v, "nothing of it applied");
}

/// New tables let the records expire (the tombstone retention and a week, so the log does
/// not grow with every file ever merged) and say since when they keep them; full-load
/// records carry no time and never expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_tables_keep_the_records_of_cdc_files_for_the_tombstone_retention_and_a_week() {
    let fx = Fixture::new(&format!("{ITEMS_TABLE}tombstone_retention_days = 3\n"));
    let file = fx.put_items(
        "20240101-0100000000.parquet",
        &[c('I', "2024-01-01 01:00:00.000000", 1, "a", 1)],
    );
    fx.merge_ok(&[file]).await;
    let table = delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .expect("open");
    let conf = table
        .snapshot()
        .expect("snapshot")
        .metadata()
        .configuration()
        .clone();
    assert_eq!(
        conf.get("delta.setTransactionRetentionDuration")
            .map(String::as_str),
        Some("interval 864000 seconds"),
        "{conf:?}"
    );
    assert!(conf.contains_key("tributary.fileRecordsSince"), "{conf:?}");
}

/// A file without a record, written before the records' horizon, on a table that has kept
/// records since before it: its record may have expired, so it is refused (`too_late`)
/// instead of being applied as new. A new table takes the same old file (a backfill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrecorded_file_older_than_the_records_kept_is_too_late() {
    let old = [c('I', "2020-01-01 00:00:00.000000", 1, "a", 1)];
    let backfill = Fixture::items();
    let file = backfill.put_items("20200101-0000000000.parquet", &old);
    backfill.merge_ok(&[file]).await;
    assert_eq!(backfill.items_rows().await, vec![(1, "a".into(), 1)]);

    let fx = Fixture::items();
    let now = chrono::Utc::now();
    let recent = fx.put_items(
        &format!("{}.parquet", now.format("%Y%m%d-%H%M%S%3f")),
        &[c(
            'I',
            &now.format("%Y-%m-%d %H:%M:%S%.6f").to_string(),
            2,
            "a",
            2,
        )],
    );
    fx.merge_ok(&[recent]).await;
    // As if the table had kept records for years.
    let table = delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .expect("open");
    table
        .set_tbl_properties()
        .with_properties(std::collections::HashMap::from([(
            "tributary.fileRecordsSince".to_string(),
            "2000-01-01T00:00:00Z".to_string(),
        )]))
        .with_raise_if_not_exists(false)
        .await
        .expect("set property");
    let file = fx.put_items("20200101-0000000000.parquet", &old);
    let r = fx.engine.process(std::slice::from_ref(&file)).await;
    let e = Fixture::failure(&r, &file);
    assert_eq!(e.kind(), "too_late", "{e}");
    assert!(
        e.to_string().contains("records of the files it applied"),
        "{e}"
    );
    assert_eq!(fx.items_rows().await, vec![(2, "a".into(), 2)]);
}
