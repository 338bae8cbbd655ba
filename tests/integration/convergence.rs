//! Convergence under real delivery: random change streams, split into DMS files,
//! delivered shuffled and duplicated (sequentially in the property test, by ≥ 8 concurrent
//! invocations in the concurrency test). The table must equal the source's final state.

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tributary_tests::*;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// Every file delivered once, some twice (40 %), shuffled, in calls of one to three files.
async fn deliver_shuffled(fx: &Fixture, urls: &[url::Url], seed: u64) {
    deliver_shuffled_maintained(fx, urls, seed, 0.0).await;
}

/// As [`deliver_shuffled`], with maintenance (compaction, which materialises deletion
/// vectors; checkpoint; vacuum) run after a call with probability `maintain`.
async fn deliver_shuffled_maintained(fx: &Fixture, urls: &[url::Url], seed: u64, maintain: f64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut deliveries: Vec<url::Url> = Vec::new();
    for u in urls {
        deliveries.push(u.clone());
        if rng.random_bool(0.4) {
            deliveries.push(u.clone());
        }
    }
    deliveries.shuffle(&mut rng);
    let mut i = 0;
    while i < deliveries.len() {
        let n = rng.random_range(1..=3).min(deliveries.len() - i);
        fx.merge_ok(&deliveries[i..i + n]).await;
        i += n;
        if maintain > 0.0 && rng.random_bool(maintain) {
            fx.maintain().await;
        }
    }
}

/// As [`deliver_shuffled`], but every call under a deadline already passed
/// (`tributary::budget`): a type widening then rewrites one slice per call, staged, and the
/// files of that call fail with kind `widening`; they are delivered again at a random later
/// point, as SQS redelivers a failed message. Any other failure fails the test.
async fn deliver_shuffled_out_of_time(fx: &Fixture, urls: &[url::Url], seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut queue: std::collections::VecDeque<url::Url> = Default::default();
    for u in urls {
        queue.push_back(u.clone());
        if rng.random_bool(0.4) {
            queue.push_back(u.clone());
        }
    }
    queue.make_contiguous().shuffle(&mut rng);
    let mut calls = 0;
    while !queue.is_empty() {
        let n = rng.random_range(1..=3).min(queue.len());
        let call: Vec<url::Url> = queue.drain(..n).collect();
        let r =
            tributary::budget::within(std::time::Instant::now(), fx.engine.process(&call)).await;
        for f in &r.files {
            if let tributary::FileStatus::Failed { error, .. } = &f.status {
                assert_eq!(error.kind(), "widening", "{}: {error}", f.file);
                let at = rng.random_range(0..=queue.len());
                queue.insert(at, f.file.clone());
            }
        }
        calls += 1;
        assert!(calls < 10_000, "no progress");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 50, ..ProptestConfig::default() })]

    /// Any delivery order, any duplication, any grouping of files into invocations.
    #[test]
    fn shuffled_duplicated_delivery_converges(
        seed in any::<u64>(),
        keys in 1i64..8,
        changes in 1usize..25,
        max_file in 1usize..6,
        dup_seed in any::<u64>(),
    ) {
        let rt = runtime();
        let fx = Fixture::items();
        let (load, files) = history(seed, keys, changes, max_file);
        let (urls, expected) = land(&fx, &load, &files);
        rt.block_on(deliver_shuffled(&fx, &urls, dup_seed));
        let got = rt.block_on(fx.items_rows());
        prop_assert_eq!(got, expected);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: (cases() / 2).max(1), max_shrink_iters: 50, ..ProptestConfig::default() })]

    /// #46: with deletion vectors on (merges mark replaced and deleted rows in vectors,
    /// extend them, rewrite files most of whose rows go), any delivery order, duplication
    /// and grouping, and maintenance between merges materialising vectors: the same model.
    #[test]
    fn delivery_with_deletion_vectors_converges(
        seed in any::<u64>(),
        keys in 1i64..30,
        changes in 1usize..40,
        max_file in 1usize..6,
        dup_seed in any::<u64>(),
    ) {
        let rt = runtime();
        let fx = Fixture::new(&format!("{ITEMS_TABLE}deletion_vectors = true\nmanifests = false\n"));
        let (load, files) = history(seed, keys, changes, max_file);
        let (urls, expected) = land(&fx, &load, &files);
        rt.block_on(deliver_shuffled_maintained(&fx, &urls, dup_seed, 0.25));
        let got = rt.block_on(fx.items_rows());
        prop_assert_eq!(got, expected);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: (cases() / 4).max(1), max_shrink_iters: 20, ..ProptestConfig::default() })]

    /// #26: the source widens `id` and `val` from `int` to `bigint` part-way (the files
    /// before the cut are 32-bit, the later ones 64-bit with values past 2^31), delivered
    /// shuffled, duplicated and grouped at random: the table converges to the source's final
    /// state, in the wider type, whatever order the narrow and wide files came in. Half the
    /// cases run every call out of time, so that each widening is staged a slice per call
    /// (one data file each) over many calls, while narrow files merge in between.
    #[test]
    fn a_column_widened_part_way_converges(
        seed in any::<u64>(),
        keys in 1i64..8,
        changes in 2usize..20,
        max_file in 1usize..5,
        cut in 0usize..6,
        dup_seed in any::<u64>(),
        staged in any::<bool>(),
    ) {
        let rt = runtime();
        let fx = if staged {
            Fixture::new(&format!("{ITEMS_TABLE}slice_mb = 0.000001\n"))
        } else {
            Fixture::items()
        };
        let (load, mut files) = history(seed, keys, changes, max_file);
        let cut = cut.min(files.len());
        for f in files.iter_mut().skip(cut) {
            for c in f.iter_mut() {
                c.val += 1 << 40;
            }
        }
        let mut urls = Vec::new();
        if !load.is_empty() {
            let b = items_batch_int32(&load, false);
            urls.push(fx.put_batch("shop/items", "LOAD00000001.parquet", &b));
        }
        for (n, f) in files.iter().enumerate() {
            let name = format!("2024/01/01/20240101-{:010}.parquet", n + 1);
            let b = if n < cut { items_batch_int32(f, true) } else { items_batch(f, true) };
            urls.push(fx.put_batch("shop/items", &name, &b));
        }
        let mut all = load.clone();
        all.extend(files.iter().flatten().cloned());
        let expected = model(&all);
        if staged {
            rt.block_on(deliver_shuffled_out_of_time(&fx, &urls, dup_seed));
        } else {
            rt.block_on(deliver_shuffled(&fx, &urls, dup_seed));
        }
        let got = rt.block_on(fx.items_rows());
        prop_assert_eq!(got, expected);
        if cut < files.len() {
            let types = rt.block_on(fx.batch("curated/items", &["id", "val"], &[]));
            if types.num_rows() > 0 {
                let schema = types.schema();
                let t = format!("{},{}", schema.field(0).data_type(), schema.field(1).data_type());
                prop_assert_eq!(vec![t], vec!["Int64,Int64".to_string()]);
            }
        }
    }
}

/// ≥ 8 invocations merging files of one table at the same time, every file delivered
/// twice, in random order.
#[test]
fn concurrent_invocations_converge() {
    let rt = runtime();
    // Seeds 3 and 4 with deletion vectors: concurrent merges extending one file's vector
    // conflict (both remove it) and the loser plans again on the winner's vector.
    for seed in 0..5u64 {
        let vectors = if seed >= 3 {
            "deletion_vectors = true\nmanifests = false\n"
        } else {
            ""
        };
        let fx = Fixture::new(&ITEMS_TABLE.replace(
            "drop_columns",
            &format!("max_commit_attempts = 200\n{vectors}drop_columns"),
        ));
        let (load, files) = history(1000 + seed, 12, 80, 4);
        let (urls, expected) = land(&fx, &load, &files);
        let mut deliveries: Vec<url::Url> = urls.iter().chain(urls.iter()).cloned().collect();
        deliveries.shuffle(&mut StdRng::seed_from_u64(seed));
        let workers = 8;
        let got = rt.block_on(async {
            let mut tasks = Vec::new();
            for w in 0..workers {
                // each worker is a separate "Lambda instance" with its own engine
                let engine = fx.another_engine();
                let mine: Vec<url::Url> = deliveries
                    .iter()
                    .skip(w)
                    .step_by(workers)
                    .cloned()
                    .collect();
                tasks.push(tokio::spawn(async move {
                    let mut failures = Vec::new();
                    for chunk in mine.chunks(2) {
                        let r = engine.process(chunk).await;
                        failures.extend(r.failures().map(|f| format!("{f:?}")));
                    }
                    failures
                }));
            }
            let mut failures = Vec::new();
            for t in tasks {
                failures.extend(t.await.expect("task"));
            }
            assert!(failures.is_empty(), "failed merges: {failures:?}");
            fx.items_rows().await
        });
        assert_eq!(got, expected, "seed {seed}");
    }
}
