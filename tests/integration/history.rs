//! History tables: random histories with inserts, updates (some touching only untracked
//! columns), deletes and re-inserts, split into files, shuffled, duplicated and grouped into
//! random invocations (sequentially in the property test, 8 at a time in the concurrency
//! test). The history table must equal a model computed from the ordered changes, row for
//! row, interval bounds included.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tributary::deltalake::arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, RecordBatch, Scalar, StringArray,
};
use tributary::deltalake::arrow::compute::cast;
use tributary::deltalake::arrow::datatypes::{DataType, Int64Type};
use tributary_tests::*;

const TABLE: &str = r#"
[[table]]
name = "h"
source = "raw/h/"
target = "curated/h"
primary_key = ["id"]
sequence_by = ["ts"]
drop_columns = ["ts"]
max_commit_attempts = 300
[table.history]
target = "curated/h_history"
current_column = "is_current"
track_columns = ["t"]
"#;

/// The table's configuration: deletes flagged or closing; with `only`, no current table
/// (the history table instead of it).
fn config(flag: bool, only: bool) -> String {
    let mut c = TABLE.to_string();
    if only {
        c = c.replace("target = \"curated/h\"\n", "");
    }
    if flag {
        c.push_str("deletes = \"flag\"\n");
    }
    c
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// One change: op, microseconds since 2024-01-01 (the sequence value), id, tracked t,
/// untracked u.
#[derive(Debug, Clone)]
struct Ch {
    /// A full-load row (in a `LOAD*` file, no `Op`).
    load: bool,
    op: char,
    us: i64,
    id: i64,
    t: i64,
    u: i64,
}

const BASE_US: i64 = 1_704_067_200_000_000; // 2024-01-01 00:00:00 UTC

fn ts_text(us: i64) -> String {
    let t =
        tributary::deltalake::arrow::temporal_conversions::timestamp_us_to_datetime(BASE_US + us)
            .expect("ts");
    t.format("%Y-%m-%d %H:%M:%S%.6f").to_string()
}

/// A consistent random history (ties on the timestamp happen: one transaction).
/// With `load`, some keys start in a full load written at a random time, which can be
/// later than CDC changes that follow it (changes cached during the load).
fn generate(seed: u64, keys: i64, n: usize, load: bool) -> Vec<Ch> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut present: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    let mut us = 0;
    let mut out = Vec::new();
    if load {
        let at = rng.random_range(0..=n as i64 / 2);
        for id in 0..keys {
            if rng.random_bool(0.5) {
                let (t, u) = (rng.random_range(0..3), rng.random_range(0..100));
                present.insert(id, (t, u));
                out.push(Ch {
                    load: true,
                    op: 'I',
                    us: at,
                    id,
                    t,
                    u,
                });
            }
        }
    }
    for _ in 0..n {
        if rng.random_bool(0.7) {
            us += 1;
        }
        let id = rng.random_range(0..keys);
        let ch = match present.get(&id).copied() {
            None => {
                let (t, u) = (rng.random_range(0..3), rng.random_range(0..100));
                present.insert(id, (t, u));
                Ch {
                    load: false,
                    op: 'I',
                    us,
                    id,
                    t,
                    u,
                }
            }
            Some((t, u)) if rng.random_bool(0.25) => {
                present.remove(&id);
                Ch {
                    load: false,
                    op: 'D',
                    us,
                    id,
                    t,
                    u,
                }
            }
            Some((t, _)) => {
                // half the updates leave the tracked column as it was
                let t = if rng.random_bool(0.5) {
                    t
                } else {
                    rng.random_range(0..3)
                };
                let u = rng.random_range(0..100);
                present.insert(id, (t, u));
                Ch {
                    load: false,
                    op: 'U',
                    us,
                    id,
                    t,
                    u,
                }
            }
        };
        out.push(ch);
    }
    out
}

/// A history row: (id, t, u, start µs, end µs, is_current, deleted).
type Row = (i64, i64, i64, i64, Option<i64>, bool, bool);

/// The versions the changes (in their true order) make; with `flag`, a delete also opens a
/// version flagged as deleted (the deleted row's values), current until a re-insert. A
/// version never starts before the one it follows (a full load's time can be later than the
/// changes after it).
fn model(changes: &[Ch], flag: bool) -> Vec<Row> {
    let mut out = Vec::new();
    // id → (t, u, start, deleted)
    let mut open: BTreeMap<i64, (i64, i64, i64, bool)> = BTreeMap::new();
    for c in changes {
        let prev = open.get(&c.id).copied();
        match (c.op, prev) {
            ('D', Some((_, _, _, true))) | ('D', None) => {}
            ('D', Some((t, u, start, false))) => {
                let at = c.us.max(start);
                out.push((c.id, t, u, start, Some(at), false, false));
                open.remove(&c.id);
                if flag {
                    open.insert(c.id, (c.t, c.u, at, true));
                }
            }
            (_, Some((t, _, start, false))) if t == c.t => {
                open.insert(c.id, (t, c.u, start, false));
            }
            (_, prev) => {
                let mut at = c.us;
                if let Some((t, u, start, deleted)) = prev {
                    at = at.max(start);
                    out.push((c.id, t, u, start, Some(at), false, deleted));
                }
                open.insert(c.id, (c.t, c.u, at, false));
            }
        }
    }
    out.extend(
        open.into_iter()
            .map(|(id, (t, u, start, deleted))| (id, t, u, start, None, true, deleted)),
    );
    out.sort();
    out
}

fn file(changes: &[Ch]) -> RecordBatch {
    let ints = |f: &dyn Fn(&Ch) -> i64| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(changes.iter().map(f)))
    };
    let text = |f: &dyn Fn(&Ch) -> String| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(changes.iter().map(f)))
    };
    let mut cols = vec![("Op", text(&|c| c.op.to_string()))];
    if changes.iter().all(|c| c.load) {
        cols.clear(); // a full-load file has no `Op`
    }
    cols.extend([
        ("ts", text(&|c| ts_text(c.us))),
        ("id", ints(&|c| c.id)),
        ("t", ints(&|c| c.t)),
        ("u", ints(&|c| c.u)),
    ]);
    batch(cols)
}

/// Land the history as DMS files of random sizes (in DMS order).
/// Full-load rows go to `LOAD*` files, the changes to CDC files.
fn land(fx: &Fixture, changes: &[Ch], rng: &mut StdRng, max_file: usize) -> Vec<url::Url> {
    let mut urls = Vec::new();
    let loads = changes.iter().take_while(|c| c.load).count();
    let (load, cdc) = changes.split_at(loads);
    for (i, part) in load.chunks(load.len().div_ceil(2).max(1)).enumerate() {
        let name = format!("LOAD{:08}.parquet", i + 1);
        urls.push(fx.put_batch("h", &name, &file(part)));
    }
    let mut i = 0;
    while i < cdc.len() {
        let n = rng.random_range(1..=max_file).min(cdc.len() - i);
        let name = format!("2024/01/01/20240101-{:010}.parquet", urls.len() + 1);
        urls.push(fx.put_batch("h", &name, &file(&cdc[i..i + n])));
        i += n;
    }
    urls
}

async fn history_rows(fx: &Fixture, flag: bool) -> Vec<Row> {
    let t = tributary::delta::open(&fx.url("curated/h_history"), &Default::default())
        .await
        .unwrap();
    if !tributary::delta::exists(&t) {
        return vec![];
    }
    let mut columns = vec!["id", "t", "u", "__START_AT", "__END_AT", "is_current"];
    if flag {
        columns.push("__DELETED");
    }
    let batches = [table_batch(&t, &columns, &[]).await];
    let mut out = Vec::new();
    for b in &batches {
        let col = |i: usize| cast(b.column(i), &DataType::Int64).unwrap();
        let (id, t, u, s, e) = (col(0), col(1), col(2), col(3), col(4));
        let cur = b.column(5).as_boolean();
        for i in 0..b.num_rows() {
            let deleted = flag && b.column(6).as_boolean().value(i);
            let v = |a: &ArrayRef| a.as_primitive::<Int64Type>().value(i);
            out.push((
                v(&id),
                v(&t),
                v(&u),
                v(&s) - BASE_US,
                e.is_valid(i).then(|| v(&e) - BASE_US),
                cur.value(i),
                deleted,
            ));
        }
    }
    out.sort();
    out
}

fn deliveries(urls: &[url::Url], rng: &mut StdRng) -> Vec<url::Url> {
    let mut d: Vec<url::Url> = Vec::new();
    for u in urls {
        d.push(u.clone());
        if rng.random_bool(0.4) {
            d.push(u.clone());
        }
    }
    d.shuffle(rng);
    d
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 30, ..ProptestConfig::default() })]

    /// Any delivery order, duplication and grouping: the model, interval bounds included.
    #[test]
    fn history_equals_the_model_whatever_the_delivery(
        seed in any::<u64>(),
        keys in 1i64..6,
        n in 1usize..20,
        max_file in 1usize..5,
        delivery in any::<u64>(),
        flag in any::<bool>(),
        only in any::<bool>(),
        load in any::<bool>(),
    ) {
        let rt = runtime();
        let fx = Fixture::new(&config(flag, only));
        let changes = generate(seed, keys, n, load);
        let mut rng = StdRng::seed_from_u64(delivery);
        let urls = land(&fx, &changes, &mut rng, max_file);
        let d = deliveries(&urls, &mut rng);
        rt.block_on(async {
            let mut i = 0;
            while i < d.len() {
                let k = rng.random_range(1..=3).min(d.len() - i);
                fx.merge_ok(&d[i..i + k]).await;
                i += k;
            }
        });
        prop_assert_eq!(rt.block_on(history_rows(&fx, flag)), model(&changes, flag));
        prop_assert_eq!(fx.path("curated/h").exists(), !only);
    }
}

/// 8 invocations merging every file twice, at the same time (closing and flagging
/// deletes, with and without a current table).
#[test]
fn concurrent_invocations_build_the_same_history() {
    let rt = runtime();
    for seed in 0..4u64 {
        let (flag, only) = (seed % 2 == 1, seed >= 2);
        let fx = Fixture::new(&config(flag, only));
        let changes = generate(500 + seed, 6, 50, true);
        let mut rng = StdRng::seed_from_u64(seed);
        let urls = land(&fx, &changes, &mut rng, 3);
        let mut all: Vec<url::Url> = urls.iter().chain(urls.iter()).cloned().collect();
        all.shuffle(&mut rng);
        rt.block_on(async {
            let tasks: Vec<_> = (0..8)
                .map(|w| {
                    let engine = fx.another_engine();
                    let mine: Vec<url::Url> = all.iter().skip(w).step_by(8).cloned().collect();
                    tokio::spawn(async move {
                        let mut failures = Vec::new();
                        for chunk in mine.chunks(2) {
                            let r = engine.process(chunk).await;
                            failures.extend(r.failures().map(|f| format!("{f:?}")));
                        }
                        failures
                    })
                })
                .collect();
            for t in tasks {
                let f = t.await.unwrap();
                assert!(f.is_empty(), "{f:?}");
            }
        });
        assert_eq!(
            rt.block_on(history_rows(&fx, flag)),
            model(&changes, flag),
            "seed {seed}"
        );
    }
}

/// The `items` table keeping only its history (no `target`).
const ITEMS_HISTORY_ONLY: &str = r#"
[[table]]
name = "items"
source = "raw/shop/items/"
primary_key = ["id"]
partition_by = ["part"]
sequence_by = ["ts"]
drop_columns = ["ts"]
target_file_size_mb = 1
[table.history]
target = "curated/items_history"
current_column = "is_current"
"#;

/// (id, part, val, start as text, end as text, is_current), ordered.
type Version = (i64, String, i64, String, Option<String>, bool);

async fn item_versions(fx: &Fixture) -> Vec<Version> {
    let columns = ["id", "part", "val", "__START_AT", "__END_AT", "is_current"];
    let b = [fx.batch("curated/items_history", &columns, &[]).await];
    let mut out = Vec::new();
    for b in &b {
        let text = |i: usize| cast(b.column(i), &DataType::Utf8).unwrap();
        let (part, s, e) = (text(1), text(3), text(4));
        let (part, s, e) = (
            part.as_string::<i32>(),
            s.as_string::<i32>(),
            e.as_string::<i32>(),
        );
        let (id, val, cur) = (
            b.column(0).as_primitive::<Int64Type>(),
            b.column(2).as_primitive::<Int64Type>(),
            b.column(5).as_boolean(),
        );
        for i in 0..b.num_rows() {
            out.push((
                id.value(i),
                part.value(i).to_string(),
                val.value(i),
                s.value(i).to_string(),
                e.is_valid(i).then(|| e.value(i).to_string()),
                cur.value(i),
            ));
        }
    }
    // by id, then start as text
    out.sort_by(|x: &Version, y: &Version| (x.0, &x.3).cmp(&(y.0, &y.3)));
    out
}

fn set_mtime(u: &url::Url, t: std::time::SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(u.to_file_path().unwrap())
        .unwrap()
        .set_modified(t)
        .unwrap();
}

/// A table without a current table: the history table records what the current table would
/// (full-load files, sequence kinds), keeps no tombstones, and a late insert older than a
/// delete does not revive the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_only_table_records_loads_and_kinds_and_never_revives_a_deleted_key() {
    let fx = Fixture::new(ITEMS_HISTORY_ONLY);
    let load = fx.put_items(
        "LOAD00000001.parquet",
        &[
            c('I', "2024-01-01 00:00:00.000000", 1, "a", 1),
            c('I', "2024-01-01 00:00:00.000000", 2, "a", 2),
        ],
    );
    set_mtime(
        &load,
        std::time::SystemTime::now() - std::time::Duration::from_secs(3600),
    );
    let update = fx.put_items(
        "2024/01/01/20240101-0000000002.parquet",
        &[c('U', "2024-01-01 00:00:02.000000", 1, "b", 10)],
    );
    let delete = fx.put_items(
        "2024/01/01/20240101-0000000003.parquet",
        &[c('D', "2024-01-01 00:00:03.000000", 2, "a", 2)],
    );
    // Delivered newest first: the delete before the insert it follows.
    fx.merge_ok(std::slice::from_ref(&delete)).await;
    fx.merge_ok(std::slice::from_ref(&update)).await;
    fx.merge_ok(std::slice::from_ref(&load)).await;
    let late_insert = fx.put_items(
        "2024/01/01/20240101-0000000001.parquet",
        &[c('I', "2024-01-01 00:00:01.000000", 2, "a", 20)],
    );
    fx.merge_ok(std::slice::from_ref(&late_insert)).await;
    let want: Vec<Version> = vec![
        (
            1,
            "a".into(),
            1,
            "2024-01-01T00:00:00".into(),
            Some("2024-01-01T00:00:02".into()),
            false,
        ),
        (1, "b".into(), 10, "2024-01-01T00:00:02".into(), None, true),
        (
            2,
            "a".into(),
            2,
            "2024-01-01T00:00:00".into(),
            Some("2024-01-01T00:00:01".into()),
            false,
        ),
        (
            2,
            "a".into(),
            20,
            "2024-01-01T00:00:01".into(),
            Some("2024-01-01T00:00:03".into()),
            false,
        ),
    ];
    let got = item_versions(&fx).await;
    let norm = |v: Vec<Version>| -> Vec<Version> {
        v.into_iter()
            .map(|(i, p, x, s, e, c)| {
                let t = |s: String| s.trim_end_matches('Z').replace(' ', "T");
                (i, p, x, t(s), e.map(t), c)
            })
            .collect()
    };
    assert_eq!(norm(got), want, "key 2 stays deleted");
    assert!(!fx.path("curated/items").exists(), "no current table");
    assert!(
        !walk(&fx.path("curated")).any(|p| p.contains("_tributary_tombstones")),
        "no tombstone table"
    );

    // The full-load file delivered again changes nothing; rewritten by a DMS reload it is
    // refused, as with a current table.
    fx.merge_ok(std::slice::from_ref(&load)).await;
    assert_eq!(
        norm(item_versions(&fx).await),
        want,
        "a re-delivered full load changes nothing"
    );
    let rewritten = fx.put_items(
        "LOAD00000001.parquet",
        &[c('I', "2099-01-01 00:00:00.000000", 1, "a", 99)],
    );
    let r = fx.engine.process(std::slice::from_ref(&rewritten)).await;
    let e = Fixture::failure(&r, &rewritten);
    assert_eq!(e.kind(), "reload");
    assert!(
        e.to_string()
            .contains("cannot apply a reload to a table with a history table"),
        "{e}"
    );

    // The sequence kind (timestamp) is recorded: a file of integers is refused.
    let ints = fx.put_batch(
        "shop/items",
        "2024/01/01/20240101-0000000004.parquet",
        &batch(vec![
            ("Op", strings(&["U"])),
            ("ts", Arc::new(Int64Array::from(vec![5]))),
            ("id", Arc::new(Int64Array::from(vec![1]))),
            ("part", strings(&["b"])),
            ("val", Arc::new(Int64Array::from(vec![11]))),
        ]),
    );
    let r = fx.engine.process(std::slice::from_ref(&ints)).await;
    let e = Fixture::failure(&r, &ints);
    assert!(e.to_string().contains("integer"), "{e}");
}

/// A history-only table keeps the table's state: each merge commits its versions and the
/// watermark it moves in one commit (#43 item 8; before, a second commit of the watermark
/// alone followed every merge), and a re-delivery commits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_only_merge_commits_its_watermark_with_its_versions() {
    let fx = Fixture::new(ITEMS_HISTORY_ONLY);
    let version = || async {
        tributary::delta::open(&fx.url("curated/items_history"), &Default::default())
            .await
            .unwrap()
            .version()
    };
    let files: Vec<url::Url> = (0..3i64)
        .map(|i| {
            let ts = format!("2024-01-01 00:00:{i:02}.000000");
            fx.put_items(
                &format!("2024/01/01/20240101-{:010}.parquet", i + 1),
                &[c('I', &ts, 10 + i, "a", i)],
            )
        })
        .collect();
    fx.merge_ok(&files[..1]).await;
    for f in &files[1..] {
        let before = version().await;
        let r = fx.merge_ok(std::slice::from_ref(f)).await;
        let p = r.tables[0].watermark.clone().expect("the watermark");
        assert!(p.advanced, "{p:?}");
        assert_eq!(
            version().await,
            before.map(|v| v + 1),
            "one commit per merge"
        );
    }
    let before = version().await;
    fx.merge_ok(&files).await;
    assert_eq!(version().await, before, "a re-delivery commits nothing");
}

/// Maintenance of a history-only table compacts the history table (and its change log)
/// and changes no version; status reports the history table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_and_status_of_a_history_only_table() {
    let fx = Fixture::new(ITEMS_HISTORY_ONLY);
    let mut files = Vec::new();
    for i in 0..6i64 {
        let ts = format!("2024-01-01 00:00:{i:02}.000000");
        files.push(fx.put_items(
            &format!("2024/01/01/20240101-{:010}.parquet", i + 1),
            &[c('I', &ts, 10 + i, "a", i)],
        ));
    }
    for f in &files {
        fx.merge_ok(std::slice::from_ref(f)).await;
    }
    let before = item_versions(&fx).await;
    assert_eq!(before.len(), 6);
    let cfg = &fx.engine.config().tables[0];
    let m = fx.maintain().await;
    assert!(m.skipped.is_none(), "{m:?}");
    assert!(m.history.is_none(), "the history table is the table: {m:?}");
    let h = &m;
    assert_eq!(h.table, "items");
    assert!(h.files_compacted >= 2, "{h:?}");
    assert!(h.files_after < h.files_before, "{h:?}");
    assert_eq!(
        item_versions(&fx).await,
        before,
        "maintenance changes no version"
    );
    // Manifests list exactly the live files after the compaction.
    let st = tributary::status::table_status(
        cfg,
        fx.engine.storage_options(),
        fx.engine.storage(),
        None,
        chrono::Utc::now(),
    )
    .await
    .expect("status");
    assert!(
        st.target.ends_with("curated/items_history"),
        "{}",
        st.target
    );
    assert_eq!(st.rows, 6);
    assert_eq!(st.tombstones, 0);
    assert_eq!(st.manifests.as_ref().map(|m| m.exact), Some(true), "{st:?}");
    assert_eq!(
        st.freshness.newest_sequence.as_deref(),
        Some("2024-01-01 00:00:05.000000"),
        "{st:?}"
    );
}

/// Every file path under `dir`.
fn walk(dir: &std::path::Path) -> impl Iterator<Item = String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.display().to_string());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out.into_iter()
}

/// A `[table.history]` ordered by `seq` (text or timestamps), with a current table.
const SEQ_HISTORY: &str = r#"
[[table]]
name = "s"
source = "raw/s/"
target = "curated/s"
primary_key = ["id"]
sequence_by = ["seq"]
drop_columns = ["seq"]
[table.history]
target = "curated/s_history"
current_column = "is_current"
"#;

/// A file of `s`: (op, seq, id, val); a full-load file (`LOAD*`) has no `Op`, and a `None`
/// sequence value is a null (DMS's `AR_H_CHANGE_SEQ` during the full load).
fn put_s(fx: &Fixture, name: &str, rows: &[(char, Option<&str>, i64, i64)]) -> url::Url {
    let mut cols: Vec<(&str, ArrayRef)> = Vec::new();
    if !name.starts_with("LOAD") {
        let ops: Vec<String> = rows.iter().map(|r| r.0.to_string()).collect();
        cols.push(("Op", Arc::new(StringArray::from(ops))));
    }
    cols.extend([
        (
            "seq",
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            )) as ArrayRef,
        ),
        (
            "id",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
        ),
        (
            "val",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.3))),
        ),
    ]);
    fx.put_batch("s", name, &batch(cols))
}

/// (id, val, start as text, end as text, is_current) of `s`'s history, ordered.
async fn s_versions(fx: &Fixture) -> Vec<(i64, i64, String, Option<String>, bool)> {
    let columns = ["id", "val", "__START_AT", "__END_AT", "is_current"];
    let b = [fx.batch("curated/s_history", &columns, &[]).await];
    let mut out = Vec::new();
    for b in &b {
        let text = |i: usize| cast(b.column(i), &DataType::Utf8).unwrap();
        let (s, e) = (text(2), text(3));
        let (s, e) = (s.as_string::<i32>(), e.as_string::<i32>());
        let (id, val, cur) = (
            b.column(0).as_primitive::<Int64Type>(),
            b.column(1).as_primitive::<Int64Type>(),
            b.column(4).as_boolean(),
        );
        for i in 0..b.num_rows() {
            out.push((
                id.value(i),
                val.value(i),
                s.value(i).to_string(),
                e.is_valid(i).then(|| e.value(i).to_string()),
                cur.value(i),
            ));
        }
    }
    // by id, then start as text
    out.sort_by(|x, y| (x.0, &x.2).cmp(&(y.0, &y.2)));
    let t = |v: &str| v.trim_end_matches('Z').replace('T', " ");
    out.into_iter()
        .map(|(id, val, s, e, cur)| (id, val, t(&s), e.map(|e| t(&e)), cur))
        .collect()
}

/// The Delta type of the history's start column (`string`, `timestamp`).
async fn s_start_type(fx: &Fixture) -> String {
    let t = tributary::delta::open(&fx.url("curated/s_history"), &Default::default())
        .await
        .unwrap();
    let schema = t.snapshot().unwrap().schema();
    schema.field("__START_AT").unwrap().data_type().to_string()
}

/// DMS leaves `AR_H_CHANGE_SEQ` empty during the full load. Before, the load typed the
/// history's start column `timestamp` (the default kind) and every CDC file after it failed
/// parsing its text sequence values as timestamps, while delivered in the other order it
/// worked; and the load's versions had a null start, so "as of" never returned them. Now
/// the type follows the sequence kind whatever came first, and a version the load opened
/// starts at the kind's lower bound (`''` for text, 1970-01-01 for timestamps).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_load_without_sequence_values_neither_fixes_the_history_type_nor_leaves_null_starts()
{
    for (text, s1, s2, floor) in [
        (
            true,
            "20261130080000000000000000000000001",
            "20261130090000000000000000000000001",
            "",
        ),
        (
            false,
            "2026-11-30 08:00:00.000000",
            "2026-11-30 09:00:00.000000",
            "1970-01-01 00:00:00",
        ),
    ] {
        for load_first in [true, false] {
            let fx = Fixture::new(SEQ_HISTORY);
            let load = put_s(
                &fx,
                "LOAD00000001.parquet",
                &[('I', None, 1, 10), ('I', None, 2, 20)],
            );
            let u1 = put_s(
                &fx,
                "20261130-0800000000.parquet",
                &[('U', Some(s1), 1, 11)],
            );
            let u2 = put_s(
                &fx,
                "20261130-0900000000.parquet",
                &[('U', Some(s2), 1, 12)],
            );
            let order = if load_first {
                [&load, &u1, &u2]
            } else {
                [&u2, &u1, &load]
            };
            for f in order {
                fx.merge_ok(std::slice::from_ref(f)).await;
            }
            let want_type = if text { "string" } else { "timestamp" };
            assert_eq!(
                s_start_type(&fx).await,
                want_type,
                "text {text}, load first {load_first}"
            );
            let t = |s: &str| s.trim_end_matches(".000000").to_string();
            let want = vec![
                (1, 10, floor.to_string(), Some(t(s1)), false),
                (1, 11, t(s1), Some(t(s2)), false),
                (1, 12, t(s2), None, true),
                (2, 20, floor.to_string(), None, true),
            ];
            let got: Vec<_> = s_versions(&fx)
                .await
                .into_iter()
                .map(|(i, v, s, e, c)| (i, v, t(&s), e.map(|e| t(&e)), c))
                .collect();
            assert_eq!(got, want, "text {text}, load first {load_first}");
            // "As of" a time between the load and the first change: the loaded state.
            let as_of = if text {
                "20261130070000000000000000000000001"
            } else {
                "2026-11-30T07:00:00Z"
            };
            let columns = ["id", "val", "__START_AT", "__END_AT"];
            let b = fx.batch("curated/s_history", &columns, &["id"]).await;
            let vals = versions_as_of(&b, as_of);
            assert_eq!(vals, vec![10, 20], "text {text}, load first {load_first}");
        }
    }
}

/// The `val`s of the versions (`id`, `val`, start, end) valid at `as_of` (text of a value of
/// the start column's type), as SQL's `start <= as_of AND (end > as_of OR end IS NULL)`
/// selects them, in the batch's order.
fn versions_as_of(b: &RecordBatch, as_of: &str) -> Vec<i64> {
    use tributary::deltalake::arrow::compute::kernels::boolean::{and_kleene, is_null, or_kleene};
    use tributary::deltalake::arrow::compute::kernels::cmp::{gt, lt_eq};
    let (start, end) = (b.column(2), b.column(3));
    let as_of: ArrayRef = Arc::new(StringArray::from(vec![as_of]));
    let as_of = Scalar::new(cast(&as_of, start.data_type()).unwrap());
    let open = or_kleene(&gt(end, &as_of).unwrap(), &is_null(end).unwrap()).unwrap();
    let valid = and_kleene(&lt_eq(start, &as_of).unwrap(), &open).unwrap();
    let b = tributary::deltalake::arrow::compute::filter_record_batch(b, &valid).unwrap();
    b.column(1).as_primitive::<Int64Type>().values().to_vec()
}

/// The change log's row count and the history table's version.
async fn s_history_state(fx: &Fixture) -> (usize, Option<u64>) {
    let log = "curated/s_history/_tributary_changes";
    let n = fx.batch(log, &[], &[]).await.num_rows();
    let t = tributary::delta::open(&fx.url("curated/s_history"), &Default::default())
        .await
        .unwrap();
    (n, t.version())
}

/// At-least-once delivery: before, every re-delivery of an applied file rewrote the keys'
/// versions in a new history commit and appended the file's rows to the change log again,
/// which grew without bound. A re-delivery now changes nothing and commits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_delivered_file_appends_nothing_to_the_change_log_and_commits_nothing() {
    let fx = Fixture::new(SEQ_HISTORY);
    let ts = |s: u32| format!("2024-01-01 00:00:{s:02}.000000");
    let (t1, t2, t3) = (ts(1), ts(2), ts(3));
    let load = put_s(
        &fx,
        "LOAD00000001.parquet",
        &[('I', Some(&ts(0)), 1, 10), ('I', Some(&ts(0)), 2, 20)],
    );
    let a = put_s(
        &fx,
        "20240101-0000000001.parquet",
        &[('U', Some(&t1), 1, 11), ('I', Some(&t1), 3, 30)],
    );
    let b = put_s(
        &fx,
        "20240101-0000000002.parquet",
        &[('D', Some(&t2), 2, 20), ('U', Some(&t3), 1, 12)],
    );
    let files = [load, a, b];
    for f in &files {
        fx.merge_ok(std::slice::from_ref(f)).await;
    }
    let before = s_history_state(&fx).await;
    let versions = s_versions(&fx).await;
    assert_eq!(before.0, 6, "every change logged once");
    for _ in 0..2 {
        for f in &files {
            fx.merge_ok(std::slice::from_ref(f)).await;
        }
        fx.merge_ok(&files).await;
    }
    assert_eq!(
        s_history_state(&fx).await,
        before,
        "nothing logged, nothing committed"
    );
    assert_eq!(s_versions(&fx).await, versions);
    // A late file among re-delivered ones: only its row is logged.
    let late = put_s(
        &fx,
        "20240101-0000000000.parquet",
        &[('U', Some(&ts(1)), 2, 21)],
    );
    fx.merge_ok(&[files[2].clone(), late]).await;
    let after = s_history_state(&fx).await;
    assert_eq!(after.0, 7);
    assert_eq!(after.1, before.1.map(|v| v + 1), "one history commit");
}
