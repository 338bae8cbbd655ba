//! DMS table reloads: a reload rewrites `LOAD*` files with the source's current rows. The
//! merge path refuses them (before: every row was skipped as stale, exit 0, and rows changed
//! or deleted while replication was stopped were never corrected); `reload` applies the new
//! full load and the changes after it, deleting rows the reload does not have, in one commit.

use std::time::{Duration, SystemTime};

use tributary::reload;
use tributary::{delta, FileStatus};
use tributary_tests::*;

fn set_mtime(u: &url::Url, t: SystemTime) {
    let f = std::fs::File::options()
        .write(true)
        .open(u.to_file_path().unwrap())
        .unwrap();
    f.set_modified(t).unwrap();
}

/// A DMS CDC file name for a write time.
fn cdc_name(t: SystemTime) -> String {
    let t: chrono::DateTime<chrono::Utc> = t.into();
    format!("{}0000.parquet", t.format("%Y%m%d-%H%M%S"))
}

async fn version(fx: &Fixture) -> Option<u64> {
    delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap()
        .version()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_is_refused_by_the_merge_path_and_applied_whole_by_reload() {
    reload_scenario(ITEMS_TABLE).await;
}

/// #46: the same with deletion vectors: the rows a reload deletes are marked in vectors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_into_a_table_with_deletion_vectors_is_applied_whole() {
    reload_scenario(&format!(
        "{ITEMS_TABLE}deletion_vectors = true\nmanifests = false\n"
    ))
    .await;
}

async fn reload_scenario(config: &str) {
    let fx = Fixture::new(config);
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    // The first load and CDC.
    let load = fx.put_items(
        "LOAD00000001.parquet",
        &[
            c('I', "2024-01-01 00:00:00.000000", 1, "a", 1),
            c('I', "2024-01-01 00:00:00.000000", 2, "a", 2),
            c('I', "2024-01-01 00:00:00.000000", 3, "b", 3),
            c('I', "2024-01-01 00:00:00.000000", 4, "b", 4),
        ],
    );
    set_mtime(&load, hour_ago);
    let cdc1 = fx.put_items(
        "2024/01/01/20240101-0000000001.parquet",
        &[c('U', "2024-01-01 00:00:01.000000", 1, "a", 10)],
    );
    fx.merge_ok(std::slice::from_ref(&load)).await;
    fx.merge_ok(std::slice::from_ref(&cdc1)).await;
    // Replication stops; the source changes 2, deletes 3, inserts 5; DMS reloads the table:
    // the same file name, the source's current rows.
    let reload_start = SystemTime::now();
    let reloaded = fx.put_items(
        "LOAD00000001.parquet",
        &[
            c('I', "2099-01-01 00:00:00.000000", 1, "a", 10),
            c('I', "2099-01-01 00:00:00.000000", 2, "c", 20),
            c('I', "2099-01-01 00:00:00.000000", 4, "b", 4),
            c('I', "2099-01-01 00:00:00.000000", 5, "a", 5),
        ],
    );
    set_mtime(&reloaded, reload_start);
    let r = fx.engine.process(std::slice::from_ref(&reloaded)).await;
    let e = Fixture::failure(&r, &reloaded);
    assert_eq!(e.kind(), "reload", "{e}");
    assert!(e.to_string().contains("tributary reload"), "{e}");
    // A change after the reload started arrives before the reload is applied.
    let after = fx.put_items(
        &format!("2099/{}", cdc_name(reload_start + Duration::from_secs(60))),
        &[c('U', "2099-01-01 00:00:01.000000", 4, "b", 40)],
    );
    fx.merge_ok(std::slice::from_ref(&after)).await;
    assert_eq!(
        fx.items_rows().await.len(),
        4,
        "the old rows are still there"
    );

    let before = version(&fx).await.unwrap();
    let report = reload::reload(&fx.engine, "items").await.expect("reload");
    assert_eq!(
        (report.generation, report.load_files, report.cdc_files),
        (2, 1, 1)
    );
    let expected = vec![
        (1, "a".to_string(), 10),
        (2, "c".to_string(), 20),
        (4, "b".to_string(), 40),
        (5, "a".to_string(), 5),
    ];
    assert_eq!(fx.items_rows().await, expected);
    assert_eq!(
        version(&fx).await.unwrap(),
        before + 2,
        "one property commit, then one MERGE carrying the watermark: readers never see a half-applied reload"
    );

    // Everything delivered again, old and new: nothing changes, nothing fails.
    let late_insert_of_3 = fx.put_items(
        "2024/01/01/20240101-0000000002.parquet",
        &[c('U', "2024-01-01 00:00:02.000000", 3, "b", 33)],
    );
    let r = fx
        .merge_ok(&[load, cdc1, late_insert_of_3, reloaded, after])
        .await;
    assert!(r
        .files
        .iter()
        .all(|f| matches!(f.status, FileStatus::Merged { .. })));
    assert_eq!(fx.items_rows().await, expected, "row 3 stays deleted");
    // New changes apply on top of the reload.
    let next = fx.put_items(
        &format!("2099/{}", cdc_name(reload_start + Duration::from_secs(120))),
        &[c('D', "2099-01-01 00:00:02.000000", 5, "a", 5)],
    );
    fx.merge_ok(&[next]).await;
    assert_eq!(fx.items_rows().await, expected[..3].to_vec());
    // Running it again finds no new full load.
    let e = reload::reload(&fx.engine, "items").await.unwrap_err();
    assert!(e.to_string().contains("no new full load"), "{e}");
    assert_eq!(
        log_mentions(&fx, "curated/items", "\"deletionVector\":{"),
        config.contains("deletion_vectors = true"),
        "vectors written exactly when on"
    );
}

/// A full-load file whose rows changed nothing is still recorded, so a later reload of it
/// is detected (before: nothing was committed and the reload would have looked new).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_load_that_changes_nothing_is_still_recorded() {
    let fx = Fixture::items();
    let newer = fx.put_items(
        "2024/01/01/20240101-0000000001.parquet",
        &[c('U', "2024-01-01 00:00:01.000000", 1, "a", 10)],
    );
    fx.merge_ok(&[newer]).await;
    let load = fx.put_items(
        "LOAD00000001.parquet",
        &[c('I', "2024-01-01 00:00:00.000000", 1, "a", 1)],
    );
    set_mtime(&load, SystemTime::now() - Duration::from_secs(60));
    let r = fx.merge_ok(std::slice::from_ref(&load)).await;
    assert_eq!(r.tables[0].skipped_stale, 1);
    let rewritten = fx.put_items(
        "LOAD00000001.parquet",
        &[c('I', "2099-01-01 00:00:00.000000", 1, "a", 99)],
    );
    let r = fx.engine.process(std::slice::from_ref(&rewritten)).await;
    assert_eq!(Fixture::failure(&r, &rewritten).kind(), "reload");
}
