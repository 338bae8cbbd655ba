//! Delta tables tributary did not create (#43): tables another writer (Spark, Databricks, an
//! earlier job) made, with the features such tables carry, built here by the tests
//! themselves — a commit log written by hand and data files in Spark's shapes (INT96
//! timestamps) — and tables with constraints and `appendOnly`. Each is merged into exactly,
//! or refused by name with the table's log unchanged and the failure not retryable.

use std::sync::Arc;

use parquet::data_type::{ByteArray, ByteArrayType, Int64Type, Int96, Int96Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use tributary::{delta, FileStatus};
use tributary_tests::*;

/// A table `t` keyed by `id` whose CDC files land under `raw/src/t/`.
const T_TABLE: &str = r#"
[[table]]
name = "t"
source = "raw/src/t/"
target = "curated/t"
primary_key = ["id"]
"#;

/// Write the first commit of a table another writer created at `curated/t`: its protocol,
/// `schema` (Delta's JSON field list), properties and one data file.
fn create_foreign_table(fx: &Fixture, fields: &str, configuration: &str, file: &[u8]) {
    let root = fx.path("curated/t");
    std::fs::create_dir_all(root.join("_delta_log")).unwrap();
    std::fs::write(root.join("part-00000-spark.snappy.parquet"), file).unwrap();
    let schema = format!(r#"{{"type":"struct","fields":[{fields}]}}"#);
    let log = [
        serde_json::json!({"commitInfo":{"timestamp":1700000000000i64,"operation":"WRITE",
            "operationParameters":{"mode":"ErrorIfExists"},"engineInfo":"Apache-Spark/3.5.0 Delta-Lake/3.2.0"}}),
        serde_json::json!({"protocol":{"minReaderVersion":1,"minWriterVersion":2}}),
        serde_json::json!({"metaData":{"id":"5fba94ed-9794-4965-ba6e-6ee3c0d22af9",
            "format":{"provider":"parquet","options":{}},"schemaString":schema,
            "partitionColumns":[],"configuration":serde_json::from_str::<serde_json::Value>(configuration).unwrap(),
            "createdTime":1700000000000i64}}),
        serde_json::json!({"add":{"path":"part-00000-spark.snappy.parquet","partitionValues":{},
            "size":file.len(),"modificationTime":1700000000000i64,"dataChange":true}}),
    ]
    .iter()
    .map(|v| v.to_string())
    .collect::<Vec<_>>()
    .join("\n");
    std::fs::write(root.join("_delta_log/00000000000000000000.json"), log).unwrap();
}

/// Spark's INT96 form of an instant (nanoseconds of the day, Julian day).
fn int96(t: chrono::DateTime<chrono::Utc>) -> Int96 {
    let days = t
        .date_naive()
        .signed_duration_since(chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap())
        .num_days();
    let nanos =
        (t.timestamp() - days * 86_400) * 1_000_000_000 + i64::from(t.timestamp_subsec_nanos());
    let mut v = Int96::new();
    v.set_data(
        nanos as u32,
        (nanos >> 32) as u32,
        (2_440_588 + days) as u32,
    );
    v
}

/// A Parquet file as Spark 3 writes timestamps by default (INT96): `id`, `ts`, `name`.
fn spark_int96_file(rows: &[(i64, chrono::DateTime<chrono::Utc>, &str)]) -> Vec<u8> {
    let schema = Arc::new(
        parse_message_type(
            "message spark_schema { required int64 id; optional int96 ts; optional binary name (STRING); }",
        )
        .unwrap(),
    );
    let mut out = Vec::new();
    let mut w = SerializedFileWriter::new(
        &mut out,
        schema,
        Arc::new(WriterProperties::builder().build()),
    )
    .unwrap();
    let mut rg = w.next_row_group().unwrap();
    let defined = vec![1i16; rows.len()];
    let mut col = rg.next_column().unwrap().unwrap();
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    col.typed::<Int64Type>()
        .write_batch(&ids, None, None)
        .unwrap();
    col.close().unwrap();
    let mut col = rg.next_column().unwrap().unwrap();
    let ts: Vec<Int96> = rows.iter().map(|r| int96(r.1)).collect();
    col.typed::<Int96Type>()
        .write_batch(&ts, Some(&defined), None)
        .unwrap();
    col.close().unwrap();
    let mut col = rg.next_column().unwrap().unwrap();
    let names: Vec<ByteArray> = rows.iter().map(|r| ByteArray::from(r.2)).collect();
    col.typed::<ByteArrayType>()
        .write_batch(&names, Some(&defined), None)
        .unwrap();
    col.close().unwrap();
    rg.close().unwrap();
    w.close().unwrap();
    out
}

const SPARK_FIELDS: &str = r#"{"name":"id","type":"long","nullable":false,"metadata":{}},{"name":"ts","type":"timestamp","nullable":true,"metadata":{}},{"name":"name","type":"string","nullable":true,"metadata":{}}"#;

/// The table `t`'s rows, each as its `columns`' values joined by `sep` (nulls as `NULL`),
/// sorted by `order_by`.
async fn text(fx: &Fixture, columns: &[&str], sep: &str, order_by: &[&str]) -> Vec<String> {
    let rows = fx.rows("curated/t", columns, order_by).await;
    rows.into_iter().map(|r| r.join(sep)).collect()
}

fn log_files(fx: &Fixture) -> usize {
    std::fs::read_dir(fx.path("curated/t/_delta_log"))
        .unwrap()
        .count()
}

/// Merging into a table Spark wrote adopts it (#43): the order-key column is added by a
/// metadata commit, the table records the adoption, the rows it had rank below every change
/// (an update, a delete and an insert apply; a re-delivery changes nothing), and the rows no
/// change touched keep their values. An INT96 timestamp of 9999-12-30 in a row a merge
/// rewrote (the CDC file lacks the column, so the row's value is kept) stays 9999-12-30:
/// delta-rs's MERGE (before #43) read it as nanoseconds, which wrap (1816-03-28, exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spark_table_is_adopted_and_its_int96_timestamps_stay_exact() {
    use chrono::TimeZone;
    let fx = Fixture::new(T_TABLE);
    let far = chrono::Utc
        .with_ymd_and_hms(9999, 12, 30, 23, 59, 59)
        .unwrap();
    let old = chrono::Utc.with_ymd_and_hms(1500, 2, 28, 1, 2, 3).unwrap();
    let now = chrono::Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap()
        + chrono::Duration::microseconds(123_456);
    create_foreign_table(
        &fx,
        SPARK_FIELDS,
        "{}",
        &spark_int96_file(&[(1, far, "a"), (2, old, "b"), (3, now, "c"), (4, far, "d")]),
    );
    // Updates of 1 and 3 without the `ts` column, a delete of 2, an insert of 5.
    let cdc = fx.put_batch(
        "src/t",
        "20240601-120000000.parquet",
        &batch(vec![
            ("Op", strings(&["U", "U", "D", "I"])),
            (
                "id",
                Arc::new(tributary::deltalake::arrow::array::Int64Array::from(vec![
                    1, 3, 2, 5,
                ])),
            ),
            ("name", strings(&["a2", "c2", "b", "e"])),
        ]),
    );
    let r = fx.merge_ok(std::slice::from_ref(&cdc)).await;
    assert!(
        matches!(r.files[0].status, FileStatus::Merged { .. }),
        "{r:?}"
    );
    // tributary's own rewrite reads the INT96 data file (in microseconds), not a fallback.
    assert_eq!(
        r.tables[0].write_path,
        Some(tributary::WritePath::Rewrite),
        "{:?}",
        r.tables
    );
    // id|ts (`<null>` for null)|name|whether the order key is null, by id
    let rows = || async {
        let rows = fx.values(
            "curated/t",
            &["id", "ts", "name", "_tributary_seq"],
            &["id"],
        );
        let rows = rows.await.into_iter();
        rows.map(|r| {
            let ts = r[1].clone().unwrap_or_else(|| "<null>".into());
            let no_seq = r[3].is_none().to_string();
            concat(&[
                r[0].clone(),
                Some(format!("|{ts}|")),
                r[2].clone(),
                Some(format!("|{no_seq}")),
            ])
        })
        .collect::<Vec<_>>()
    };
    let want = vec![
        "1|9999-12-30T23:59:59Z|a2|false",
        "3|2024-05-01T12:00:00.123456Z|c2|false",
        "4|9999-12-30T23:59:59Z|d|true",
        "5|<null>|e|false",
    ];
    assert_eq!(rows().await, want);
    let t = delta::open(&fx.url("curated/t"), &Default::default())
        .await
        .unwrap();
    assert!(
        delta::props(&t).adopted.is_some(),
        "the adoption is recorded"
    );
    // Re-delivered: nothing changes, nothing is committed.
    let version = t.version();
    fx.merge_ok(&[cdc]).await;
    assert_eq!(rows().await, want);
    let t = delta::open(&fx.url("curated/t"), &Default::default())
        .await
        .unwrap();
    assert_eq!(t.version(), version);
}

fn int64(v: Vec<i64>) -> tributary::deltalake::arrow::array::ArrayRef {
    Arc::new(tributary::deltalake::arrow::array::Int64Array::from(v))
}

/// A CDC file of table `t` (`Op`, `id`, `amount`) under its source.
fn put_t(fx: &Fixture, name: &str, ops: &[&str], ids: Vec<i64>, amounts: Vec<i64>) -> url::Url {
    fx.put_batch(
        "src/t",
        name,
        &batch(vec![
            ("Op", strings(ops)),
            ("id", int64(ids)),
            ("amount", int64(amounts)),
        ]),
    )
}

/// `rows` as a Parquet file's bytes.
fn parquet_bytes(rows: &tributary::deltalake::arrow::array::RecordBatch) -> Vec<u8> {
    let mut file = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut file, rows.schema(), None).unwrap();
    w.write(rows).unwrap();
    w.close().unwrap();
    file
}

/// Add a CHECK constraint to the table at `curated/t` as Spark's `ALTER TABLE … ADD
/// CONSTRAINT` commits it: the table's metadata with `delta.constraints.<name>`, and writer
/// version 3.
fn add_constraint(fx: &Fixture, t: &tributary::deltalake::DeltaTable, name: &str, expr: &str) {
    let state = t.snapshot().unwrap();
    let mut meta = serde_json::to_value(state.metadata()).unwrap();
    meta["configuration"][format!("delta.constraints.{name}")] = serde_json::json!(expr);
    let version = t.version().unwrap() + 1;
    let log = [
        serde_json::json!({"commitInfo":{"timestamp":1700000000000i64,"operation":"ADD CONSTRAINT",
            "operationParameters":{"name":name,"expr":expr},"engineInfo":"Apache-Spark/3.5.0 Delta-Lake/3.2.0"}}),
        serde_json::json!({"protocol":{"minReaderVersion":1,"minWriterVersion":3}}),
        serde_json::json!({ "metaData": meta }),
    ]
    .iter()
    .map(|v| v.to_string())
    .collect::<Vec<_>>()
    .join("\n");
    let path = fx.path(&format!("curated/t/_delta_log/{version:020}.json"));
    std::fs::write(path, log).unwrap();
}

/// Table `t` created by tributary from a full load of (1, 10), (2, 20): id, amount.
async fn loaded() -> (Fixture, tributary::deltalake::DeltaTable) {
    let fx = Fixture::new(T_TABLE);
    let load = fx.put_batch(
        "src/t",
        "LOAD00000001.parquet",
        &batch(vec![
            ("id", int64(vec![1, 2])),
            ("amount", int64(vec![10, 20])),
        ]),
    );
    fx.merge_ok(&[load]).await;
    let t = delta::open(&fx.url("curated/t"), &Default::default())
        .await
        .unwrap();
    (fx, t)
}

/// A CHECK constraint holds on every path (#43): an insert-only file went through the append,
/// which wrote the rows unchecked (exit 0, `(4, 500)` in the table), while a file with an
/// update was refused. Now both are refused, not retryable, the table's log unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_constraint_refuses_inserts_as_it_refuses_updates() {
    let (fx, t) = loaded().await;
    add_constraint(&fx, &t, "amount_below_100", "amount < 100");
    let before = log_files(&fx);
    for (name, ops, ids) in [
        ("20240101-000000001.parquet", vec!["I", "I"], vec![3, 4]),
        ("20240101-000000002.parquet", vec!["U", "I"], vec![1, 4]),
    ] {
        let f = put_t(&fx, name, &ops, ids, vec![30, 500]);
        let r = fx.engine.process(std::slice::from_ref(&f)).await;
        let e = Fixture::failure(&r, &f);
        assert!(e.to_string().contains("amount < 100"), "{name}: {e}");
        assert!(!e.is_retryable(), "{name}: {e}");
        assert_eq!(
            log_files(&fx),
            before,
            "{name}: the table's log is unchanged"
        );
    }
    assert_eq!(
        text(&fx, &["id", "amount"], ":", &["id"]).await,
        vec!["1:10", "2:20"]
    );
    // A file whose rows keep the constraint: written by tributary's rewrite.
    let ok = put_t(&fx, "20240101-000000003.parquet", &["U"], vec![1], vec![99]);
    let r = fx.merge_ok(&[ok]).await;
    assert_eq!(
        r.tables[0].write_path,
        Some(tributary::WritePath::Rewrite),
        "{:?}",
        r.tables
    );
}

/// A table with a column invariant and NOT NULL columns (writer version 2, as Spark writes
/// them): every row tributary writes is checked — an insert breaking the invariant, an
/// insert with a null in a NOT NULL column are refused by name, not retryable, the log
/// unchanged; a valid update goes through tributary's rewrite (before: delta-rs's MERGE).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariants_and_not_null_columns_are_checked_on_every_row_written() {
    use tributary::deltalake::arrow::array::StringArray;
    use tributary::deltalake::arrow::datatypes::{DataType, Field, Schema};
    let fx = Fixture::new(T_TABLE);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("amount", DataType::Int64, true),
        Field::new("name", DataType::Utf8, false),
    ]));
    let rows = tributary::deltalake::arrow::array::RecordBatch::try_new(
        schema.clone(),
        vec![
            int64(vec![1]),
            int64(vec![5]),
            Arc::new(StringArray::from(vec!["a"])),
        ],
    )
    .unwrap();
    let file = parquet_bytes(&rows);
    create_foreign_table(
        &fx,
        r#"{"name":"id","type":"long","nullable":false,"metadata":{}},
           {"name":"amount","type":"long","nullable":true,"metadata":{"delta.invariants":"{\"expression\":{\"expression\":\"amount > 0\"}}"}},
           {"name":"name","type":"string","nullable":false,"metadata":{}}"#,
        "{}",
        &file,
    );
    // Adopted (the order-key column added) by a first, valid update.
    let first = fx.put_batch(
        "src/t",
        "20240101-000000001.parquet",
        &batch(vec![
            ("Op", strings(&["U"])),
            ("id", int64(vec![1])),
            ("amount", int64(vec![9])),
            ("name", strings(&["a2"])),
        ]),
    );
    let r = fx.merge_ok(&[first]).await;
    assert_eq!(
        r.tables[0].write_path,
        Some(tributary::WritePath::Rewrite),
        "{:?}",
        r.tables
    );
    let before = log_files(&fx);
    for (name, amount, who, broken) in [
        (
            "20240101-000000002.parquet",
            -3,
            Some("b"),
            "invariant of `amount`",
        ),
        ("20240101-000000003.parquet", 7, None, "NOT NULL `name`"),
    ] {
        let f = fx.put_batch(
            "src/t",
            name,
            &batch(vec![
                ("Op", strings(&["I"])),
                ("id", int64(vec![2])),
                ("amount", int64(vec![amount])),
                ("name", Arc::new(StringArray::from(vec![who]))),
            ]),
        );
        let r = fx.engine.process(std::slice::from_ref(&f)).await;
        let e = Fixture::failure(&r, &f);
        assert!(e.to_string().contains(broken), "{name}: {e}");
        assert!(e.to_string().contains("id = 2"), "{name}: {e}");
        assert!(!e.is_retryable(), "{name}: {e}");
        assert_eq!(log_files(&fx), before, "{name}: the log is unchanged");
    }
    assert_eq!(
        text(&fx, &["id", "amount", "name"], ":", &["id"]).await,
        vec!["1:9:a2"]
    );
}

/// Tables tributary cannot write exactly are refused by name before anything is written —
/// not even the adoption's metadata commit — and not retried: column mapping (before:
/// delta-rs's "Column mapping is not supported for write operation 'ADD COLUMN' yet",
/// without a way forward), identity columns, generated columns (before: delta-rs's MERGE
/// computed them; it is out of the build) and protocol features tributary does not know
/// (row tracking: writers must assign row ids).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_tributary_cannot_write_exactly_are_refused_by_name_before_any_write() {
    let plain = r#"{"name":"id","type":"long","nullable":true,"metadata":{}},
               {"name":"amount","type":"long","nullable":true,"metadata":{}}"#;
    for (fields, configuration, protocol, named) in [
        (
            r#"{"name":"id","type":"long","nullable":true,"metadata":{"delta.columnMapping.id":1,"delta.columnMapping.physicalName":"col-1"}},
               {"name":"amount","type":"long","nullable":true,"metadata":{"delta.columnMapping.id":2,"delta.columnMapping.physicalName":"col-2"}}"#,
            r#"{"delta.columnMapping.mode":"name","delta.columnMapping.maxColumnId":"2"}"#,
            r#"{"minReaderVersion":2,"minWriterVersion":5}"#,
            "column mapping",
        ),
        (
            r#"{"name":"id","type":"long","nullable":true,"metadata":{"delta.identity.start":1,"delta.identity.step":1,"delta.identity.allowExplicitInsert":false}},
               {"name":"amount","type":"long","nullable":true,"metadata":{}}"#,
            "{}",
            r#"{"minReaderVersion":1,"minWriterVersion":6}"#,
            "identity columns (`id`)",
        ),
        (
            r#"{"name":"id","type":"long","nullable":true,"metadata":{}},
               {"name":"amount","type":"long","nullable":true,"metadata":{"delta.generationExpression":"id * 10"}}"#,
            "{}",
            r#"{"minReaderVersion":1,"minWriterVersion":4}"#,
            "generated columns (`amount`)",
        ),
        (
            plain,
            r#"{"delta.enableRowTracking":"true"}"#,
            r#"{"minReaderVersion":1,"minWriterVersion":7,"writerFeatures":["rowTracking","domainMetadata","appendOnly"]}"#,
            "rowTracking, domainMetadata",
        ),
    ] {
        let fx = Fixture::new(T_TABLE);
        let rows = batch(vec![("id", int64(vec![1])), ("amount", int64(vec![10]))]);
        create_foreign_table(&fx, fields, configuration, &parquet_bytes(&rows));
        // The protocol the feature needs.
        let log = fx.path("curated/t/_delta_log/00000000000000000000.json");
        let text = std::fs::read_to_string(&log).unwrap().replace(
            r#""protocol":{"minReaderVersion":1,"minWriterVersion":2}"#,
            &format!(r#""protocol":{protocol}"#),
        );
        std::fs::write(&log, text).unwrap();
        let before = log_files(&fx);
        let f = put_t(&fx, "20240101-000000001.parquet", &["U"], vec![1], vec![20]);
        let r = fx.engine.process(std::slice::from_ref(&f)).await;
        let e = Fixture::failure(&r, &f);
        assert_eq!(e.kind(), "unsupported", "{e}");
        assert!(e.to_string().contains(named), "{e}");
        assert!(e.to_string().contains("new table"), "the way forward: {e}");
        assert!(!e.is_retryable(), "{e}");
        assert_eq!(log_files(&fx), before, "nothing written: {named}");
    }
}

/// A delete or an update on an `appendOnly` table fails the same way at every attempt:
/// not retryable (before: retried for about 70 minutes before the dead-letter queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_on_an_append_only_table_is_refused_and_not_retried() {
    let (fx, t) = loaded().await;
    t.set_tbl_properties()
        .with_properties([("delta.appendOnly".to_string(), "true".to_string())].into())
        .await
        .unwrap();
    let f = put_t(&fx, "20240101-000000001.parquet", &["D"], vec![1], vec![10]);
    let r = fx.engine.process(std::slice::from_ref(&f)).await;
    let e = Fixture::failure(&r, &f);
    assert!(e.to_string().contains("append-only"), "{e}");
    assert!(!e.is_retryable(), "{e}");
    assert_eq!(
        {
            // ordered as text
            let mut ids = text(&fx, &["id"], "", &[]).await;
            ids.sort();
            ids
        },
        vec!["1", "2"]
    );
}

/// A Spark 3.1 table's version checksum (`_delta_log/<v>.crc` without `metadata`) is read
/// past quietly (#44): the kernel skips it and reads the log, and its WARN — with a stack
/// trace where RUST_BACKTRACE is set — came at every load of the table. Shown with the
/// libraries' plain `warn` level, absent with the functions' and the CLI's filters.
#[test]
fn a_spark_3_1_version_checksum_is_read_past_without_a_warning() {
    use chrono::TimeZone;
    let merge_logging = |filter: &str| {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(move || writer.clone())
            .finish();
        let fx = Fixture::new(T_TABLE);
        let t = chrono::Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap();
        create_foreign_table(&fx, SPARK_FIELDS, "{}", &spark_int96_file(&[(1, t, "a")]));
        std::fs::write(
            fx.path("curated/t/_delta_log/00000000000000000000.crc"),
            r#"{"tableSizeBytes":1024,"numFiles":1,"numMetadata":1,"numProtocol":1,"numTransactions":0}"#,
        )
        .unwrap();
        let cdc = fx.put_batch(
            "src/t",
            "20240601-120000000.parquet",
            &batch(vec![
                ("Op", strings(&["U"])),
                (
                    "id",
                    Arc::new(tributary::deltalake::arrow::array::Int64Array::from(vec![
                        1,
                    ])),
                ),
                ("name", strings(&["b"])),
            ]),
        );
        tracing::subscriber::with_default(subscriber, || {
            // On this thread: the subscriber is this thread's (delta-rs hands it on to
            // its blocking tasks).
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                fx.merge_ok(&[cdc]).await;
                assert_eq!(text(&fx, &["name"], "", &[]).await, vec!["b"]);
            })
        });
        lines.text()
    };
    assert!(merge_logging("warn").contains("missing field `metadata`"));
    for filter in [tributary::LOG_FILTER, tributary::CLI_LOG_FILTER] {
        let logged = merge_logging(filter);
        assert!(!logged.contains("crc"), "{filter}: {logged}");
    }
}
