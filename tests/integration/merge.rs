//! Integration tests of the merge engine on a local store.

use tributary::deltalake::arrow::array::RecordBatch;
use tributary::deltalake::arrow::datatypes::{DataType, Field, Schema};
use tributary::{delta, demo, Config, FileStatus};
use tributary_tests::*;

/// `b` with the columns at the given positions as text, renamed (SQL's
/// `CAST(c AS VARCHAR) AS name`).
fn as_text(b: &RecordBatch, columns: &[(usize, &str)]) -> RecordBatch {
    let schema = b.schema();
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut cols = b.columns().to_vec();
    for (i, name) in columns {
        cols[*i] = tributary::deltalake::arrow::compute::cast(&cols[*i], &DataType::Utf8).unwrap();
        fields[*i] = Field::new(*name, DataType::Utf8, true);
    }
    RecordBatch::try_new(std::sync::Arc::new(Schema::new(fields)), cols).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_load_then_cdc_insert_update_delete() {
    let fx = Fixture::items();
    // Full-load rows carry the transfer time, later than the CDC changes below: they must
    // still rank below every CDC change.
    let load = fx.put_items(
        "LOAD00000001.parquet",
        &[
            c('I', "2024-01-01 09:00:00.000000", 1, "a", 10),
            c('I', "2024-01-01 09:00:00.000000", 2, "a", 20),
            c('I', "2024-01-01 09:00:00.000000", 3, "b", 30),
        ],
    );
    fx.merge_ok(&[load]).await;
    assert_eq!(
        fx.items_rows().await,
        vec![
            (1, "a".into(), 10),
            (2, "a".into(), 20),
            (3, "b".into(), 30)
        ]
    );
    let cdc = fx.put_items(
        "2024/01/01/20240101-0800000000.parquet",
        &[
            c('U', "2024-01-01 08:00:00.000001", 1, "a", 11),
            c('D', "2024-01-01 08:00:00.000002", 2, "a", 20),
            c('I', "2024-01-01 08:00:00.000003", 4, "b", 40),
        ],
    );
    let r = fx.merge_ok(&[cdc]).await;
    let t = &r.tables[0];
    assert_eq!((t.inserted, t.updated, t.deleted), (1, 1, 1));
    assert_eq!(
        fx.items_rows().await,
        vec![
            (1, "a".into(), 11),
            (3, "b".into(), 30),
            (4, "b".into(), 40)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_changes_to_one_key_in_one_file_keep_the_last() {
    let fx = Fixture::items();
    let f = fx.put_items(
        "20240101-0000000001.parquet",
        &[
            c('I', "2024-01-01 00:00:01.000000", 7, "a", 1),
            c('U', "2024-01-01 00:00:02.000000", 7, "a", 2),
            // same transaction timestamp: row order decides
            c('U', "2024-01-01 00:00:03.000000", 7, "a", 3),
            c('U', "2024-01-01 00:00:03.000000", 7, "a", 4),
            c('I', "2024-01-01 00:00:04.000000", 8, "a", 1),
            c('D', "2024-01-01 00:00:05.000000", 8, "a", 1),
        ],
    );
    let r = fx.merge_ok(&[f]).await;
    assert_eq!(r.tables[0].superseded_in_batch, 4);
    assert_eq!(fx.items_rows().await, vec![(7, "a".into(), 4)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_that_changes_the_partition_moves_the_row() {
    let fx = Fixture::items();
    let a = fx.put_items(
        "20240101-0000000001.parquet",
        &[c('I', "2024-01-01 00:00:01.000000", 1, "a", 1)],
    );
    fx.merge_ok(&[a]).await;
    let b = fx.put_items(
        "20240101-0000000002.parquet",
        &[c('U', "2024-01-01 00:00:02.000000", 1, "b", 2)],
    );
    fx.merge_ok(&[b]).await;
    assert_eq!(fx.items_rows().await, vec![(1, "b".into(), 2)]);
    let t = fx.url("curated/items");
    let rows: Vec<Row> = read_rows(&t)
        .await
        .into_iter()
        .filter(|r| r.1 == "a")
        .collect();
    assert!(rows.is_empty(), "old partition still has the row: {rows:?}");
    // and the file layout is really partitioned
    assert!(fx.path("curated/items/part=b").is_dir());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivery_and_out_of_order_files_converge() {
    let fx = Fixture::items();
    let f1 = fx.put_items(
        "20240101-0000000001.parquet",
        &[c('I', "2024-01-01 00:00:01.000000", 1, "a", 1)],
    );
    let f2 = fx.put_items(
        "20240101-0000000002.parquet",
        &[c('U', "2024-01-01 00:00:02.000000", 1, "a", 2)],
    );
    let f3 = fx.put_items(
        "20240101-0000000003.parquet",
        &[c('D', "2024-01-01 00:00:03.000000", 1, "a", 2)],
    );
    let f4 = fx.put_items(
        "20240101-0000000004.parquet",
        &[c('I', "2024-01-01 00:00:04.000000", 2, "b", 5)],
    );
    // newest first, then the older ones late: the delete must not be undone by the late
    // insert/update of the same key (tombstone), and f4 is independent.
    fx.merge_ok(std::slice::from_ref(&f3)).await;
    fx.merge_ok(std::slice::from_ref(&f4)).await;
    let r = fx.merge_ok(std::slice::from_ref(&f1)).await;
    assert_eq!(r.tables[0].blocked_by_tombstone, 1);
    fx.merge_ok(std::slice::from_ref(&f2)).await;
    assert_eq!(fx.items_rows().await, vec![(2, "b".into(), 5)]);
    // every file again, all at once: nothing changes and nothing is committed
    let before = delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap()
        .version();
    let r = fx.merge_ok(&[f1, f2, f3, f4]).await;
    let t = &r.tables[0];
    assert_eq!((t.inserted, t.updated, t.deleted), (0, 0, 0));
    assert_eq!(
        t.version, before,
        "a re-delivery must not create a table version"
    );
    assert_eq!(fx.items_rows().await, vec![(2, "b".into(), 5)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_and_reinserted_later_is_present() {
    let fx = Fixture::items();
    let f1 = fx.put_items(
        "20240101-0000000001.parquet",
        &[
            c('I', "2024-01-01 00:00:01.000000", 1, "a", 1),
            c('D', "2024-01-01 00:00:02.000000", 1, "a", 1),
        ],
    );
    let f2 = fx.put_items(
        "20240101-0000000002.parquet",
        &[c('I', "2024-01-01 00:00:03.000000", 1, "c", 3)],
    );
    fx.merge_ok(&[f2]).await;
    fx.merge_ok(&[f1]).await;
    assert_eq!(fx.items_rows().await, vec![(1, "c".into(), 3)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_files_in_one_call_make_one_commit() {
    let fx = Fixture::items();
    let files: Vec<_> = (1..=5)
        .map(|i| {
            fx.put_items(
                &format!("20240101-{i:010}.parquet"),
                &[c(
                    'I',
                    &format!("2024-01-01 00:00:0{i}.000000"),
                    i,
                    "a",
                    i * 10,
                )],
            )
        })
        .collect();
    let r = fx.merge_ok(&files).await;
    assert_eq!(r.tables.len(), 1);
    assert_eq!(r.tables[0].files, 5);
    // version 0 = create, version 1 = the single merge commit
    assert_eq!(r.tables[0].version, Some(1));
    assert_eq!(fx.items_rows().await.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_files_fail_alone_with_clear_errors_and_stay_in_place() {
    let fx = Fixture::items();
    let good = fx.put_items(
        "20240101-0000000001.parquet",
        &[c('I', "2024-01-01 00:00:01.000000", 1, "a", 1)],
    );
    let corrupt = fx.put_raw(
        "shop/items",
        "20240101-0000000002.parquet",
        b"PAR1 this is not parquet",
    );
    let unknown_op = fx.put_items(
        "20240101-0000000003.parquet",
        &[
            c('I', "2024-01-01 00:00:03.000000", 2, "a", 1),
            c('X', "2024-01-01 00:00:03.000000", 3, "a", 1),
        ],
    );
    // A file under the source that is not a DMS data file fails (it must reach the DLQ,
    // never be skipped); a folder marker and a file outside every source are ignored.
    let not_data = fx.put_raw("shop/items", "_SUCCESS", b"");
    let marker = fx.put_raw("shop/items", "2024_$folder$", b"");
    let elsewhere = fx.put_raw("other/table", "x.parquet", b"");
    let r = fx
        .engine
        .process(&[
            good.clone(),
            corrupt.clone(),
            unknown_op.clone(),
            not_data.clone(),
            marker,
            elsewhere,
        ])
        .await;
    let status = |u: &url::Url| &r.files.iter().find(|f| &f.file == u).unwrap().status;
    assert!(matches!(status(&good), FileStatus::Merged { .. }));
    match status(&corrupt) {
        FileStatus::Failed { error, .. } => {
            let m = error.to_string();
            assert!(
                m.contains("20240101-0000000002.parquet")
                    && m.contains("not a readable Parquet file"),
                "{m}"
            );
            assert!(!error.is_retryable());
        }
        s => panic!("expected failure, got {s:?}"),
    }
    match status(&unknown_op) {
        FileStatus::Failed { error, .. } => {
            let m = error.to_string();
            assert!(
                m.contains("row 2, column `Op`") && m.contains("unknown operation \"X\""),
                "{m}"
            );
        }
        s => panic!("expected failure, got {s:?}"),
    }
    match status(&not_data) {
        FileStatus::Failed { error, .. } => {
            let m = error.to_string();
            assert!(
                m.contains("_SUCCESS") && m.contains("not a DMS data file"),
                "{m}"
            );
            assert!(!error.is_retryable());
        }
        s => panic!("expected failure, got {s:?}"),
    }
    assert_eq!(
        r.files
            .iter()
            .filter(|f| matches!(f.status, FileStatus::Ignored { .. }))
            .count(),
        2
    );
    assert!(
        exists(&corrupt.to_file_path().unwrap()) && exists(&unknown_op.to_file_path().unwrap())
    );
    // the good file landed; nothing of the bad ones did (no half-applied file)
    assert_eq!(fx.items_rows().await, vec![(1, "a".into(), 1)]);
    // fix the file and replay it: converges
    std::fs::write(
        unknown_op.to_file_path().unwrap(),
        items_parquet(
            &[
                c('I', "2024-01-01 00:00:03.000000", 2, "a", 1),
                c('U', "2024-01-01 00:00:03.000000", 3, "a", 1),
            ],
            true,
        ),
    )
    .unwrap();
    fx.merge_ok(&[unknown_op]).await;
    assert_eq!(
        fx.items_rows().await,
        vec![(1, "a".into(), 1), (2, "a".into(), 1), (3, "a".into(), 1)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_key_null_key_and_bad_cast_are_reported() {
    let fx = Fixture::new(&format!(
        "{ITEMS_TABLE}\n[[table]]\nname = \"csvt\"\nsource = \"raw/shop/csvt/\"\ntarget = \"curated/csvt\"\nprimary_key = [\"id\"]\nformat = \"csv\"\n[table.csv]\ncolumns = [{{ name = \"id\", type = \"int64\" }}, {{ name = \"val\", type = \"int64\" }}]\n"
    ));
    let bad_cast = fx.put_raw(
        "shop/csvt",
        "20240101-000000001.csv",
        b"I,1,10\nU,2,eleven\n",
    );
    // DMS writes NULL as an empty field.
    let null_key = fx.put_raw("shop/csvt", "20240101-000000002.csv", b"I,,10\n");
    let r = fx.engine.process(&[bad_cast, null_key]).await;
    let errs: Vec<String> = r
        .failures()
        .map(|f| match &f.status {
            FileStatus::Failed { error, .. } => error.to_string(),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs.iter().any(
            |e| e.contains("20240101-000000001.csv, row 2, column `val`")
                && e.contains("\"eleven\"")
        ),
        "{errs:?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.contains("20240101-000000002.csv, row 1, column `id`: primary key is null")),
        "{errs:?}"
    );
    // A parquet file without the key column
    let batch = items_batch(&[c('I', "2024-01-01 00:00:01.000000", 1, "a", 1)], true);
    let no_key = batch.project(&[0, 1, 3, 4]).unwrap();
    let u = fx.put_raw(
        "shop/items",
        "20240101-9.parquet",
        &demo::to_parquet(&no_key).unwrap(),
    );
    let r = fx.engine.process(&[u]).await;
    let e = match &r.files[0].status {
        FileStatus::Failed { error, .. } => error.to_string(),
        s => panic!("{s:?}"),
    };
    assert!(
        e.contains("column `id`: primary key column is missing"),
        "{e}"
    );
}

/// CSV files in the shapes real DMS tasks write (MySQL without a header, Oracle with one,
/// `%+.16e` doubles), merged with `[table.csv]` defaults only (#44): NULL is an empty field,
/// quoted or not; text keeps its spaces, quoted commas and UTF-8; the I, U, D, I of one key
/// in one file leaves the last insert. Before, the default `null_value = "NULL"` stored `""`
/// for every NULL of a text column, with exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dms_csv_shapes_merge_exactly_with_the_defaults() {
    let fx = Fixture::new(
        r#"
[[table]]
name = "customers"
source = "raw/mysql/customers/"
target = "curated/customers"
primary_key = ["customerNumber"]
format = "csv"
[table.csv]
columns = [
  { name = "customerNumber", type = "int32" },
  { name = "contactFirstName", type = "string" },
  { name = "addressLine2", type = "string" },
  { name = "salesRep", type = "int32" },
  { name = "creditLimit", type = "decimal(10,2)" },
]

[[table]]
name = "employees"
source = "raw/oracle/employees/"
target = "curated/employees"
primary_key = ["EMPLOYEE_ID"]
format = "csv"
[table.csv]
header = true
columns = [{ name = "EMPLOYEE_ID", type = "int64" }, { name = "SALARY", type = "double" }]
"#,
    );
    let load = fx.put_raw(
        "mysql/customers",
        "LOAD00000001.csv",
        "103,Carine ,,1370,21000.00\n114,\"Peter, Jr\",Level 3,1611,117300.00\n125,Zbyszek ,\"\",,0.00\n"
            .as_bytes(),
    );
    let cdc = fx.put_raw(
        "mysql/customers",
        "20240809-192717787.csv",
        "I,497,Mitesh,,1188,85100.00\nU,497,Ruffy,,1188,85100.00\nD,497,Ruffy,,1188,85100.00\nI,497,Luleå,,1188,85100.00\nU,103,Carine ,Suite 2,,21000.00\n"
            .as_bytes(),
    );
    fx.merge_ok(&[load, cdc]).await;
    // The columns' values joined by `|` (`<null>` for nulls), by the first column.
    let rows = |table: &'static str, columns: &'static [&'static str]| {
        let fx = &fx;
        async move {
            let rows = fx.values(table, columns, &columns[..1]).await;
            rows.into_iter()
                .map(|r| {
                    let r: Vec<String> = r
                        .into_iter()
                        .map(|v| v.unwrap_or_else(|| "<null>".into()))
                        .collect();
                    r.join("|")
                })
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        rows(
            "curated/customers",
            &[
                "customerNumber",
                "contactFirstName",
                "addressLine2",
                "salesRep",
                "creditLimit"
            ]
        )
        .await,
        vec![
            "103|Carine |Suite 2|<null>|21000.00",
            "114|Peter, Jr|Level 3|1611|117300.00",
            // A quoted empty field is NULL too: without CsvNullValue DMS writes an empty
            // string and NULL alike (docs/configuration.md).
            "125|Zbyszek |<null>|<null>|0.00",
            "497|Luleå|<null>|1188|85100.00",
        ]
    );
    // With a header, Op first; DMS's `%+.16e` doubles; an empty commission is NULL.
    let load = fx.put_raw(
        "oracle/employees",
        "LOAD00000001.csv",
        b"EMPLOYEE_ID,SALARY,COMMISSION_PCT\n100,+2.4000000000000000e+04,\n101,+1.7000000000000000e+04,.25\n",
    );
    let cdc = fx.put_raw(
        "oracle/employees",
        "20190118-184518184.csv",
        b"Op,EMPLOYEE_ID,SALARY,COMMISSION_PCT\nU,101,+8.3005000000000000e+03,\nI,2311,-5.0000000000000000e-01,.1\n",
    );
    fx.merge_ok(&[load, cdc]).await;
    assert_eq!(
        rows(
            "curated/employees",
            &["EMPLOYEE_ID", "SALARY", "COMMISSION_PCT"]
        )
        .await,
        vec!["100|24000.0|<null>", "101|8300.5|<null>", "2311|-0.5|.1"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_feed_without_header_and_full_load_with_header() {
    let fx = Fixture::new(
        r#"
[[table]]
name = "policies"
source = "raw/ins/policies/"
target = "curated/policies"
primary_key = ["policy_id"]
format = "csv"
[table.csv]
header = false
null_value = "NULL"
columns = [
  { name = "policy_id", type = "int64" },
  { name = "holder", type = "string" },
  { name = "premium", type = "decimal(10,2)" },
  { name = "starts", type = "date" },
]
"#,
    );
    // Full load files from DMS with AddColumnName would have a header; this table is
    // configured without one, so the LOAD file has none either (and no Op column).
    let load = fx.put_raw(
        "ins/policies",
        "LOAD00000001.csv",
        b"1,\"Smith, Jane\",100.50,2024-01-01\n2,Bob,NULL,2024-02-01\n3,\"\",7.00,2024-03-01\n",
    );
    let cdc = fx.put_raw(
        "ins/policies",
        "20240301-1200000000.csv",
        b"U,2,Bob,250.00,2024-02-01\nD,3,,7.00,2024-03-01\nI,4,Ann,1.25,NULL\n",
    );
    fx.merge_ok(&[load]).await;
    fx.merge_ok(&[cdc]).await;
    let b = fx
        .batch(
            "curated/policies",
            &["policy_id", "holder", "premium", "starts"],
            &["policy_id"],
        )
        .await;
    let b = as_text(&b, &[(2, "p"), (3, "s")]);
    let text = tributary::deltalake::arrow::util::pretty::pretty_format_batches(&[b])
        .unwrap()
        .to_string();
    assert!(
        text.contains("| 1         | Smith, Jane | 100.50 | 2024-01-01 |"),
        "{text}"
    );
    assert!(
        text.contains("| 2         | Bob         | 250.00 | 2024-02-01 |"),
        "{text}"
    );
    assert!(
        text.contains("| 4         | Ann         | 1.25   |            |"),
        "{text}"
    );
    assert!(!text.contains("| 3 "), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_source_columns_are_added_and_type_changes_are_refused() {
    let fx = Fixture::items();
    let a = fx.put_items(
        "20240101-0000000001.parquet",
        &[c('I', "2024-01-01 00:00:01.000000", 1, "a", 1)],
    );
    fx.merge_ok(&[a]).await;
    // DMS picks up an ALTER TABLE ADD COLUMN: a new `note` column.
    let batch = items_batch(
        &[
            c('U', "2024-01-01 00:00:02.000000", 1, "a", 2),
            c('I', "2024-01-01 00:00:03.000000", 2, "a", 3),
        ],
        true,
    );
    let mut fields: Vec<_> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut cols = batch.columns().to_vec();
    fields.push(tributary::deltalake::arrow::datatypes::Field::new(
        "note",
        tributary::deltalake::arrow::datatypes::DataType::Utf8,
        true,
    ));
    cols.push(std::sync::Arc::new(
        tributary::deltalake::arrow::array::StringArray::from(vec![Some("hello"), None]),
    ));
    let with_note = tributary::deltalake::arrow::array::RecordBatch::try_new(
        std::sync::Arc::new(tributary::deltalake::arrow::datatypes::Schema::new(fields)),
        cols,
    )
    .unwrap();
    let b = fx.put_raw(
        "shop/items",
        "20240101-0000000002.parquet",
        &demo::to_parquet(&with_note).unwrap(),
    );
    fx.merge_ok(&[b]).await;
    let out = fx.batch("curated/items", &["id", "note"], &["id"]).await;
    let text = tributary::deltalake::arrow::util::pretty::pretty_format_batches(&[out])
        .unwrap()
        .to_string();
    assert!(
        text.contains("| 1  | hello |") && text.contains("| 2  |       |"),
        "{text}"
    );
    // `val` arrives as text that is not a number: a clear, non-retryable error.
    let mut fields: Vec<_> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut cols = batch.columns().to_vec();
    fields[4] = tributary::deltalake::arrow::datatypes::Field::new(
        "val",
        tributary::deltalake::arrow::datatypes::DataType::Utf8,
        true,
    );
    cols[4] = std::sync::Arc::new(tributary::deltalake::arrow::array::StringArray::from(vec![
        "2", "three",
    ]));
    let wrong = tributary::deltalake::arrow::array::RecordBatch::try_new(
        std::sync::Arc::new(tributary::deltalake::arrow::datatypes::Schema::new(fields)),
        cols,
    )
    .unwrap();
    let w = fx.put_raw(
        "shop/items",
        "20240101-0000000003.parquet",
        &demo::to_parquet(&wrong).unwrap(),
    );
    let r = fx.engine.process(&[w]).await;
    match &r.files[0].status {
        FileStatus::Failed { error, .. } => {
            let m = error.to_string();
            assert!(
                m.contains("row 2, column `val`") && m.contains("\"three\""),
                "{m}"
            );
            assert!(!error.is_retryable());
        }
        s => panic!("{s:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tables_in_one_call_are_independent() {
    let fx = Fixture::new(&format!(
        "{ITEMS_TABLE}\n{}",
        ITEMS_TABLE
            .replace("\"items\"", "\"items2\"")
            .replace("shop/items", "shop/items2")
            .replace("curated/items", "curated/items2")
    ));
    let a = fx.put_items(
        "20240101-1.parquet",
        &[c('I', "2024-01-01 00:00:01.000000", 1, "a", 1)],
    );
    let b = fx.put_raw(
        "shop/items2",
        "20240101-1.parquet",
        &items_parquet(&[c('I', "2024-01-01 00:00:01.000000", 9, "z", 9)], true),
    );
    let bad = fx.put_raw("shop/items2", "20240101-2.parquet", b"garbage");
    let r = fx.engine.process(&[a, b, bad]).await;
    assert_eq!(r.tables.len(), 2);
    assert_eq!(r.failures().count(), 1);
    assert_eq!(fx.items_rows().await, vec![(1, "a".into(), 1)]);
    let rows2 = read_rows(&fx.url("curated/items2")).await;
    assert_eq!(rows2, vec![(9, "z".into(), 9)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_scenario_equals_source() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tributary.toml");
    std::fs::write(&cfg, demo::CONFIG).unwrap();
    let engine = tributary::Engine::new(tributary::Config::from_path(&cfg).unwrap());
    let s = demo::seed_scenario(1, 2_000, 200, 2).unwrap();
    let t = &engine.config().tables[0];
    for f in &s.files {
        let u = t.source.join(&f.path).unwrap();
        engine
            .storage()
            .put(&u, demo::to_parquet(&f.batch).unwrap())
            .await
            .unwrap();
        let r = engine.process(&[u]).await;
        assert_eq!(r.failures().count(), 0);
    }
    let table = delta::open(t.target.as_ref().unwrap(), &Default::default())
        .await
        .unwrap();
    // destination → count(*)
    let mut counts = std::collections::BTreeMap::new();
    for r in table_rows(&table, &["destination"], &[]).await {
        *counts.entry(r[0].clone()).or_insert(0i64) += 1;
    }
    assert_eq!(counts, demo::counts_by_destination(&s.source));
    assert!(!counts.contains_key("Miami") && !counts.contains_key("Los Angeles"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_batch_reports_only_the_bad_message_as_failed() {
    // The Lambda handler path, with s3://tributary-raw/... served from the temp dir.
    let fx = Fixture::new(
        &ITEMS_TABLE.replace("raw/shop/items/", "s3root/tributary-raw/dms/shop/items/"),
    );
    let engine = fx.another_engine().with_local_s3_root(fx.path("s3root"));
    let write = |name: &str, data: &[u8]| {
        let p = fx.path(&format!("s3root/tributary-raw/dms/shop/items/{name}"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    };
    write(
        "20240101-1.parquet",
        &items_parquet(&[c('I', "2024-01-01 00:00:01.000000", 1, "a", 1)], true),
    );
    write("20240101 2.parquet", b"corrupt");
    let s3 = |key: &str| {
        serde_json::json!({"Records":[{"eventSource":"aws:s3","eventTime":"2024-01-01T00:00:00Z",
            "eventName":"ObjectCreated:Put","s3":{"bucket":{"name":"tributary-raw"},"object":{"key":key}}}]})
        .to_string()
    };
    let event = serde_json::json!({"Records":[
        {"messageId":"good","eventSource":"aws:sqs","body": s3("dms/shop/items/20240101-1.parquet")},
        {"messageId":"bad","eventSource":"aws:sqs","body": s3("dms/shop/items/20240101+2.parquet")},
        {"messageId":"test","eventSource":"aws:sqs","body": "{\"Event\":\"s3:TestEvent\"}"}
    ]});
    let handled = tributary_lambda::handler::handle(&engine, &event)
        .await
        .unwrap();
    assert_eq!(
        handled.response().unwrap(),
        serde_json::json!({"batchItemFailures":[{"itemIdentifier":"bad"}]})
    );
    assert!(
        handled.failed_messages[0]
            .reason
            .contains("20240101 2.parquet"),
        "{:?}",
        handled.failed_messages
    );
    assert_eq!(fx.items_rows().await, vec![(1, "a".into(), 1)]);
}

/// The files a MERGE writes skip the dictionary for columns unique per row (the order key
/// and a single-column key) and keep it for the others (the benchmarked writer setting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_output_has_no_dictionary_for_unique_columns() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let fx = Fixture::items();
    let rows: Vec<Change> = (0..50)
        .map(|i| c('I', "2024-01-01 09:00:00.000000", i, "a", i % 3))
        .collect();
    let load = fx.put_items("LOAD00000001.parquet", &rows);
    fx.merge_ok(&[load]).await;
    let dir = fx.path("curated/items/part=a");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("parquet") {
            continue;
        }
        let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        let meta = reader.metadata();
        for rg in meta.row_groups() {
            let dict = |name: &str| {
                rg.columns()
                    .iter()
                    .find(|c| c.column_path().string() == name)
                    .unwrap_or_else(|| panic!("column {name} in {}", path.display()))
                    .dictionary_page_offset()
                    .is_some()
            };
            assert!(!dict("_tributary_seq"), "order key dictionary-encoded");
            assert!(!dict("id"), "key dictionary-encoded");
            assert!(dict("val"), "other columns keep the dictionary");
        }
        checked += 1;
    }
    assert!(checked > 0, "no data file in {}", dir.display());
}

/// A Glue client for an endpoint where nothing listens (an outage), without retries.
fn unreachable_glue() -> tributary::catalog::Catalog {
    use aws_sdk_glue::config::{BehaviorVersion, Credentials, Region, SharedCredentialsProvider};
    let config = aws_config::SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "test", "test", None, None, "test",
        )))
        .endpoint_url("http://127.0.0.1:9")
        .retry_config(aws_config::retry::RetryConfig::disabled())
        .build();
    tributary::catalog::Catalog::from_sdk_config(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_failure_never_fails_a_merge() {
    let mut fx = Fixture::new(&format!(
        "{ITEMS_TABLE}[table.catalog]\ndatabase = \"lake\"\n"
    ));
    fx.engine = fx.engine.clone().with_catalog(unreachable_glue());
    let first = fx.put_items(
        "20240101-0000000001.parquet",
        &[
            c('I', "2024-01-01 00:00:01.000000", 1, "a", 1),
            c('I', "2024-01-01 00:00:01.000000", 2, "b", 2),
        ],
    );
    let r = fx.merge_ok(&[first]).await;
    let cat = r.tables[0].catalog.as_ref().expect("a catalog report");
    let e = cat.error.as_deref().expect("the outage is reported");
    assert!(
        e.contains("lake.items") && e.contains("lake.items_manifest"),
        "{e}"
    );
    assert!(cat.calls > 0);
    // The next merge retries the entries it owes (the commit does not depend on it).
    let second = fx.put_items(
        "20240101-0000000002.parquet",
        &[c('U', "2024-01-01 00:00:02.000000", 1, "a", 10)],
    );
    let r = fx.merge_ok(&[second]).await;
    let cat = r.tables[0].catalog.as_ref().expect("a catalog report");
    assert!(cat.error.is_some() && cat.calls > 0, "{cat:?}");
    assert_eq!(
        fx.items_rows().await,
        vec![(1, "a".into(), 10), (2, "b".into(), 2)]
    );
    // A table without catalog settings never reports (nor calls) the catalog.
    let plain = Fixture::items();
    let f = plain.put_items(
        "20240101-0000000001.parquet",
        &[c('I', "2024-01-01 00:00:01.000000", 1, "a", 1)],
    );
    assert!(plain.merge_ok(&[f]).await.tables[0].catalog.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_configuration_is_picked_up_and_a_broken_one_is_not() {
    use std::sync::Arc;
    use tributary::Engine;
    use tributary_lambda::live::LiveEngine;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.toml");
    std::fs::write(&path, ITEMS_TABLE).unwrap();
    let loc = path.to_str().unwrap().to_string();
    let live = LiveEngine::start(&loc, std::time::Duration::ZERO, |l| {
        let l = l.to_string();
        Box::pin(async move { Engine::from_config_location(&l).await })
    })
    .await
    .unwrap();
    let first = live.engine().await;
    assert_eq!(first.config().tables.len(), 1);
    assert!(
        Arc::ptr_eq(&first, &live.engine().await),
        "unchanged: no reload"
    );
    // A second table uploaded: in force at the next invocation.
    std::fs::write(
        &path,
        format!("{ITEMS_TABLE}\n[[table]]\nname = \"other\"\nsource = \"raw/other/\"\ntarget = \"curated/other\"\nprimary_key = [\"id\"]\n"),
    )
    .unwrap();
    assert_eq!(live.engine().await.config().tables.len(), 2);
    // A broken upload: logged, and the previous configuration stays in force.
    std::fs::write(&path, "[[table]]\nname = 3\n").unwrap();
    assert_eq!(live.engine().await.config().tables.len(), 2);
}

/// The error of the one file `event` announces, which no table owns: it must fail
/// (retryably), not be ignored.
async fn unowned_failure(
    live: &tributary_lambda::live::LiveEngine,
    event: &serde_json::Value,
    file: &str,
) -> String {
    let engine = live.engine_for(event).await.unwrap();
    let handled = tributary_lambda::handler::handle(&engine, event)
        .await
        .unwrap();
    let f = &handled.report.files[0];
    assert_eq!(tributary::storage::display(&f.file), file);
    match &f.status {
        FileStatus::Failed { error, .. } => {
            assert!(error.is_retryable(), "{error}");
            assert_eq!(error.kind(), "unowned");
            error.to_string()
        }
        s => panic!("{file} not failed: {s:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_a_table_just_added_is_neither_ignored_nor_lost() {
    use tributary::Engine;
    use tributary_lambda::live::LiveEngine;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.toml");
    let table = |name: &str| {
        format!("[[table]]\nname = \"{name}\"\nsource = \"s3://raw/dms/{name}/\"\ntarget = \"curated/{name}\"\nprimary_key = [\"id\"]\n")
    };
    let event = |table: &str| {
        serde_json::json!({"Records":[{"eventSource":"aws:s3","eventTime":"2024-01-01T00:00:00Z",
            "eventName":"ObjectCreated:Put","s3":{"bucket":{"name":"raw"},"object":{"key":format!("dms/{table}/1.parquet")}}}]})
    };
    std::fs::write(&path, table("a")).unwrap();
    let loc = path.to_str().unwrap().to_string();
    // Checks due only once an hour: what follows is forced by the files.
    let live = LiveEngine::start(&loc, std::time::Duration::from_secs(3600), |l| {
        let l = l.to_string();
        Box::pin(async move { Engine::from_config_location(&l).await })
    })
    .await
    .unwrap();
    // A prefix no configuration has: the configuration in force decides (ignored later).
    assert_eq!(
        live.engine_for(&event("b"))
            .await
            .unwrap()
            .config()
            .tables
            .len(),
        1
    );
    // Table b added: its first file brings the new configuration in at once.
    std::fs::write(&path, format!("{}{}", table("a"), table("b"))).unwrap();
    assert_eq!(
        live.engine_for(&event("a"))
            .await
            .unwrap()
            .config()
            .tables
            .len(),
        1,
        "not due"
    );
    assert_eq!(
        live.engine_for(&event("b"))
            .await
            .unwrap()
            .config()
            .tables
            .len(),
        2
    );
    // A broken configuration: files of known tables go on; a file no table owns fails
    // (retried until the configuration is fixed) instead of being ignored.
    std::fs::write(
        &path,
        format!("{}{}{}x", table("a"), table("b"), table("c")),
    )
    .unwrap();
    assert_eq!(
        live.engine_for(&event("a"))
            .await
            .unwrap()
            .config()
            .tables
            .len(),
        2
    );
    let err = unowned_failure(&live, &event("c"), "s3://raw/dms/c/1.parquet").await;
    assert!(err.contains("does not load"), "{err}");
    // The configuration cannot be read at all (deleted): a file no table owns fails too.
    std::fs::remove_file(&path).unwrap();
    let err = unowned_failure(&live, &event("d"), "s3://raw/dms/d/1.parquet").await;
    assert!(err.contains("cannot be read"), "{err}");
    assert_eq!(
        live.engine_for(&event("a"))
            .await
            .unwrap()
            .config()
            .tables
            .len(),
        2,
        "files of known tables go on"
    );
    std::fs::write(&path, format!("{}{}{}", table("a"), table("b"), table("c"))).unwrap();
    assert_eq!(
        live.engine_for(&event("c"))
            .await
            .unwrap()
            .config()
            .tables
            .len(),
        3
    );
}

/// The change data feed of `table` from `version` on, read as the Delta protocol defines
/// it ([`change_data_feed`]): (commit version, change type, row), in commit order.
async fn change_feed(table: &url::Url, version: u64) -> Vec<(i64, String, Row)> {
    use tributary::deltalake::arrow::array::AsArray;
    use tributary::deltalake::arrow::compute::cast;
    use tributary::deltalake::arrow::datatypes::{DataType, Int64Type};
    let feed = change_data_feed(table, version).await;
    let at = ["_commit_version", "_change_type", "id", "part", "val"]
        .map(|c| feed.schema().index_of(c).unwrap());
    let batches = [feed.project(&at).unwrap()];
    let mut out = Vec::new();
    for b in batches {
        let col = |i: usize, ty: &DataType| cast(b.column(i), ty).unwrap();
        let (v, kind, id, part, val) = (
            col(0, &DataType::Int64),
            col(1, &DataType::Utf8),
            col(2, &DataType::Int64),
            col(3, &DataType::Utf8),
            col(4, &DataType::Int64),
        );
        for i in 0..b.num_rows() {
            out.push((
                v.as_primitive::<Int64Type>().value(i),
                kind.as_string::<i32>().value(i).to_string(),
                (
                    id.as_primitive::<Int64Type>().value(i),
                    part.as_string::<i32>().value(i).to_string(),
                    val.as_primitive::<Int64Type>().value(i),
                ),
            ));
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_data_feed_replays_to_the_table() {
    let fx = Fixture::items();
    let table = fx.url("curated/items");
    let load = fx.put_items(
        "LOAD00000001.parquet",
        &[
            c('I', "2024-01-01 09:00:00.000000", 1, "a", 10),
            c('I', "2024-01-01 09:00:00.000000", 2, "a", 20),
            c('I', "2024-01-01 09:00:00.000000", 3, "b", 30),
            c('I', "2024-01-01 09:00:00.000000", 5, "a", 50),
        ],
    );
    fx.merge_ok(&[load]).await;
    let before = fx.items_rows().await;
    let v0 = delta::open(&table, &Default::default())
        .await
        .unwrap()
        .version()
        .unwrap();
    assert!(
        !delta::props(&delta::open(&table, &Default::default()).await.unwrap()).change_data_feed
    );
    // The option turned on for the existing table: the next merge turns the feed on first.
    std::fs::write(
        fx.path("tributary.toml"),
        format!("{ITEMS_TABLE}change_data_feed = true\n"),
    )
    .unwrap();
    let on = Fixture {
        dir: tempfile::tempdir().unwrap(),
        engine: fx.another_engine(),
    };
    let cdc = fx.put_items(
        "2024/01/01/20240101-0800000000.parquet",
        &[
            c('U', "2024-01-01 08:00:00.000001", 1, "b", 11),
            c('U', "2024-01-01 08:00:00.000001", 3, "b", 31),
            c('D', "2024-01-01 08:00:00.000002", 2, "a", 20),
            c('I', "2024-01-01 08:00:00.000003", 4, "b", 40),
        ],
    );
    // Updates (one moving to another partition), a delete and an insert: tributary's
    // rewrite writes the feed's `_change_data` files (#43: once delta-rs's MERGE did).
    let r = on.merge_ok(&[cdc]).await;
    assert_eq!(
        r.tables[0].write_path,
        Some(tributary::WritePath::Rewrite),
        "{:?}",
        r.tables
    );
    // Inserts of new keys only (the append path: add actions, no change files).
    let new = fx.put_items(
        "2024/01/01/20240101-0900000000.parquet",
        &[
            c('I', "2024-01-01 09:00:00.000001", 7, "a", 70),
            c('I', "2024-01-01 09:00:00.000002", 8, "b", 80),
        ],
    );
    on.merge_ok(&[new]).await;
    assert!(
        delta::props(&delta::open(&table, &Default::default()).await.unwrap()).change_data_feed
    );
    let feed = change_feed(&table, v0 + 1).await;
    let kinds = |id: i64| -> Vec<&str> {
        feed.iter()
            .filter(|(_, _, r)| r.0 == id)
            .map(|(_, k, _)| k.as_str())
            .collect()
    };
    assert_eq!(kinds(1), vec!["update_postimage", "update_preimage"]);
    assert_eq!(kinds(2), vec!["delete"]);
    assert_eq!(kinds(3), vec!["update_postimage", "update_preimage"]);
    assert_eq!(
        kinds(5),
        Vec::<&str>::new(),
        "untouched rows of a rewritten file are not in the feed"
    );
    assert_eq!(
        kinds(8),
        vec!["insert"],
        "rows of a commit without change files are inserts"
    );
    assert_eq!(kinds(4), vec!["insert"]);
    assert_eq!(kinds(7), vec!["insert"]);
    // Replaying the feed on the rows before gives the table.
    let mut state: std::collections::BTreeMap<i64, Row> =
        before.into_iter().map(|r| (r.0, r)).collect();
    for (_, kind, row) in &feed {
        match kind.as_str() {
            "insert" | "update_postimage" => {
                state.insert(row.0, row.clone());
            }
            "delete" => {
                state.remove(&row.0);
            }
            _ => {}
        }
    }
    assert_eq!(
        state.into_values().collect::<Vec<_>>(),
        fx.items_rows().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_with_a_header_in_the_full_load_only() {
    let fx = Fixture::new(
        r#"
[[table]]
name = "policies"
source = "raw/ins/policies/"
target = "curated/policies"
primary_key = ["policy_id"]
format = "csv"
[table.csv]
full_load_header = true
cdc_header = false
null_value = "NULL"   # the walkthrough's files write NULL as text (CsvNullValue = NULL)
columns = [
  { name = "policy_id", type = "int64" }, { name = "expiry_date", type = "date" },
  { name = "location_name", type = "string" }, { name = "state_code", type = "string" },
  { name = "region_name", type = "string" }, { name = "insured_value", type = "decimal(12,2)" },
  { name = "business_type", type = "string" }, { name = "earthquake", type = "string" },
  { name = "flood", type = "string" },
]
"#,
    );
    let fixture = |name: &str| {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/policies")
            .join(name);
        fx.put_raw("ins/policies", name, &std::fs::read(p).unwrap())
    };
    let load = fixture("LOAD00000001.csv");
    let cdc = fixture("20181106-183011209.csv");
    fx.merge_ok(&[load, cdc]).await;
    let b = fx
        .batch(
            "curated/policies",
            &["policy_id", "expiry_date", "insured_value", "business_type"],
            &["policy_id"],
        )
        .await;
    let b = as_text(&b, &[(1, "e"), (2, "v")]);
    let text = tributary::deltalake::arrow::util::pretty::pretty_format_batches(&[b])
        .unwrap()
        .to_string();
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("| ") && !l.contains("policy_id"))
        .collect();
    assert_eq!(
        rows,
        vec![
            "| 100462    | 2022-01-01 | 1800000.00  | Retail        |",
            "| 223238    | 2021-01-01 |             | Farming       |",
            "| 333743    | 2021-01-01 | 17580000.00 | Office Bldg   |",
            "| 400101    | 2022-06-30 | 250000.00   | Farming       |",
        ],
        "{text}"
    );
    // A CDC file with a header although the table says it has none: the header row is
    // named as a bad row, not merged.
    let with_header = fx.put_raw(
        "ins/policies",
        "20181106-190000000.csv",
        b"Op,policy_id,expiry_date,location_name,state_code,region_name,insured_value,business_type,earthquake,flood\nU,100462,2023-01-01,Urban,NY,East,1,Retail,N,N\n",
    );
    let r = fx.engine.process(std::slice::from_ref(&with_header)).await;
    let e = Fixture::failure(&r, &with_header).to_string();
    assert!(e.contains("20181106-190000000.csv, row 1"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_each_figure_of_the_table() {
    use tributary::status::table_status;
    let fx = Fixture::items();
    let cfg = fx.engine.config().tables[0].clone();
    let now = chrono::DateTime::parse_from_rfc3339("2024-01-01T09:00:00Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    let status = || async {
        table_status(
            &cfg,
            fx.engine.storage_options(),
            fx.engine.storage(),
            None,
            now,
        )
        .await
        .unwrap()
    };
    let st = status().await;
    assert!(!st.exists && st.version.is_none() && st.rows == 0);
    let load = fx.put_items(
        "LOAD00000001.parquet",
        &[
            c('I', "2024-01-01 00:00:00.000000", 1, "a", 10),
            c('I', "2024-01-01 00:00:00.000000", 2, "a", 20),
            c('I', "2024-01-01 00:00:00.000000", 3, "b", 30),
        ],
    );
    fx.merge_ok(&[load]).await;
    let st = status().await;
    assert!(st.exists && st.freshness.full_load_only, "{st:?}");
    let cdc = fx.put_items(
        "2024/01/01/20240101-0800000000.parquet",
        &[
            c('U', "2024-01-01 08:00:00.000001", 1, "a", 11),
            c('I', "2024-01-01 08:00:00.000002", 4, "c", 40),
            c('D', "2024-01-01 08:30:00.000000", 2, "a", 20),
        ],
    );
    let r = fx.merge_ok(&[cdc]).await;
    let st = status().await;
    let table = delta::open(&fx.url("curated/items"), &Default::default())
        .await
        .unwrap();
    let files = tributary::manifest::live_files(&table).unwrap();
    // The MERGE's version: it carries the watermark it moved (one commit per merge).
    assert_eq!(st.version, r.tables[0].version);
    assert_eq!(st.version, table.version());
    let commit = st.last_commit.expect("last commit time");
    assert!(
        (chrono::Utc::now() - commit).num_seconds().abs() < 60,
        "{commit}"
    );
    assert_eq!(st.rows, 3);
    assert_eq!(st.files, files.len() as u64);
    assert_eq!(st.bytes, files.iter().map(|f| f.size as u64).sum::<u64>());
    assert_eq!(st.small_files, st.files, "every file is far below 128 MB");
    assert_eq!(st.partitions, 3, "a, b, c");
    // The newest change is the delete (only in the tombstones), 30 minutes before `now`.
    assert_eq!(
        st.freshness.newest_sequence.as_deref(),
        Some("2024-01-01 08:30:00.000000")
    );
    assert_eq!(
        st.freshness.newest_file.as_deref(),
        Some("20240101-0800000000.parquet")
    );
    assert_eq!(st.freshness.behind_seconds, Some(1800.0));
    assert_eq!(st.tombstones, 2, "the delete's pending and applied rows");
    assert!(!st.change_data_feed && st.catalog.is_none());
    let m = st.manifests.as_ref().unwrap();
    assert!(m.exact, "{m:?}");
    // A manifest removed behind tributary's back: named.
    std::fs::remove_file(fx.path("curated/items/_symlink_format_manifest/part=c/manifest"))
        .unwrap();
    let m = status().await.manifests.unwrap();
    assert!(
        !m.exact && m.differing_partitions == vec!["part=c".to_string()],
        "{m:?}"
    );
}

/// The column chunks of every data file under `dir` (not `_` folders), per file.
fn chunks(dir: &std::path::Path) -> Vec<Vec<parquet::file::metadata::ColumnChunkMetaData>> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    parquet_files(dir)
        .iter()
        .map(|p| {
            let r = SerializedFileReader::new(std::fs::File::open(p).unwrap()).unwrap();
            r.metadata()
                .row_groups()
                .iter()
                .flat_map(|rg| rg.columns().iter().cloned())
                .collect()
        })
        .collect()
}

/// The codec of every column chunk of every data file under `dir`.
fn codecs(dir: &std::path::Path) -> std::collections::BTreeSet<String> {
    chunks(dir)
        .iter()
        .flatten()
        .map(|c| {
            let codec = format!("{:?}", c.compression());
            codec.split('(').next().unwrap_or_default().to_string()
        })
        .collect()
}

/// `parquet_compression = "zstd"`: merges, appends (new keys) and compaction all write zstd
/// files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_compression_applies_to_every_file_written() {
    let fx = Fixture::new(&format!("{ITEMS_TABLE}parquet_compression = \"zstd\"\n"));
    let load = fx.put_items(
        "LOAD00000001.parquet",
        &(1..=50)
            .map(|i| c('I', "2024-01-01 09:00:00.000000", i, "a", i))
            .collect::<Vec<_>>(),
    );
    fx.merge_ok(&[load]).await;
    for i in 0..3 {
        let f = fx.put_items(
            &format!("20240101-100000000{i}.parquet"),
            &[c(
                'I',
                &format!("2024-01-01 10:00:0{i}.000000"),
                100 + i,
                "a",
                i,
            )],
        );
        fx.merge_ok(&[f]).await;
    }
    let m = fx.maintain().await;
    assert!(m.files_compacted >= 2, "{m:?}");
    // A MERGE rewriting the compacted file.
    let update = fx.put_items(
        "20240101-1100000000.parquet",
        &[c('U', "2024-01-01 11:00:00.000000", 1, "a", 1000)],
    );
    let r = fx.merge_ok(&[update]).await;
    assert_eq!((r.tables[0].updated, r.tables[0].appended()), (1, false));
    let table = fx.path("curated/items");
    assert_eq!(
        codecs(&table),
        ["ZSTD".to_string()].into(),
        "live and replaced files alike"
    );
    let e = Config::from_toml(
        &format!("{ITEMS_TABLE}parquet_compression = \"lz4\"\n"),
        "t.toml",
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("parquet_compression = \"lz4\"")
            && e.contains("expected one of `snappy`, `zstd`, `gzip`"),
        "the setting, its line and the values it takes: {e}"
    );
}

/// The encodings of `column`'s chunks, per data file under `dir`.
fn encodings(dir: &std::path::Path, column: &str) -> Vec<std::collections::BTreeSet<String>> {
    chunks(dir)
        .iter()
        .map(|file| {
            file.iter()
                .filter(|c| c.column_path().string() == column)
                .flat_map(|c| c.encodings().map(|e| format!("{e:?}")))
                .collect()
        })
        .collect()
}

/// `order_key_encoding = "delta"`: the order keys are written DELTA_BYTE_ARRAY by appends,
/// merges and compaction, and the table reads back the same as with plain keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_encoded_order_keys_read_back_the_same() {
    let mut tables = Vec::new();
    for extra in ["", "order_key_encoding = \"delta\"\n"] {
        let fx = Fixture::new(&format!("{ITEMS_TABLE}{extra}"));
        let load: Vec<Change> = (1..=200)
            .map(|i| c('I', "2024-01-01 09:00:00.000000", i, "a", i))
            .collect();
        fx.merge_ok(&[fx.put_items("LOAD00000001.parquet", &load)])
            .await;
        for i in 0..3i64 {
            let ts = format!("2024-01-01 10:00:0{i}.000000");
            let f = fx.put_items(
                &format!("20240101-100000000{i}.parquet"),
                &[
                    c('I', &ts, 500 + i, "a", i),
                    c('U', &ts, 1 + i, "a", 100 + i),
                ],
            );
            fx.merge_ok(&[f]).await;
        }
        fx.maintain().await;
        // `id seq`, by id
        let rows: Vec<String> = fx
            .values("curated/items", &["id", "_tributary_seq"], &["id"])
            .await
            .into_iter()
            .map(|r| concat(&[r[0].clone(), Some(" ".into()), r[1].clone()]))
            .collect();
        let enc = encodings(&fx.path("curated/items"), "_tributary_seq");
        tables.push((rows, enc));
    }
    assert_eq!(tables[0].0.len(), 203);
    assert_eq!(tables[0].0, tables[1].0, "the same keys and order keys");
    // Every file written (load, appends, merges, compaction) has its order keys so encoded.
    assert!(
        tables[0].1.iter().all(|f| !f.contains("DELTA_BYTE_ARRAY")),
        "{:?}",
        tables[0].1
    );
    assert!(
        tables[1].1.iter().all(|f| f.contains("DELTA_BYTE_ARRAY")
            && !f.contains("PLAIN_DICTIONARY")
            && !f.contains("RLE_DICTIONARY")),
        "{:?}",
        tables[1].1
    );
}

/// Small files a rewrite reads but does not change are written into its output and removed:
/// a merge's inserts land in a file whose key range is scattered (here -i and 100+i), which
/// every later merge of a key in that range reads. Without folding the partition gained a
/// file per merge and each merge read all of them (15 live files after 12 merges).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_files_a_rewrite_reads_are_folded_into_its_output() {
    let fx = Fixture::items();
    let part = |id: i64| ["a", "b", "c"][(id % 3) as usize];
    let load: Vec<Change> = (10..=60)
        .map(|id| c('I', "2024-01-01 00:00:00.000000", id, part(id), id))
        .collect();
    fx.merge_ok(&[fx.put_items("LOAD00000001.parquet", &load)])
        .await;
    let mut all = load.clone();
    let mut folded = 0;
    for i in 1..=12i64 {
        let ts = format!("2024-01-01 01:{i:02}:00.000000");
        let f = vec![
            c('U', &ts, 51, "a", 1000 + i),
            c('I', &ts, -i, "a", -i),
            c('I', &ts, 100 + i, "a", 100 + i),
        ];
        let r = fx
            .merge_ok(&[fx.put_items(&format!("2024/01/01/20240101-{i:010}.parquet"), &f)])
            .await;
        let t = &r.tables[0];
        assert!(t.rewritten(), "{t:?}");
        folded += t.files_folded;
        all.extend(f);
        assert_eq!(fx.items_rows().await, model(&all), "merge {i}");
    }
    let live = live_files(&fx.url("curated/items")).await;
    assert!(
        live <= 5,
        "{live} live files: the read small files were not folded"
    );
    assert!(folded >= 10, "{folded} files folded in 12 merges");
}

/// tributary's copy-on-write rewrite gives the model's table step by step, with counts
/// that add up: updates moving partitions, deletes, inserts, a late file of stale changes,
/// a delete of an absent key, a re-insert after a delete; files that hold no changed key
/// stay as they are. (Until #43 this compared it with delta-rs's MERGE, now out of the
/// build; the property tests compare it with the model under any delivery.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rewrite_gives_the_models_table_and_counts_step_by_step() {
    let rewrite = Fixture::items();
    let part = |id: i64| ["a", "b", "c"][(id % 3) as usize];
    let load: Vec<Change> = (1..=60)
        .map(|id| c('I', "2024-01-01 00:00:00.000000", id, part(id), id))
        .collect();
    let mut f1: Vec<Change> = (1..=10)
        .map(|id| {
            c(
                'U',
                "2024-01-01 01:00:00.000000",
                id,
                part(id + 1),
                id * 100,
            )
        })
        .collect();
    f1.extend((11..=15).map(|id| c('D', "2024-01-01 01:00:00.000000", id, part(id), id)));
    f1.extend((61..=70).map(|id| c('I', "2024-01-01 01:00:00.000000", id, part(id), id)));
    f1.push(c('U', "2024-01-01 01:00:01.000000", 20, "a", 1));
    f1.push(c('U', "2024-01-01 01:00:02.000000", 20, "b", 2));
    // Late: older than f1 for ids 1..5 (stale), newer than the load for id 30.
    let mut f2: Vec<Change> = (1..=5)
        .map(|id| c('U', "2024-01-01 00:30:00.000000", id, "c", -id))
        .collect();
    f2.push(c('U', "2024-01-01 00:30:00.000000", 30, "c", 3000));
    let f3 = vec![
        c('D', "2024-01-01 02:00:00.000000", 999, "a", 0),
        c('I', "2024-01-01 02:00:00.000000", 11, "c", 11),
    ];
    let mut all = load.clone();
    // The last step delivers f1 again: every change of it is stale (same order keys).
    for (n, f) in [&load, &f1, &f2, &f3, &f1].into_iter().enumerate() {
        let name = match n {
            0 => "LOAD00000001.parquet".to_string(),
            4 => "2024/01/01/20240101-0000000001.parquet".to_string(),
            n => format!("2024/01/01/20240101-{n:010}.parquet"),
        };
        let before = rewrite.items_rows().await.len();
        let a = rewrite.merge_ok(&[rewrite.put_items(&name, f)]).await;
        let t = &a.tables[0];
        assert_eq!(
            rewrite.items_rows().await.len(),
            before + t.inserted - t.deleted,
            "{name}: the counts add up: {t:?}"
        );
        if n == 4 {
            let t = &a.tables[0];
            let nothing = (
                t.updated,
                t.deleted,
                t.inserted,
                t.files_added,
                t.files_removed,
            );
            assert_eq!(
                nothing,
                (0, 0, 0, 0, 0),
                "a re-delivery changes nothing: {t:?}"
            );
        } else if n > 0 {
            all.extend(f.iter().cloned());
            // The source's order is the commit timestamps' (stable: a file's rows in order).
            let mut in_order = all.clone();
            in_order.sort_by(|x, y| x.ts.cmp(&y.ts));
            assert_eq!(rewrite.items_rows().await, model(&in_order), "{name}");
            assert!(a.tables[0].rewritten(), "{name}");
        }
        if n == 1 {
            // Rows moved to another partition are written with the inserts: one new file
            // per partition for them, not one per file rewritten and partition.
            let t = &a.tables[0];
            assert!(t.files_added <= t.files_removed + 3, "{t:?}");
        }
        if n == 3 {
            // Only the insert of id 11 (a new file); no file held a changed key.
            assert_eq!((a.tables[0].files_removed, a.tables[0].files_added), (0, 1));
        }
    }
    // Other engines read the rewritten table: one skipping files by their statistics finds
    // each key's row.
    let t = rewrite.table("curated/items").await;
    let mut rows: Vec<Row> = Vec::new();
    for id in 1..=3 {
        for r in rows_where(&t, "id", &id.to_string(), &["id", "part", "val"]).await {
            rows.push((r[0].parse().unwrap(), r[1].clone(), r[2].parse().unwrap()));
        }
    }
    assert_eq!(
        rows,
        vec![
            (1, "c".into(), 100),
            (2, "a".into(), 200),
            (3, "b".into(), 300)
        ]
    );
}

/// A data file whose key range holds a key of the plan but no row with it (a new key
/// between its keys) is read and left as it is, also when it is larger than what the
/// rewrite holds back before the first change: nothing of it is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_the_rewrite_does_not_change_is_left_as_it_is() {
    // Slices of ~10 KB: many small files, each larger than the 5 KB held back.
    let fx = Fixture::new(&format!("{ITEMS_TABLE}slice_mb = 0.01\n"));
    let mut load: Vec<Change> = (0..2000)
        .map(|i| c('I', "2024-01-01 00:00:00.000000", i * 2 + 1, "a", i))
        .collect();
    load.push(c('I', "2024-01-01 00:00:00.000000", 5000, "b", 0));
    fx.merge_ok(&[fx.put_items("LOAD00000001.parquet", &load)])
        .await;
    let before = parquet_files(&fx.path("curated/items"));
    // Key 2 is new (inside the range of the first file of partition a); 5000 changes.
    let cdc = [
        c('I', "2024-01-01 01:00:00.000000", 2, "a", 7),
        c('U', "2024-01-01 01:00:00.000000", 5000, "b", 1),
    ];
    let r = fx
        .merge_ok(&[fx.put_items("2024/01/01/20240101-0000000001.parquet", &cdc)])
        .await;
    let t = &r.tables[0];
    assert!(t.rewritten(), "{t:?}");
    assert_eq!((t.inserted, t.updated, t.files_removed), (1, 1, 1), "{t:?}");
    let after = parquet_files(&fx.path("curated/items"));
    assert_eq!(
        after.len(),
        before.len() + t.files_added,
        "no file left behind but the ones committed"
    );
    let mut all = load.clone();
    all.extend(cdc);
    assert_eq!(fx.items_rows().await, model(&all));
}

/// A file whose first change comes after more rows than the rewrite holds back is read
/// again and written whole: the rows before the change are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_changed_after_the_rows_held_back_is_read_again_and_written_whole() {
    let fx = Fixture::items();
    // One data file of 20,000 rows (3 batches of 8192 as it is read back).
    let load: Vec<Change> = (0..20_000)
        .map(|i| c('I', "2024-01-01 00:00:00.000000", i * 2 + 1, "a", i))
        .collect();
    fx.merge_ok(&[fx.put_items("LOAD00000001.parquet", &load)])
        .await;
    assert_eq!(live_files(&fx.url("curated/items")).await, 1);
    // Now hold back at most ~5 KB of rows before a file's first change.
    std::fs::write(
        fx.path("tributary.toml"),
        format!("{ITEMS_TABLE}slice_mb = 0.01\n"),
    )
    .expect("config");
    let engine = fx.another_engine();
    let before = parquet_files(&fx.path("curated/items"));
    // The last row changes; key 2 is new (inside the file's key range).
    let cdc = [
        c('I', "2024-01-01 01:00:00.000000", 2, "a", 7),
        c('U', "2024-01-01 01:00:00.000000", 39_999, "a", -1),
    ];
    let r = engine
        .process(&[fx.put_items("2024/01/01/20240101-0000000001.parquet", &cdc)])
        .await;
    assert!(r.failures().next().is_none(), "{:?}", r.files);
    let t = &r.tables[0];
    assert!(t.rewritten(), "{t:?}");
    assert_eq!((t.inserted, t.updated, t.files_removed), (1, 1, 1), "{t:?}");
    let after = parquet_files(&fx.path("curated/items"));
    assert_eq!(after.len(), before.len() + t.files_added);
    let mut all = load.clone();
    all.extend(cdc);
    assert_eq!(fx.items_rows().await, model(&all));
}

/// A composite key of a string and an integer (the rewrite's row-encoded key index, and
/// file pruning by string statistics): each key's own row updated, deleted, inserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composite_string_key_rewrites_each_keys_own_row() {
    use std::sync::Arc;
    use tributary::deltalake::arrow::array::{ArrayRef, Int64Array};
    let table = |extra: &str| {
        format!(
            "[[table]]\nname = \"multi\"\nsource = \"raw/multi/\"\ntarget = \"curated/multi\"\nprimary_key = [\"region\", \"id\"]\nsequence_by = [\"ts\"]\ndrop_columns = [\"ts\"]\n{extra}"
        )
    };
    let rewrite = Fixture::new(&table(""));
    let ints = |v: Vec<i64>| -> ArrayRef { Arc::new(Int64Array::from(v)) };
    let regions = ["eu-west", "us-east", "ap-south"];
    // Load: 3 regions × ids 1..=300 (the same ids in every region).
    let n = 900;
    let load = batch(vec![
        ("ts", strings(&vec!["2024-01-01 00:00:00"; n])),
        (
            "region",
            strings(&(0..n).map(|i| regions[i / 300]).collect::<Vec<_>>()),
        ),
        ("id", ints((0..n as i64).map(|i| i % 300 + 1).collect())),
        ("val", ints(vec![0; n])),
    ]);
    // CDC: updates and deletes in two regions, an insert, a stale change (older ts).
    let cdc = |ts: &str, ops: &[&str], region: &[&str], ids: Vec<i64>, vals: Vec<i64>| {
        batch(vec![
            ("Op", strings(ops)),
            ("ts", strings(&vec![ts; ops.len()])),
            ("region", strings(region)),
            ("id", ints(ids)),
            ("val", ints(vals)),
        ])
    };
    let f1 = cdc(
        "2024-01-01 01:00:00",
        &["U", "D", "I", "U"],
        &["us-east", "us-east", "eu-west", "ap-south"],
        vec![7, 8, 301, 300],
        vec![70, 0, 3010, 3000],
    );
    let f2 = cdc(
        "2024-01-01 00:30:00",
        &["U", "U"],
        &["us-east", "eu-west"],
        vec![7, 7],
        vec![-7, 77],
    );
    /// `region/id=val` of every row, by region and id.
    async fn region_rows(fx: &Fixture) -> Vec<String> {
        let rows = fx.rows("curated/multi", &["region", "id", "val"], &["region", "id"]);
        let rows = rows.await.into_iter();
        rows.map(|r| format!("{}/{}={}", r[0], r[1], r[2]))
            .collect()
    }
    for (name, b) in [
        ("LOAD00000001.parquet", &load),
        ("20240101-0000000001.parquet", &f1),
        ("20240101-0000000002.parquet", &f2),
    ] {
        let a = rewrite
            .merge_ok(&[rewrite.put_batch("multi", name, b)])
            .await;
        let ta = &a.tables[0];
        let counts = (ta.inserted, ta.updated, ta.deleted, ta.skipped_stale);
        match name {
            "LOAD00000001.parquet" => assert_eq!(counts, (900, 0, 0, 0)),
            "20240101-0000000001.parquet" => assert_eq!(counts, (1, 2, 1, 0), "{ta:?}"),
            _ => assert_eq!(counts, (0, 1, 0, 1), "{ta:?}"),
        }
        if !name.starts_with("LOAD") {
            assert!(ta.rewritten(), "{name}");
        }
    }
    let got = region_rows(&rewrite).await;
    assert_eq!(got.len(), 900, "one insert, one delete");
    for want in [
        "us-east/7=70",
        "eu-west/7=77",
        "ap-south/300=3000",
        "eu-west/301=3010",
    ] {
        assert!(got.contains(&want.to_string()), "{want}");
    }
    assert!(!got.contains(&"us-east/8=0".to_string()));
}

/// A table deleted and created again at the same place by another writer (another process,
/// another tool): its new commit files have the old names. A warm instance must read the
/// new table, not serve the old commits from its log cache (`logcache.rs`: a cached file is
/// used only while the log's listing shows the same size and ETag).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_deleted_and_created_again_elsewhere_is_read_afresh() {
    let fx = Fixture::items();
    let first: Vec<Change> = (1..=3)
        .map(|id| c('I', "2024-01-01 00:00:01", id, "a", id * 10))
        .collect();
    let f = fx.put_items("20240101-0000000001.parquet", &first);
    fx.merge_ok(&[f]).await;
    let f = fx.put_items(
        "20240101-0000000002.parquet",
        &[c('U', "2024-01-01 00:00:02", 1, "a", 11)],
    );
    fx.merge_ok(&[f]).await;
    assert_eq!(fx.items_rows().await.len(), 3);
    // Another writer builds a different table with the same number of commits...
    let other = Fixture::items();
    let second = vec![c('I', "2024-01-02 00:00:01", 7, "b", 70)];
    let f = other.put_items("20240102-0000000001.parquet", &second);
    other.merge_ok(&[f]).await;
    let f = other.put_items(
        "20240102-0000000002.parquet",
        &[c('U', "2024-01-02 00:00:02", 7, "b", 71)],
    );
    other.merge_ok(&[f]).await;
    // ... and puts it in place of the first (below this process's stores).
    let table = fx.path("curated/items");
    std::fs::remove_dir_all(&table).unwrap();
    let copy = std::process::Command::new("cp")
        .arg("-r")
        .arg(other.path("curated/items"))
        .arg(&table)
        .status()
        .unwrap();
    assert!(copy.success());
    assert_eq!(fx.items_rows().await, vec![(7, "b".to_string(), 71)]);
    // And merges go on from the new table.
    let f = fx.put_items(
        "20240103-0000000001.parquet",
        &[c('I', "2024-01-03 00:00:01", 8, "b", 80)],
    );
    fx.merge_ok(&[f]).await;
    assert_eq!(
        fx.items_rows().await,
        vec![(7, "b".to_string(), 71), (8, "b".to_string(), 80)]
    );
}
