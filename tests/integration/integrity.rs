//! Regressions of the data-integrity edges (issue #10): types, batching, skipped files,
//! partition values, names and the tombstone horizon. Each one ended in wrong data (or a
//! silently skipped file) with success before its fix.

use std::sync::Arc;

use tributary::deltalake::arrow::array::{
    ArrayRef, Decimal128Array, DictionaryArray, Float64Array, Int32Array, Int64Array,
    TimestampMicrosecondArray,
};
use tributary::deltalake::arrow::datatypes::Int32Type;
use tributary::maintenance::{self, MaintenanceOptions};
use tributary::{delta, manifest, FileStatus};
use tributary_tests::*;

fn ints(v: &[i64]) -> ArrayRef {
    Arc::new(Int64Array::from(v.to_vec()))
}

fn ts(s: u32) -> String {
    format!("2024-01-01 00:00:{s:02}.000000")
}

/// A CDC file of table `t`: Op, ts, id and extra columns.
fn cdc(
    fx: &Fixture,
    name: &str,
    op: &str,
    t: u32,
    id: i64,
    extra: Vec<(&str, ArrayRef)>,
) -> url::Url {
    let mut cols = vec![
        ("Op", strings(&[op])),
        ("ts", strings(&[&ts(t)])),
        ("id", ints(&[id])),
    ];
    cols.extend(extra);
    fx.put_batch("t", name, &batch(cols))
}

/// One column of the table `t` as text (`NULL` for nulls), rows sorted by `order_by`.
async fn t_column(fx: &Fixture, column: &str, order_by: &[&str]) -> Vec<String> {
    fx.column("curated/t", column, order_by).await
}

/// The rows of the table `t`, each as its `columns`' values joined by `sep` (nulls as
/// `NULL`), sorted by `order_by`.
async fn t_joined(fx: &Fixture, columns: &[&str], sep: &str, order_by: &[&str]) -> Vec<String> {
    let rows = fx.rows("curated/t", columns, order_by).await;
    rows.into_iter().map(|r| r.join(sep)).collect()
}

async fn maintain(fx: &Fixture) -> tributary::Result<maintenance::MaintenanceReport> {
    let engine = fx.another_engine();
    let t = &engine.config().tables[0];
    maintenance::maintain(
        t,
        engine.storage(),
        engine.storage_options(),
        MaintenanceOptions::default(),
    )
    .await
}

// ---- types ------------------------------------------------------------------------------

/// Files of one batch that disagree on a new column's type: the first file (canonical order)
/// sets it; a later file of a wider type widens it (#26: `int` then `bigint`, every value
/// kept); a value that fits neither fails its file with row, column and value — never NULL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_types_in_one_batch_widen_or_fail_the_file_instead_of_nulling() {
    let fx = Fixture::new(T_TABLE);
    let f1 = cdc(
        &fx,
        "20240101-0000000001.parquet",
        "I",
        1,
        1,
        vec![("n", Arc::new(Int32Array::from(vec![5])))],
    );
    let f2 = cdc(
        &fx,
        "20240101-0000000002.parquet",
        "I",
        2,
        2,
        vec![("n", ints(&[1 << 40]))],
    );
    let f3 = cdc(
        &fx,
        "20240101-0000000003.parquet",
        "I",
        3,
        3,
        vec![("n", strings(&["abc"]))],
    );
    let r = fx
        .engine
        .process(&[f3.clone(), f2.clone(), f1.clone()])
        .await;
    assert_eq!(r.failures().count(), 1, "{:?}", r.files);
    let e3 = Fixture::failure(&r, &f3).to_string();
    assert!(e3.contains("column `n`") && e3.contains("abc"), "{e3}");
    assert_eq!(
        t_column(&fx, "n", &["id"]).await,
        vec!["5", "1099511627776"]
    );
    assert_eq!(
        fx.batch("curated/t", &["n"], &[])
            .await
            .schema()
            .fields()
            .iter()
            .map(|f| f.data_type().to_string())
            .collect::<Vec<_>>(),
        vec!["Int64"]
    );

    // The same files one per call (canonical order): the same table and the same failures;
    // the second call widens the table.
    let one = Fixture::new(T_TABLE);
    for (name, id, n) in [
        ("20240101-0000000001.parquet", 1, None),
        ("20240101-0000000002.parquet", 2, Some(1i64 << 40)),
    ] {
        let n: ArrayRef = match n {
            None => Arc::new(Int32Array::from(vec![5])),
            Some(v) => ints(&[v]),
        };
        let f = cdc(&one, name, "I", id as u32, id, vec![("n", n)]);
        let r = one.engine.process(&[f]).await;
        assert_eq!(r.failures().count(), 0, "{:?}", r.files);
        let widened: Vec<String> = r.tables.iter().flat_map(|t| t.widened.clone()).collect();
        match id {
            1 => assert!(widened.is_empty(), "{widened:?}"),
            _ => assert_eq!(widened, vec!["n: Int32 -> Int64"]),
        }
    }
    assert_eq!(
        t_column(&one, "n", &["id"]).await,
        vec!["5", "1099511627776"]
    );
}

/// The same for the key: a key of a wider integer type widens the key column (#26); a key
/// that fits neither type is never written as NULL (a lost row and a NULL key before #10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_a_conflicting_type_widens_the_key_or_fails_never_nulled() {
    let fx = Fixture::new(T_TABLE);
    let key_file = |name: &str, t: u32, id: ArrayRef| {
        fx.put_batch(
            "t",
            name,
            &batch(vec![
                ("Op", strings(&["I"])),
                ("ts", strings(&[&ts(t)])),
                ("id", id),
            ]),
        )
    };
    let narrow = key_file(
        "20240101-0000000001.parquet",
        1,
        Arc::new(Int32Array::from(vec![1])),
    );
    let wide = key_file("20240101-0000000002.parquet", 2, ints(&[1 << 40]));
    let r = fx.engine.process(&[narrow, wide.clone()]).await;
    assert_eq!(r.failures().count(), 0, "{:?}", r.files);
    let fraction = key_file(
        "20240101-0000000003.parquet",
        3,
        Arc::new(Float64Array::from(vec![1.5])),
    );
    let r = fx.engine.process(std::slice::from_ref(&fraction)).await;
    let e = Fixture::failure(&r, &fraction);
    assert_eq!(e.kind(), "type_change", "{e}");
    let e = e.to_string();
    assert!(
        e.contains("column `id`") && e.contains("1.5") && e.contains("reload the table"),
        "{e}"
    );
    assert_eq!(
        t_column(&fx, "id", &["id"]).await,
        vec!["1", "1099511627776"]
    );
}

/// Values that an existing column cannot hold exactly fail with file, row, column, value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy_conversions_into_existing_columns_fail() {
    let fx = Fixture::new(T_TABLE);
    let dec = |v: i128, s: i8| -> ArrayRef {
        Arc::new(
            Decimal128Array::from(vec![v])
                .with_precision_and_scale(10, s)
                .unwrap(),
        )
    };
    let base = cdc(
        &fx,
        "20240101-0000000001.parquet",
        "I",
        1,
        1,
        vec![("v", ints(&[7])), ("d", dec(123, 2))],
    );
    fx.merge_ok(&[base]).await;
    let double = cdc(
        &fx,
        "20240101-0000000002.parquet",
        "U",
        2,
        1,
        vec![
            ("v", Arc::new(Float64Array::from(vec![1.75]))),
            ("d", dec(123, 2)),
        ],
    );
    let finer = cdc(
        &fx,
        "20240101-0000000003.parquet",
        "U",
        3,
        1,
        vec![("v", ints(&[8])), ("d", dec(1234, 3))],
    );
    let exact = cdc(
        &fx,
        "20240101-0000000004.parquet",
        "U",
        4,
        1,
        vec![
            ("v", Arc::new(Float64Array::from(vec![2.0]))),
            ("d", dec(1250, 3)),
        ],
    );
    for (f, value) in [(&double, "1.75"), (&finer, "1.234")] {
        let r = fx.engine.process(std::slice::from_ref(f)).await;
        let e = Fixture::failure(&r, f).to_string();
        assert!(
            e.contains("row 1") && e.contains(value) && e.contains("exactly"),
            "{e}"
        );
    }
    fx.merge_ok(&[exact]).await;
    assert_eq!(t_joined(&fx, &["v", "d"], " ", &[]).await, vec!["2 1.25"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_text_that_a_decimal_column_cannot_hold_fails() {
    let fx = Fixture::new(
        r#"
[[table]]
name = "t"
source = "raw/t/"
target = "curated/t"
primary_key = ["id"]
format = "csv"
[table.csv]
header = true
columns = [{ name = "id", type = "int64" }, { name = "amount", type = "decimal(10,2)" }]
"#,
    );
    let bad = fx.put_raw("t", "LOAD00000001.csv", b"id,amount\n1,1.10\n2,3.333\n");
    let r = fx.engine.process(std::slice::from_ref(&bad)).await;
    let e = Fixture::failure(&r, &bad).to_string();
    assert!(
        e.contains("row 2, column `amount`") && e.contains("3.333"),
        "{e}"
    );
    let good = fx.put_raw("t", "LOAD00000002.csv", b"id,amount\n1,1.10\n2,3.330\n");
    fx.merge_ok(&[good]).await;
    assert_eq!(t_column(&fx, "amount", &["id"]).await, vec!["1.10", "3.33"]);
}

/// Issue #23: `zip int64` held 2134 and a file with the text `'02134'` merged as 2134. Text
/// goes into an integer column only as the integer writes it back; anything else fails the
/// file with its name, the row, the column and the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_that_is_not_an_integers_canonical_form_fails_instead_of_losing_its_zeros() {
    let fx = Fixture::new(T_TABLE);
    let base = cdc(
        &fx,
        "20240101-0000000001.parquet",
        "I",
        1,
        1,
        vec![("zip", ints(&[2134]))],
    );
    fx.merge_ok(&[base]).await;
    for (i, text) in ["02134", "+5", " 7", "1e3"].into_iter().enumerate() {
        let name = format!("20240101-000000001{i}.parquet");
        let f = cdc(&fx, &name, "U", 2, 1, vec![("zip", strings(&[text]))]);
        let r = fx.engine.process(std::slice::from_ref(&f)).await;
        let e = Fixture::failure(&r, &f).to_string();
        assert!(
            e.contains(&name)
                && e.contains("row 1, column `zip`")
                && e.contains(&format!("{text:?}")),
            "{e}"
        );
    }
    let canonical = cdc(
        &fx,
        "20240101-0000000003.parquet",
        "U",
        3,
        1,
        vec![("zip", strings(&["-5"]))],
    );
    fx.merge_ok(&[canonical]).await;
    assert_eq!(t_column(&fx, "zip", &[]).await, vec!["-5"]);
}

// ---- batching ---------------------------------------------------------------------------

/// A file that lacks a column of the table leaves that column as it was, whether it is
/// merged alone or with a file that has the column (before: NULL in the second case).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_column_means_unchanged_however_files_are_batched() {
    let setup = |fx: &Fixture| {
        cdc(
            fx,
            "20240101-0000000001.parquet",
            "I",
            1,
            1,
            vec![("v", ints(&[1])), ("c", strings(&["x"]))],
        )
    };
    let lacks_c = |fx: &Fixture| {
        cdc(
            fx,
            "20240101-0000000003.parquet",
            "U",
            3,
            1,
            vec![("v", ints(&[2]))],
        )
    };
    let other_key = |fx: &Fixture| {
        cdc(
            fx,
            "20240101-0000000004.parquet",
            "I",
            4,
            2,
            vec![("v", ints(&[9])), ("c", strings(&["y"]))],
        )
    };
    let earlier_c = |fx: &Fixture| {
        cdc(
            fx,
            "20240101-0000000002.parquet",
            "U",
            2,
            1,
            vec![("v", ints(&[5])), ("c", strings(&["z"]))],
        )
    };
    // id:v:c, by id
    let cols = ["id", "v", "c"];
    // alone, then with another file that has the column
    let alone = Fixture::new(T_TABLE);
    alone.merge_ok(&[setup(&alone)]).await;
    alone.merge_ok(&[lacks_c(&alone)]).await;
    alone.merge_ok(&[other_key(&alone)]).await;
    let together = Fixture::new(T_TABLE);
    together.merge_ok(&[setup(&together)]).await;
    together
        .merge_ok(&[lacks_c(&together), other_key(&together)])
        .await;
    let want = vec!["1:2:x".to_string(), "2:9:y".to_string()];
    assert_eq!(t_joined(&alone, &cols, ":", &["id"]).await, want);
    assert_eq!(t_joined(&together, &cols, ":", &["id"]).await, want);
    // an earlier change in the same batch sets the column, the later one keeps it
    let chain = Fixture::new(T_TABLE);
    chain.merge_ok(&[setup(&chain)]).await;
    chain.merge_ok(&[lacks_c(&chain), earlier_c(&chain)]).await;
    assert_eq!(t_joined(&chain, &cols, ":", &["id"]).await, vec!["1:2:z"]);
    // ... unless the table already has a newer change than that earlier one
    let stale = Fixture::new(T_TABLE);
    stale.merge_ok(&[setup(&stale)]).await;
    stale.merge_ok(&[lacks_c(&stale)]).await;
    stale.merge_ok(&[lacks_c(&stale), earlier_c(&stale)]).await;
    assert_eq!(t_joined(&stale, &cols, ":", &["id"]).await, vec!["1:2:x"]);
}

const NO_SUP_TABLE: &str = r#"
[[table]]
name = "t"
source = "raw/t/"
target = "curated/t"
primary_key = ["id"]
sequence_by = ["ts"]
change_data_feed = true
format = "csv"
[table.csv]
header = false
no_sup_value = "__NOSUP__"
columns = [{ name = "ts", type = "timestamp" }, { name = "id", type = "int64" }, { name = "v", type = "string" }, { name = "n", type = "int64" }]
[table.history]
target = "curated/t_history"
"#;

/// Issue #23: with DMS `UseCsvNoSupValue`, a column the source did not log for a change
/// comes as the endpoint's `CsvNoSupValue` text, and that text was stored as the value (or
/// failed the file as a type error). With `csv.no_sup_value` the change leaves the column as
/// it was — in the table, its history and its change feed — however the files are batched;
/// in an insert it fails the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_sup_placeholder_leaves_the_column_as_it_was() {
    let load = |fx: &Fixture| {
        fx.put_raw(
            "t",
            "LOAD00000001.csv",
            b"2024-01-01 00:00:00,1,a,10\n2024-01-01 00:00:00,2,b,20\n",
        )
    };
    let first = |fx: &Fixture| {
        fx.put_raw(
            "t",
            "20240101-0000000001.csv",
            b"U,2024-01-01 00:00:01,1,__NOSUP__,11\n",
        )
    };
    let second = |fx: &Fixture| {
        fx.put_raw(
            "t",
            "20240101-0000000002.csv",
            b"U,2024-01-01 00:00:02,1,c,__NOSUP__\nU,2024-01-01 00:00:03,1,__NOSUP__,13\nD,2024-01-01 00:00:04,2,__NOSUP__,__NOSUP__\n",
        )
    };
    // id:v:n, by id
    let cols = ["id", "v", "n"];
    /// v:n of the history's versions of id 1, by start.
    async fn history(fx: &Fixture) -> Vec<String> {
        let h = fx.rows("curated/t_history", &["id", "v", "n"], &["__START_AT"]);
        let h = h.await.into_iter().filter(|r| r[0] == "1");
        h.map(|r| r[1..].join(":")).collect()
    }
    let alone = Fixture::new(NO_SUP_TABLE);
    alone.merge_ok(&[load(&alone)]).await;
    alone.merge_ok(&[first(&alone)]).await;
    assert_eq!(
        t_joined(&alone, &cols, ":", &["id"]).await,
        vec!["1:a:11", "2:b:20"]
    );
    alone.merge_ok(&[second(&alone)]).await;
    let together = Fixture::new(NO_SUP_TABLE);
    together.merge_ok(&[load(&together)]).await;
    together
        .merge_ok(&[first(&together), second(&together)])
        .await;
    for fx in [&alone, &together] {
        assert_eq!(t_joined(fx, &cols, ":", &["id"]).await, vec!["1:c:13"]);
        assert_eq!(history(fx).await, vec!["a:10", "a:11", "c:11", "c:13"]);
        // The change feed's images are the table's rows: never the text, never NULL.
        let feed = change_feed_values(&fx.url("curated/t")).await;
        assert!(
            !feed.is_empty()
                && feed
                    .iter()
                    .all(|r| !r.contains("NULL") && !r.contains("NOSUP")),
            "{feed:?}"
        );
    }

    let insert = alone.put_raw(
        "t",
        "20240101-0000000003.csv",
        b"I,2024-01-01 00:00:05,3,__NOSUP__,30\n",
    );
    let r = alone.engine.process(std::slice::from_ref(&insert)).await;
    let e = Fixture::failure(&r, &insert);
    assert!(
        e.kind() == "bad_input"
            && e.to_string().contains("row 1, column `v`")
            && e.to_string().contains("an insert"),
        "{e}"
    );
    assert_eq!(t_joined(&alone, &cols, ":", &["id"]).await, vec!["1:c:13"]);
}

/// Every row image of the table's change data feed, `id:v:n`.
async fn change_feed_values(table: &url::Url) -> Vec<String> {
    let feed = change_data_feed(table, 0).await;
    let at = ["id", "v", "n", "_change_type"].map(|c| feed.schema().index_of(c).unwrap());
    let rows = text_rows(&feed.project(&at).unwrap());
    rows.into_iter().map(|r| r.join(":")).collect()
}

/// A delete then a re-insert without the column, in one batch: the column starts empty
/// (as merged one by one), instead of keeping the deleted row's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reinsert_after_a_delete_in_one_batch_starts_without_the_old_value() {
    let fx = Fixture::new(T_TABLE);
    fx.merge_ok(&[cdc(
        &fx,
        "20240101-0000000001.parquet",
        "I",
        1,
        1,
        vec![("v", ints(&[1])), ("c", strings(&["x"]))],
    )])
    .await;
    let del = cdc(
        &fx,
        "20240101-0000000002.parquet",
        "D",
        2,
        1,
        vec![("v", ints(&[1])), ("c", strings(&["x"]))],
    );
    let ins = cdc(
        &fx,
        "20240101-0000000003.parquet",
        "I",
        3,
        1,
        vec![("v", ints(&[3]))],
    );
    fx.merge_ok(&[ins, del]).await;
    assert_eq!(t_joined(&fx, &["v", "c"], ":", &[]).await, vec!["3:NULL"]);
}

/// Sequence values of different types name the same instants the same way (before: a
/// timestamp compared with an ISO string by its text, and the older change won).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_values_of_different_types_order_by_their_instant() {
    let fx = Fixture::new(T_TABLE);
    let micros = |s: i64| 1_704_067_200_000_000 + s * 1_000_000; // 2024-01-01 00:00:00 UTC
    let typed = fx.put_batch(
        "t",
        "20240101-0000000001.parquet",
        &batch(vec![
            ("Op", strings(&["U"])),
            (
                "ts",
                Arc::new(TimestampMicrosecondArray::from(vec![micros(5)]).with_timezone("+02:00")),
            ),
            ("id", ints(&[1])),
            ("v", ints(&[5])),
        ]),
    );
    let iso_older = fx.put_batch(
        "t",
        "20240101-0000000002.parquet",
        &batch(vec![
            ("Op", strings(&["U"])),
            ("ts", strings(&["2024-01-01T00:00:04Z"])),
            ("id", ints(&[1])),
            ("v", ints(&[4])),
        ]),
    );
    let dms_newer = fx.put_batch(
        "t",
        "20240101-0000000003.parquet",
        &batch(vec![
            ("Op", strings(&["U"])),
            ("ts", strings(&["2024-01-01 00:00:06.000000"])),
            ("id", ints(&[2])),
            ("v", ints(&[6])),
        ]),
    );
    fx.merge_ok(&[typed]).await;
    fx.merge_ok(&[iso_older]).await;
    fx.merge_ok(&[dms_newer]).await;
    assert_eq!(t_column(&fx, "v", &["id"]).await, vec!["5", "6"]);
    // an integer sequence where the table orders by timestamps cannot be compared: refused
    let int_seq = fx.put_batch(
        "t",
        "20240101-0000000004.parquet",
        &batch(vec![
            ("Op", strings(&["U"])),
            ("ts", ints(&[99])),
            ("id", ints(&[1])),
            ("v", ints(&[7])),
        ]),
    );
    let r = fx.engine.process(std::slice::from_ref(&int_seq)).await;
    let e = Fixture::failure(&r, &int_seq).to_string();
    assert!(e.contains("integer") && e.contains("timestamp"), "{e}");
}

// ---- files that used to be skipped -------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_compressed_csv_is_read_and_a_corrupt_one_fails() {
    use std::io::Write;
    let fx = Fixture::new(
        r#"
[[table]]
name = "t"
source = "raw/t/"
target = "curated/t"
primary_key = ["id"]
format = "csv"
[table.csv]
header = false
columns = [{ name = "id", type = "int64" }, { name = "v", type = "string" }]
"#,
    );
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(b"1,one\n2,two\n").unwrap();
    let load = fx.put_raw("t", "LOAD00000001.csv.gz", &gz.finish().unwrap());
    let r = fx.merge_ok(std::slice::from_ref(&load)).await;
    assert!(matches!(r.files[0].status, FileStatus::Merged { .. }));
    assert_eq!(t_column(&fx, "v", &["id"]).await, vec!["one", "two"]);
    let broken = fx.put_raw("t", "20240101-0000000001.csv.gz", b"\x1f\x8b\x08 not gzip");
    let r = fx.engine.process(std::slice::from_ref(&broken)).await;
    let e = Fixture::failure(&r, &broken).to_string();
    assert!(e.contains("gzip"), "{e}");
}

/// Keys with `%` (a literal percent sign in an S3 key) are read, listed and merged; so are
/// files under a source folder with `%` in its name (before: "not found" / "ignored").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn percent_signs_in_keys_and_source_folders_are_not_decoded_twice() {
    let fx = Fixture::new(&T_TABLE.replace("raw/t/", "raw/100%25 t/"));
    let file = batch(vec![
        ("Op", strings(&["I"])),
        ("ts", strings(&[&ts(1)])),
        ("id", ints(&[1])),
    ]);
    let a = fx.put_batch("100%25 t", "2024%2001.parquet", &file);
    assert!(fx.path("raw/100%25 t/2024%2001.parquet").is_file());
    let mut prefix = fx.url("raw/100%25 t");
    prefix.set_path(&format!("{}/", prefix.path()));
    let listed = fx.engine.storage().list(&prefix).await.unwrap();
    assert_eq!(listed.len(), 1);
    let r = fx.merge_ok(&listed).await;
    assert!(
        matches!(r.files[0].status, FileStatus::Merged { .. }),
        "{:?}",
        r.files
    );
    let r = fx.merge_ok(&[a]).await;
    assert!(matches!(r.files[0].status, FileStatus::Merged { .. }));
    assert_eq!(t_column(&fx, "id", &[]).await, vec!["1"]);
}

// ---- names and keys ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_names_duplicate_columns_and_nan_keys_are_refused() {
    let fx = Fixture::new(T_TABLE);
    let internal = cdc(
        &fx,
        "20240101-0000000001.parquet",
        "I",
        1,
        1,
        vec![("_tributary_op", strings(&["x"]))],
    );
    let dup = cdc(
        &fx,
        "20240101-0000000002.parquet",
        "I",
        2,
        2,
        vec![("v", ints(&[1])), ("V", ints(&[2]))],
    );
    let r = fx.engine.process(&[internal.clone(), dup.clone()]).await;
    let e = Fixture::failure(&r, &internal);
    assert!(
        e.to_string().contains("`_tributary_op`") && e.kind() == "bad_input",
        "{e}"
    );
    let e = Fixture::failure(&r, &dup).to_string();
    assert!(e.contains("two columns"), "{e}");

    let fx = Fixture::new(&T_TABLE.replace("[\"id\"]", "[\"k\"]"));
    let f = |name: &str, k: f64, v: i64, t: u32| {
        fx.put_batch(
            "t",
            name,
            &batch(vec![
                ("Op", strings(&["U"])),
                ("ts", strings(&[&ts(t)])),
                ("k", Arc::new(Float64Array::from(vec![k]))),
                ("v", ints(&[v])),
            ]),
        )
    };
    let nan = f("20240101-0000000001.parquet", f64::NAN, 1, 1);
    let r = fx.engine.process(std::slice::from_ref(&nan)).await;
    assert!(Fixture::failure(&r, &nan).to_string().contains("NaN"));
    fx.merge_ok(&[f("20240101-0000000002.parquet", 0.0, 1, 2)])
        .await;
    fx.merge_ok(&[f("20240101-0000000003.parquet", -0.0, 2, 3)])
        .await;
    assert_eq!(
        t_column(&fx, "v", &[]).await,
        vec!["2"],
        "0.0 and -0.0 are one key"
    );
}

/// Issue #23: a column whose name differs from a table column only by case (`Name` where
/// the table has `name`) failed as a `delta` error with an Arrow message. It fails the file
/// as bad input naming both spellings, against the table or another file of the batch; so
/// does `_TRIBUTARY_SEQ` (tributary's own column, whatever its case).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_that_differs_from_another_only_by_case_fails_naming_both() {
    let fx = Fixture::new(T_TABLE);
    let base = cdc(
        &fx,
        "20240101-0000000001.parquet",
        "I",
        1,
        1,
        vec![("name", strings(&["a"]))],
    );
    fx.merge_ok(&[base]).await;
    let upper = cdc(
        &fx,
        "20240101-0000000002.parquet",
        "U",
        2,
        1,
        vec![("Name", strings(&["b"]))],
    );
    let r = fx.engine.process(std::slice::from_ref(&upper)).await;
    let e = Fixture::failure(&r, &upper);
    assert!(
        e.kind() == "bad_input"
            && e.to_string()
                .contains("column `Name` of the file collides with the table's column `name`")
            && e.to_string().contains("case-insensitive"),
        "{e}"
    );

    let lower = cdc(
        &fx,
        "20240101-0000000003.parquet",
        "U",
        3,
        1,
        vec![("extra", strings(&["x"]))],
    );
    let mixed = cdc(
        &fx,
        "20240101-0000000004.parquet",
        "U",
        4,
        1,
        vec![("EXTRA", strings(&["y"]))],
    );
    let r = fx.engine.process(&[lower.clone(), mixed.clone()]).await;
    let e = Fixture::failure(&r, &mixed);
    assert!(
        e.kind() == "bad_input"
            && e.to_string().contains("`EXTRA`")
            && e.to_string().contains("another file of this batch `extra`"),
        "{e}"
    );
    assert!(matches!(
        r.files.iter().find(|f| f.file == lower).map(|f| &f.status),
        Some(FileStatus::Merged { .. })
    ));

    let seq = cdc(
        &fx,
        "20240101-0000000005.parquet",
        "U",
        5,
        1,
        vec![("_TRIBUTARY_SEQ", strings(&["z"]))],
    );
    let r = fx.engine.process(std::slice::from_ref(&seq)).await;
    let e = Fixture::failure(&r, &seq);
    assert!(
        e.kind() == "bad_input" && e.to_string().contains("internal sequence column"),
        "{e}"
    );
    assert_eq!(
        fx.values("curated/t", &["name", "extra"], &[])
            .await
            .into_iter()
            .map(|r| concat(&[r[0].clone(), Some(":".into()), r[1].clone()]))
            .collect::<Vec<_>>(),
        vec!["a:x"]
    );
}

/// Issue #23: a key written as `dictionary<int32, float64>` holding NaN merged (rows with
/// NaN keys no change could match again) while a plain float64 NaN key was refused. Every
/// input rule judges the decoded values, whatever the layout the file chose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dictionary_encoded_nan_key_is_refused_like_a_plain_one() {
    let fx = Fixture::new(T_TABLE);
    let f = |name: &str, t: u32, keys: Vec<i32>, values: Vec<f64>, v: &[&str]| {
        let id: ArrayRef = Arc::new(
            DictionaryArray::<Int32Type>::try_new(
                Int32Array::from(keys),
                Arc::new(Float64Array::from(values)),
            )
            .unwrap(),
        );
        let t = ts(t);
        fx.put_batch(
            "t",
            name,
            &batch(vec![
                ("Op", strings(&vec!["I"; v.len()])),
                ("ts", strings(&vec![t.as_str(); v.len()])),
                ("id", id),
                ("v", strings(v)),
            ]),
        )
    };
    let nan = f(
        "20240101-0000000001.parquet",
        1,
        vec![0, 0],
        vec![f64::NAN],
        &["a", "b"],
    );
    let mixed = f(
        "20240101-0000000002.parquet",
        2,
        vec![0, 1],
        vec![1.0, f64::NAN],
        &["one", "c"],
    );
    let plain = f(
        "20240101-0000000003.parquet",
        3,
        vec![0],
        vec![1.0],
        &["one"],
    );
    let r = fx
        .engine
        .process(&[nan.clone(), mixed.clone(), plain])
        .await;
    for (file, row) in [(&nan, 1), (&mixed, 2)] {
        let e = Fixture::failure(&r, file);
        let m = e.to_string();
        assert!(
            e.kind() == "bad_input"
                && m.contains(&format!("row {row}, column `id`"))
                && m.contains("NaN"),
            "{m}"
        );
    }
    assert_eq!(t_column(&fx, "v", &[]).await, vec!["one"]);
}

// ---- partitions -------------------------------------------------------------------------

const PARTITIONED: &str = r#"
[[table]]
name = "t"
source = "raw/t/"
target = "curated/t"
primary_key = ["id"]
partition_by = ["p"]
sequence_by = ["ts"]
drop_columns = ["ts"]
"#;

/// NULL partitions (integer and string) are compacted and maintained; values with
/// characters Hive escapes keep exact manifests through merges and maintenance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_values_with_nulls_and_special_characters_are_maintained() {
    let int_part = Fixture::new(PARTITIONED);
    for i in 1..=3 {
        let p: ArrayRef = Arc::new(Int32Array::from(vec![if i < 3 { None } else { Some(7) }]));
        int_part
            .merge_ok(&[cdc(
                &int_part,
                &format!("20240101-000000000{i}.parquet"),
                "I",
                i,
                i as i64,
                vec![("p", p)],
            )])
            .await;
    }
    let r = maintain(&int_part)
        .await
        .expect("maintenance with a NULL integer partition");
    assert_eq!(r.files_compacted, 2, "{r:?}");
    assert_exact_manifests(&int_part).await;

    // The same with a date partition column (NULL twice, then a date).
    let date_part = Fixture::new(PARTITIONED);
    for i in 1..=3 {
        let p: ArrayRef = Arc::new(tributary::deltalake::arrow::array::Date32Array::from(vec![
            if i < 3 { None } else { Some(19_723) }, // 2024-01-01
        ]));
        date_part
            .merge_ok(&[cdc(
                &date_part,
                &format!("20240101-000000000{i}.parquet"),
                "I",
                i,
                i as i64,
                vec![("p", p)],
            )])
            .await;
    }
    let r = maintain(&date_part)
        .await
        .expect("maintenance with a NULL date partition");
    assert_eq!(r.files_compacted, 2, "{r:?}");
    assert_exact_manifests(&date_part).await;
    assert_eq!(
        t_column(&date_part, "p", &["id"]).await,
        vec!["NULL", "NULL", "2024-01-01"]
    );

    let str_part = Fixture::new(PARTITIONED);
    let values = [
        None,
        None,
        Some("a/b"),
        Some("x=y"),
        Some("50%"),
        Some("what?#1"),
        Some("a/b"),
    ];
    for (i, v) in values.iter().enumerate() {
        let p: ArrayRef = Arc::new(tributary::deltalake::arrow::array::StringArray::from(vec![
            *v,
        ]));
        str_part
            .merge_ok(&[cdc(
                &str_part,
                &format!("20240101-00000000{i:02}.parquet"),
                "I",
                i as u32,
                i as i64,
                vec![("p", p)],
            )])
            .await;
    }
    assert_exact_manifests(&str_part).await;
    let r = maintain(&str_part).await.unwrap();
    assert_eq!(
        r.files_compacted, 4,
        "the NULL and the a/b partitions: {r:?}"
    );
    assert_eq!(r.manifests_deleted, 0, "{r:?}");
    assert_exact_manifests(&str_part).await;
    let t = delta::open(&str_part.url("curated/t"), &Default::default())
        .await
        .unwrap();
    let folders: Vec<String> = manifest::read_manifests(str_part.engine.storage(), &t)
        .await
        .unwrap()
        .into_keys()
        .collect();
    assert_eq!(
        folders,
        vec![
            "p=50%25",
            "p=__HIVE_DEFAULT_PARTITION__",
            "p=a%2Fb",
            "p=what%3F%231",
            "p=x%3Dy"
        ]
    );
    assert_eq!(
        t_column(&str_part, "p", &["id"]).await,
        vec!["NULL", "NULL", "a/b", "x=y", "50%", "what?#1", "a/b"]
    );
}

/// An empty-string partition value is NULL for Delta: the protocol serialises both as an
/// empty partition value (Spark, Athena and Trino read NULL; delta-rs's own reader shows "").
/// tributary follows the protocol: the manifest folder is Hive's NULL folder. Documented in
/// docs/configuration.md; this pins it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_string_partition_value_is_stored_as_null() {
    let fx = Fixture::new(PARTITIONED);
    fx.merge_ok(&[cdc(
        &fx,
        "20240101-0000000001.parquet",
        "I",
        1,
        1,
        vec![("p", strings(&[""]))],
    )])
    .await;
    let log = std::fs::read_dir(fx.path("curated/t/_delta_log"))
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
        .collect::<String>();
    assert!(
        log.contains(r#""partitionValues":{"p":null}"#)
            || log.contains(r#""partitionValues":{"p":""}"#),
        "{log}"
    );
    let t = delta::open(&fx.url("curated/t"), &Default::default())
        .await
        .unwrap();
    let folders: Vec<String> = manifest::read_manifests(fx.engine.storage(), &t)
        .await
        .unwrap()
        .into_keys()
        .collect();
    assert_eq!(folders, vec!["p=__HIVE_DEFAULT_PARTITION__"]);
}

async fn assert_exact_manifests(fx: &Fixture) {
    let t = delta::open(&fx.url("curated/t"), &Default::default())
        .await
        .unwrap();
    let got = manifest::read_manifests(fx.engine.storage(), &t)
        .await
        .unwrap();
    let want = manifest::expected_manifests(&t).unwrap();
    assert_eq!(got, want);
    for uris in got.values() {
        for u in uris {
            let path = url::Url::parse(u).unwrap().to_file_path().unwrap();
            assert!(path.is_file(), "manifest lists {u}, which does not exist");
        }
    }
}

// ---- tombstone horizon --------------------------------------------------------------------

/// Once maintenance has expired tombstones, a file written before the horizon is refused
/// (it could revive a row whose delete was forgotten); newer files still merge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_older_than_the_tombstone_horizon_are_refused() {
    let fx = Fixture::new(&T_TABLE.replace(
        "drop_columns",
        "tombstone_retention_days = 0.00001\ndrop_columns",
    ));
    fx.merge_ok(&[cdc(&fx, "20240101-0000000001.parquet", "I", 1, 1, vec![])])
        .await;
    fx.merge_ok(&[cdc(&fx, "20240101-0000000002.parquet", "D", 2, 1, vec![])])
        .await;
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let r = maintain(&fx).await.unwrap();
    // two rows for the delete: pending (before its MERGE) and applied (after)
    assert_eq!(r.tombstones_expired, 2, "{r:?}");
    let t = delta::open(&fx.url("curated/t"), &Default::default())
        .await
        .unwrap();
    let horizon = delta::props(&t)
        .tombstone_horizon
        .expect("horizon recorded");
    let age = chrono::Utc::now() - horizon;
    assert!(
        age > chrono::Duration::zero() && age < chrono::Duration::seconds(60),
        "{horizon}"
    );
    // the insert again (a late re-delivery): its tombstone is gone, so it is refused
    let late = cdc(&fx, "20240101-0000000001.parquet", "I", 1, 1, vec![]);
    let r = fx.engine.process(std::slice::from_ref(&late)).await;
    let e = Fixture::failure(&r, &late);
    assert_eq!(e.kind(), "too_late", "{e}");
    assert!(t_column(&fx, "id", &[]).await.is_empty());
    fx.merge_ok(&[cdc(&fx, "20990101-0000000001.parquet", "I", 9, 2, vec![])])
        .await;
}

/// The default tombstone retention outlasts everything the template lets a message wait,
/// along every path a notification can take through its queues.
#[test]
fn default_tombstone_retention_outlasts_the_templates_queues() {
    let template =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml")).unwrap();
    // MessageRetentionPeriod of each queue resource (its block: indented under `  Name:`).
    let mut retention_of = std::collections::HashMap::new();
    let mut current = String::new();
    for line in template.lines() {
        if line.starts_with("  ") && !line.starts_with("   ") && line.trim_end().ends_with(':') {
            current = line.trim().trim_end_matches(':').to_string();
        }
        if let Some(v) = line.trim().strip_prefix("MessageRetentionPeriod:") {
            retention_of.insert(current.clone(), v.trim().parse::<u64>().unwrap());
        }
    }
    let wait = |path: &[&str]| -> u64 {
        path.iter()
            .map(|q| {
                *retention_of
                    .get(*q)
                    .unwrap_or_else(|| panic!("no queue {q}"))
            })
            .sum()
    };
    let paths: [&[&str]; 3] = [
        // the queue, then (after a redrive) its dead-letter queue
        &["MergeQueue", "MergeDeadLetterQueue"],
        // one writer per table: forwarded to the FIFO queue, then its dead-letter queue,
        // or moved to the dead-letter queue as unmergeable
        &["MergeQueue", "TableQueue", "TableDeadLetterQueue"],
        &["MergeQueue", "TableQueue", "MergeDeadLetterQueue"],
    ];
    assert_eq!(retention_of.len(), 4, "{retention_of:?}");
    let config = tributary::Config::from_toml(T_TABLE, "t", None).unwrap();
    let retention = config.tables[0].limits.tombstone_retention.as_secs();
    for path in paths {
        assert!(
            retention > wait(path),
            "{retention} vs {path:?}: {}",
            wait(path)
        );
    }
}

// ---- logs ---------------------------------------------------------------------------------

/// Commit conflicts that the engine retries are INFO lines of tributary's, not delta-rs's
/// ERROR "conflict detected … Help:" (which trips log-based alarms for events that succeed).
#[test]
fn handled_commit_conflicts_are_not_logged_as_errors() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_env_filter(tracing_subscriber::EnvFilter::new(tributary::LOG_FILTER))
        .with_writer(move || writer.clone())
        .finish();
    let fx =
        Fixture::new(&T_TABLE.replace("drop_columns", "max_commit_attempts = 100\ndrop_columns"));
    let files: Vec<url::Url> = (0..8)
        .map(|i| {
            cdc(
                &fx,
                &format!("20240101-{i:010}.parquet"),
                "U",
                i as u32,
                1,
                vec![("v", ints(&[i]))],
            )
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            fx.merge_ok(&files[..1]).await;
            let tasks: Vec<_> = files[1..]
                .iter()
                .map(|f| {
                    let engine = fx.another_engine();
                    let f = f.clone();
                    async move { engine.process(&[f]).await }
                })
                .collect();
            for r in futures::future::join_all(tasks).await {
                assert_eq!(r.failures().count(), 0);
            }
        })
    });
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("commit conflict with a concurrent writer"),
        "no conflict happened: {text}"
    );
    assert!(!text.contains("\"level\":\"ERROR\""), "{text}");
    assert!(!text.contains("Help:"), "{text}");
    assert_eq!(rt.block_on(t_column(&fx, "v", &[])), vec!["7"]);
}

// ---- exact statistics (#23) ---------------------------------------------------------------

fn decimals(v: &[i128], precision: u8, scale: i8) -> ArrayRef {
    Arc::new(
        Decimal128Array::from(v.to_vec())
            .with_precision_and_scale(precision, scale)
            .unwrap(),
    )
}

/// The statistics JSON of every `add` in the table's commit files.
fn logged_stats(fx: &Fixture, rel: &str) -> Vec<String> {
    let mut out = Vec::new();
    let log = fx.path(&format!("{rel}/_delta_log"));
    let mut commits: Vec<_> = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    commits.sort();
    for c in commits {
        for line in std::fs::read_to_string(&c).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Some(s) = v["add"]["stats"].as_str() {
                out.push(s.to_string());
            }
        }
    }
    out
}

/// #23 item 1: delta-rs's writer logs decimal bounds through `f64` (`1234567890123456789`
/// as `…768`), and every reader that skips files by statistics misses the row. Every `add`
/// tributary commits — the load, a MERGE, compaction — carries exact bounds, and filtered
/// reads (which prune by them) find the rows, also from a checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wide_decimal_bounds_are_exact_in_the_log_and_filters_find_their_rows() {
    let fx = Fixture::new(T_TABLE);
    let big = 1_234_567_890_123_456_789i128;
    // 123.456789012345678901 at scale 18, and a negative amount
    let frac = 123_456_789_012_345_678_901i128;
    let load = fx.put_batch(
        "t",
        "LOAD00000001.parquet",
        &batch(vec![
            ("ts", strings(&[&ts(0), &ts(0)])),
            ("id", ints(&[1, 2])),
            ("amt", decimals(&[big, 5], 38, 0)),
            ("frac", decimals(&[frac, -1], 38, 18)),
        ]),
    );
    fx.merge_ok(&[load]).await;
    let stats = logged_stats(&fx, "curated/t");
    assert_eq!(stats.len(), 1, "{stats:?}");
    for want in [
        "\"amt\":1234567890123456789",
        "\"amt\":5",
        "\"frac\":123.456789012345678901",
        "\"frac\":-0.000000000000000001",
    ] {
        assert!(stats[0].contains(want), "{want} not in {}", stats[0]);
    }
    // The ids a reader skipping files by their statistics finds where `column = value`.
    let found = |column: &'static str, value: &'static str| {
        let t = fx.table("curated/t");
        async move {
            let rows = rows_where(&t.await, column, value, &["id"]).await;
            rows.into_iter()
                .map(|mut r| r.remove(0))
                .collect::<Vec<_>>()
        }
    };
    let by_amt = ("amt", "1234567890123456789");
    let by_frac = ("frac", "123.456789012345678901");
    assert_eq!(found(by_amt.0, by_amt.1).await, vec!["1"]);
    assert_eq!(found(by_frac.0, by_frac.1).await, vec!["1"]);
    // A merge and a compaction write new files: their bounds are exact too (made exact in
    // tributary's commit, on every store).
    let update = cdc(
        &fx,
        "20240101-0000000001.parquet",
        "U",
        1,
        3,
        vec![
            ("amt", decimals(&[big + 1], 38, 0)),
            ("frac", decimals(&[frac + 1], 38, 18)),
        ],
    );
    fx.merge_ok(&[update]).await;
    let m = maintain(&fx).await.unwrap();
    assert!(m.partitions_compacted >= 1, "{m:?}");
    let stats = logged_stats(&fx, "curated/t");
    let last = stats.last().unwrap();
    for want in [
        "\"amt\":1234567890123456790",
        "\"frac\":123.456789012345678902",
    ] {
        assert!(last.contains(want), "{want} not in {last}");
    }
    assert_eq!(found("amt", "1234567890123456790").await, vec!["3"]);
    assert_eq!(found(by_amt.0, by_amt.1).await, vec!["1"]);
    assert_eq!(found(by_frac.0, by_frac.1).await, vec!["1"]);
}

/// #23 item 2: keys whose bounds went through `f64` merged wrongly — an update of a
/// `decimal(38,0)` key inserted a second row, a delete deleted nothing, a late older insert
/// came back; `uint64` keys (stored as `decimal(20,0)`) the same. With exact bounds they
/// behave as any key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wide_decimal_and_unsigned_keys_update_delete_and_block_like_any_key() {
    use tributary::deltalake::arrow::array::UInt64Array;
    let big = 1_234_567_890_123_456_789i128;
    let keys: Vec<(&str, ArrayRef, ArrayRef)> = vec![
        (
            "decimal(38,0)",
            decimals(&[big, 5], 38, 0),
            decimals(&[big], 38, 0),
        ),
        (
            "uint64",
            Arc::new(UInt64Array::from(vec![u64::MAX, 5])),
            Arc::new(UInt64Array::from(vec![u64::MAX])),
        ),
        (
            "uint64 (a snowflake id)",
            Arc::new(UInt64Array::from(vec![big as u64, 5])),
            Arc::new(UInt64Array::from(vec![big as u64])),
        ),
    ];
    for (what, load_keys, key) in keys {
        let fx = Fixture::new(T_TABLE);
        let file = |name: &str, op: Option<&str>, t: u32, v: i64, k: &ArrayRef| {
            let mut cols = Vec::new();
            if let Some(op) = op {
                cols.push(("Op", strings(&[op])));
            }
            cols.extend([
                ("ts", strings(&[&ts(t)])),
                ("id", k.clone()),
                ("v", ints(&[v])),
            ]);
            fx.put_batch("t", name, &batch(cols))
        };
        let load = fx.put_batch(
            "t",
            "LOAD00000001.parquet",
            &batch(vec![
                ("ts", strings(&[&ts(0), &ts(0)])),
                ("id", load_keys.clone()),
                ("v", ints(&[1, 2])),
            ]),
        );
        fx.merge_ok(&[load]).await;
        let u = file("20240101-0000000001.parquet", Some("U"), 1, 3, &key);
        let r = fx.merge_ok(&[u]).await;
        assert_eq!(r.tables[0].updated, 1, "{what}: {:?}", r.tables[0]);
        assert_eq!(
            vec![fx
                .batch("curated/t", &["id"], &[])
                .await
                .num_rows()
                .to_string()],
            vec!["2"],
            "{what}: no second row"
        );
        let d = file("20240101-0000000003.parquet", Some("D"), 3, 3, &key);
        let r = fx.merge_ok(&[d]).await;
        assert_eq!(r.tables[0].deleted, 1, "{what}: {:?}", r.tables[0]);
        assert_eq!(
            vec![fx
                .batch("curated/t", &["id"], &[])
                .await
                .num_rows()
                .to_string()],
            vec!["1"],
            "{what}: deleted"
        );
        let late = file("20240101-0000000004.parquet", Some("I"), 2, 9, &key);
        fx.merge_ok(&[late]).await;
        assert_eq!(
            vec![fx
                .batch("curated/t", &["id"], &[])
                .await
                .num_rows()
                .to_string()],
            vec!["1"],
            "{what}: a late older insert stays out"
        );
    }
}

/// #23 item 9: in a table without `sequence_by`, CDC changes are ordered by their files'
/// names; a file not named as DMS names them (`manual_fix.parquet`) ranked after every DMS
/// file forever, so its old change beat every later one. It fails, saying how to fix it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdc_file_without_a_dms_name_fails_where_names_order_the_changes() {
    let fx = Fixture::new(&T_TABLE.replace("sequence_by = [\"ts\"]\n", ""));
    let good = cdc(&fx, "20240101-0000000001.parquet", "I", 1, 1, vec![]);
    fx.merge_ok(&[good]).await;
    let manual = cdc(&fx, "manual_fix.parquet", "U", 0, 1, vec![]);
    let r = fx.engine.process(std::slice::from_ref(&manual)).await;
    let e = Fixture::failure(&r, &manual).to_string();
    assert!(
        e.contains("manual_fix.parquet") && e.contains("sequence_by") && e.contains("Rename"),
        "{e}"
    );
}

/// #23 item 7: DMS writes an update of the primary key as one `U` with the new key; merged
/// by key alone the old row stayed (a ghost, exit 0). With the before-image columns of
/// `add-before-image-columns` (`BI_id`) and `before_image_prefix`, the update moves the
/// row: the old key is deleted (and its tombstone stops a late insert), the new one
/// upserted; the `BI_` columns are not stored. Without the setting such a file fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_of_the_primary_key_moves_the_row_with_before_images() {
    let fx = Fixture::new(&T_TABLE.replace(
        "drop_columns",
        "before_image_prefix = \"BI_\"\ndrop_columns",
    ));
    let load = fx.put_batch(
        "t",
        "LOAD00000001.parquet",
        &batch(vec![
            ("ts", strings(&[&ts(0), &ts(0), &ts(0)])),
            ("id", ints(&[1, 2, 5])),
            ("v", ints(&[10, 20, 50])),
        ]),
    );
    fx.merge_ok(&[load]).await;
    let cdc_bi = |name: &str, t: u32, rows: &[(&str, i64, Option<i64>, i64)]| {
        fx.put_batch(
            "t",
            name,
            &batch(vec![
                ("Op", strings(&rows.iter().map(|r| r.0).collect::<Vec<_>>())),
                ("ts", strings(&vec![ts(t).as_str(); rows.len()])),
                ("id", ints(&rows.iter().map(|r| r.1).collect::<Vec<_>>())),
                (
                    "BI_id",
                    Arc::new(Int64Array::from(
                        rows.iter().map(|r| r.2).collect::<Vec<_>>(),
                    )),
                ),
                ("v", ints(&rows.iter().map(|r| r.3).collect::<Vec<_>>())),
            ]),
        )
    };
    // 1 → 3 (a key change), 2 → 2 (a plain update), 5 with no before-image (plain update)
    let moves = cdc_bi(
        "20240101-0000000001.parquet",
        1,
        &[
            ("U", 3, Some(1), 11),
            ("U", 2, Some(2), 21),
            ("U", 5, None, 51),
        ],
    );
    let r = fx.merge_ok(&[moves]).await;
    assert_eq!(r.tables[0].deleted, 1, "{:?}", r.tables[0]);
    let rows = ["id", "v"];
    assert_eq!(
        t_joined(&fx, &rows, "=", &["id"]).await,
        vec!["2=21", "3=11", "5=51"]
    );
    let columns = fx.columns("curated/t").await;
    assert!(
        !columns.iter().any(|c| c == "BI_id"),
        "before-images are not stored"
    );
    // The old key's delete is a tombstone: a late, older insert of key 1 stays out.
    let late = cdc(
        &fx,
        "20240101-0000000002.parquet",
        "I",
        0,
        1,
        vec![("v", ints(&[99]))],
    );
    fx.merge_ok(&[late]).await;
    assert_eq!(
        t_joined(&fx, &rows, "=", &["id"]).await,
        vec!["2=21", "3=11", "5=51"]
    );

    // The same file without the setting fails, saying what to set.
    let fx = Fixture::new(T_TABLE);
    let f = fx.put_batch(
        "t",
        "20240101-0000000001.parquet",
        &batch(vec![
            ("Op", strings(&["U"])),
            ("ts", strings(&[&ts(1)])),
            ("id", ints(&[3])),
            ("BI_id", ints(&[1])),
        ]),
    );
    let r = fx.engine.process(std::slice::from_ref(&f)).await;
    let e = Fixture::failure(&r, &f).to_string();
    assert!(
        e.contains("before_image_prefix") && e.contains("BI_id"),
        "{e}"
    );
}
