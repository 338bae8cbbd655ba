//! Files larger than a slice (`slice_rows`): merged alone in slices, with the same result
//! as whole, a bad row anywhere failing the file before any slice is applied, and errors and
//! order keys numbered as the file's rows.

use tributary::FileStatus;
use tributary_tests::*;

/// The items table with the smallest slice allowed.
fn sliced() -> Fixture {
    Fixture::new(&format!("{ITEMS_TABLE}slice_rows = 1024\n"))
}

fn ts(i: usize) -> String {
    format!(
        "2024-01-01 10:{:02}:{:02}.{:06}",
        i / 60_000 % 60,
        i / 1000 % 60,
        i % 1_000_000
    )
}

/// A full load of `n` rows and a CDC file whose changes hit the same keys across slice
/// boundaries (updates, deletes, re-inserts, several changes of one key).
fn scenario(n: i64) -> (Vec<Change>, Vec<Change>) {
    let load: Vec<Change> = (1..=n)
        .map(|id| {
            c(
                'I',
                "2024-01-01 09:00:00.000000",
                id,
                ["a", "b", "c"][id as usize % 3],
                id,
            )
        })
        .collect();
    let mut cdc = Vec::new();
    for i in 0..(n as usize) {
        let id = (i as i64 * 7919) % n + 1;
        let op = match i % 5 {
            0 => 'D',
            1 if id % 2 == 0 => 'I',
            _ => 'U',
        };
        cdc.push(c(op, &ts(i), id, ["a", "b", "d"][i % 3], i as i64));
    }
    (load, cdc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_larger_than_a_slice_merges_in_slices_with_the_same_result() {
    let (load, cdc) = scenario(5000);
    let fx = sliced();
    let files = [
        fx.put_items("LOAD00000001.parquet", &load),
        fx.put_items("20240101-1000000000.parquet", &cdc),
    ];
    let r = fx.merge_ok(&files).await;
    let want = model(&[load.clone(), cdc.clone()].concat());
    assert_eq!(fx.items_rows().await, want);
    for t in &r.tables {
        assert_eq!(t.files, 1, "a large file is merged alone");
        assert!(
            t.slices >= 4,
            "5000 rows in slices of 1024: {} commits",
            t.slices
        );
    }
    for f in &r.files {
        match &f.status {
            FileStatus::Merged { counts, .. } => assert_eq!(counts.rows, 5000),
            other => panic!("{other:?}"),
        }
    }
    // Re-delivered (after a crash between slices, or twice): nothing changes.
    let again = fx.merge_ok(&files).await;
    assert!(again
        .tables
        .iter()
        .all(|t| t.inserted + t.updated + t.deleted == 0));
    assert_eq!(fx.items_rows().await, want);
    // The same files merged whole give the same table.
    let whole = Fixture::items();
    let files = [
        whole.put_items("LOAD00000001.parquet", &load),
        whole.put_items("20240101-1000000000.parquet", &cdc),
    ];
    whole.merge_ok(&files).await;
    assert_eq!(whole.items_rows().await, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_row_in_a_late_slice_fails_the_file_before_any_slice_is_applied() {
    let (load, mut cdc) = scenario(4000);
    let fx = sliced();
    fx.merge_ok(&[fx.put_items("LOAD00000001.parquet", &load)])
        .await;
    let before = fx.items_rows().await;
    cdc[3499].op = 'X';
    let bad = fx.put_items("20240101-1000000000.parquet", &cdc);
    let r = fx.engine.process(std::slice::from_ref(&bad)).await;
    let msg = Fixture::failure(&r, &bad).to_string();
    assert!(
        msg.contains("row 3500") && msg.contains("unknown operation"),
        "{msg}"
    );
    assert!(r.tables.is_empty(), "nothing committed");
    assert_eq!(
        fx.items_rows().await,
        before,
        "no slice of the bad file applied"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_errors_and_order_keys_are_numbered_as_the_files_rows() {
    let fx = Fixture::new(&format!(
        "{ITEMS_TABLE}slice_rows = 1024\nformat = \"csv\"\n[table.csv]\nheader = false\ncolumns = [{{ name = \"ts\", type = \"string\" }}, {{ name = \"id\", type = \"bigint\" }}, {{ name = \"part\", type = \"string\" }}, {{ name = \"val\", type = \"bigint\" }}]\n"
    ));
    // Two changes of one key in the same transaction (same ts), 2000 rows apart: the later
    // row wins, as in a file read whole.
    let mut lines = String::new();
    for i in 0..3000 {
        let (id, val) = match i {
            100 => (1, 100),
            2100 => (1, 2100),
            _ => (10 + i, i),
        };
        lines.push_str(&format!("U,2024-01-01 10:00:00.000000,{id},a,{val}\n"));
    }
    let f = fx.put_raw("shop/items", "20240101-1000000000.csv", lines.as_bytes());
    fx.merge_ok(std::slice::from_ref(&f)).await;
    assert!(fx.items_rows().await.contains(&(1, "a".into(), 2100)));
    // A value that does not fit, in the third slice: named with its row in the file.
    let bad = lines.replacen(
        "U,2024-01-01 10:00:00.000000,2510,a,2500\n",
        "U,2024-01-01 10:00:00.000000,2510,a,x\n",
        1,
    );
    let f = fx.put_raw("shop/items", "20240101-1100000000.csv", bad.as_bytes());
    let r = fx.engine.process(std::slice::from_ref(&f)).await;
    let msg = Fixture::failure(&r, &f).to_string();
    assert!(msg.contains("row 2501") && msg.contains("`val`"), "{msg}");
}
