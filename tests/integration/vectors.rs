//! Merge-on-read (#46): with `deletion_vectors = true` a merge marks the rows it replaces
//! or deletes in the data file's deletion vector and writes only the new row versions.

use tributary_tests::*;

/// The items table with deletion vectors on (and the manifests off, as they must be).
fn vectors_table() -> String {
    format!("{ITEMS_TABLE}deletion_vectors = true\nmanifests = false\n")
}

fn ts(s: u32) -> String {
    format!("2024-01-01 00:00:{s:02}.000000")
}

/// The live files of the items table: path, deletion vector (storage type, cardinality).
async fn files(fx: &Fixture) -> Vec<(String, Option<(String, i64)>)> {
    let t = fx.table("curated/items").await;
    let mut v: Vec<_> = t
        .snapshot()
        .unwrap()
        .log_data()
        .iter()
        .map(|f| {
            (
                f.path().to_string(),
                f.deletion_vector_descriptor()
                    .map(|d| (d.storage_type.to_string(), d.cardinality)),
            )
        })
        .collect();
    v.sort();
    v
}

/// Updates and deletes leave the loaded file in place with a vector of the rows they
/// replaced; a second merge into the same file keeps the first vector's rows deleted; the
/// table equals the source throughout, read by tributary's scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_marks_replaced_rows_in_a_vector_and_writes_only_new_versions() {
    let fx = Fixture::new(&vectors_table());
    let load: Vec<Change> = (1..=20).map(|id| c('I', &ts(0), id, "a", id)).collect();
    let load_url = fx.put_items("LOAD00000001.parquet", &load);
    fx.merge_ok(&[load_url]).await;
    let loaded = files(&fx).await;
    assert_eq!(loaded.len(), 1, "{loaded:?}");
    assert!(loaded[0].1.is_none());
    let t = fx.table("curated/items").await;
    let protocol = t.snapshot().unwrap().protocol().clone();
    assert_eq!(
        (protocol.min_reader_version(), protocol.min_writer_version()),
        (3, 7)
    );

    let f1 = fx.put_items(
        "2024/01/01/20240101-0000000001.parquet",
        &[
            c('U', &ts(1), 2, "a", 200),
            c('D', &ts(1), 3, "a", 3),
            c('I', &ts(1), 21, "a", 21),
        ],
    );
    let r = fx.merge_ok(std::slice::from_ref(&f1)).await;
    assert_eq!(r.tables[0].files_vectored, 1, "{:?}", r.tables);
    assert_eq!(r.tables[0].files_removed, 0, "{:?}", r.tables);
    let after = files(&fx).await;
    let kept = after
        .iter()
        .find(|f| f.0 == loaded[0].0)
        .expect("the loaded file stays");
    assert_eq!(kept.1, Some(("i".to_string(), 2)), "{after:?}");
    let mut expected = load.clone();
    expected.extend([
        c('U', &ts(1), 2, "a", 200),
        c('D', &ts(1), 3, "a", 3),
        c('I', &ts(1), 21, "a", 21),
    ]);
    assert_eq!(fx.items_rows().await, model(&expected));

    // The same file again (its vector holds rows 1 and 2): three rows more.
    let f2 = fx.put_items(
        "2024/01/01/20240101-0000000002.parquet",
        &[
            c('U', &ts(2), 5, "a", 500),
            c('D', &ts(2), 6, "a", 6),
            c('U', &ts(2), 2, "a", 201),
            c('I', &ts(2), 3, "a", 33),
        ],
    );
    let r = fx.merge_ok(&[f2]).await;
    assert!(r.tables[0].files_vectored >= 1, "{:?}", r.tables);
    expected.extend([
        c('U', &ts(2), 5, "a", 500),
        c('D', &ts(2), 6, "a", 6),
        c('U', &ts(2), 2, "a", 201),
        c('I', &ts(2), 3, "a", 33),
    ]);
    assert_eq!(fx.items_rows().await, model(&expected));
    let after = files(&fx).await;
    let kept = after.iter().find(|f| f.0 == loaded[0].0).expect("kept");
    assert_eq!(kept.1, Some(("i".to_string(), 4)), "{after:?}");

    // A re-delivery changes nothing.
    let r = fx.merge_ok(&[f1]).await;
    assert_eq!(r.tables[0].files_vectored, 0, "{:?}", r.tables);
    assert_eq!(fx.items_rows().await, model(&expected));
}

/// A load of `n` rows into partition `a` (one data file), merged.
async fn loaded(fx: &Fixture, n: i64) -> Vec<Change> {
    let load: Vec<Change> = (1..=n).map(|id| c('I', &ts(0), id, "a", id)).collect();
    let url = fx.put_items("LOAD00000001.parquet", &load);
    fx.merge_ok(&[url]).await;
    load
}

/// A merge that would leave most of a file's rows deleted rewrites the file instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_most_of_whose_rows_change_is_rewritten() {
    let fx = Fixture::new(&vectors_table());
    let mut all = loaded(&fx, 10).await;
    let changes: Vec<Change> = (1..=6).map(|id| c('U', &ts(1), id, "a", id * 10)).collect();
    let u = fx.put_items("2024/01/01/20240101-0000000001.parquet", &changes);
    let r = fx.merge_ok(&[u]).await;
    assert_eq!(
        (r.tables[0].files_vectored, r.tables[0].files_removed),
        (0, 1),
        "{:?}",
        r.tables
    );
    assert!(files(&fx).await.iter().all(|f| f.1.is_none()));
    all.extend(changes);
    assert_eq!(fx.items_rows().await, model(&all));
}

/// A vector of more than 1 KB goes to a `deletion_vector_<uuid>.bin` (size, magic number,
/// bitmap, checksum) that the descriptor names by its Z85-encoded UUID; the rows it
/// deletes stay deleted, and updates moving rows to another partition leave their file's
/// vector too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_vector_goes_to_a_file_and_moved_rows_leave_their_partition() {
    let fx = Fixture::new(&vectors_table());
    let mut all = loaded(&fx, 3000).await;
    let mut changes: Vec<Change> = (1..=3000)
        .filter(|id| id % 4 == 1)
        .map(|id| c('D', &ts(1), id, "a", id))
        .collect();
    changes.push(c('U', &ts(1), 2, "b", 2000));
    let u = fx.put_items("2024/01/01/20240101-0000000001.parquet", &changes);
    let r = fx.merge_ok(&[u]).await;
    assert_eq!(r.tables[0].files_vectored, 1, "{:?}", r.tables);
    let f = files(&fx).await;
    let vectored: Vec<_> = f.iter().filter_map(|f| f.1.clone()).collect();
    assert_eq!(vectored, vec![("u".to_string(), 751)], "{f:?}");
    let on_disk: Vec<String> = std::fs::read_dir(fx.path("curated/items"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("deletion_vector_") && n.ends_with(".bin"))
        .collect();
    assert_eq!(on_disk.len(), 1, "{on_disk:?}");
    all.extend(changes);
    assert_eq!(fx.items_rows().await, model(&all));
}

/// Maintenance rewrites a file whose vector deletes more than 5 % of its rows without
/// them, keeps a large file whose vector deletes fewer, and `status` counts both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_materialises_vectors_past_five_percent() {
    // Files of 1,000 rows are "large" against this target; the merges' own small files
    // are compacted as usual.
    let fx = Fixture::new(&format!("{}target_file_size_mb = 0.001\n", vectors_table()));
    let mut all = loaded(&fx, 1000).await;
    let few: Vec<Change> = (1..=10).map(|id| c('D', &ts(1), id * 7, "a", 0)).collect();
    let u = fx.put_items("2024/01/01/20240101-0000000001.parquet", &few);
    fx.merge_ok(&[u]).await;
    all.extend(few);
    let st = tributary::status::table_status(
        &fx.engine.config().tables[0],
        fx.engine.storage_options(),
        fx.engine.storage(),
        None,
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    assert_eq!((st.files_with_vectors, st.rows_deleted_by_vectors), (1, 10));
    fx.maintain().await;
    assert_eq!(
        files(&fx).await.iter().filter(|f| f.1.is_some()).count(),
        1,
        "1 % deleted: the vector stays"
    );
    let more: Vec<Change> = (1..=60).map(|id| c('U', &ts(2), id * 11, "a", 1)).collect();
    let u = fx.put_items("2024/01/01/20240101-0000000002.parquet", &more);
    fx.merge_ok(&[u]).await;
    all.extend(more);
    fx.maintain().await;
    assert!(
        files(&fx).await.iter().all(|f| f.1.is_none()),
        "past 5 %: rewritten without its deleted rows"
    );
    assert_eq!(fx.items_rows().await, model(&all));
}

/// What kill -9 between writing a merge's files (its vector file among them) and its commit
/// leaves — the files, no commit — reads as the table before; the file merges again when
/// redelivered, and VACUUM removes the orphans once past the retention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_killed_before_its_commit_leaves_the_table_as_before() {
    let fx = Fixture::new(&format!(
        "{}vacuum_retention_hours = 0.0003\nmin_vacuum_retention_hours = 0.0001\n",
        vectors_table()
    ));
    let mut all = loaded(&fx, 3000).await;
    let before = fx.items_rows().await;
    let changes: Vec<Change> = (1..=3000)
        .filter(|id| id % 4 == 1)
        .map(|id| c('U', &ts(1), id, "a", -id))
        .collect();
    let u = fx.put_items("2024/01/01/20240101-0000000001.parquet", &changes);
    fx.merge_ok(std::slice::from_ref(&u)).await;
    // Take the commit back: the merge's data and vector files stay, as a kill leaves them.
    let log = fx.path("curated/items/_delta_log");
    let mut commits: Vec<_> = std::fs::read_dir(&log)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    commits.sort();
    let last = commits.pop().unwrap();
    assert!(std::fs::read_to_string(&last)
        .unwrap()
        .contains("deletionVector"));
    std::fs::remove_file(&last).unwrap();
    let vector_files = || -> Vec<String> {
        std::fs::read_dir(fx.path("curated/items"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with("deletion_vector_"))
            .collect()
    };
    let orphan = vector_files();
    assert_eq!(orphan.len(), 1);
    let fresh = fx.another_engine();
    assert_eq!(
        read_rows(&fx.url("curated/items")).await,
        before,
        "the table as before"
    );
    let r = fresh.process(&[u]).await;
    assert!(r.failures().next().is_none(), "{:?}", r.files);
    all.extend(changes);
    assert_eq!(fx.items_rows().await, model(&all));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    fx.maintain().await;
    assert!(
        !vector_files().contains(&orphan[0]),
        "the orphan vector file is vacuumed: {:?}",
        vector_files()
    );
    assert_eq!(fx.items_rows().await, model(&all));
}

/// A table another writer (Spark's DELETE) gave deletion vectors, with the feature but not
/// `delta.enableDeletionVectors`: the setting turns the property on, and a merge extends the
/// file's vector — the rows Spark deleted stay deleted, a key it deleted comes back only as
/// the change inserts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vector_another_writer_left_is_extended() {
    // Loaded with copy-on-write, then Spark's DELETE: a table as Spark would leave it.
    let fx = Fixture::items();
    let load: Vec<Change> = (1..=20).map(|id| c('I', &ts(0), id, "a", id)).collect();
    let url = fx.put_items("LOAD00000001.parquet", &load);
    fx.merge_ok(&[url]).await;
    crate::onepath::delete_with_a_vector(&fx, &[2, 5]);
    assert!(!tributary::delta::props(&fx.table("curated/items").await).deletion_vectors);
    std::fs::write(fx.path("tributary.toml"), vectors_table()).unwrap();
    let engine = fx.another_engine();
    let f = files(&fx).await;
    assert_eq!(
        f.iter().filter_map(|f| f.1.clone()).collect::<Vec<_>>(),
        vec![("p".to_string(), 2)]
    );
    let changes = vec![
        c('U', &ts(1), 1, "a", 10),
        c('D', &ts(1), 3, "a", 3),
        c('U', &ts(1), 4, "a", 40),
        c('I', &ts(1), 5, "a", 50),
    ];
    let u = fx.put_items("2024/01/01/20240101-0000000001.parquet", &changes);
    let r = engine.process(&[u]).await;
    assert!(r.failures().next().is_none(), "{:?}", r.files);
    assert_eq!(r.tables[0].files_vectored, 1, "{:?}", r.tables);
    assert!(tributary::delta::props(&fx.table("curated/items").await).deletion_vectors);
    let f = files(&fx).await;
    assert_eq!(
        f.iter().filter_map(|f| f.1.clone()).collect::<Vec<_>>(),
        vec![("i".to_string(), 5)],
        "Spark's two rows and the merge's three: {f:?}"
    );
    let mut expected: Vec<Change> = load
        .into_iter()
        .filter(|c| c.id != 2 && c.id != 5)
        .collect();
    expected.extend(changes);
    assert_eq!(fx.items_rows().await, model(&expected));
}

/// A key of two columns, one of them the partition column (read from the partition values,
/// not the file), and rows a vector already deletes: the key columns read first find the
/// changed rows, and only those are read whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composite_key_with_the_partition_column_finds_its_rows() {
    let fx = Fixture::new(
        &vectors_table().replace("primary_key = [\"id\"]", "primary_key = [\"part\", \"id\"]"),
    );
    let load: Vec<Change> = (1..=40)
        .map(|id| c('I', &ts(0), id % 20, ["a", "b"][(id / 20) as usize % 2], id))
        .collect();
    let url = fx.put_items("LOAD00000001.parquet", &load);
    fx.merge_ok(&[url]).await;
    let mut all = load.clone();
    for (n, round) in [
        vec![
            c('U', &ts(1), 3, "a", 300),
            c('D', &ts(1), 4, "b", 0),
            c('U', &ts(1), 3, "b", 301),
        ],
        vec![
            c('U', &ts(2), 3, "a", 302),
            c('D', &ts(2), 5, "a", 0),
            c('I', &ts(2), 4, "b", 400),
        ],
    ]
    .into_iter()
    .enumerate()
    {
        let u = fx.put_items(&format!("2024/01/01/20240101-000000000{n}.parquet"), &round);
        let r = fx.merge_ok(&[u]).await;
        assert!(r.tables[0].files_vectored >= 1, "{:?}", r.tables);
        all.extend(round);
    }
    let mut want: std::collections::BTreeMap<(String, i64), i64> = Default::default();
    for ch in &all {
        match ch.op {
            'D' => {
                want.remove(&(ch.part.clone(), ch.id));
            }
            _ => {
                want.insert((ch.part.clone(), ch.id), ch.val);
            }
        }
    }
    let mut got: Vec<((String, i64), i64)> = fx
        .items_rows()
        .await
        .into_iter()
        .map(|(id, part, val)| ((part, id), val))
        .collect();
    got.sort();
    assert_eq!(got, want.into_iter().collect::<Vec<_>>());
}

/// A column the changes do not carry keeps each updated row's value: merge-on-read reads
/// it from the file for the rows it replaces (and only the columns it needs), and writes
/// the new version with it; the columns left unread never reach a written row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_the_changes_lack_keeps_the_rows_value_in_the_new_version() {
    use std::sync::Arc;
    use tributary::deltalake::arrow::array::Int64Array;
    let fx = Fixture::new(&vectors_table());
    let n = 30i64;
    let ids: Vec<i64> = (1..=n).collect();
    let notes: Vec<String> = ids.iter().map(|i| format!("note {i}")).collect();
    let load = batch(vec![
        ("ts", strings(&vec![ts(0).as_str(); n as usize])),
        ("id", Arc::new(Int64Array::from(ids.clone()))),
        ("part", strings(&vec!["a"; n as usize])),
        ("val", Arc::new(Int64Array::from(ids.clone()))),
        (
            "note",
            strings(&notes.iter().map(String::as_str).collect::<Vec<_>>()),
        ),
    ]);
    let url = fx.put_batch("shop/items", "LOAD00000001.parquet", &load);
    fx.merge_ok(&[url]).await;
    // The changes without `note`: two updates, a delete, an insert.
    let changes = [
        c('U', &ts(1), 4, "a", 40),
        c('U', &ts(1), 9, "a", 90),
        c('D', &ts(1), 5, "a", 0),
        c('I', &ts(1), 31, "a", 31),
    ];
    let u = fx.put_items("2024/01/01/20240101-0000000001.parquet", &changes);
    let r = fx.merge_ok(&[u]).await;
    assert_eq!(r.tables[0].files_vectored, 1, "{:?}", r.tables);
    let rows = fx
        .rows("curated/items", &["id", "val", "note"], &["id"])
        .await;
    let get = |id: &str| rows.iter().find(|r| r[0] == id).cloned();
    assert_eq!(
        get("4"),
        Some(vec!["4".into(), "40".into(), "note 4".into()])
    );
    assert_eq!(
        get("9"),
        Some(vec!["9".into(), "90".into(), "note 9".into()])
    );
    assert_eq!(get("5"), None);
    assert_eq!(
        get("6"),
        Some(vec!["6".into(), "6".into(), "note 6".into()])
    );
    assert_eq!(get("31").map(|r| r[1].clone()), Some("31".to_string()));
    assert_eq!(rows.len(), 30);
}

/// Vectors turned off and the manifests on again (a table that Spectrum must read): the
/// next maintenance rewrites every file with a vector, whatever its share (manifests
/// cannot leave deleted rows out), and writes the manifests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_manifests_back_on_maintenance_materialises_every_vector() {
    let fx = Fixture::new(&format!("{}target_file_size_mb = 0.001\n", vectors_table()));
    let mut all = loaded(&fx, 1000).await;
    let few = vec![c('D', &ts(1), 7, "a", 0), c('U', &ts(1), 8, "a", 80)];
    let u = fx.put_items("2024/01/01/20240101-0000000001.parquet", &few);
    fx.merge_ok(&[u]).await;
    all.extend(few);
    fx.maintain().await;
    assert_eq!(
        files(&fx).await.iter().filter(|f| f.1.is_some()).count(),
        1,
        "0.2 %: kept under its vector"
    );
    std::fs::write(
        fx.path("tributary.toml"),
        format!("{ITEMS_TABLE}target_file_size_mb = 0.001\n"),
    )
    .unwrap();
    let engine = fx.another_engine();
    let r = tributary::maintenance::maintain(
        &engine.config().tables[0],
        engine.storage(),
        engine.storage_options(),
        Default::default(),
    )
    .await
    .expect("maintenance");
    assert!(files(&fx).await.iter().all(|f| f.1.is_none()), "{r:?}");
    assert_eq!(fx.items_rows().await, model(&all));
    assert!(fx
        .path("curated/items/_symlink_format_manifest/part=a/manifest")
        .exists());
}
