//! Planning without a table: admission, latest change per key, sparse columns, tombstones.

use std::collections::HashMap;

use arrow::array::{Int32Array, Int64Array, StringArray};
use url::Url;

use super::*;
use crate::config::Config;
use crate::source::FileCounts;

fn cfg() -> TableConfig {
    let text = "[[table]]\nname = \"t\"\nsource = \"s3://r/t/\"\ntarget = \"s3://c/t\"\nprimary_key = [\"id\"]\nsequence_by = [\"ts\"]\n";
    Config::from_toml(text, "test", None)
        .unwrap()
        .tables
        .remove(0)
}

/// A change set of one file: (op, order key, id, columns).
fn cs(name: &str, rows: &[(ChangeOp, &str, i64)], cols: Vec<(&str, ArrayRef)>) -> ChangeSet {
    let mut fields = vec![Field::new("id", DataType::Int64, true)];
    let mut arrays: Vec<ArrayRef> = vec![Arc::new(Int64Array::from_iter_values(
        rows.iter().map(|r| r.2),
    ))];
    for (n, a) in cols {
        fields.push(Field::new(n, a.data_type().clone(), true));
        arrays.push(a);
    }
    ChangeSet {
        file: Url::parse(&format!("s3://r/t/{name}")).unwrap(),
        kind: FileKind::of(name),
        data: RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap(),
        ops: rows.iter().map(|r| r.0).collect(),
        order: rows.iter().map(|r| Some(r.1)).collect(),
        seq_kinds: vec![Some(SeqKind::Timestamp)],
        starts: rows.iter().map(|r| Some(r.1.to_string())).collect(),
        generation: 1,
        written: None,
        last_modified: None,
        digest: None,
        counts: FileCounts::default(),
        absent: Vec::new(),
        partial: false,
        first_row: 0,
    }
}

fn key() -> Vec<String> {
    cfg().primary_key
}

fn strs(v: &[Option<&str>]) -> ArrayRef {
    Arc::new(StringArray::from(v.to_vec()))
}

fn column_text(p: &MergePlan, name: &str) -> Vec<Option<String>> {
    let a = arrow::compute::cast(p.column(name).unwrap(), &DataType::Utf8).unwrap();
    a.as_string::<i32>()
        .iter()
        .map(|v| v.map(str::to_string))
        .collect()
}

#[test]
fn the_latest_change_per_key_wins_across_files() {
    use ChangeOp::*;
    let a = cs(
        "20240101-1.parquet",
        &[(Insert, "1 a", 1), (Update, "1 c", 2)],
        vec![],
    );
    let b = cs(
        "20240101-2.parquet",
        &[(Delete, "1 b", 1), (Update, "1 b", 2)],
        vec![],
    );
    let p = plan(&cfg(), &[a, b]).unwrap();
    assert_eq!(p.batch.num_rows(), 2);
    assert_eq!(p.superseded, 2);
    assert_eq!(
        column_text(&p, "id"),
        vec![Some("2".into()), Some("1".into())]
    );
    assert_eq!(p.ops().unwrap(), vec![PlanOp::Upsert, PlanOp::Delete]);
    assert_eq!((p.upserts, p.deletes), (1, 1));
    assert_eq!(
        column_text(&p, &cfg().writing.sequence_column),
        vec![Some("1 c".into()), Some("1 b".into())]
    );
}

#[test]
fn admission_orders_files_widens_and_refuses_values_that_do_not_fit() {
    use arrow::array::Float64Array;
    use ChangeOp::*;
    let narrow = cs(
        "20240101-1.parquet",
        &[(Insert, "1 a", 1)],
        vec![("n", Arc::new(Int32Array::from(vec![5])))],
    );
    let wide = cs(
        "20240101-2.parquet",
        &[(Insert, "1 b", 2)],
        vec![("n", Arc::new(Int64Array::from(vec![1i64 << 40])))],
    );
    let fraction = cs(
        "20240101-3.parquet",
        &[(Insert, "1 c", 3)],
        vec![("n", Arc::new(Float64Array::from(vec![2.5])))],
    );
    let a = admit(vec![fraction, wide, narrow], &key(), None, None);
    let names: Vec<String> = a
        .admitted
        .iter()
        .map(|c| crate::storage::file_name(&c.file))
        .collect();
    assert_eq!(
        names,
        vec!["20240101-1.parquet", "20240101-2.parquet"],
        "canonical order, the misfit out"
    );
    assert_eq!(a.rejected.len(), 1);
    let e = &a.rejected[0].1;
    assert_eq!(e.kind(), "type_change", "{e}");
    assert!(e.to_string().contains("2.5"), "{e}");
    // The wider file widened the column: the narrower one admitted before it too.
    for c in &a.admitted {
        assert_eq!(
            c.data.column_by_name("n").unwrap().data_type(),
            &DataType::Int64
        );
    }
    // A refused file widens nothing.
    let narrow = cs(
        "20240101-4.parquet",
        &[(Insert, "1 d", 4)],
        vec![("n", Arc::new(Int32Array::from(vec![5])))],
    );
    let bad_wide = cs(
        "20240101-5.parquet",
        &[(Insert, "1 e", 5)],
        vec![
            ("n", Arc::new(Int64Array::from(vec![1i64 << 40]))),
            ("m", Arc::new(Float64Array::from(vec![0.5]))),
        ],
    );
    let table = arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("n", DataType::Int32, true),
        arrow::datatypes::Field::new("m", DataType::Int64, true),
    ]);
    let a = admit(vec![bad_wide, narrow], &key(), Some(&table), None);
    assert_eq!(a.rejected.len(), 1);
    assert_eq!(
        a.admitted[0].data.column_by_name("n").unwrap().data_type(),
        &DataType::Int32
    );
    // the sequence kinds of the table are checked
    let text = ChangeSet {
        seq_kinds: vec![Some(SeqKind::Text)],
        ..cs("20240101-4.parquet", &[(Insert, "1 d", 4)], vec![])
    };
    let a = admit(vec![text], &key(), None, Some(&[SeqKind::Timestamp]));
    assert!(
        a.rejected[0].1.to_string().contains("text values"),
        "{}",
        a.rejected[0].1
    );
}

#[test]
fn a_column_some_files_lack_carries_the_order_key_that_set_it() {
    use ChangeOp::*;
    // key 1: set c at "1 a", then a change without c at "1 b" → c from "1 a"
    // key 2: set c at "1 a", deleted at "1 b", re-inserted without c at "1 c" → empty as of "1 b"
    // key 3: only changes without c → not set by this batch
    let with_c = cs(
        "20240101-1.parquet",
        &[(Insert, "1 a", 1), (Insert, "1 a", 2)],
        vec![("c", strs(&[Some("x"), Some("y")]))],
    );
    let without = cs(
        "20240101-2.parquet",
        &[
            (Update, "1 b", 1),
            (Delete, "1 b", 2),
            (Insert, "1 c", 2),
            (Insert, "1 c", 3),
        ],
        vec![],
    );
    let p = plan(&cfg(), &[with_c, without]).unwrap();
    assert_eq!(p.sparse.len(), 1);
    let seq = &p.sparse[0].seq_column;
    let by_id: HashMap<_, _> = column_text(&p, "id")
        .into_iter()
        .zip(column_text(&p, "c").into_iter().zip(column_text(&p, seq)))
        .collect();
    assert_eq!(
        by_id[&Some("1".into())],
        (Some("x".into()), Some("1 a".into()))
    );
    assert_eq!(by_id[&Some("2".into())], (None, Some("1 b".into())));
    assert_eq!(by_id[&Some("3".into())], (None, None));
    assert!(
        !p.table_schema().fields().iter().any(|f| f.name() == seq),
        "internal columns are not stored"
    );
}

#[test]
fn tombstones_turn_older_upserts_into_deletes_and_clear_what_they_predate() {
    use ChangeOp::*;
    let with_c = cs(
        "20240101-1.parquet",
        &[(Insert, "1 a", 1)],
        vec![("c", strs(&[Some("x")]))],
    );
    let without = cs(
        "20240101-2.parquet",
        &[(Update, "1 c", 1), (Insert, "1 a", 2)],
        vec![],
    );
    let mut p = plan(&cfg(), &[with_c, without]).unwrap();
    let enc = KeyEncoder::new(&p.batch.schema(), &cfg().primary_key).unwrap();
    let keys = enc.encode(&p.batch).unwrap();
    let ids = column_text(&p, "id");
    let key_of =
        |id: &str| keys[ids.iter().position(|i| i.as_deref() == Some(id)).unwrap()].clone();
    // key 1 was deleted at "1 b" (after c was set, before the last change); key 2 at "1 z"
    let tombs = HashMap::from([
        (key_of("1"), "1 b".to_string()),
        (key_of("2"), "1 z".to_string()),
    ]);
    let blocked = apply_tombstones(&mut p, &cfg(), &tombs).unwrap();
    assert_eq!(blocked, 1);
    let seq = p.sparse[0].seq_column.clone();
    let rows: HashMap<_, _> = column_text(&p, "id")
        .into_iter()
        .zip(
            p.ops()
                .unwrap()
                .into_iter()
                .zip(column_text(&p, "c").into_iter().zip(column_text(&p, &seq))),
        )
        .collect();
    assert_eq!(
        rows[&Some("1".into())],
        (PlanOp::Upsert, (None, Some("1 b".into())))
    );
    assert_eq!(rows[&Some("2".into())].0, PlanOp::Delete);
}

/// A key converted to the type another file of the batch gave the key column is checked in
/// that type: text `NaN` into a float key fails its file, text `-0` is the key `0`.
#[test]
fn a_key_converted_to_another_files_type_is_checked_again() {
    use arrow::array::{AsArray, Float64Array};
    use arrow::datatypes::Float64Type;
    use ChangeOp::*;
    let keyed = |name: &str, id: ArrayRef| ChangeSet {
        data: RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new(
                "id",
                id.data_type().clone(),
                true,
            )])),
            vec![id],
        )
        .unwrap(),
        ..cs(name, &[(Insert, "1 a", 0)], vec![])
    };
    let floats = keyed(
        "20240101-1.parquet",
        Arc::new(Float64Array::from(vec![1.5])),
    );
    let nan = keyed("20240101-2.parquet", strs(&[Some("NaN")]));
    let zero = keyed("20240101-3.parquet", strs(&[Some("-0")]));
    let a = admit(vec![floats, nan, zero], &key(), None, None);
    assert_eq!(a.rejected.len(), 1);
    assert!(a.rejected[0].0.path().ends_with("20240101-2.parquet"));
    let e = a.rejected[0].1.to_string();
    assert!(e.contains("NaN") && e.contains("row 1"), "{e}");
    assert_eq!(a.admitted.len(), 2);
    let z = a.admitted[1]
        .data
        .column_by_name("id")
        .unwrap()
        .as_primitive::<Float64Type>()
        .value(0);
    assert!(z == 0.0 && z.is_sign_positive(), "-0 is stored as 0: {z}");
}

/// Text `NaN` into a float key column of the table is a NaN key: refused when admission
/// converts the file's column to the table's type (files are read in their own types).
#[test]
fn text_nan_into_a_float_key_column_fails_the_file() {
    let mut file = cs(
        "LOAD00000001.parquet",
        &[(ChangeOp::Insert, "0 a", 1), (ChangeOp::Insert, "0 b", 2)],
        vec![],
    );
    file.data = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, true)])),
        vec![Arc::new(StringArray::from(vec!["1.5", "NaN"]))],
    )
    .unwrap();
    let table = Schema::new(vec![Field::new("id", DataType::Float64, true)]);
    let a = admit(vec![file], &key(), Some(&table), None);
    assert!(a.admitted.is_empty());
    let e = a.rejected[0].1.to_string();
    assert!(e.contains("row 2, column `id`") && e.contains("NaN"), "{e}");
}

/// Keys that ascend, keys all distinct but unordered, and ascending keys with a repeat: each
/// plan keeps the file's order and one row per key, the latest (the shortcuts for distinct
/// keys must not skip a repeat).
#[test]
fn distinct_keys_are_each_chosen_in_file_order_and_a_repeat_is_still_folded() {
    use ChangeOp::*;
    let ids = |p: &MergePlan| column_text(p, "id");
    let text = |v: &[i64]| v.iter().map(|i| Some(i.to_string())).collect::<Vec<_>>();
    for keys in [vec![1, 2, 3, 5], vec![5, 1, 3, 2]] {
        let rows: Vec<_> = keys.iter().map(|&k| (Insert, "1 a", k)).collect();
        let p = plan(&cfg(), &[cs("LOAD00000001.parquet", &rows, vec![])]).unwrap();
        assert_eq!(ids(&p), text(&keys));
        assert_eq!(p.superseded, 0);
    }
    let rows = [
        (Insert, "1 a", 1),
        (Insert, "1 b", 2),
        (Update, "1 c", 2),
        (Insert, "1 d", 3),
    ];
    let p = plan(&cfg(), &[cs("20240101-1.parquet", &rows, vec![])]).unwrap();
    assert_eq!(ids(&p), text(&[1, 2, 3]));
    assert_eq!(p.superseded, 1);
    assert_eq!(
        column_text(&p, &cfg().writing.sequence_column),
        vec![Some("1 a".into()), Some("1 c".into()), Some("1 d".into())]
    );
    // Text keys, told ascending from the strings themselves: a repeat is folded too.
    for (keys, kept, superseded) in [
        (["a", "b", "c", "d"], vec!["a", "b", "c", "d"], 0),
        (["a", "b", "b", "c"], vec!["a", "b", "c"], 1),
    ] {
        let mut c = cs("20240101-1.parquet", &rows, vec![]);
        c.data = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, true)])),
            vec![Arc::new(StringArray::from(keys.to_vec()))],
        )
        .unwrap();
        let p = plan(&cfg(), &[c]).unwrap();
        let kept: Vec<_> = kept.iter().map(|k| Some(k.to_string())).collect();
        assert_eq!(ids(&p), kept);
        assert_eq!(p.superseded, superseded);
    }
}
