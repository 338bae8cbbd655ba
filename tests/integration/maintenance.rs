//! Maintenance: compaction, vacuum retention, tombstone expiry, manifests after merges and
//! maintenance (read back with a plain Parquet reader), and maintenance racing merges.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use tributary::deltalake::arrow::array::AsArray;
use tributary::deltalake::arrow::compute::cast;
use tributary::deltalake::arrow::datatypes::{DataType, Int64Type};
use tributary::maintenance::{self, MaintenanceOptions};
use tributary::{delta, manifest};
use tributary_tests::*;

fn ts(i: usize) -> String {
    format!("2024-01-01 00:00:00.{i:06}")
}

async fn maintain(fx: &Fixture, force: bool) -> tributary::Result<maintenance::MaintenanceReport> {
    let t = &fx.engine.config().tables[0];
    maintenance::maintain(
        t,
        fx.engine.storage(),
        fx.engine.storage_options(),
        MaintenanceOptions { force },
    )
    .await
}

/// Manifests on disk equal the live files of the latest version.
async fn assert_manifests_exact(fx: &Fixture) {
    let t = delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap();
    let got = manifest::read_manifests(fx.engine.storage(), &t)
        .await
        .unwrap();
    let want = manifest::expected_manifests(&t).unwrap();
    assert_eq!(
        got,
        want,
        "manifests differ from the live files of v{:?}",
        t.version()
    );
}

/// What an engine that only understands manifests (Athena, Spectrum) sees: every file
/// listed, read with a plain Parquet reader, partition value from the manifest folder.
async fn rows_via_manifests(fx: &Fixture) -> Vec<Row> {
    let t = delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap();
    let manifests = manifest::read_manifests(fx.engine.storage(), &t)
        .await
        .unwrap();
    let mut rows = Vec::new();
    for (partition, files) in manifests {
        let part = partition.strip_prefix("part=").unwrap().to_string();
        for f in files {
            let path = url::Url::parse(&f).unwrap().to_file_path().unwrap();
            let file = std::fs::File::open(&path).unwrap();
            let reader =
                parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                    .unwrap()
                    .build()
                    .unwrap();
            for b in reader {
                let b = b.unwrap();
                assert!(
                    b.column_by_name("part").is_none(),
                    "partition values live in folder names"
                );
                let id = cast(b.column_by_name("id").unwrap(), &DataType::Int64).unwrap();
                let val = cast(b.column_by_name("val").unwrap(), &DataType::Int64).unwrap();
                for i in 0..b.num_rows() {
                    rows.push((
                        id.as_primitive::<Int64Type>().value(i),
                        part.clone(),
                        val.as_primitive::<Int64Type>().value(i),
                    ));
                }
            }
        }
    }
    rows.sort();
    rows
}

/// The number of compaction commits in the table's history.
async fn optimize_commits(fx: &Fixture) -> usize {
    use futures::StreamExt;
    let t = delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap();
    let infos: Vec<_> = t.history(None).collect().await;
    infos
        .into_iter()
        .filter(|i| i.as_ref().unwrap().operation.as_deref() == Some("OPTIMIZE"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_reduces_files_keeps_rows_and_manifests_match() {
    let fx = Fixture::items();
    // 12 insert-only merges: each adds a small file to each of its partitions.
    let mut all = Vec::new();
    for i in 0..12 {
        let ch = vec![
            c('I', &ts(i * 2), i as i64 * 2, "a", i as i64),
            c('I', &ts(i * 2 + 1), i as i64 * 2 + 1, "b", i as i64),
        ];
        all.extend(ch.clone());
        let u = fx.put_items(&format!("20240101-{i:010}.parquet"), &ch);
        fx.merge_ok(&[u]).await;
        assert_manifests_exact(&fx).await;
    }
    let before = live_files(&fx.url("curated/items")).await;
    assert_eq!(before, 24);
    let r = maintain(&fx, false).await.unwrap();
    assert_eq!((r.files_before, r.files_after), (24, 2), "{r:?}");
    assert_eq!(r.partitions_compacted, 2);
    assert_eq!(
        optimize_commits(&fx).await,
        1,
        "both partitions are compacted in one commit (each commit costs a log replay)"
    );
    assert_eq!(
        r.files_vacuumed, 0,
        "default retention keeps the compacted-away files"
    );
    assert_eq!(fx.items_rows().await, model(&all));
    assert_manifests_exact(&fx).await;
    assert_eq!(rows_via_manifests(&fx).await, model(&all));
    // a second run has nothing to compact
    let r2 = maintain(&fx, false).await.unwrap();
    assert_eq!((r2.partitions_compacted, r2.files_after), (0, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_follow_merges_and_an_emptied_partition_loses_its_manifest() {
    let fx = Fixture::items();
    let f1 = fx.put_items(
        "20240101-1.parquet",
        &[c('I', &ts(1), 1, "a", 1), c('I', &ts(2), 2, "c", 2)],
    );
    fx.merge_ok(&[f1]).await;
    assert_manifests_exact(&fx).await;
    assert!(fx
        .path("curated/items/_symlink_format_manifest/part=c/manifest")
        .exists());
    // move the only row of partition c to b, then delete everything in a
    let f2 = fx.put_items("20240101-2.parquet", &[c('U', &ts(3), 2, "b", 3)]);
    fx.merge_ok(&[f2]).await;
    assert_manifests_exact(&fx).await;
    assert!(!fx
        .path("curated/items/_symlink_format_manifest/part=c/manifest")
        .exists());
    let f3 = fx.put_items("20240101-3.parquet", &[c('D', &ts(4), 1, "a", 1)]);
    fx.merge_ok(&[f3]).await;
    assert_manifests_exact(&fx).await;
    assert!(!fx
        .path("curated/items/_symlink_format_manifest/part=a/manifest")
        .exists());
    assert_eq!(rows_via_manifests(&fx).await, vec![(2, "b".into(), 3)]);
    // maintenance also removes a stale manifest it finds (e.g. left by a crash)
    let stale = fx.path("curated/items/_symlink_format_manifest/part=z/manifest");
    std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
    std::fs::write(&stale, "file:///nowhere.parquet\n").unwrap();
    let r = maintain(&fx, false).await.unwrap();
    assert_eq!(r.manifests_deleted, 1);
    assert!(!stale.exists());
    assert_manifests_exact(&fx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_can_be_switched_off() {
    let fx = Fixture::new(&ITEMS_TABLE.replace("drop_columns", "manifests = false\ndrop_columns"));
    let f1 = fx.put_items("20240101-1.parquet", &[c('I', &ts(1), 1, "a", 1)]);
    fx.merge_ok(&[f1]).await;
    assert!(!fx.path("curated/items/_symlink_format_manifest").exists());
}

/// An engine over the fixture's table that writes no manifests: what a merge killed right
/// after its commit leaves (the commit, no manifest).
fn crashing_engine(fx: &Fixture, extra: &str) -> tributary::Engine {
    let text = format!(
        "{}{extra}",
        ITEMS_TABLE.replace("drop_columns", "manifests = false\ndrop_columns")
    );
    let path = fx.path("crashing.toml");
    std::fs::write(&path, text).unwrap();
    tributary::Engine::new(tributary::Config::from_path(&path).unwrap())
}

/// The version the manifests record (`_tributary_manifests_version`) and the table's.
async fn recorded_and_table_version(fx: &Fixture) -> (Option<u64>, Option<u64>) {
    let t = delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap();
    let recorded = manifest::recorded_version(fx.engine.storage(), &t)
        .await
        .unwrap();
    (recorded, t.version())
}

/// Issue #28: a merge killed between its commit and its manifests left them wrong, and the
/// retry — which finds its changes applied and commits nothing — wrote none. The retry
/// must find the manifests behind the table (their version marker) and rewrite the
/// partitions the commit touched, and only those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_of_a_merge_killed_before_its_manifests_rewrites_them() {
    let fx = Fixture::items();
    let f1 = fx.put_items(
        "20240101-1.parquet",
        &[
            c('I', &ts(1), 1, "a", 1),
            c('I', &ts(2), 2, "b", 2),
            c('I', &ts(3), 3, "d", 3),
        ],
    );
    fx.merge_ok(&[f1]).await;
    assert_manifests_exact(&fx).await;
    let (recorded, version) = recorded_and_table_version(&fx).await;
    assert_eq!(recorded, version, "the marker records the version written");
    let untouched = fx.path("curated/items/_symlink_format_manifest/part=d/manifest");
    let untouched_at = std::fs::metadata(&untouched).unwrap().modified().unwrap();
    // Killed after the commit: b updated, c inserted, a deleted; no manifest written.
    let f2 = fx.put_items(
        "20240101-2.parquet",
        &[
            c('U', &ts(4), 2, "b", 20),
            c('I', &ts(5), 4, "c", 4),
            c('D', &ts(6), 1, "a", 1),
        ],
    );
    let r = crashing_engine(&fx, "")
        .process(std::slice::from_ref(&f2))
        .await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    let t = delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap();
    let stale = manifest::read_manifests(fx.engine.storage(), &t)
        .await
        .unwrap();
    assert_ne!(stale, manifest::expected_manifests(&t).unwrap(), "stale");
    assert!(t.version() > version);
    // The retry (a re-delivery of the same file) changes nothing and commits nothing...
    let r = fx.merge_ok(std::slice::from_ref(&f2)).await;
    let t0 = &r.tables[0];
    assert_eq!(t0.inserted + t0.updated + t0.deleted, 0, "{t0:?}");
    assert_eq!(t0.version, t.version(), "no commit: {t0:?}");
    // ...and leaves the manifests exact: the partitions of the commit, not the others.
    assert!(t0.manifests_caught_up, "{t0:?}");
    assert_manifests_exact(&fx).await;
    assert!(!fx
        .path("curated/items/_symlink_format_manifest/part=a/manifest")
        .exists());
    assert_eq!(t0.manifests_written, 2, "b and c: {t0:?}");
    assert_eq!(t0.manifests_deleted, 1, "a: {t0:?}");
    assert_eq!(
        std::fs::metadata(&untouched).unwrap().modified().unwrap(),
        untouched_at,
        "partition d was not rewritten"
    );
    let (recorded, version) = recorded_and_table_version(&fx).await;
    assert_eq!(recorded, version);
    // The marker is no manifest: neither listed nor deleted by maintenance.
    maintain(&fx, false).await.unwrap();
    assert_manifests_exact(&fx).await;
    assert!(fx
        .path("curated/items/_tributary_manifests_version")
        .exists());
    // Caught up, the next re-delivery writes nothing.
    let r = fx.merge_ok(&[f2]).await;
    let t0 = &r.tables[0];
    assert!(
        !t0.manifests_caught_up && t0.manifests_written == 0,
        "{t0:?}"
    );
}

/// The case: a large full-load file appended whole into a new table, killed right
/// after the append's commit (no `_symlink_format_manifest/` at all). Its retry goes slice
/// by slice and commits nothing; the manifests are regenerated (there is no marker yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_of_a_whole_file_append_killed_before_its_manifests_writes_them() {
    let fx = Fixture::new(&format!("{ITEMS_TABLE}slice_rows = 1024\n"));
    let parts = ["a", "b", "c", "d"];
    let rows: Vec<Change> = (1..=3000)
        .map(|i| c('I', &ts(0), i, parts[i as usize % 4], i))
        .collect();
    let load = fx.put_items("LOAD00000001.parquet", &rows);
    let crashed = crashing_engine(&fx, "slice_rows = 1024\n");
    let r = crashed.process(std::slice::from_ref(&load)).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    assert!(r.tables[0].appended(), "{:?}", r.tables[0]);
    assert!(!fx.path("curated/items/_symlink_format_manifest").exists());
    let r = fx.merge_ok(&[load]).await;
    for t in &r.tables {
        assert_eq!(t.inserted + t.updated + t.deleted, 0, "{t:?}");
    }
    assert!(
        r.tables.iter().any(|t| t.manifests_caught_up),
        "{:?}",
        r.tables
    );
    assert_manifests_exact(&fx).await;
    let mut seen = rows_via_manifests(&fx).await;
    seen.sort();
    assert_eq!(seen.len(), 3000, "every row through the manifests");
    let (recorded, version) = recorded_and_table_version(&fx).await;
    assert_eq!(recorded, version);
}

/// Every load of a table reads each commit since the last checkpoint (one GET each on S3):
/// tributary's tables are created with a checkpoint every 10 commits, not delta-rs's 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_write_a_checkpoint_every_ten_commits() {
    let fx = Fixture::items();
    for i in 0..11 {
        let u = fx.put_items(
            &format!("20240101-{i}.parquet"),
            &[c('I', &ts(i), i as i64, "a", 1)],
        );
        fx.merge_ok(&[u]).await;
    }
    let t = delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap();
    let config = t.snapshot().unwrap().metadata().configuration().clone();
    assert_eq!(
        config.get("delta.checkpointInterval").map(String::as_str),
        Some("10")
    );
    let checkpoints: Vec<String> = std::fs::read_dir(fx.path("curated/items/_delta_log"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".checkpoint.parquet"))
        .collect();
    // Every merge here is two commits (the MERGE, then its watermark's): checkpoints of
    // versions 9 and 19, written by the commits that reached them.
    let mut checkpoints = checkpoints;
    checkpoints.sort();
    assert_eq!(
        checkpoints,
        vec![
            "00000000000000000009.checkpoint.parquet".to_string(),
            "00000000000000000019.checkpoint.parquet".to_string()
        ],
        "commits wrote the checkpoints of versions 9 and 19"
    );
}

/// Log cleanup is maintenance's: a merge commit leaves expired log entries where they are.
/// delta-rs's post-commit cleanup lists the whole `_delta_log` at every commit (30 days of
/// commits by default); tributary switches it off and cleans once per maintenance run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merges_leave_log_cleanup_to_maintenance() {
    let fx = Fixture::items();
    let url = fx.url("curated/items");
    let commits = |fx: &Fixture| {
        std::fs::read_dir(fx.path("curated/items/_delta_log"))
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                let name = name.to_string_lossy();
                name.ends_with(".json") && !name.contains("checkpoint")
            })
            .count()
    };
    for i in 0..3 {
        let u = fx.put_items(
            &format!("20240101-{i}.parquet"),
            &[c('I', &ts(i), i as i64, "a", 1)],
        );
        fx.merge_ok(&[u]).await;
    }
    // Log entries expire after a second; a checkpoint makes the older ones removable.
    let t = delta::open(&url, &Default::default()).await.unwrap();
    let t = t
        .set_tbl_properties()
        .with_properties(
            [(
                "delta.logRetentionDuration".to_string(),
                "interval 1 second".to_string(),
            )]
            .into(),
        )
        .await
        .unwrap();
    tributary::deltalake::checkpoints::create_checkpoint(&t, None)
        .await
        .unwrap();
    let before = commits(&fx);
    let version_before = t.version().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let u = fx.put_items("20240101-9.parquet", &[c('I', &ts(9), 9, "a", 1)]);
    fx.merge_ok(&[u]).await;
    let version_after = delta::open(&url, &Default::default())
        .await
        .unwrap()
        .version()
        .unwrap();
    assert!(version_after > version_before);
    assert_eq!(
        commits(&fx),
        before + (version_after - version_before) as usize,
        "the merge's commits (its MERGE, its watermark's) removed no log entry"
    );
    let r = maintain(&fx, false).await.unwrap();
    assert!(r.log_files_removed > 0, "{r:?}");
    assert!(commits(&fx) < before, "maintenance cleaned the log");
    assert_eq!(fx.items_rows().await.len(), 4);
}

/// VACUUM deletes only what a Delta writer made (#44): delta-rs's full mode deleted every
/// object of the table's folder its log does not reference, so a `target` set over other
/// data lost it at the first maintenance. A data file of a write that never committed is
/// still removed; another tool's files, and Parquet files outside the partition layout, stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vacuum_leaves_files_no_delta_writer_made() {
    let short = ITEMS_TABLE.replace(
        "drop_columns",
        "vacuum_retention_hours = 0.0003\nmin_vacuum_retention_hours = 0.0001\ndrop_columns",
    );
    let fx = Fixture::new(&short);
    let u = fx.put_items("20240101-1.parquet", &[c('I', &ts(1), 1, "a", 1)]);
    fx.merge_ok(&[u]).await;
    let data = parquet_files(&fx.path("curated/items"))[0].clone();
    let foreign = [
        "notes.txt",
        "exports/part-00000-other.parquet",
        "dms/shop/x/LOAD00000001.parquet",
    ];
    for f in foreign {
        let p = fx.path(&format!("curated/items/{f}"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::copy(&data, &p).unwrap();
    }
    let orphan = fx.path("curated/items/part=a/part-00009-uncommitted.snappy.parquet");
    std::fs::copy(&data, &orphan).unwrap();
    // Past the retention (1.08 s).
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let r = maintain(&fx, false).await.unwrap();
    assert!(
        !exists(&orphan),
        "the uncommitted data file is vacuumed: {r:?}"
    );
    for f in foreign {
        assert!(
            exists(&fx.path(&format!("curated/items/{f}"))),
            "{f} is kept"
        );
    }
    assert_eq!(fx.items_rows().await, vec![(1, "a".into(), 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vacuum_respects_retention_and_refuses_short_ones() {
    let short = ITEMS_TABLE.replace(
        "drop_columns",
        "vacuum_retention_hours = 0.0003\nmin_vacuum_retention_hours = 0.0001\ntombstone_retention_days = 0.00001\ndrop_columns",
    );
    let fx = Fixture::new(&short);
    for i in 0..4 {
        let u = fx.put_items(
            &format!("20240101-{i}.parquet"),
            &[c('I', &ts(i), i as i64, "a", 1)],
        );
        fx.merge_ok(&[u]).await;
    }
    let d = fx.put_items("20240101-9.parquet", &[c('D', &ts(9), 0, "a", 1)]);
    fx.merge_ok(&[d]).await;
    let data_files = |fx: &Fixture| {
        std::fs::read_dir(fx.path("curated/items/part=a"))
            .unwrap()
            .count()
    };
    let first = maintain(&fx, false).await.unwrap();
    assert!(first.files_compacted >= 2, "{first:?}");
    let on_disk = data_files(&fx);
    assert!(
        on_disk > 1,
        "compacted-away files are still there within the retention"
    );
    // Past both retentions: vacuum 1.08 s; tombstones 0.864 s, whose expiry cutoff is rounded
    // down to whole seconds (a step of a seventh of the retention, at least 1 s), so up to
    // 1.864 s (1.5 s failed whenever the delete was recorded early in a second).
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let r = maintain(&fx, false).await.unwrap();
    assert!(
        r.files_vacuumed >= on_disk - 1,
        "{r:?} on disk before: {on_disk}"
    );
    assert_eq!(data_files(&fx), 1);
    // Expired by this run, or already by the first one when the merges before it took
    // longer than the retention (a loaded machine: CI's cold run).
    // Two rows for the delete: pending, then applied.
    assert_eq!(
        first.tombstones_expired + r.tombstones_expired,
        2,
        "{first:?} {r:?}"
    );
    assert_eq!(fx.items_rows().await.len(), 3);
    assert_manifests_exact(&fx).await;

    // A retention below the configured minimum is refused unless forced.
    let risky = Fixture::new(
        &ITEMS_TABLE.replace("drop_columns", "vacuum_retention_hours = 1\ndrop_columns"),
    );
    let u = risky.put_items("20240101-1.parquet", &[c('I', &ts(1), 1, "a", 1)]);
    risky.merge_ok(&[u]).await;
    let e = maintain(&risky, false).await.unwrap_err().to_string();
    assert!(e.contains("shorter than min_vacuum_retention_hours"), "{e}");
    assert!(maintain(&risky, true).await.is_ok());
}

/// The request a maintenance payload makes, as the maintenance function parses it (the
/// Lambda adapter: the library reads no event).
fn request_from_event(event: &serde_json::Value) -> maintenance::Request {
    tributary_lambda::maintenance::MaintenanceRequest::parse(event)
        .unwrap()
        .into()
}

#[test]
fn maintenance_requests_from_events() {
    use serde_json::json;
    let r = request_from_event(
        &json!({"detail-type":"Scheduled Event","source":"aws.events","detail":{}}),
    );
    assert_eq!(r, maintenance::Request::default());
    let r = request_from_event(&json!({"table":"items","force":true}));
    assert_eq!(r.tables, vec!["items".to_string()]);
    assert!(r.force);
    let r = request_from_event(&json!({"detail":{"tables":["a","b"]}}));
    assert_eq!(r.tables, vec!["a".to_string(), "b".to_string()]);
    let r = request_from_event(&json!({"reload":"items"}));
    assert_eq!(r.reload.as_deref(), Some("items"));
    assert!(request_from_event(&json!({"list": true})).list);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_request_names_every_table_and_maintains_none() {
    let fx = Fixture::new(&format!(
        "{ITEMS_TABLE}\n[[table]]\nname = \"other\"\nsource = \"raw/shop/other/\"\ntarget = \"curated/other\"\nprimary_key = [\"id\"]\n"
    ));
    let s = maintenance::handle(
        &fx.engine,
        &request_from_event(&serde_json::json!({"list": true})),
    )
    .await
    .unwrap();
    assert_eq!(
        s.tables,
        Some(vec!["items".to_string(), "other".to_string()])
    );
    assert!(s.maintained.is_empty() && s.failed.is_empty());
    let out = serde_json::to_value(&s).unwrap();
    assert_eq!(out["tables"], serde_json::json!(["items", "other"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_table_and_failing_table_are_reported() {
    let fx = Fixture::items();
    let e = maintenance::handle(
        &fx.engine,
        &maintenance::Request {
            tables: vec!["nope".into()],
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert!(
        e.to_string().contains("`nope`, which is not configured"),
        "{e}"
    );
    assert_eq!(e.kind(), "config");
    // a table that does not exist yet is skipped, not failed
    let s = maintenance::handle(&fx.engine, &Default::default())
        .await
        .unwrap();
    assert!(s.failed.is_empty());
    assert_eq!(s.outcome(), Ok(()));
    assert!(s.maintained[0].skipped.is_some());
    let failed = maintenance::Summary {
        failed: vec![("a".into(), "boom".into()), ("b".into(), "bang".into())],
        ..Default::default()
    };
    assert_eq!(
        failed.outcome().unwrap_err().to_string(),
        "maintenance failed for 2 table(s): a: boom; b: bang"
    );
}

/// Two maintenance runs at the same time over 20 one-file commits: both plan to compact the
/// same files; one commit wins and the other conflicts (before: both committed and every
/// row was there twice).
#[test]
fn concurrent_maintenance_runs_never_duplicate_rows() {
    let rt = runtime();
    for rep in 0..3 {
        let fx = Fixture::new(
            &ITEMS_TABLE.replace("drop_columns", "max_commit_attempts = 200\ndrop_columns"),
        );
        let changes: Vec<Change> = (0..20)
            .map(|i| c('I', &ts(i), i as i64, "a", i as i64))
            .collect();
        rt.block_on(async {
            for (i, ch) in changes.iter().enumerate() {
                let u = fx.put_items(
                    &format!("20240101-{i:010}.parquet"),
                    std::slice::from_ref(ch),
                );
                fx.merge_ok(&[u]).await;
            }
            let runs: Vec<_> = (0..2)
                .map(|_| {
                    let engine = fx.another_engine();
                    tokio::spawn(async move {
                        let t = &engine.config().tables[0];
                        maintenance::maintain(
                            t,
                            engine.storage(),
                            engine.storage_options(),
                            MaintenanceOptions::default(),
                        )
                        .await
                    })
                })
                .collect();
            let mut compacted = 0;
            for r in runs {
                let r = r.await.unwrap().expect("maintenance");
                compacted += r.partitions_compacted + r.partitions_skipped;
            }
            assert!(compacted >= 1, "rep {rep}");
        });
        assert_eq!(rt.block_on(fx.items_rows()), model(&changes), "rep {rep}");
    }
}

/// Merges (4 invocations at a time) and 2 maintenance loops (compacting aggressively) run
/// together, 20 times: no duplicate keys, no lost rows, and the manifests end exact.
#[test]
fn concurrent_merges_and_maintenance_converge() {
    for seed in 0..20 {
        concurrent_merges_and_maintenance(seed);
    }
}

fn concurrent_merges_and_maintenance(seed: u64) {
    let rt = runtime();
    let fx = Fixture::new(&ITEMS_TABLE.replace(
        "drop_columns",
        "max_commit_attempts = 200\ntarget_file_size_mb = 1\ndrop_columns",
    ));
    let (load, history_files) = history(seed, 12, 30, 3);
    let (mut files, expected) = land(&fx, &load, &history_files);
    let mut rng = StdRng::seed_from_u64(seed);
    files.shuffle(&mut rng);
    rt.block_on(async {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut merges = Vec::new();
        for w in 0..4 {
            let engine = fx.another_engine();
            let mine: Vec<_> = files.iter().skip(w).step_by(4).cloned().collect();
            merges.push(tokio::spawn(async move {
                let mut failures = Vec::new();
                for f in mine {
                    let r = engine.process(&[f]).await;
                    failures.extend(r.failures().map(|f| format!("{f:?}")));
                }
                failures
            }));
        }
        let mut maint = Vec::new();
        for _ in 0..2 {
            let (engine, stop) = (fx.another_engine(), done.clone());
            maint.push(tokio::spawn(async move {
                let (mut runs, mut compacted) = (0, 0);
                let mut errors = Vec::new();
                loop {
                    let t = &engine.config().tables[0];
                    match maintenance::maintain(
                        t,
                        engine.storage(),
                        engine.storage_options(),
                        MaintenanceOptions::default(),
                    )
                    .await
                    {
                        Ok(r) => compacted += r.partitions_compacted,
                        Err(e) => errors.push(e.to_string()),
                    }
                    runs += 1;
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                }
                (runs, compacted, errors)
            }));
        }
        let mut failures = Vec::new();
        for m in merges {
            failures.extend(m.await.unwrap());
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(failures.is_empty(), "merges failed: {failures:?}");
        for m in maint {
            let (runs, _compacted, errors) = m.await.unwrap();
            assert!(runs >= 1, "runs={runs}");
            assert!(errors.is_empty(), "maintenance failed: {errors:?}");
        }
    });
    let got = rt.block_on(fx.items_rows());
    if got != expected && std::env::var("KEEP_FAILED").is_ok() {
        let kept = fx.dir.path().to_path_buf();
        std::mem::forget(fx);
        panic!(
            "seed {seed}: kept {} got {got:?} want {expected:?}",
            kept.display()
        );
    }
    assert_eq!(got, expected, "seed {seed}");
    // a last maintenance run leaves exact manifests
    rt.block_on(async {
        maintain(&fx, false).await.unwrap();
        assert_manifests_exact(&fx).await;
        assert_eq!(rows_via_manifests(&fx).await, expected);
    });
}
