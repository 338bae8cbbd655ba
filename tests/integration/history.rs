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
    Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray,
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

fn config(flag: bool) -> String {
    if flag {
        format!("{TABLE}deletes = \"flag\"\n")
    } else {
        TABLE.to_string()
    }
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
fn generate(seed: u64, keys: i64, n: usize) -> Vec<Ch> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut present: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    let mut us = 0;
    let mut out = Vec::new();
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
/// version flagged as deleted (the deleted row's values), current until a re-insert.
fn model(changes: &[Ch], flag: bool) -> Vec<Row> {
    let mut out = Vec::new();
    // id → (t, u, start, deleted)
    let mut open: BTreeMap<i64, (i64, i64, i64, bool)> = BTreeMap::new();
    for c in changes {
        let prev = open.get(&c.id).copied();
        match (c.op, prev) {
            ('D', Some((_, _, _, true))) | ('D', None) => {}
            ('D', Some((t, u, start, false))) => {
                out.push((c.id, t, u, start, Some(c.us), false, false));
                open.remove(&c.id);
                if flag {
                    open.insert(c.id, (c.t, c.u, c.us, true));
                }
            }
            (_, Some((t, _, start, false))) if t == c.t => {
                open.insert(c.id, (t, c.u, start, false));
            }
            (_, prev) => {
                if let Some((t, u, start, deleted)) = prev {
                    out.push((c.id, t, u, start, Some(c.us), false, deleted));
                }
                open.insert(c.id, (c.t, c.u, c.us, false));
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
    batch(vec![
        ("Op", text(&|c| c.op.to_string())),
        ("ts", text(&|c| ts_text(c.us))),
        ("id", ints(&|c| c.id)),
        ("t", ints(&|c| c.t)),
        ("u", ints(&|c| c.u)),
    ])
}

/// Land the history as DMS files of random sizes (in DMS order).
fn land(fx: &Fixture, changes: &[Ch], rng: &mut StdRng, max_file: usize) -> Vec<url::Url> {
    let mut urls = Vec::new();
    let mut i = 0;
    while i < changes.len() {
        let n = rng.random_range(1..=max_file).min(changes.len() - i);
        let name = format!("2024/01/01/20240101-{:010}.parquet", urls.len() + 1);
        urls.push(fx.put_batch("h", &name, &file(&changes[i..i + n])));
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
    let batches = tributary::delta::query(
        &t,
        &format!(
            r#"SELECT id, t, u, CAST("__START_AT" AS BIGINT), CAST("__END_AT" AS BIGINT), is_current, {} FROM t"#,
            if flag { r#""__DELETED""# } else { "false" }
        ),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    for b in &batches {
        let col = |i: usize| cast(b.column(i), &DataType::Int64).unwrap();
        let (id, t, u, s, e) = (col(0), col(1), col(2), col(3), col(4));
        let cur = b.column(5).as_boolean();
        let deleted = b.column(6).as_boolean();
        for i in 0..b.num_rows() {
            let v = |a: &ArrayRef| a.as_primitive::<Int64Type>().value(i);
            out.push((
                v(&id),
                v(&t),
                v(&u),
                v(&s) - BASE_US,
                e.is_valid(i).then(|| v(&e) - BASE_US),
                cur.value(i),
                deleted.value(i),
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
    ) {
        let rt = runtime();
        let fx = Fixture::new(&config(flag));
        let changes = generate(seed, keys, n);
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
    }
}

/// 8 invocations merging every file twice, at the same time.
#[test]
fn concurrent_invocations_build_the_same_history() {
    let rt = runtime();
    for seed in 0..2u64 {
        let flag = seed == 1;
        let fx = Fixture::new(&config(flag));
        let changes = generate(500 + seed, 6, 50);
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
