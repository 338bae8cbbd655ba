//! Tests of the Delta engine that need its internals: forced interleavings of concurrent
//! writers.

use std::sync::atomic::Ordering;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};

use std::sync::Arc;

use super::*;
use crate::engine::FileStatus;
use crate::props::TableProps;
use crate::storage::Storage;

use crate::delta;
use crate::delta::testing::{table_batch, text_values, Hook, Point};

/// The ids in the table, in order.
async fn ids_of(config: &Config) -> Vec<i64> {
    let table = delta::open(
        config.tables[0].target.as_ref().unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let rows = [table_batch(&table, &["id"], &["id"]).await];
    rows.iter()
        .flat_map(|b| {
            arrow::compute::cast(b.column(0), &DataType::Int64)
                .unwrap()
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect()
}

fn cdc(op: &str, ts: &str, id: i64) -> bytes::Bytes {
    let schema = Arc::new(Schema::new(vec![
        Field::new("Op", DataType::Utf8, true),
        Field::new("ts", DataType::Utf8, true),
        Field::new("id", DataType::Int64, true),
    ]));
    let b = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(vec![op])),
            Arc::new(StringArray::from(vec![ts])),
            Arc::new(Int64Array::from(vec![id])),
        ],
    )
    .unwrap();
    crate::demo::to_parquet(&b).unwrap()
}

/// The race the post-commit tombstone re-check exists for: a late, older insert reads
/// the tombstones (none yet), then a newer delete of the same key records its tombstone
/// and merges (finding no row), then the insert commits. The insert's re-check must
/// remove the row again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_insert_racing_a_delete_does_not_revive_the_row() {
    let dir = tempfile::tempdir().unwrap();
    let text = crate::config::test_table("t", "raw/t/", "curated/t", "sequence_by = [\"ts\"]");
    let config = Config::from_toml(&text, "test", Some(dir.path())).unwrap();
    let deleter = Engine::new(config.clone());
    let src = config.tables[0].source.clone();
    let insert = src.join("20240101-0000000001.parquet").unwrap();
    let delete = src.join("20240101-0000000002.parquet").unwrap();
    let storage = Storage::new();
    storage
        .put(&insert, cdc("I", "2024-01-01 00:00:01", 1))
        .await
        .unwrap();
    storage
        .put(&delete, cdc("D", "2024-01-01 00:00:02", 1))
        .await
        .unwrap();
    // create the table first with an unrelated row
    let other = src.join("20240101-0000000000.parquet").unwrap();
    storage
        .put(&other, cdc("I", "2024-01-01 00:00:00", 2))
        .await
        .unwrap();
    let r = deleter.process(&[other]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);

    let inserter = Engine::new(config.clone());
    let (d, del) = (deleter.clone(), delete.clone());
    let (hook, fired) = Hook::once(move || {
        let (d, del) = (d.clone(), del.clone());
        async move {
            let r = d.process(&[del]).await;
            assert_eq!(r.failures().count(), 0);
            assert_eq!(r.tables[0].deleted, 0, "the row is not there yet");
        }
    });
    inserter.hooks().set(Point::BeforeMerge, "", hook);
    let r = inserter.process(&[insert]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    assert!(fired.load(Ordering::SeqCst));
    assert_eq!(
        r.tables[0].inserted, 1,
        "the insert did commit before the re-check"
    );
    assert_eq!(r.tables[0].deleted, 1, "the re-check removed it again");
    let ids = ids_of(&config).await;
    assert_eq!(ids, vec![2]);
}

/// A compaction that commits while a merge is between its read and its commit: the merge
/// removes a file the compaction already replaced. delta-rs's conflict checker ignores
/// removes without data change (docs/design.md, "what delta-rs misses"), so without
/// tributary's guard the merge commits on top and the compacted copy of the deleted row
/// stays live: the row comes back. The merge must conflict, re-plan and delete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_racing_a_merge_never_revives_a_deleted_row() {
    let dir = tempfile::tempdir().unwrap();
    let text = crate::config::test_table("t", "raw/t/", "curated/t", "sequence_by = [\"ts\"]");
    let config = Config::from_toml(&text, "test", Some(dir.path())).unwrap();
    let writer = Engine::new(config.clone());
    let src = config.tables[0].source.clone();
    let storage = Storage::new();
    // three one-row commits: three small files for the compaction
    for id in 1..=3 {
        let f = src
            .join(&format!("20240101-000000000{id}.parquet"))
            .unwrap();
        storage
            .put(&f, cdc("I", &format!("2024-01-01 00:00:0{id}"), id))
            .await
            .unwrap();
        let r = writer.process(&[f]).await;
        assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    }
    let delete = src.join("20240101-0000000009.parquet").unwrap();
    storage
        .put(&delete, cdc("D", "2024-01-01 00:00:09", 1))
        .await
        .unwrap();
    let deleter = Engine::new(config.clone());
    let cfg = config.tables[0].clone();
    let (hook, fired) = Hook::once(move || {
        let cfg = cfg.clone();
        async move {
            let m = crate::delta::maintenance::maintain(
                &cfg,
                &Storage::new(),
                &Default::default(),
                Default::default(),
            )
            .await
            .unwrap();
            assert_eq!(m.partitions_compacted, 1, "the three files were compacted");
        }
    });
    deleter.hooks().set(Point::BeforeMerge, "", hook);
    let r = deleter.process(&[delete]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    assert!(fired.load(Ordering::SeqCst));
    assert!(
        r.tables[0].commit_attempts >= 2,
        "the merge conflicted with the compaction: {:?}",
        r.tables[0]
    );
    let ids = ids_of(&config).await;
    assert_eq!(ids, vec![2, 3], "the deleted row stays deleted");
}

/// The other order of the insert/delete race: the delete's engine loaded the table before
/// the insert committed, and the insert (older, so the delete must win) commits and
/// re-checks the tombstones before the delete records its tombstone. The delete must then
/// read the table after recording it: a MERGE planned on the table as loaded before finds no
/// row, changes nothing and so commits nothing — no conflict tells it that it was stale —
/// and the inserted row would stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_planned_on_a_table_loaded_before_a_late_insert_still_deletes_it() {
    let dir = tempfile::tempdir().unwrap();
    let text = crate::config::test_table("t", "raw/t/", "curated/t", "sequence_by = [\"ts\"]");
    let config = Config::from_toml(&text, "test", Some(dir.path())).unwrap();
    let inserter = Engine::new(config.clone());
    let src = config.tables[0].source.clone();
    let storage = Storage::new();
    let other = src.join("20240101-0000000000.parquet").unwrap();
    let insert = src.join("20240101-0000000001.parquet").unwrap();
    let delete = src.join("20240101-0000000002.parquet").unwrap();
    for (f, op, ts, id) in [
        (&other, "I", "2024-01-01 00:00:00", 2),
        (&insert, "I", "2024-01-01 00:00:01", 1),
        (&delete, "D", "2024-01-01 00:00:02", 1),
    ] {
        storage.put(f, cdc(op, ts, id)).await.unwrap();
    }
    let r = inserter.process(std::slice::from_ref(&other)).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    let deleter = Engine::new(config.clone());
    let (ins, file) = (inserter.clone(), insert.clone());
    let (hook, fired) = Hook::once(move || {
        let (ins, file) = (ins.clone(), file.clone());
        async move {
            let r = ins.process(&[file]).await;
            assert_eq!(r.failures().count(), 0);
            assert_eq!(r.tables[0].inserted, 1, "no tombstone yet: inserted");
        }
    });
    deleter.hooks().set(Point::BeforeTombstones, "", hook);
    let r = deleter.process(&[delete]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    assert!(fired.load(Ordering::SeqCst));
    assert_eq!(
        r.tables[0].deleted, 1,
        "the delete found the row: {:?}",
        r.tables[0]
    );
    let ids = ids_of(&config).await;
    assert_eq!(ids, vec![2], "the deleted row stays deleted");
}

/// A full-load file appended whole while a delete of one of its keys is recorded and
/// merged (finding no row: the append is not committed yet): the re-check after the append
/// reads the file again and deletes the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_racing_a_whole_file_append_still_deletes_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let extra = "sequence_by = [\"ts\"]\nslice_rows = 1024";
    let text = crate::config::test_table("t", "raw/t/", "curated/t", extra);
    let config = Config::from_toml(&text, "test", Some(dir.path())).unwrap();
    let src = config.tables[0].source.clone();
    let storage = Storage::new();
    let load = src.join("LOAD00000001.parquet").unwrap();
    let n = 3000i64;
    let b = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("ts", DataType::Utf8, true),
            Field::new("id", DataType::Int64, true),
        ])),
        vec![
            Arc::new(StringArray::from(vec!["2024-01-01 00:00:00"; n as usize])),
            Arc::new(Int64Array::from_iter_values(1..=n)),
        ],
    )
    .unwrap();
    storage
        .put(&load, crate::demo::to_parquet(&b).unwrap())
        .await
        .unwrap();
    let delete = src.join("20240101-0000000002.parquet").unwrap();
    storage
        .put(&delete, cdc("D", "2024-01-01 00:00:02", 5))
        .await
        .unwrap();
    let deleter = Engine::new(config.clone());
    let loader = Engine::new(config.clone());
    let (d, del) = (deleter.clone(), delete.clone());
    let (hook, fired) = Hook::once(move || {
        let (d, del) = (d.clone(), del.clone());
        async move {
            let r = d.process(&[del]).await;
            assert_eq!(r.failures().count(), 0, "{:?}", r.files);
            assert_eq!(r.tables[0].deleted, 0, "the row is not there yet");
        }
    });
    loader.hooks().set(Point::BeforeMerge, "", hook);
    let r = loader.process(&[load]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    assert!(fired.load(Ordering::SeqCst));
    let t = &r.tables[0];
    assert_eq!(
        (t.slices, t.appended(), t.inserted),
        (1, true, 3000),
        "{t:?}"
    );
    assert_eq!(t.deleted, 1, "the re-check removed it again");
    let ids = ids_of(&config).await;
    assert_eq!(ids.len(), 2999);
    assert!(!ids.contains(&5));
}

/// What a DMS reload commits first: a new generation starting now (`tributary reload`
/// registers it, then MERGEs the new load, deleting rows it does not have, without
/// tombstones).
async fn register_reload(config: &Config) {
    let t = delta::open(
        config.tables[0].target.as_ref().unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let g = delta::props(&t).generation() + 1;
    delta::set_properties(t, TableProps::for_generation(g, chrono::Utc::now()))
        .await
        .unwrap();
}

/// A CDC insert screened before a DMS reload and committed after it would bring back a row
/// the reload deleted (a reload records no tombstones): the merge that loses its commit race
/// to the reload is screened again and fails with the retryable `reloaded`; retried, the
/// file belongs to the older load and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_racing_a_reload_is_screened_again() {
    let dir = tempfile::tempdir().unwrap();
    let text = crate::config::test_table("t", "raw/t/", "curated/t", "sequence_by = [\"ts\"]");
    let config = Config::from_toml(&text, "test", Some(dir.path())).unwrap();
    let src = config.tables[0].source.clone();
    let storage = Storage::new();
    let first = src.join("20240101-0000000000.parquet").unwrap();
    storage
        .put(&first, cdc("I", "2024-01-01 00:00:00", 1))
        .await
        .unwrap();
    let r = Engine::new(config.clone()).process(&[first]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    let insert = src.join("20240101-0000000001.parquet").unwrap();
    storage
        .put(&insert, cdc("I", "2024-01-01 00:00:01", 99))
        .await
        .unwrap();
    let merger = Engine::new(config.clone());
    let c = config.clone();
    let (hook, fired) = Hook::once(move || {
        let c = c.clone();
        async move {
            register_reload(&c).await;
        }
    });
    merger.hooks().set(Point::BeforeMerge, "", hook);
    let r = merger.process(std::slice::from_ref(&insert)).await;
    assert!(fired.load(Ordering::SeqCst));
    let e = match &r.files[0].status {
        FileStatus::Failed { error, .. } => error.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!((e.kind(), e.is_retryable()), ("reloaded", true), "{e}");
    assert_eq!(ids_of(&config).await, vec![1], "nothing applied");
    // Redelivered: the file is of the older load, which the reload reflects.
    let r = Engine::new(config.clone()).process(&[insert]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    assert_eq!(
        ids_of(&config).await,
        vec![1],
        "the row the reload deleted stays deleted"
    );
}

/// The same race for a large file appended whole: screened before the reload, its commit
/// would come after it. It goes to the slice path instead, which finds it superseded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_file_append_racing_a_reload_is_screened_again() {
    let dir = tempfile::tempdir().unwrap();
    let extra = "sequence_by = [\"ts\"]\nslice_rows = 1024";
    let text = crate::config::test_table("t", "raw/t/", "curated/t", extra);
    let config = Config::from_toml(&text, "test", Some(dir.path())).unwrap();
    let src = config.tables[0].source.clone();
    let storage = Storage::new();
    let first = src.join("20240101-0000000000.parquet").unwrap();
    storage
        .put(&first, cdc("I", "2024-01-01 00:00:00", 1))
        .await
        .unwrap();
    let r = Engine::new(config.clone()).process(&[first]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    // 3000 CDC inserts of new keys: appendable whole.
    let n = 3000usize;
    let b = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("Op", DataType::Utf8, true),
            Field::new("ts", DataType::Utf8, true),
            Field::new("id", DataType::Int64, true),
        ])),
        vec![
            Arc::new(StringArray::from(vec!["I"; n])),
            Arc::new(StringArray::from(vec!["2024-01-01 00:00:01"; n])),
            Arc::new(Int64Array::from_iter_values(1000..1000 + n as i64)),
        ],
    )
    .unwrap();
    let big = src.join("20240101-0000000001.parquet").unwrap();
    storage
        .put(&big, crate::demo::to_parquet(&b).unwrap())
        .await
        .unwrap();
    let loader = Engine::new(config.clone());
    let c = config.clone();
    let (hook, fired) = Hook::once(move || {
        let c = c.clone();
        async move {
            register_reload(&c).await;
        }
    });
    loader.hooks().set(Point::BeforeMerge, "", hook);
    let r = loader.process(std::slice::from_ref(&big)).await;
    assert!(fired.load(Ordering::SeqCst));
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    assert!(r.tables.is_empty(), "nothing committed: {:?}", r.tables);
    assert_eq!(
        ids_of(&config).await,
        vec![1],
        "none of the older load's rows"
    );
}

/// Two writers of a new table whose files order changes by values of different kinds: the
/// second admitted its file when there was no table (no kinds to check against), then the
/// first created the table and recorded timestamps. The second's commit must check its
/// file again and refuse it, not write text order keys among timestamp ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinds_recorded_by_a_concurrent_writer_are_checked_before_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let text = crate::config::test_table("t", "raw/t/", "curated/t", "sequence_by = [\"ts\"]");
    let config = Config::from_toml(&text, "test", Some(dir.path())).unwrap();
    let src = config.tables[0].source.clone();
    let storage = Storage::new();
    let stamped = src.join("20240101-0000000001.parquet").unwrap();
    let texted = src.join("20240101-0000000002.parquet").unwrap();
    storage
        .put(&stamped, cdc("I", "2024-01-01 00:00:01", 1))
        .await
        .unwrap();
    storage.put(&texted, cdc("I", "seq-0002", 2)).await.unwrap();
    let first = Engine::new(config.clone());
    let second = Engine::new(config.clone());
    let (f, file) = (first.clone(), stamped.clone());
    let (hook, fired) = Hook::once(move || {
        let (f, file) = (f.clone(), file.clone());
        async move {
            let r = f.process(&[file]).await;
            assert_eq!(r.failures().count(), 0, "{:?}", r.files);
        }
    });
    second.hooks().set(Point::BeforeTombstones, "", hook);
    let r = second.process(std::slice::from_ref(&texted)).await;
    assert!(fired.load(Ordering::SeqCst));
    let failed: Vec<String> = r
        .failures()
        .filter_map(|f| match &f.status {
            FileStatus::Failed { error, .. } => Some(error.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 1, "{:?}", r.files);
    assert!(
        failed[0].contains("values of different kinds do not compare"),
        "{failed:?}"
    );
    assert_eq!(
        ids_of(&config).await,
        vec![1],
        "the text-ordered row is not written"
    );
}

/// A CDC file of `(op, id, v)` rows, all at time `ts`.
fn cdc_rows(ts: &str, rows: &[(&str, i64, i64)]) -> bytes::Bytes {
    let schema = Arc::new(Schema::new(vec![
        Field::new("Op", DataType::Utf8, true),
        Field::new("ts", DataType::Utf8, true),
        Field::new("id", DataType::Int64, true),
        Field::new("v", DataType::Int64, true),
    ]));
    let b = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|_| ts))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
        ],
    )
    .unwrap();
    crate::demo::to_parquet(&b).unwrap()
}

/// The table's newest version.
async fn latest_version(url: &url::Url) -> u64 {
    delta::open(url, &Default::default())
        .await
        .unwrap()
        .version()
        .unwrap()
}

/// `(id, v)` rows of the table's newest version, in key order.
async fn latest_rows(url: &url::Url) -> Vec<(i64, i64)> {
    rows_at(url, latest_version(url).await).await
}

/// `(id, v)` rows of the table at `version`, in key order.
async fn rows_at(url: &url::Url, version: u64) -> Vec<(i64, i64)> {
    let mut table = delta::open(url, &Default::default()).await.unwrap();
    table.load_version(version).await.unwrap();
    let batches = [table_batch(&table, &["id", "v"], &["id"]).await];
    let col = |b: &RecordBatch, i: usize| {
        arrow::compute::cast(b.column(i), &DataType::Int64)
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .values()
            .to_vec()
    };
    batches
        .iter()
        .flat_map(|b| col(b, 0).into_iter().zip(col(b, 1)))
        .collect()
}

/// #28: a merge of grouped files is killed in the third group — after its tombstones are
/// recorded and before its MERGE commits, or after the MERGE and before the tombstones are
/// confirmed — and the retry merges all the files again. Every table version the retry
/// writes must be a state the source had — the table after some prefix of the files — and
/// the deletes must stop late older inserts afterwards. Before the fix (the first case) the
/// retry's already-applied groups turned their stale upserts of the unfinished group's
/// deleted keys into deletes: the retry's first versions were the table minus those keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_crash_between_a_groups_tombstones_and_merge_shows_only_states_of_the_source(
) {
    retry_after_a_crash_in_the_third_group(false).await;
}

/// The other crash window of a group with deletes: its MERGE is in, its tombstones are
/// still pending. The retry's earlier groups must not bring the deleted rows back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_crash_between_a_groups_merge_and_its_confirmation_shows_only_states_of_the_source(
) {
    retry_after_a_crash_in_the_third_group(true).await;
}

#[allow(
    clippy::too_many_lines,
    reason = "a test reads as one scenario, setup to assertions"
)]
async fn retry_after_a_crash_in_the_third_group(after_the_merge: bool) {
    let dir = tempfile::tempdir().unwrap();
    let extra = "sequence_by = [\"ts\"]\nslice_rows = 1024";
    let text = crate::config::test_table("t", "raw/t/", "curated/t", extra);
    let config = Config::from_toml(&text, "test", Some(dir.path())).unwrap();
    let src = config.tables[0].source.clone();
    let url = config.tables[0].target.clone().unwrap();
    let storage = Storage::new();
    // Six files of 400 changes of keys 1..=400: merged two per commit (1024-row slices).
    let keys = 1..=400i64;
    let files_rows: Vec<Vec<(&str, i64, i64)>> = vec![
        keys.clone().map(|k| ("I", k, 0)).collect(),
        keys.clone().map(|k| ("U", k, 1)).collect(),
        keys.clone().map(|k| ("U", k, 2)).collect(),
        keys.clone()
            .map(|k| if k <= 200 { ("D", k, 3) } else { ("U", k, 3) })
            .collect(),
        keys.clone().map(|k| ("U", k, 4)).collect(),
        keys.clone()
            .map(|k| if k > 300 { ("D", k, 5) } else { ("U", k, 5) })
            .collect(),
    ];
    let mut files = Vec::new();
    for (i, rows) in files_rows.iter().enumerate() {
        let f = src.join(&format!("20240101-010000000{i}.parquet")).unwrap();
        let ts = format!("2024-01-01 01:00:0{i}");
        storage.put(&f, cdc_rows(&ts, rows)).await.unwrap();
        files.push(f);
    }
    // The source's states: after each prefix of the files.
    let mut states = vec![Vec::new()];
    let mut state = std::collections::BTreeMap::new();
    for rows in &files_rows {
        for (op, k, v) in rows {
            match *op {
                "D" => state.remove(k),
                _ => state.insert(*k, *v),
            };
        }
        states.push(state.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>());
    }
    // Killed at the third group, between its two commits.
    let crashing = Engine::new(config.clone());
    let (reached, mut crashed) = tokio::sync::mpsc::unbounded_channel::<()>();
    let crash = Hook::nth(3, move || {
        let reached = reached.clone();
        async move {
            let _ = reached.send(());
            std::future::pending::<()>().await;
        }
    });
    match after_the_merge {
        true => crashing.hooks().set(Point::BetweenCommits, "", crash),
        false => crashing.hooks().set(Point::BeforeMerge, "", crash),
    }
    let run = {
        let files = files.clone();
        tokio::spawn(async move { crashing.process(&files).await })
    };
    crashed.recv().await.expect("the third group was reached");
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    let at_crash = latest_version(&url).await;

    let r = Engine::new(config.clone()).process(&files).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    let last = latest_version(&url).await;
    assert_eq!(rows_at(&url, last).await, states[6], "the retry ends exact");
    for v in at_crash..=last {
        let rows = rows_at(&url, v).await;
        assert!(
            states.contains(&rows),
            "version {v} (crash at {at_crash}, last {last}) is no state of the source: {} rows, {:?}…",
            rows.len(),
            &rows[..rows.len().min(5)]
        );
    }
    // The unfinished group's deletes are in force: a late, older insert stays out.
    let late = src.join("20240101-0100000009.parquet").unwrap();
    storage
        .put(&late, cdc_rows("2024-01-01 01:00:04", &[("I", 350, 9)]))
        .await
        .unwrap();
    let r = Engine::new(config.clone()).process(&[late]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    assert_eq!(ids_of(&config).await, (1..=300).collect::<Vec<_>>());
}

/// #28: a merge that gives up on contention has applied nothing — also not through its
/// tombstones, recorded (pending) before its MERGE: another writer's older upsert of the
/// deleted key is held back, not turned into the delete. Before, the tombstone counted at
/// once: the other writer deleted the row, a state the source had only after the
/// unfinished file. The retry then applies the delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_that_gives_up_on_contention_applies_none_of_its_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let extra = "sequence_by = [\"ts\"]\nmax_commit_attempts = 1";
    let text = crate::config::test_table("t", "raw/t/", "curated/t", extra);
    let config = Config::from_toml(&text, "test", Some(dir.path())).unwrap();
    let src = config.tables[0].source.clone();
    let storage = Storage::new();
    let put = |name: &str, ts: &str, rows: &[(&str, i64, i64)]| {
        let (f, body) = (src.join(name).unwrap(), cdc_rows(ts, rows));
        let storage = &storage;
        async move {
            storage.put(&f, body).await.unwrap();
            f
        }
    };
    let base = put(
        "20240101-0000000000.parquet",
        "2024-01-01 00:00:00",
        &[("I", 1, 0), ("I", 2, 0)],
    )
    .await;
    let delete = put(
        "20240101-0000000005.parquet",
        "2024-01-01 00:00:05",
        &[("D", 1, 0), ("U", 2, 5)],
    )
    .await;
    let other = put(
        "20240101-0000000003.parquet",
        "2024-01-01 00:00:03",
        &[("U", 2, 3)],
    )
    .await;
    let late = put(
        "20240101-0000000002.parquet",
        "2024-01-01 00:00:02",
        &[("U", 1, 2)],
    )
    .await;
    let r = Engine::new(config.clone()).process(&[base]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);

    // The deleter's MERGE meets a concurrent commit in its key range, once: it gives up.
    let deleter = Engine::new(config.clone());
    let (cfg, f) = (config.clone(), other.clone());
    let (hook, fired) = Hook::once(move || {
        let (cfg, f) = (cfg.clone(), f.clone());
        async move {
            let r = Engine::new(cfg).process(&[f]).await;
            assert_eq!(r.failures().count(), 0, "{:?}", r.files);
        }
    });
    deleter.hooks().set(Point::BeforeMerge, "", hook);
    let r = deleter.process(std::slice::from_ref(&delete)).await;
    assert!(fired.load(Ordering::SeqCst));
    let failed = r.failures().next().expect("the deleter gave up");
    assert!(
        matches!(&failed.status, FileStatus::Failed { error, .. } if error.kind() == "contention"),
        "{failed:?}"
    );
    let url = config.tables[0].target.clone().unwrap();
    assert_eq!(
        latest_rows(&url).await,
        vec![(1, 0), (2, 3)],
        "nothing of the file applied"
    );

    // An older upsert of the deleted key, by another writer: held back, not a delete.
    let r = Engine::new(config.clone()).process(&[late]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    assert_eq!(
        latest_rows(&url).await,
        vec![(1, 0), (2, 3)],
        "the delete is not applied early"
    );

    // The retry applies the file.
    let r = Engine::new(config.clone()).process(&[delete]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    assert_eq!(latest_rows(&url).await, vec![(2, 5)]);
}

/// #23 item 5, the race: a merge reads a CDC file and screens it (no version of it applied
/// yet); before its MERGE commits (the hook `install` sets at `Point::BeforeMerge`), the
/// file is overwritten and another instance merges the new contents. The first merge's
/// commit conflicts (both record the file), and its retry must find the other version
/// applied and refuse its own: merged over it, the old rows would be skipped as already
/// applied and only part of the old contents would land. `url`: the table that holds the
/// rows (and the records).
async fn lose_the_race_to_another_version(
    config: &Config,
    url: &url::Url,
    install: impl FnOnce(&Engine, Hook),
) {
    let src = config.tables[0].source.clone();
    let storage = Storage::new();
    let first = src.join("20240101-0000000000.parquet").unwrap();
    storage
        .put(&first, cdc_rows("2024-01-01 00:00:00", &[("I", 9, 9)]))
        .await
        .unwrap();
    let r = Engine::new(config.clone()).process(&[first]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);

    let file = src.join("20240101-0100000000.parquet").unwrap();
    let old = cdc_rows("2024-01-01 01:00:00", &[("I", 1, 10), ("I", 2, 20)]);
    let new = cdc_rows("2024-01-01 01:00:00", &[("I", 1, 11), ("I", 3, 30)]);
    storage.put(&file, old).await.unwrap();
    let other = Engine::new(config.clone());
    let f = file.clone();
    let (hook, fired) = Hook::once(move || {
        let (o, f, new) = (other.clone(), f.clone(), new.clone());
        async move {
            Storage::new().put(&f, new).await.unwrap();
            let r = o.process(&[f]).await;
            assert_eq!(r.failures().count(), 0, "{:?}", r.files);
        }
    });
    let slow = Engine::new(config.clone());
    install(&slow, hook);
    let r = slow.process(std::slice::from_ref(&file)).await;
    assert!(fired.load(Ordering::SeqCst));
    let failed: Vec<_> = r.failures().collect();
    assert_eq!(failed.len(), 1, "{:?}", r.files);
    match &failed[0].status {
        FileStatus::Failed { error, .. } => assert_eq!(error.kind(), "reuploaded", "{error}"),
        s => panic!("{s:?}"),
    }
    assert_eq!(
        latest_rows(url).await,
        vec![(1, 11), (3, 30), (9, 9)],
        "the table holds the version that was applied, and nothing of the other"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_that_loses_the_race_to_another_version_of_its_file_applies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let text = crate::config::test_table("t", "raw/t/", "curated/t", "sequence_by = [\"ts\"]");
    let config = Config::from_toml(&text, "test", Some(dir.path())).unwrap();
    let target = config.tables[0].target.clone().unwrap();
    lose_the_race_to_another_version(&config, &target, |slow, hook| {
        slow.hooks().set(Point::BeforeMerge, "", hook)
    })
    .await;
}

/// The same race on a table that keeps only its history: the history table records the
/// files, and a history MERGE that loses to another version of its file must refuse its
/// own on the retry (before: merged over it, the old rows the new version lacked landed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_merge_that_loses_the_race_to_another_version_of_its_file_applies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let text = r#"
[[table]]
name = "t"
source = "raw/t/"
primary_key = ["id"]
sequence_by = ["ts"]
drop_columns = ["ts"]
[table.history]
target = "curated/t_history"
"#;
    let config = Config::from_toml(text, "test", Some(dir.path())).unwrap();
    let history = config.tables[0].history.as_ref().unwrap().target.clone();
    let key = history.to_string();
    lose_the_race_to_another_version(&config, &history, |_, hook| {
        crate::delta::testing::global().set(Point::BeforeMerge, &key, hook)
    })
    .await;
    crate::delta::testing::global().clear(history.as_str());
}

/// Two writers of a history-only table racing on one key (#43): the first writer read the
/// key's versions (none: a new key) and folded its change into an open version; before its
/// MERGE committed, the second writer committed an older change of the same key. delta-rs's
/// MERGE read predicate was the key range *and* the range of the versions' first order
/// keys, so the other writer's version (another order key) was no conflict: both committed,
/// and the key had two current versions (and the older one was never closed). The MERGE's
/// read now covers the keys only, so the first writer conflicts, reads again and closes the
/// older version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_racing_on_a_key_of_a_history_only_table_leave_one_current_version() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[[table]]\nname = \"t\"\nsource = \"raw/t/\"\nprimary_key = [\"id\"]\nsequence_by = [\"ts\"]\n\
                [table.history]\ntarget = \"curated/t_history\"\ncurrent_column = \"is_current\"\n";
    let config = Config::from_toml(text, "test", Some(dir.path())).unwrap();
    let src = config.tables[0].source.clone();
    let storage = Storage::new();
    let (older, newer) = (
        src.join("20240101-0000000001.parquet").unwrap(),
        src.join("20240101-0000000002.parquet").unwrap(),
    );
    storage
        .put(&older, cdc_rows("2024-01-01 00:00:01", &[("I", 1, 10)]))
        .await
        .unwrap();
    storage
        .put(&newer, cdc_rows("2024-01-01 00:00:02", &[("U", 1, 20)]))
        .await
        .unwrap();
    // The history table exists (another key), so both writers merge into it.
    let other = src.join("20240101-0000000000.parquet").unwrap();
    storage
        .put(&other, cdc_rows("2024-01-01 00:00:00", &[("I", 2, 0)]))
        .await
        .unwrap();
    let first = Engine::new(config.clone());
    assert_eq!(first.process(&[other]).await.failures().count(), 0);
    let history = config.tables[0].history.as_ref().unwrap().target.clone();
    let second = Engine::new(config.clone());
    let (hook, fired) = Hook::once(move || {
        let (second, older) = (second.clone(), older.clone());
        async move {
            let r = second.process(&[older]).await;
            assert_eq!(r.failures().count(), 0, "{:?}", r.files);
        }
    });
    crate::delta::testing::global().set(Point::BeforeMerge, history.as_str(), hook);
    let r = first.process(&[newer]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    assert!(fired.load(Ordering::SeqCst));
    let rows = history_rows(&history, Some(1)).await;
    assert_eq!(
        rows,
        vec![
            "1:10:false:2024-01-01T00:00:01Z:2024-01-01T00:00:02Z",
            "1:20:true:2024-01-01T00:00:02Z:open"
        ],
        "one current version; the older one closed by the newer"
    );
}

/// A history table's versions (of key `id` only, if given) as `id:v:is_current:start:end`
/// (`null` for a null v, `open` without an end), in key and start order.
async fn history_rows(table: &url::Url, id: Option<i64>) -> Vec<String> {
    let t = delta::open(table, &Default::default()).await.unwrap();
    let columns = ["id", "v", "is_current", "__START_AT", "__END_AT"];
    let b = table_batch(&t, &columns, &["id", "__START_AT"]).await;
    let text = |v: &Option<String>, none: &str| v.clone().unwrap_or_else(|| none.to_string());
    text_values(&b)
        .into_iter()
        .filter(|r| id.is_none_or(|id| r[0] == Some(id.to_string())))
        .map(|r| {
            let (v, end) = (text(&r[1], "null"), text(&r[4], "open"));
            let (id, current, start) = (text(&r[0], ""), text(&r[2], ""), text(&r[3], ""));
            format!("{id}:{v}:{current}:{start}:{end}")
        })
        .collect()
}

/// A CDC row of [`cdc_rows`]: op, id, v.
type ChangeRow = (&'static str, i64, i64);

fn history_race_cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(24)
        .min(24)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: history_race_cases(), max_shrink_iters: 10, ..Default::default() })]

    /// Writers of a history-only table racing (#43): four engines merge a random history of
    /// a few keys, every file announced once or twice in a random order, each writer's
    /// MERGE held back a random few milliseconds after its read (the window the race needs);
    /// the history equals the one a single writer builds from the files in order. Before
    /// the MERGE read by key alone, a writer whose read came before another's commit of the
    /// same key left two current versions.
    #[test]
    fn concurrent_writers_of_a_history_only_table_build_the_sequential_history(seed in proptest::prelude::any::<u64>()) {
        use rand::seq::SliceRandom;
        use rand::{Rng, SeedableRng};
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // Changes in order: per key, an insert first, then updates and deletes (an insert
        // again after a delete); one or two changes per file, times increasing.
        let mut live = [false; 3];
        let mut files: Vec<(String, Vec<ChangeRow>)> = Vec::new();
        for f in 0..8usize {
            let mut rows = Vec::new();
            for _ in 0..rng.random_range(1..=2) {
                let k = rng.random_range(0..3usize);
                if rows.iter().any(|r: &ChangeRow| r.1 == k as i64 + 1) {
                    continue; // one change per key and file: one sequence value per file
                }
                let op = match (live[k], rng.random_range(0..4)) {
                    (false, _) => "I",
                    (true, 0) => "D",
                    _ => "U",
                };
                live[k] = op != "D";
                rows.push((op, k as i64 + 1, rng.random_range(0..100)));
            }
            files.push((format!("2024-01-01 00:00:{f:02}"), rows));
        }
        let text = "[[table]]\nname = \"t\"\nsource = \"raw/t/\"\nprimary_key = [\"id\"]\nsequence_by = [\"ts\"]\n\
                    [table.history]\ntarget = \"curated/t_history\"\ncurrent_column = \"is_current\"\n";
        let (sequential, concurrent) = rt.block_on(async {
            let mut out = Vec::new();
            for racing in [false, true] {
                let dir = tempfile::tempdir().unwrap();
                let config = Config::from_toml(text, "test", Some(dir.path())).unwrap();
                let src = config.tables[0].source.clone();
                let storage = Storage::new();
                let mut urls = Vec::new();
                for (i, (ts, rows)) in files.iter().enumerate() {
                    let u = src.join(&format!("20240101-{i:010}.parquet")).unwrap();
                    storage.put(&u, cdc_rows(ts, rows)).await.unwrap();
                    urls.push(u);
                }
                let history = config.tables[0].history.as_ref().unwrap().target.clone();
                if !racing {
                    let e = Engine::new(config.clone());
                    for u in &urls {
                        let r = e.process(std::slice::from_ref(u)).await;
                        assert_eq!(r.failures().count(), 0, "{:?}", r.files);
                    }
                } else {
                    let mut d: Vec<url::Url> = urls.iter().flat_map(|u| {
                        let twice = rng.random_bool(0.3);
                        std::iter::repeat_n(u.clone(), if twice { 2 } else { 1 })
                    }).collect();
                    d.shuffle(&mut rng);
                    let delays: Arc<Vec<u64>> = Arc::new((0..256).map(|_| rng.random_range(0..25)).collect());
                    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
                    crate::delta::testing::global().set(Point::BeforeMerge, history.as_str(), Hook::each(move |_| {
                        let ms = delays[calls.fetch_add(1, Ordering::SeqCst) % delays.len()];
                        async move { tokio::time::sleep(std::time::Duration::from_millis(ms)).await }
                    }));
                    let tasks: Vec<_> = (0..4).map(|w| {
                        let e = Engine::new(config.clone());
                        let mine: Vec<url::Url> = d.iter().skip(w).step_by(4).cloned().collect();
                        tokio::spawn(async move {
                            let mut failed = Vec::new();
                            for u in mine {
                                let r = e.process(&[u]).await;
                                failed.extend(r.failures().map(|f| format!("{f:?}")));
                            }
                            failed
                        })
                    }).collect();
                    for t in tasks {
                        let failed = t.await.unwrap();
                        assert!(failed.is_empty(), "{failed:?}");
                    }
                }
                out.push(history_rows(&history, None).await);
            }
            (out[0].clone(), out[1].clone())
        });
        proptest::prop_assert_eq!(concurrent, sequential);
    }
}
