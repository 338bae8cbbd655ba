//! Property test of the readers and the type coercion: random Arrow types per column and per
//! file (so files of one table disagree), random values (nulls, NaN, infinities, extremes,
//! sub-unit timestamps, decimals of every scale up to decimal(38,18) with all 38 digits,
//! dictionary-encoded and view-typed columns), random key types per run (int64,
//! decimal(38,0), uint64, dictionary, view text, with values no f64 holds), random grouping
//! of the files into calls.
//!
//! Every file either merges exactly — each of its values, read back from the table and
//! converted to the type it came in, is the value it had — or fails with a named error and
//! leaves no row; every merged key is found by a filtered read (file skipping by the log's
//! statistics keeps its file). And the table never depends on how the files were grouped.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tributary::deltalake::arrow::array::*;
use tributary::deltalake::arrow::compute::{cast_with_options, CastOptions};
use tributary::deltalake::arrow::datatypes::*;
use tributary::{FileStatus, ProcessReport};
use tributary_tests::*;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// The types the readers accept (and Delta can store, after mapping).
fn random_type(rng: &mut StdRng) -> DataType {
    let tz = Some(Arc::<str>::from(
        ["UTC", "+02:00", "-05:30"][rng.random_range(0..3)],
    ));
    match rng.random_range(0..20) {
        17 => DataType::Dictionary(
            Box::new(DataType::Int32),
            Box::new(
                [DataType::Utf8, DataType::Float64, DataType::Int64][rng.random_range(0..3)]
                    .clone(),
            ),
        ),
        18 => DataType::Utf8View,
        19 => DataType::Decimal128(38, rng.random_range(0..=18)),
        0 => DataType::Boolean,
        1 => DataType::Int8,
        2 => DataType::Int16,
        3 => DataType::Int32,
        4 => DataType::Int64,
        5 => DataType::UInt8,
        6 => DataType::UInt32,
        7 => DataType::UInt64,
        8 => DataType::Float32,
        9 => DataType::Float64,
        10 => DataType::Decimal128(rng.random_range(3..=38), rng.random_range(0..=3)),
        11 => DataType::Utf8,
        12 => DataType::LargeUtf8,
        13 => DataType::Binary,
        14 => DataType::Date32,
        15 => DataType::Timestamp(
            [
                TimeUnit::Millisecond,
                TimeUnit::Microsecond,
                TimeUnit::Nanosecond,
            ][rng.random_range(0..3)],
            if rng.random_bool(0.5) { tz } else { None },
        ),
        _ => DataType::Date64,
    }
}

/// `n` random values of a type, with nulls and edge values.
fn random_values(rng: &mut StdRng, dt: &DataType, n: usize) -> ArrayRef {
    let null = |rng: &mut StdRng| rng.random_bool(0.15);
    macro_rules! prim {
        ($arr:ty, $gen:expr) => {{
            let v: $arr = (0..n)
                .map(|_| if null(rng) { None } else { Some($gen(rng)) })
                .collect();
            Arc::new(v) as ArrayRef
        }};
    }
    let small = |rng: &mut StdRng| rng.random_range(-300i64..300);
    match dt {
        DataType::Boolean => prim!(BooleanArray, |r: &mut StdRng| r.random_bool(0.5)),
        DataType::Int8 => prim!(Int8Array, |r: &mut StdRng| pick(
            r,
            &[i8::MIN, i8::MAX, 0, -1, 7]
        )),
        DataType::Int16 => prim!(Int16Array, |r: &mut StdRng| small(r) as i16),
        DataType::Int32 => prim!(Int32Array, |r: &mut StdRng| pick(
            r,
            &[i32::MIN, i32::MAX, 5, -40000, 300]
        )),
        DataType::Int64 => prim!(Int64Array, |r: &mut StdRng| pick(
            r,
            &[i64::MIN, i64::MAX, 1 << 40, 5, -7, 1 << 53 | 1]
        )),
        DataType::UInt8 => prim!(UInt8Array, |r: &mut StdRng| pick(r, &[0, 5, 255])),
        DataType::UInt32 => prim!(UInt32Array, |r: &mut StdRng| pick(r, &[0, 5, u32::MAX])),
        DataType::UInt64 => prim!(UInt64Array, |r: &mut StdRng| pick(
            r,
            &[0, 5, u64::MAX, 1 << 63]
        )),
        DataType::Float32 => prim!(Float32Array, |r: &mut StdRng| pick(
            r,
            &[0.5, -0.0, 1.75, f32::NAN, f32::INFINITY, 3.0, 0.1, f32::MAX]
        )),
        DataType::Float64 => prim!(Float64Array, |r: &mut StdRng| pick(
            r,
            &[
                0.5,
                -0.0,
                1.75,
                f64::NAN,
                f64::NEG_INFINITY,
                3.0,
                0.1,
                1e300,
                2f64.powi(60)
            ]
        )),
        DataType::Dictionary(_, value) => {
            let values = random_values(rng, value, n);
            cast_with_options(&values, dt, &CastOptions::default()).expect("dictionary")
        }
        DataType::Utf8View => {
            let values = random_values(rng, &DataType::Utf8, n);
            cast_with_options(&values, dt, &CastOptions::default()).expect("view")
        }
        DataType::Decimal128(p, s) => {
            // every digit of the precision: a decimal(38,*) bound no f64 holds
            let max = 10i128.pow(u32::from(*p)) - 1;
            let v: Decimal128Array = (0..n)
                .map(|_| {
                    if null(rng) {
                        None
                    } else {
                        Some(pick(
                            rng,
                            &[
                                0,
                                1,
                                -1,
                                1234,
                                max,
                                -max,
                                10i128.pow(u32::from(*s as u8)),
                                max / 7,
                            ],
                        ))
                    }
                })
                .collect();
            Arc::new(v.with_precision_and_scale(*p, *s).expect("decimal"))
        }
        DataType::Utf8 | DataType::LargeUtf8 => {
            let v: StringArray = (0..n)
                .map(|_| {
                    if null(rng) {
                        None
                    } else {
                        Some(pick(
                            rng,
                            &[
                                "abc",
                                "5",
                                "-12",
                                "1.75",
                                "3.330",
                                "2024-01-01 00:00:00",
                                "true",
                                "",
                                "1e400",
                                "2024-02-30",
                                "007",
                            ],
                        ))
                    }
                })
                .collect();
            cast_with_options(&(Arc::new(v) as ArrayRef), dt, &CastOptions::default())
                .expect("string")
        }
        DataType::Binary => {
            let v: BinaryArray = (0..n)
                .map(|_| {
                    if null(rng) {
                        None
                    } else {
                        Some(pick(rng, &[&b"ab"[..], b"\xff\xfe", b""]))
                    }
                })
                .collect();
            Arc::new(v)
        }
        DataType::Date32 => prim!(Date32Array, |r: &mut StdRng| pick(
            r,
            &[0, 19_000, -1, 2_932_896]
        )),
        DataType::Date64 => prim!(Date64Array, |r: &mut StdRng| pick(
            r,
            &[0, 86_400_000, 1_700_000_000_000, -86_400_000]
        )),
        DataType::Timestamp(unit, tz) => {
            let base = 1_700_000_000i64;
            let raw: Vec<Option<i64>> = (0..n)
                .map(|_| {
                    if null(rng) {
                        return None;
                    }
                    let sub = pick(rng, &[0i64, 0, 1]);
                    Some(match unit {
                        TimeUnit::Second => base,
                        TimeUnit::Millisecond => base * 1_000 + sub,
                        TimeUnit::Microsecond => base * 1_000_000 + sub,
                        TimeUnit::Nanosecond => {
                            base * 1_000_000_000 + sub * 1_000 + pick(rng, &[0, 0, 1])
                        }
                    })
                })
                .collect();
            let a: ArrayRef = Arc::new(Int64Array::from(raw));
            let a = cast_with_options(
                &a,
                &DataType::Timestamp(*unit, None),
                &CastOptions::default(),
            )
            .expect("ts");
            cast_with_options(
                &a,
                &DataType::Timestamp(*unit, tz.clone()),
                &CastOptions::default(),
            )
            .expect("tz")
        }
        other => panic!("no generator for {other}"),
    }
}

fn pick<T: Copy>(rng: &mut StdRng, v: &[T]) -> T {
    v[rng.random_range(0..v.len())]
}

/// One generated file: its name, its data (with `Op`, `ts`, `id`) and its keys.
struct File {
    name: String,
    batch: RecordBatch,
}

/// Key types drawn for a run (one per run: every file of the table agrees): plain
/// integers, wide decimals (Oracle NUMBER(38)), unsigned (BIGINT UNSIGNED, stored as
/// decimal(20,0)), dictionary-encoded and view-typed text. Values large enough that a
/// bound through f64 would not hold them.
const KEY_BASE: i64 = 1_234_567_890_123_456_789;

fn key_type(rng: &mut StdRng) -> DataType {
    match rng.random_range(0..5) {
        0 => DataType::Int64,
        1 => DataType::Decimal128(38, 0),
        2 => DataType::UInt64,
        3 => DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Int64)),
        _ => DataType::Utf8View,
    }
}

fn key_values(dt: &DataType, ids: impl Iterator<Item = i64>) -> ArrayRef {
    let a: ArrayRef = Arc::new(Int64Array::from_iter_values(ids.map(|i| KEY_BASE + i)));
    let via = match dt {
        DataType::Utf8View => &DataType::Utf8,
        other => other,
    };
    let a = cast_with_options(&a, via, &CastOptions::default()).expect("key");
    cast_with_options(&a, dt, &CastOptions::default()).expect("key")
}

fn generate(seed: u64) -> Vec<File> {
    let mut rng = StdRng::seed_from_u64(seed);
    let columns = rng.random_range(1..=3);
    let key = key_type(&mut rng);
    let mut id = 0i64;
    (0..rng.random_range(2..=4))
        .map(|f| {
            let n = rng.random_range(1..=3);
            let mut cols: Vec<(String, ArrayRef)> = vec![
                ("Op".into(), strings(&vec!["I"; n])),
                ("ts".into(), strings(&vec!["2024-01-01 00:00:00.000000"; n])),
                ("id".into(), key_values(&key, (0..n).map(|i| id + i as i64))),
            ];
            id += n as i64;
            for c in 0..columns {
                if rng.random_bool(0.85) {
                    let dt = random_type(&mut rng);
                    cols.push((format!("c{c}"), random_values(&mut rng, &dt, n)));
                }
            }
            File {
                name: format!("20240101-{:010}.parquet", f + 1),
                batch: batch(cols.iter().map(|(n, a)| (n.as_str(), a.clone())).collect()),
            }
        })
        .collect()
}

/// Table rows by id: column name → value (as a one-row array).
async fn table_rows(fx: &Fixture) -> BTreeMap<i64, BTreeMap<String, ArrayRef>> {
    let t = tributary::delta::open(&fx.url("curated/t"), &Default::default())
        .await
        .unwrap();
    if !tributary::delta::exists(&t) {
        return BTreeMap::new();
    }
    let mut out = BTreeMap::new();
    for b in [table_batch(&t, &[], &[]).await] {
        let ids = cast_with_options(
            b.column_by_name("id").unwrap(),
            &DataType::Int64,
            &CastOptions::default(),
        )
        .unwrap();
        let ids = ids.as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            let row = b
                .schema()
                .fields()
                .iter()
                .enumerate()
                .map(|(j, f)| (f.name().clone(), b.column(j).slice(i, 1)))
                .collect();
            assert!(
                out.insert(ids.value(i), row).is_none(),
                "duplicate key {}",
                ids.value(i)
            );
        }
    }
    out
}

/// Rows a filter `id = <key>` (in the table's key type) finds, skipping files by the log's
/// statistics.
async fn found_by_key(fx: &Fixture, id: i64) -> usize {
    let t = tributary::delta::open(&fx.url("curated/t"), &Default::default())
        .await
        .unwrap();
    rows_where(&t, "id", &id.to_string(), &["id"]).await.len()
}

/// Whether a table value, converted back to the file's type, is the file's value.
fn same_value(file: &ArrayRef, row: usize, table: Option<&ArrayRef>) -> bool {
    // Judged as its decoded value: a dictionary as its values, a view as plain text.
    let want = file.slice(row, 1);
    let plain = match want.data_type() {
        DataType::Dictionary(_, v) => Some(v.as_ref().clone()),
        DataType::Utf8View => Some(DataType::Utf8),
        _ => None,
    };
    let want = match plain {
        Some(t) => cast_with_options(&want, &t, &CastOptions::default()).unwrap(),
        None => want,
    };
    let Some(got) = table else {
        return want.is_null(0);
    };
    if want.is_null(0) || got.is_null(0) {
        return want.is_null(0) && got.is_null(0);
    }
    if matches!(want.data_type(), DataType::Utf8 | DataType::LargeUtf8)
        && !matches!(
            got.data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        )
    {
        return same_parsed(&want, got);
    }
    let Ok(back) = cast_with_options(got, want.data_type(), &CastOptions::default()) else {
        return false;
    };
    if back.is_null(0) {
        return false;
    }
    match want.data_type() {
        DataType::Float32 | DataType::Float64 => {
            f64_of(&want) == f64_of(&back) || (f64_of(&want).is_nan() && f64_of(&back).is_nan())
        }
        _ => tributary::deltalake::arrow::compute::kernels::cmp::eq(&want, &back)
            .map(|r| r.value(0))
            .unwrap_or(false),
    }
}

fn f64_of(a: &ArrayRef) -> f64 {
    cast_with_options(a, &DataType::Float64, &CastOptions::default())
        .unwrap()
        .as_primitive::<Float64Type>()
        .value(0)
}

/// Text stored in a typed column: compare what the text says with the stored value,
/// independently of the conversion under test (numbers as Rust parses them, instants at
/// nanosecond precision).
fn same_parsed(text: &ArrayRef, got: &ArrayRef) -> bool {
    let t = cast_with_options(text, &DataType::Utf8, &CastOptions::default()).unwrap();
    let written = t.as_string::<i32>().value(0).to_string();
    let t = written.trim().to_string();
    match got.data_type() {
        // An integer gives its text back exactly (`007` is not 7).
        dt if dt.is_integer() => {
            let back = cast_with_options(got, &DataType::Utf8, &CastOptions::default()).unwrap();
            back.is_valid(0) && back.as_string::<i32>().value(0) == written
        }
        DataType::Float32 => t
            .parse::<f32>()
            .map(|v| f64::from(v) == f64_of(got))
            .unwrap_or(false),
        dt if dt.is_numeric() => t.parse::<f64>().map(|v| v == f64_of(got)).unwrap_or(false),
        DataType::Date32 | DataType::Date64 | DataType::Timestamp(..) => {
            let ns = DataType::Timestamp(TimeUnit::Nanosecond, None);
            let a = cast_with_options(text, &ns, &CastOptions::default()).unwrap();
            let b = cast_with_options(got, &ns, &CastOptions::default()).unwrap();
            a.is_valid(0)
                && b.is_valid(0)
                && a.as_primitive::<TimestampNanosecondType>().value(0)
                    == b.as_primitive::<TimestampNanosecondType>().value(0)
        }
        _ => {
            let back = cast_with_options(got, &DataType::Utf8, &CastOptions::default()).unwrap();
            back.is_valid(0) && back.as_string::<i32>().value(0) == t
        }
    }
}

/// Check the oracle for one run; returns the names of the files that failed.
async fn check_run(
    fx: &Fixture,
    files: &[File],
    reports: &[ProcessReport],
    filtered: bool,
) -> Vec<String> {
    let rows = table_rows(fx).await;
    let mut failed = Vec::new();
    for f in files {
        let status = reports
            .iter()
            .flat_map(|r| &r.files)
            .find(|o| o.file.path().ends_with(&f.name))
            .map(|o| &o.status)
            .expect("an outcome for every file");
        let ids = cast_with_options(
            f.batch.column_by_name("id").unwrap(),
            &DataType::Int64,
            &CastOptions::default(),
        )
        .unwrap()
        .as_primitive::<Int64Type>()
        .clone();
        match status {
            FileStatus::Merged { .. } => {
                for i in 0..f.batch.num_rows() {
                    if filtered {
                        // Found by a filter on the key: file skipping by the log's
                        // statistics must keep the file that holds it.
                        assert_eq!(
                            found_by_key(fx, ids.value(i)).await,
                            1,
                            "{}: key {} not found by a filtered read",
                            f.name,
                            ids.value(i)
                        );
                    }
                    let row = rows
                        .get(&ids.value(i))
                        .unwrap_or_else(|| panic!("{}: row {} missing", f.name, ids.value(i)));
                    for (j, field) in f.batch.schema().fields().iter().enumerate() {
                        if ["Op", "ts", "id"].contains(&field.name().as_str()) {
                            continue;
                        }
                        let got = row.get(field.name());
                        assert!(
                            same_value(f.batch.column(j), i, got),
                            "{}: row {} column {} changed: {:?} ({}) became {:?}",
                            f.name,
                            i + 1,
                            field.name(),
                            f.batch.column(j).slice(i, 1),
                            field.data_type(),
                            got
                        );
                    }
                }
            }
            FileStatus::Failed { error, .. } => {
                let m = error.to_string();
                assert!(m.contains(&f.name), "the error must name the file: {m}");
                assert!(
                    ["bad_input", "type_change", "schema"].contains(&error.kind()),
                    "{m}"
                );
                for i in 0..ids.len() {
                    assert!(
                        !rows.contains_key(&ids.value(i)),
                        "{}: failed but row {} landed",
                        f.name,
                        ids.value(i)
                    );
                }
                failed.push(f.name.clone());
            }
            FileStatus::Ignored { .. } => panic!("{} was ignored", f.name),
        }
    }
    failed
}

fn land(fx: &Fixture, files: &[File]) -> Vec<url::Url> {
    files
        .iter()
        .map(|f| fx.put_batch("t", &f.name, &f.batch))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 20, ..ProptestConfig::default() })]

    /// Exact or a named error; and one file per call equals any grouping into calls.
    #[test]
    fn every_file_merges_exactly_or_fails_by_name(seed in any::<u64>(), grouping in any::<u64>()) {
        let rt = runtime();
        let files = generate(seed);
        let alone = Fixture::new(T_TABLE);
        let urls = land(&alone, &files);
        let mut reports = Vec::new();
        rt.block_on(async {
            for u in &urls {
                reports.push(alone.engine.process(std::slice::from_ref(u)).await);
            }
        });
        let failed_alone = rt.block_on(check_run(&alone, &files, &reports, true));

        let grouped = Fixture::new(T_TABLE);
        let urls = land(&grouped, &files);
        let mut rng = StdRng::seed_from_u64(grouping);
        let mut reports = Vec::new();
        rt.block_on(async {
            let mut i = 0;
            while i < urls.len() {
                let n = rng.random_range(1..=urls.len() - i);
                reports.push(grouped.engine.process(&urls[i..i + n]).await);
                i += n;
            }
        });
        let failed_grouped = rt.block_on(check_run(&grouped, &files, &reports, false));
        prop_assert_eq!(&failed_alone, &failed_grouped, "the same files fail however they are grouped");
        let (a, g) = rt.block_on(async { (table_rows(&alone).await, table_rows(&grouped).await) });
        prop_assert_eq!(format!("{a:?}"), format!("{g:?}"), "the same table however files are grouped");
    }
}
