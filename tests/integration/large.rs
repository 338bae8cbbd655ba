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
    }
    // The full load into a new table: appended whole, one commit; the CDC file (updates
    // and deletes): one commit per slice.
    let commits: Vec<(usize, bool)> = r.tables.iter().map(|t| (t.slices, t.appended())).collect();
    assert_eq!(commits[0], (1, true), "{commits:?}");
    assert!(
        commits[1].0 >= 4,
        "5000 rows in slices of 1024: {commits:?}"
    );
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

/// A value of another type that does not fit the table's column, in a late slice: the
/// error (kind `type_change`, found when admission converts the slice) names the file's row,
/// not the slice's (3500, not 3500 − 3 × 1024), and nothing of the file is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_change_in_a_late_slice_names_the_files_row() {
    use std::sync::Arc;
    use tributary::deltalake::arrow::array::{ArrayRef, Float64Array, Int64Array};
    let (load, cdc) = scenario(4000);
    let fx = sliced();
    fx.merge_ok(&[fx.put_items("LOAD00000001.parquet", &load)])
        .await;
    let before = fx.items_rows().await;
    let mut vals: Vec<f64> = cdc.iter().map(|c| c.val as f64).collect();
    vals[3499] = 0.5;
    let ops: Vec<String> = cdc.iter().map(|c| c.op.to_string()).collect();
    let tss: Vec<&str> = cdc.iter().map(|c| c.ts.as_str()).collect();
    let parts: Vec<&str> = cdc.iter().map(|c| c.part.as_str()).collect();
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(cdc.iter().map(|c| c.id)));
    let b = batch(vec![
        (
            "Op",
            strings(&ops.iter().map(String::as_str).collect::<Vec<_>>()),
        ),
        ("ts", strings(&tss)),
        ("id", ids),
        ("part", strings(&parts)),
        ("val", Arc::new(Float64Array::from(vals))),
    ]);
    let bad = fx.put_batch("shop/items", "20240101-1000000000.parquet", &b);
    let r = fx.engine.process(std::slice::from_ref(&bad)).await;
    let e = Fixture::failure(&r, &bad);
    assert_eq!(e.kind(), "type_change", "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("row 3500 does not fit") && msg.contains("0.5"),
        "{msg}"
    );
    assert!(r.tables.is_empty(), "nothing committed");
    assert_eq!(fx.items_rows().await, before);
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

// ---- appends: what MERGE would insert, written without reading or rewriting the table

fn load(ids: std::ops::RangeInclusive<i64>, val: i64) -> Vec<Change> {
    ids.map(|id| {
        c(
            'I',
            "2024-01-01 09:00:00.000000",
            id,
            ["a", "b"][id as usize % 2],
            val,
        )
    })
    .collect()
}

/// (rows, distinct keys) of the items table.
async fn counts(fx: &Fixture) -> (i64, i64) {
    let ids = fx.values("curated/items", &["id"], &[]).await;
    let distinct: std::collections::HashSet<_> = ids.iter().filter_map(|r| r[0].clone()).collect();
    (ids.len() as i64, distinct.len() as i64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_keys_are_appended_and_anything_else_is_merged() {
    let fx = Fixture::items();
    let l = fx.put_items("LOAD00000001.parquet", &load(1..=1000, 1));
    let r = fx.merge_ok(std::slice::from_ref(&l)).await;
    assert!(
        r.tables[0].appended(),
        "a full load into a new table is appended"
    );
    assert_eq!(r.tables[0].inserted, 1000);
    // Re-delivered: its keys are there now, so it is merged (and changes nothing).
    let r = fx.merge_ok(std::slice::from_ref(&l)).await;
    assert!(!r.tables[0].appended());
    assert_eq!(r.tables[0].inserted + r.tables[0].updated, 0);
    // CDC inserts of keys above every key: appended; with an update among them: merged.
    let new = fx.put_items(
        "20240101-1000000000.parquet",
        &[
            c('I', "2024-01-01 10:00:00.000000", 1001, "a", 2),
            c('I', "2024-01-01 10:00:00.000001", 1002, "b", 2),
        ],
    );
    assert!(fx.merge_ok(&[new]).await.tables[0].appended());
    let mixed = fx.put_items(
        "20240101-1100000000.parquet",
        &[
            c('I', "2024-01-01 11:00:00.000000", 1003, "a", 3),
            c('U', "2024-01-01 11:00:00.000001", 5, "b", 3),
        ],
    );
    assert!(!fx.merge_ok(&[mixed]).await.tables[0].appended());
    // A key deleted earlier (a tombstone) and inserted again by an older change: merged,
    // and the delete stands.
    let del = fx.put_items(
        "20240101-1200000000.parquet",
        &[c('D', "2024-01-01 12:00:00.000000", 2000, "a", 0)],
    );
    fx.merge_ok(&[del]).await;
    let late = fx.put_items(
        "20240101-1150000000.parquet",
        &[c('I', "2024-01-01 11:50:00.000000", 2000, "a", 9)],
    );
    let r = fx.merge_ok(&[late]).await;
    assert!(!r.tables[0].appended());
    assert!(!fx.items_rows().await.iter().any(|r| r.0 == 2000));
    assert_eq!(counts(&fx).await, (1003, 1003));
}

/// Every file merged by an engine of its own, all at once; none may fail.
async fn race(fx: &Fixture, files: &[url::Url], round: usize) -> Vec<tributary::ProcessReport> {
    let runs = files.iter().map(|f| {
        let (e, f) = (fx.another_engine(), f.clone());
        async move { e.process(std::slice::from_ref(&f)).await }
    });
    let reports = futures::future::join_all(runs).await;
    for r in &reports {
        assert!(
            r.failures().next().is_none(),
            "round {round}: {:?}",
            r.files
        );
    }
    reports
}

/// After a race of LOAD00000001 and an overlapping LOAD00000002 (with disjoint LOAD files
/// and the CDC update of key 10): `rows` rows, no key twice; the CDC change wins, and
/// LOAD00000002 ranks above LOAD00000001 (same full load: file order) — `keys` are one key
/// of each overlapping file's range: (in both, only in the first).
async fn check_winners(fx: &Fixture, round: usize, rows: i64, keys: (i64, i64)) {
    assert_eq!(
        counts(fx).await,
        (rows, rows),
        "round {round}: no key twice"
    );
    let got = fx.items_rows().await;
    assert!(
        got.contains(&(10, "b".into(), 7)),
        "round {round}: the CDC change wins"
    );
    let (both, first) = keys;
    assert!(
        got.contains(&(both, "a".into(), 2)),
        "round {round}: LOAD2 over LOAD1"
    );
    assert!(got.contains(&(first, "a".into(), 1)), "round {round}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_never_duplicate_a_key() {
    for round in 0..8 {
        let fx = Fixture::items();
        // Overlapping key ranges (never from one DMS full load, but a copy or a hand-made
        // file can): whichever commits second must see the first and merge.
        let a = fx.put_items("LOAD00000001.parquet", &load(1..=600, 1));
        let b = fx.put_items("LOAD00000002.parquet", &load(400..=1000, 2));
        // Disjoint ranges (the parallel full load): both appended, no conflict needed.
        let d1 = fx.put_items("LOAD00000003.parquet", &load(2001..=2500, 3));
        let d2 = fx.put_items("LOAD00000004.parquet", &load(3001..=3500, 4));
        // A CDC change of a key of the first file, racing its append.
        let cdc = fx.put_items(
            "20240101-1000000000.parquet",
            &[c('U', "2024-01-01 10:00:00.000000", 10, "b", 7)],
        );
        race(&fx, &[a, b, d1, d2, cdc], round).await;
        check_winners(&fx, round, 2000, (500, 300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wide_rows_make_shorter_slices() {
    // 5000 rows are fewer than `slice_rows`, but more decoded bytes than `slice_mb`.
    let fx = Fixture::new(&format!(
        "{ITEMS_TABLE}slice_rows = 100000\nslice_mb = 0.02\n"
    ));
    let (load, cdc) = scenario(5000);
    let files = [
        fx.put_items("LOAD00000001.parquet", &load),
        fx.put_items("20240101-1000000000.parquet", &cdc),
    ];
    let r = fx.merge_ok(&files).await;
    let slices: Vec<usize> = r.tables.iter().map(|t| t.slices).collect();
    assert!(
        slices[0] == 1 && slices[1] >= 4,
        "load whole, CDC in slices: {slices:?}"
    );
    assert_eq!(fx.items_rows().await, model(&[load, cdc].concat()));
}

/// The files of an abandoned whole-file append are deleted also in partitions whose folder
/// names are percent-encoded (a space, a colon): they were deleted by a key encoded twice,
/// which named no object, and stayed behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_whole_append_leaves_no_file_in_encoded_partitions() {
    let fx = sliced();
    let rows: Vec<Change> = (1..=5000)
        .map(|id| {
            let part = ["new york", "10:30"][id as usize % 2];
            c('I', "2024-01-01 09:00:00.000000", id, part, 1)
        })
        .collect();
    let bad = null_key_at(&rows, 4800);
    let bad_file = fx.put_batch("shop/items", "LOAD00000001.parquet", &bad);
    let r = fx.engine.process(std::slice::from_ref(&bad_file)).await;
    assert!(Fixture::failure(&r, &bad_file)
        .to_string()
        .contains("row 4800"));
    assert_eq!(
        parquet_files(&fx.path("curated/items")),
        Vec::<std::path::PathBuf>::new(),
        "the slices written before the bad row are deleted"
    );
}

/// The rows of a full-load file of ids 1..=n with the key of row `at` null (a bad row).
fn null_key_at(rows: &[Change], at: i64) -> tributary::deltalake::arrow::array::RecordBatch {
    let good = items_batch(rows, false);
    let ids: Vec<Option<i64>> = (1..=rows.len() as i64)
        .map(|i| (i != at).then_some(i))
        .collect();
    let mut cols = good.columns().to_vec();
    cols[1] = std::sync::Arc::new(tributary::deltalake::arrow::array::Int64Array::from(ids));
    tributary::deltalake::arrow::array::RecordBatch::try_new(good.schema(), cols).unwrap()
}

/// Data files under a table folder, live or not.
fn data_files(dir: &std::path::Path) -> usize {
    parquet_files(dir).len()
}

/// A full-load file larger than a slice into a new table: read once and appended in one
/// commit (readers never see part of it), recorded for reload detection; a bad row in its
/// last slice fails it with nothing committed and no data file left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_full_load_is_appended_whole_in_one_commit() {
    let fx = sliced();
    let rows = load(1..=5000, 1);
    // A bad row (null key) in the last slice: nothing of the file is committed.
    let bad = null_key_at(&rows, 4800);
    let bad_file = fx.put_batch("shop/items", "LOAD00000001.parquet", &bad);
    let r = fx.engine.process(std::slice::from_ref(&bad_file)).await;
    let e = Fixture::failure(&r, &bad_file).to_string();
    assert!(e.contains("row 4800"), "{e}");
    assert_eq!(
        data_files(&fx.path("curated/items")),
        0,
        "the slices written before the bad row are deleted"
    );
    // The good file: one commit.
    let good = fx.put_items("LOAD00000001.parquet", &rows);
    let before = tributary::delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap()
        .version();
    let r = fx.merge_ok(std::slice::from_ref(&good)).await;
    let t = &r.tables[0];
    assert_eq!(
        (t.slices, t.appended(), t.inserted),
        (1, true, 5000),
        "{t:?}"
    );
    // The same without `sequence_by` (no sequence kinds to record).
    let plain = Fixture::new(&format!(
        "{}slice_rows = 1024\n",
        ITEMS_TABLE
            .replace("sequence_by = [\"ts\"]\n", "")
            .replace("drop_columns = [\"ts\"]\n", "")
    ));
    let r = plain
        .merge_ok(&[plain.put_items("LOAD00000001.parquet", &rows)])
        .await;
    let p = &r.tables[0];
    assert_eq!(
        (p.slices, p.appended(), p.inserted),
        (1, true, 5000),
        "{p:?}"
    );
    assert_eq!(
        t.version,
        before.map(|v| v + 1),
        "one commit after the table existed"
    );
    assert_eq!(counts(&fx).await, (5000, 5000));
    // Recorded: the same file again changes nothing; rewritten by a DMS reload, refused.
    let r = fx.merge_ok(std::slice::from_ref(&good)).await;
    assert_eq!(r.tables[0].inserted + r.tables[0].updated, 0);
    let rewritten = fx.put_items("LOAD00000001.parquet", &load(1..=5000, 2));
    let r = fx.engine.process(std::slice::from_ref(&rewritten)).await;
    assert_eq!(Fixture::failure(&r, &rewritten).kind(), "reload");
}

/// Keys out of order across slices (a heap table's full load): the slices' key ranges
/// overlap, so the file is merged slice by slice — no key twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_load_with_keys_out_of_order_is_merged_slice_by_slice() {
    let fx = sliced();
    let mut rows = load(1..=4000, 1);
    rows.reverse();
    rows.swap(0, 3999);
    let f = fx.put_items("LOAD00000001.parquet", &rows);
    let r = fx.merge_ok(std::slice::from_ref(&f)).await;
    assert!(r.tables[0].slices >= 4, "{:?}", r.tables[0]);
    assert_eq!(counts(&fx).await, (4000, 4000));
    assert_eq!(
        data_files(&fx.path("curated/items")),
        live_files(&fx.url("curated/items")).await,
        "the files of the abandoned whole append are deleted"
    );
}

/// Large full-load files appended whole by concurrent invocations (racing to create the
/// table too): two with overlapping key ranges (the second to commit falls back to slices),
/// two disjoint ones (both appended whole), and a CDC change racing them. No key twice, the newer full-load file and the
/// CDC change win, in every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_whole_file_appends_never_duplicate_a_key() {
    for round in 0..4 {
        let fx = sliced();
        let files = [
            fx.put_items("LOAD00000001.parquet", &load(1..=3000, 1)),
            fx.put_items("LOAD00000002.parquet", &load(2000..=5000, 2)),
            fx.put_items("LOAD00000003.parquet", &load(10_001..=12_000, 3)),
            fx.put_items("LOAD00000004.parquet", &load(20_001..=22_000, 4)),
            fx.put_items(
                "20240101-1000000000.parquet",
                &[c('U', "2024-01-01 10:00:00.000000", 10, "b", 7)],
            ),
        ];
        let reports = race(&fx, &files, round).await;
        check_winners(&fx, round, 9000, (2500, 1500)).await;
        // The disjoint files are appended whole (a commit that loses to another file's append
        // or to the table's creation is re-checked and committed again); an overlapping one
        // that finds rows in its range takes slices.
        let shapes: Vec<(usize, bool, u32)> = reports
            .iter()
            .flat_map(|r| &r.tables)
            .map(|t| (t.slices, t.appended(), t.commit_attempts))
            .collect();
        assert!(
            shapes[2].0 == 1 && shapes[2].1 && shapes[3].0 == 1 && shapes[3].1,
            "round {round}: {shapes:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_files_merge_in_commits_of_at_most_a_slice() {
    // Ten CDC files of 400 changes, each smaller than a slice (1024 rows), announced
    // together (a FIFO batch can announce a thousand): merged in groups whose rows fit a
    // slice — two files per commit — not all at once, with the same result.
    let (load, _) = scenario(3000);
    let fx = sliced();
    let loaded = fx.put_items("LOAD00000001.parquet", &load);
    fx.merge_ok(&[loaded]).await;
    let mut all = load.clone();
    let mut files = Vec::new();
    for f in 0..10 {
        let changes: Vec<Change> = (0..400)
            .map(|j| {
                let i = f * 400 + j;
                let id = (i as i64 * 7919) % 3000 + 1;
                let op = if i % 4 == 0 { 'D' } else { 'U' };
                c(op, &ts(i), id, ["a", "b", "d"][i % 3], i as i64)
            })
            .collect();
        all.extend(changes.clone());
        files.push(fx.put_items(&format!("20240101-10000000{f:02}.parquet"), &changes));
    }
    let r = fx.merge_ok(&files).await;
    assert_eq!(fx.items_rows().await, model(&all));
    let per_commit: Vec<usize> = r.tables.iter().map(|t| t.files).collect();
    assert_eq!(per_commit, vec![2; 5], "commits of at most 1024 rows");
    let again = fx.merge_ok(&files).await;
    assert!(again
        .files
        .iter()
        .all(|f| matches!(f.status, FileStatus::Merged { .. })));
    assert_eq!(fx.items_rows().await, model(&all));
}

/// A digest of a table state that does not depend on row order: the wrapping sum of each
/// row's hash.
fn digest<'a>(rows: impl IntoIterator<Item = &'a Row>) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let h = BuildHasherDefault::<DefaultHasher>::default();
    rows.into_iter()
        .fold(0u64, |acc, r| acc.wrapping_add(h.hash_one(r)))
}

/// The digest of every state the source had: after each prefix of `changes` (in true order),
/// the empty table included.
fn source_states(changes: &[Change]) -> std::collections::HashSet<u64> {
    use std::collections::BTreeMap;
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let h = BuildHasherDefault::<DefaultHasher>::default();
    let row_hash = |id: i64, v: &(String, i64)| h.hash_one(&(id, v.0.clone(), v.1));
    let mut table: BTreeMap<i64, (String, i64)> = BTreeMap::new();
    let mut sum = 0u64;
    let mut states = std::collections::HashSet::from([0u64]);
    for c in changes {
        if let Some(old) = table.remove(&c.id) {
            sum = sum.wrapping_sub(row_hash(c.id, &old));
        }
        if c.op != 'D' {
            let new = (c.part.clone(), c.val);
            sum = sum.wrapping_add(row_hash(c.id, &new));
            table.insert(c.id, new);
        }
        states.insert(sum);
    }
    states
}

/// Every version of the table from `from` on, as (version, rows).
async fn every_version(table: &url::Url, from: u64) -> Vec<(u64, Vec<Row>)> {
    let latest = tributary::delta::open(table, &Default::default())
        .await
        .expect("open")
        .version()
        .expect("a version");
    let mut out = Vec::new();
    for v in from..=latest {
        let t = tributary::deltalake::open_table_with_version(table.clone(), v)
            .await
            .expect("open version");
        let rows = table_batch(&t, &["id", "part", "val"], &[]).await;
        out.push((v, rows_of(&[rows])));
    }
    out
}

/// Every version written since `from` is a state the source had, and the last is the
/// source's final state.
async fn assert_every_version_a_source_state(fx: &Fixture, from: u64, changes: &[Change]) {
    let states = source_states(changes);
    let versions = every_version(&fx.url("curated/items"), from).await;
    for (v, rows) in &versions {
        assert!(
            states.contains(&digest(rows)),
            "version {v} ({} rows) is not a state the source had",
            rows.len()
        );
    }
    let mut last = versions.last().expect("a version").1.clone();
    last.sort();
    assert_eq!(last, model(changes), "the last version is the final state");
}

/// A full load larger than a slice and the first CDC files merged in one call (#48), files
/// given in any order: the load goes first, then the CDC files, so every version written is
/// a prefix of the load or the load and the first k CDC files — never CDC values on rows the
/// load had not brought yet. Then a large CDC file between two small ones: merged slice by
/// slice at its place. The same through the Lambda adapter's batch (one SQS event announcing
/// the files in another order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_load_and_its_cdc_files_merged_together_write_only_source_states() {
    let n = 20_000i64;
    let load: Vec<Change> = (1..=n)
        .map(|id| {
            c(
                'I',
                "2024-01-01 09:00:00.000000",
                id,
                ["a", "b"][id as usize % 2],
                id,
            )
        })
        .collect();
    let at = |h: u32, i: usize| {
        format!(
            "2024-01-01 {h:02}:{:02}:{:02}.{:06}",
            i / 60 % 60,
            i % 60,
            i
        )
    };
    // 300 updates; 100 deletes and 50 updates; 200 inserts.
    let cdc1: Vec<Change> = (0..300)
        .map(|i| c('U', &at(10, i), (i as i64 * 61) % n + 1, "c", -(i as i64)))
        .collect();
    let cdc2: Vec<Change> = (0..150)
        .map(|i| {
            let id = (i as i64 * 127) % n + 1;
            match i < 100 {
                true => c('D', &at(11, i), id, "a", 0),
                false => c('U', &at(11, i), id, "d", 7 * i as i64),
            }
        })
        .collect();
    let cdc3: Vec<Change> = (0..200)
        .map(|i| c('I', &at(12, i), n + 1 + i as i64, "e", i as i64))
        .collect();
    let changes = [load.clone(), cdc1.clone(), cdc2.clone(), cdc3.clone()].concat();
    for lambda in [false, true] {
        let fx = Fixture::new(&format!(
            "{}slice_rows = 1024\n",
            ITEMS_TABLE.replace("raw/shop/items/", "s3root/tributary-raw/dms/shop/items/")
        ));
        let put = |name: &str, ch: &[Change]| {
            let p = fx.path(&format!("s3root/tributary-raw/dms/shop/items/{name}"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, items_parquet(ch, !name.starts_with("LOAD"))).unwrap();
            url::Url::from_file_path(&p).unwrap()
        };
        // Announced newest first.
        let files = [
            put("20240101-1200000000.parquet", &cdc3),
            put("20240101-1100000000.parquet", &cdc2),
            put("20240101-1000000000.parquet", &cdc1),
            put("LOAD00000001.parquet", &load),
        ];
        merge_announced(&fx, &files, lambda).await;
        assert_every_version_a_source_state(&fx, 0, &changes).await;

        // A CDC file larger than a slice (3,000 changes) between two small ones.
        let big: Vec<Change> = (0..3000)
            .map(|i| {
                let id = (i as i64 * 7919) % (n + 200) + 1;
                let op = match i % 4 {
                    0 => 'D',
                    1 => 'I',
                    _ => 'U',
                };
                c(op, &at(14, i), id, ["f", "g"][i % 2], 1000 + i as i64)
            })
            .collect();
        let before = [
            c('U', &at(13, 0), 5, "h", 55),
            c('I', &at(13, 1), n + 5000, "h", 1),
        ];
        let after = [
            c('D', &at(15, 0), 5, "h", 0),
            c('U', &at(15, 1), 6, "h", 66),
        ];
        let from = tributary::delta::open(&fx.url("curated/items"), &Default::default())
            .await
            .unwrap()
            .version()
            .unwrap();
        let files = [
            put("20240101-1500000000.parquet", &after),
            put("20240101-1400000000.parquet", &big),
            put("20240101-1300000000.parquet", &before),
        ];
        merge_announced(&fx, &files, lambda).await;
        let later = [
            changes.clone(),
            before.to_vec(),
            big.clone(),
            after.to_vec(),
        ]
        .concat();
        // States from the first call's end on.
        let states = source_states(&later);
        for (v, rows) in every_version(&fx.url("curated/items"), from).await {
            assert!(
                states.contains(&digest(&rows)),
                "{}: version {v} ({} rows) is not a state the source had",
                if lambda { "lambda" } else { "engine" },
                rows.len()
            );
        }
        assert_eq!(fx.items_rows().await, model(&later));
    }
}

/// Merge files as one call: the engine's (what `tributary merge` gives it), or one SQS
/// event of the Lambda adapter announcing each file in its own message.
async fn merge_announced(fx: &Fixture, files: &[url::Url], lambda: bool) {
    if !lambda {
        fx.merge_ok(files).await;
        return;
    }
    let engine = fx.another_engine().with_local_s3_root(fx.path("s3root"));
    let records: Vec<serde_json::Value> = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let key = f
                .path()
                .split("/tributary-raw/")
                .nth(1)
                .unwrap()
                .to_string();
            let body = serde_json::json!({"Records":[{"eventSource":"aws:s3",
                "eventTime":"2024-01-01T00:00:00Z","eventName":"ObjectCreated:Put",
                "s3":{"bucket":{"name":"tributary-raw"},"object":{"key":key}}}]});
            serde_json::json!({"messageId": format!("m{i}"), "eventSource":"aws:sqs",
                "body": body.to_string()})
        })
        .collect();
    let event = serde_json::json!({ "Records": records });
    let handled = tributary_lambda::handler::handle(&engine, &event)
        .await
        .unwrap();
    assert!(
        handled.failed_messages.is_empty(),
        "{:?}",
        handled.failed_messages
    );
}

/// A CDC file larger than a slice, appended whole, carries the watermark it moves in its
/// one commit (#43 item 8; before, a second commit of the watermark alone followed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdc_file_appended_whole_commits_its_watermark_with_it() {
    let fx = sliced();
    fx.merge_ok(&[fx.put_items("LOAD00000001.parquet", &load(1..=100, 1))])
        .await;
    let inserts: Vec<Change> = (1000..4000).map(|id| c('I', &ts(0), id, "a", id)).collect();
    let file = fx.put_items("20240101-1000000000.parquet", &inserts);
    let before = tributary::delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap()
        .version();
    let r = fx.merge_ok(std::slice::from_ref(&file)).await;
    let t = &r.tables[0];
    assert!(t.appended() && t.slices == 1, "appended whole: {t:?}");
    let p = t.watermark.clone().expect("the watermark");
    assert!(p.advanced && p.caught_up, "{p:?}");
    let after = tributary::delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap()
        .version();
    assert_eq!(
        after,
        before.map(|v| v + 1),
        "one commit: the rows and the watermark"
    );
}

/// The rows of a full-load file share one order key, the file's: a key twice in the file
/// keeps its first row, whether the two rows are planned together or land in different
/// slices, merged whole or slice by slice; a later full-load file's row still wins over an
/// earlier file's, and the earlier file delivered again changes nothing. (Until the rows
/// shared a key, each had its row number in it and the last of the two won.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_load_file_orders_its_rows_by_the_file_alone() {
    let at = "2024-01-01 09:00:00.000000";
    let first: Vec<Change> = (1..=3000).map(|id| c('I', at, id, "a", id)).collect();
    let mut load = first.clone();
    // Key 8 again in the first slice (1024 rows), key 7 again in the last one.
    load.insert(10, c('I', at, 8, "a", -8));
    load.push(c('I', at, 7, "a", -7));
    for fx in [sliced(), Fixture::items()] {
        let loaded = fx.put_items("LOAD00000001.parquet", &load);
        fx.merge_ok(std::slice::from_ref(&loaded)).await;
        assert_eq!(
            fx.items_rows().await,
            model(&first),
            "the first row of a key"
        );
        let keys = fx
            .values("curated/items", &["id", "_tributary_seq"], &["id"])
            .await;
        assert_eq!(keys.len(), 3000);
        assert!(
            keys.iter()
                .all(|k| k[1].as_deref() == Some("0 LOAD00000001.parquet")),
            "{:?}",
            &keys[..3]
        );
        let later = fx.put_items("LOAD00000002.parquet", &[c('I', at, 7, "a", 70)]);
        fx.merge_ok(&[later]).await;
        let again = fx.merge_ok(&[loaded]).await;
        assert!(again
            .tables
            .iter()
            .all(|t| t.inserted + t.updated + t.deleted == 0));
        let mut want = first.clone();
        want.push(c('I', at, 7, "a", 70));
        assert_eq!(fx.items_rows().await, model(&want));
    }
}
