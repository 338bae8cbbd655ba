//! #27: watermarks. A table's watermark stops at the first file under its source that is not
//! applied, never goes backwards, reaches the newest file once all are applied; a group's
//! cut is the least of its tables' watermarks, and each table read at its cut's version
//! (time travel) equals the source at that moment.

use chrono::{DateTime, TimeZone, Utc};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tributary::maintenance::{handle, Request};
use tributary::watermark::Progress;
use tributary_tests::*;

/// The DMS name and the time of the n-th file (one a minute from 01:00).
fn name(n: u32) -> String {
    format!("20240101-{:02}{:02}000000.parquet", 1 + n / 60, n % 60)
}

fn at(n: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 1, 1, 1 + n / 60, n % 60, 0)
        .unwrap()
}

fn ts(n: u32) -> String {
    format!("2024-01-01 {:02}:{:02}:00.000000", 1 + n / 60, n % 60)
}

fn progress(r: &tributary::ProcessReport) -> Progress {
    let t = &r.tables[0];
    assert!(t.watermark_error.is_none(), "{:?}", t.watermark_error);
    t.watermark.clone().expect("a merge reports the watermark")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watermark_stops_at_the_first_file_not_applied_and_names_it() {
    let fx = Fixture::items();
    let files: Vec<url::Url> = (0..4)
        .map(|n| fx.put_items(&name(n), &[c('I', &ts(n), n as i64, "a", 1)]))
        .collect();
    let p = progress(&fx.merge_ok(&files[..1]).await);
    assert_eq!(p.watermark, Some(at(0)));
    let held = p.held_by.expect("file 1 is not applied");
    assert!(held.file.ends_with(&name(1)), "{held:?}");
    assert!(held.reason.contains("dead-letter"), "{held:?}");
    assert!(!p.caught_up);

    // Files 1 and 3: file 2 holds the watermark at file 1's time.
    let p = progress(&fx.merge_ok(&[files[1].clone(), files[3].clone()]).await);
    assert_eq!(p.watermark, Some(at(1)));
    assert!(p.held_by.expect("held").file.ends_with(&name(2)));
    assert_eq!(p.files_waiting, 1, "file 3 waits behind the gap");

    let p = progress(&fx.merge_ok(&files[2..3]).await);
    assert_eq!(p.watermark, Some(at(3)));
    assert!(p.caught_up && p.held_by.is_none(), "{p:?}");

    // A re-delivery of an old file does not move it back; the value is the table's (a
    // reader that shares nothing with this process sees it).
    let p = progress(&fx.merge_ok(&files[..1]).await);
    assert_eq!(p.watermark, Some(at(3)));
    let w = tributary::cut::compute(
        fx.another_engine().config(),
        fx.engine.storage(),
        fx.engine.storage_options(),
        &[],
        false,
        true,
        Utc::now(),
    )
    .await;
    assert_eq!(w.tables[0].1.watermark, Some(at(3)));
}

/// One commit per merge (#43 item 8): the watermark a merge moves is in its own commit
/// (before: a second commit of the watermark alone after every merge that moved it), and a
/// re-delivery that changes nothing commits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_commits_the_watermark_it_moves_in_its_own_commit() {
    let fx = Fixture::items();
    let files: Vec<url::Url> = (0..3)
        .map(|n| fx.put_items(&name(n), &[c('I', &ts(n), n as i64, "a", 1)]))
        .collect();
    let first = fx.merge_ok(&files[..1]).await;
    assert_eq!(progress(&first).watermark, Some(at(0)));
    let mut version = first.tables[0].version.expect("a version");
    for n in 1..3 {
        let r = fx.merge_ok(&files[n..n + 1]).await;
        let p = progress(&r);
        assert_eq!(p.watermark, Some(at(n as u32)));
        assert!(p.advanced, "{p:?}");
        let t = tributary::delta::open(&fx.url("curated/items"), &Default::default())
            .await
            .unwrap();
        assert_eq!(
            t.version(),
            Some(version + 1),
            "file {n}: one commit, the merge with its watermark"
        );
        version += 1;
    }
    // Every file again: nothing changes, nothing is committed.
    let r = fx.merge_ok(&files).await;
    assert_eq!(progress(&r).watermark, Some(at(2)));
    let t = tributary::delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap();
    assert_eq!(t.version(), Some(version), "a re-delivery commits nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_load_file_not_applied_holds_every_cdc_file() {
    let fx = Fixture::items();
    let load = fx.put_items("LOAD00000001.parquet", &[c('I', &ts(0), 1, "a", 1)]);
    let cdc = fx.put_items(&name(1), &[c('U', &ts(1), 1, "a", 2)]);
    let p = progress(&fx.merge_ok(std::slice::from_ref(&cdc)).await);
    assert_eq!(p.watermark, None, "{p:?}");
    let held = p.held_by.expect("the load holds it");
    assert!(held.file.ends_with("LOAD00000001.parquet"), "{held:?}");
    let p = progress(&fx.merge_ok(&[load]).await);
    assert_eq!(p.watermark, Some(at(1)));
    assert!(p.caught_up);
}

/// Files under DMS date folders: the watermark records the layout, and the next merges list
/// only from the watermark's folder on, not the whole prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn date_folders_are_listed_from_the_watermark_on() {
    let fx = Fixture::items();
    let day = |d: u32| Utc.with_ymd_and_hms(2024, 1, d, 12, 0, 0).unwrap();
    let mut files = Vec::new();
    for d in 1..=5u32 {
        for k in 0..4u32 {
            let t = day(d) + chrono::Duration::minutes(k as i64);
            let n = format!("2024/01/{d:02}/{}.parquet", t.format("%Y%m%d-%H%M%S%3f0"));
            let ts = t.format("%Y-%m-%d %H:%M:%S%.6f").to_string();
            files.push((
                fx.put_items(&n, &[c('I', &ts, (d * 10 + k) as i64, "a", 1)]),
                t,
            ));
        }
    }
    let urls: Vec<url::Url> = files.iter().map(|(u, _)| u.clone()).collect();
    let p = progress(&fx.merge_ok(&urls[..16]).await);
    assert_eq!(p.watermark, Some(files[15].1));
    // The first computation lists everything (20 files); the next ones start at the
    // watermark's day folder (an hour before it): day 4's files and day 5's.
    let p = progress(&fx.merge_ok(&urls[16..]).await);
    assert_eq!(p.watermark, Some(files[19].1));
    assert_eq!(
        p.listed, 8,
        "listed from the watermark's folder, not the whole prefix (20)"
    );
    assert_eq!(p.list_requests, 1);
}

const TWO_TABLES: &str = r#"
[[table]]
name = "items"
source = "raw/shop/items/"
target = "curated/items"
primary_key = ["id"]
sequence_by = ["ts"]
drop_columns = ["ts"]

[[table]]
name = "stock"
source = "raw/shop/stock/"
target = "curated/stock"
primary_key = ["id"]
sequence_by = ["ts"]
drop_columns = ["ts"]
"#;

async fn rows_at(fx: &Fixture, rel: &str, version: u64) -> Vec<Row> {
    let t = tributary::delta::open(&fx.url(rel), &Default::default())
        .await
        .expect("open");
    let mut t = t;
    t.load_version(version).await.expect("time travel");
    rows_of(&[table_batch(&t, &["id", "part", "val"], &["id"]).await])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_cut_read_with_time_travel_is_the_source_at_that_moment() {
    let fx = Fixture::new(TWO_TABLES);
    // Both tables change every minute; DMS writes both tables' files at the same times.
    let change = |n: u32| {
        vec![
            c(if n == 0 { 'I' } else { 'U' }, &ts(n), 1, "a", n as i64),
            c('I', &ts(n), 10 + n as i64, "a", 0),
        ]
    };
    let mut items = Vec::new();
    let mut stock = Vec::new();
    for n in 0..3 {
        items.push(fx.put_raw("shop/items", &name(n), &items_parquet(&change(n), true)));
        stock.push(fx.put_raw("shop/stock", &name(n), &items_parquet(&change(n), true)));
    }
    // One call per file (as the per-table FIFO queue delivers them): each has a version.
    for f in &items {
        fx.merge_ok(std::slice::from_ref(f)).await;
    }
    // stock's second file fails (or waits in the dead-letter queue).
    fx.merge_ok(&[stock[0].clone()]).await;
    fx.merge_ok(&[stock[2].clone()]).await;
    let s = handle(&fx.engine, &Request::default())
        .await
        .expect("maintenance");
    assert!(s.failed.is_empty(), "{:?}", s.failed);
    let w = s.watermarks.expect("watermarks");
    let g = &w.groups[0];
    assert_eq!(g.cut, Some(at(0)), "stock's gap holds the cut: {g:?}");
    assert_eq!(g.held_by.as_deref(), Some("stock"));
    // The published object says the same.
    let published: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fx.path(&format!("curated/_tributary_cuts/{}.json", g.group)))
            .expect("published"),
    )
    .expect("json");
    assert_eq!(published["cut"], serde_json::json!(at(0)));
    // Each table at its version is the source as of the cut.
    let expected = model(&change(0));
    for t in &g.tables {
        let v = t.version.expect("a version to read");
        let rel = format!("curated/{}", t.table);
        assert_eq!(
            rows_at(&fx, &rel, v).await,
            expected,
            "{} at version {v}",
            t.table
        );
        assert_eq!(t.through, Some(at(0)));
    }
    assert_eq!(g.consistent_within_seconds, Some(0.0));

    // The replay releases it: the cut moves to the newest files.
    fx.merge_ok(&[stock[1].clone()]).await;
    let s = handle(&fx.engine, &Request::default())
        .await
        .expect("maintenance");
    let g = &s.watermarks.expect("watermarks").groups[0];
    assert_eq!(g.cut, Some(at(2)));
    assert_eq!(g.held_by, None);
    let all: Vec<_> = (0..3).flat_map(change).collect();
    for t in &g.tables {
        let rel = format!("curated/{}", t.table);
        assert_eq!(
            rows_at(&fx, &rel, t.version.expect("version")).await,
            model(&all)
        );
    }
}

/// A table without new changes (no new files, every file applied) does not hold its group
/// for ever: it counts as caught up to the group's newest watermark less the batch interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_table_counts_as_caught_up_with_its_group() {
    let fx = Fixture::new(TWO_TABLES);
    let items: Vec<url::Url> = (0..4)
        .map(|n| {
            fx.put_raw(
                "shop/items",
                &name(n),
                &items_parquet(&[c('I', &ts(n), n as i64, "a", 1)], true),
            )
        })
        .collect();
    let stock = fx.put_raw(
        "shop/stock",
        &name(0),
        &items_parquet(&[c('I', &ts(0), 1, "a", 1)], true),
    );
    fx.merge_ok(&items).await;
    fx.merge_ok(&[stock]).await;
    let s = handle(&fx.engine, &Request::default())
        .await
        .expect("maintenance");
    let g = &s.watermarks.expect("watermarks").groups[0];
    // items reached 01:03; stock is idle since 01:00: the cut is 01:03 less 60 s.
    assert_eq!(g.cut, Some(at(2)), "{g:?}");
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(24, |n| n.min(24))
}

/// Random delivery of one table's files: shuffled, duplicated, some failing first (their
/// object unreadable) and replayed after they were fixed.
async fn random_delivery(seed: u64, files: u32) {
    let fx = Fixture::items();
    let mut rng = StdRng::seed_from_u64(seed);
    let good = |n: u32| items_parquet(&[c('I', &ts(n), n as i64, "a", n as i64)], true);
    let mut broken = Vec::new();
    let mut urls = Vec::new();
    for n in 0..files {
        if rng.random_bool(0.25) {
            broken.push(n);
            urls.push(fx.put_raw("shop/items", &name(n), b"not parquet"));
        } else {
            urls.push(fx.put_raw("shop/items", &name(n), &good(n)));
        }
    }
    let mut deliveries: Vec<u32> = (0..files).collect();
    for n in 0..files {
        if rng.random_bool(0.3) {
            deliveries.push(n);
        }
    }
    deliveries.shuffle(&mut rng);
    // The broken files are fixed and replayed at the end (a DLQ redrive).
    deliveries.extend(broken.iter().copied());
    let mut applied = vec![false; files as usize];
    let mut last: Option<DateTime<Utc>> = None;
    let mut fixed = std::collections::HashSet::new();
    let redrive_from = deliveries.len() - broken.len();
    for (i, n) in deliveries.into_iter().enumerate() {
        if i >= redrive_from && fixed.insert(n) {
            fx.put_raw("shop/items", &name(n), &good(n));
        }
        let r = fx
            .engine
            .process(std::slice::from_ref(&urls[n as usize]))
            .await;
        let failed = r.failures().next().is_some();
        assert_eq!(
            failed,
            broken.contains(&n) && !fixed.contains(&n),
            "file {n}: {:?}",
            r.files
        );
        if !failed {
            applied[n as usize] = true;
        }
        let Some(p) = r.tables.first().and_then(|t| t.watermark.clone()) else {
            continue;
        };
        if let Some(w) = p.watermark {
            for k in 0..files {
                if at(k) <= w {
                    assert!(
                        applied[k as usize],
                        "the watermark {w} passed file {k}, not applied"
                    );
                }
            }
        }
        assert!(
            p.watermark >= last,
            "the watermark went back: {last:?} → {:?}",
            p.watermark
        );
        last = p.watermark;
    }
    assert_eq!(
        last,
        Some(at(files - 1)),
        "all applied: the watermark is the newest file"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 10, ..ProptestConfig::default() })]

    #[test]
    fn the_watermark_never_passes_a_file_not_applied_nor_goes_back(seed in any::<u64>(), files in 2u32..8) {
        runtime().block_on(random_delivery(seed, files));
    }
}

/// DMS names carry sub-millisecond digits (`…-0100000002` is 200 µs past the second): the
/// watermark keeps them, so a later computation finds nothing to record — before, it was
/// kept in milliseconds and every merge and maintenance run committed it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watermark_with_sub_millisecond_digits_is_recorded_once() {
    let fx = Fixture::items();
    let f = fx.put_items(
        "20240101-0100000002.parquet",
        &[c('I', "2024-01-01 01:00:00.000000", 1, "a", 1)],
    );
    let p = progress(&fx.merge_ok(std::slice::from_ref(&f)).await);
    assert!(p.advanced);
    assert_eq!(
        p.watermark,
        Some(at(0) + chrono::Duration::microseconds(200))
    );
    let table = fx.url("curated/items");
    let v = tributary::delta::open(&table, &Default::default())
        .await
        .unwrap()
        .version();
    let p = progress(&fx.merge_ok(&[f]).await);
    assert!(!p.advanced, "{p:?}");
    assert_eq!(
        tributary::delta::open(&table, &Default::default())
            .await
            .unwrap()
            .version(),
        v,
        "a re-delivery commits nothing, not even the watermark again"
    );
}
