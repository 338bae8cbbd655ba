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
    let r = fx.merge_ok(&[f1.clone()]).await;
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
