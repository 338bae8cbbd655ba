//! A test convention in Debezium's shape (#45): each row an event with `op` (`c` create,
//! `u` update, `d` delete, `r` a snapshot read), the row's values in the `before` and
//! `after` structs (a delete carries only `before`), ordered by `ts_ms` then the source's
//! log position (`source.lsn`). No full-load files: a snapshot is `r` events in the stream.
//!
//! It exists to hold the seam between decoding and meaning: it was added with no edit
//! outside `source/` and `config/`, and its tests merge it through the engine. It is not a
//! product feature (Debezium's S3 sinks, schemas and envelopes vary more than this).

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StructArray};
use arrow::datatypes::{DataType, Field, Schema};
use chrono::{DateTime, Utc};
use std::sync::Arc;

use super::convention::{Changes, Convention};
use super::{check_column_names, column, column_list, plain_columns, ChangeOp, FileInfo, Spec};
use crate::error::{Error, Location, Result};
use crate::model::FileKind;

/// The test convention.
pub(super) struct DebeziumShaped;

const OP: &str = "op";
const BEFORE: &str = "before";
const AFTER: &str = "after";
const TS: &str = "ts_ms";
const SOURCE: &str = "source";
const LSN: &str = "lsn";

impl Convention for DebeziumShaped {
    fn kind(&self, _file_name: &str) -> FileKind {
        FileKind::Cdc
    }

    fn name_time(&self, _file_name: &str) -> Option<DateTime<Utc>> {
        None
    }

    fn check_orderable(&self, _: &str, _: &str, _: FileKind, _: &Spec) -> Result<()> {
        // Every event carries its order (`ts_ms`, `source.lsn`), whatever its file's name.
        Ok(())
    }

    fn changes(&self, f: &FileInfo<'_>, raw: RecordBatch, cfg: &Spec) -> Result<Changes> {
        let raw = plain_columns(f.name, raw)?;
        let missing = |name: &str| {
            Error::bad_input(
                f.name,
                Location::Column(name.to_string()),
                format!("missing (columns: {})", column_list(&raw.schema())),
            )
        };
        let structure = |name: &str| -> Result<StructArray> {
            let a = column(&raw, name).ok_or_else(|| missing(name))?;
            a.as_struct_opt().cloned().ok_or_else(|| {
                Error::bad_input(
                    f.name,
                    Location::Column(name.to_string()),
                    format!(
                        "a Debezium envelope's `{name}` is a struct, not {}",
                        a.data_type()
                    ),
                )
            })
        };
        let (before, after, source) = (structure(BEFORE)?, structure(AFTER)?, structure(SOURCE)?);
        if before.fields() != after.fields() {
            return Err(Error::bad_input(
                f.name,
                Location::Column(BEFORE.into()),
                "`before` and `after` have different fields",
            ));
        }
        let ops = operations(f, &raw, &before, &after)?;
        let deletes = BooleanArray::from_iter(ops.iter().map(|o| Some(*o == ChangeOp::Delete)));
        let mut fields = Vec::new();
        let mut columns: Vec<ArrayRef> = Vec::new();
        for (i, field) in after.fields().iter().enumerate() {
            if [TS, LSN].contains(&field.name().as_str()) {
                return Err(Error::bad_input(
                    f.name,
                    Location::Column(field.name().clone()),
                    "a row column named like the envelope's order columns",
                ));
            }
            let c = arrow::compute::kernels::zip::zip(&deletes, before.column(i), after.column(i))
                .map_err(Error::arrow)?;
            fields.push(Field::new(field.name(), field.data_type().clone(), true));
            columns.push(c);
        }
        let ts = column(&raw, TS).ok_or_else(|| missing(TS))?;
        let lsn = source
            .column_by_name(LSN)
            .cloned()
            .ok_or_else(|| missing("source.lsn"))?;
        fields.push(Field::new(TS, ts.data_type().clone(), true));
        fields.push(Field::new(LSN, lsn.data_type().clone(), true));
        columns.extend([ts, lsn]);
        let rows =
            RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(Error::arrow)?;
        check_column_names(f.name, &rows.schema(), cfg)?;
        Ok(Changes {
            rows,
            ops,
            absent: Vec::new(),
            sequence: vec![TS.into(), LSN.into()],
            own: vec![TS.into(), LSN.into()],
        })
    }
}

/// Each event's operation; the struct it takes its row from must be there.
fn operations(
    f: &FileInfo<'_>,
    raw: &RecordBatch,
    before: &StructArray,
    after: &StructArray,
) -> Result<Vec<ChangeOp>> {
    let a = column(raw, OP)
        .ok_or_else(|| Error::bad_input(f.name, Location::Column(OP.into()), "missing"))?;
    let a = arrow::compute::cast(&a, &DataType::Utf8).map_err(Error::arrow)?;
    let a = a.as_string::<i32>();
    (0..raw.num_rows())
        .map(|i| {
            let at = |column: &str| Location::Row {
                row: i + 1,
                column: Some(column.into()),
            };
            let value = (!a.is_null(i)).then(|| a.value(i));
            let op = match value {
                Some("c" | "r") => ChangeOp::Insert,
                Some("u") => ChangeOp::Update,
                Some("d") => ChangeOp::Delete,
                other => {
                    return Err(Error::bad_input(
                        f.name,
                        at(OP),
                        format!("unknown operation {other:?} (expected c, u, d or r)"),
                    ))
                }
            };
            let (image, name) = match op {
                ChangeOp::Delete => (before, BEFORE),
                _ => (after, AFTER),
            };
            if image.is_null(i) {
                return Err(Error::bad_input(
                    f.name,
                    at(name),
                    format!(
                        "an event with op {value:?} carries its row in `{name}`, which is null"
                    ),
                ));
            }
            Ok(op)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::Fields;
    use url::Url;

    use super::*;
    use crate::config::{Config, Convention as Kind};
    use crate::engine::{Engine, FileStatus};
    use crate::error::Error;
    use crate::sink::memory::MemorySink;
    use crate::storage::Storage;
    use crate::tuning::Tuning;

    /// One event: op, (id, name) before, (id, name) after, ts_ms, lsn.
    type Event = (
        &'static str,
        Option<(i64, &'static str)>,
        Option<(i64, &'static str)>,
        i64,
        i64,
    );

    fn envelope(events: &[Event]) -> bytes::Bytes {
        let row_fields = Fields::from(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ]);
        let image = |pick: &dyn Fn(&Event) -> Option<(i64, &'static str)>| -> ArrayRef {
            let ids = Int64Array::from_iter(events.iter().map(|e| pick(e).map(|r| r.0)));
            let names = StringArray::from_iter(events.iter().map(|e| pick(e).map(|r| r.1)));
            let valid =
                arrow::buffer::NullBuffer::from_iter(events.iter().map(|e| pick(e).is_some()));
            Arc::new(StructArray::new(
                row_fields.clone(),
                vec![Arc::new(ids), Arc::new(names)],
                Some(valid),
            ))
        };
        let source_fields = Fields::from(vec![Field::new(LSN, DataType::Int64, false)]);
        let source = StructArray::new(
            source_fields.clone(),
            vec![Arc::new(Int64Array::from_iter_values(
                events.iter().map(|e| e.4),
            ))],
            None,
        );
        let schema = Schema::new(vec![
            Field::new(BEFORE, DataType::Struct(row_fields.clone()), true),
            Field::new(AFTER, DataType::Struct(row_fields.clone()), true),
            Field::new(SOURCE, DataType::Struct(source_fields), false),
            Field::new(OP, DataType::Utf8, false),
            Field::new(TS, DataType::Int64, false),
        ]);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                image(&|e| e.1),
                image(&|e| e.2),
                Arc::new(source),
                Arc::new(StringArray::from_iter_values(events.iter().map(|e| e.0))),
                Arc::new(Int64Array::from_iter_values(events.iter().map(|e| e.3))),
            ],
        )
        .unwrap();
        crate::demo::to_parquet(&batch).unwrap()
    }

    fn engine(dir: &std::path::Path) -> Engine<MemorySink> {
        let text = crate::config::test_table("t", "raw/t/", "curated/t", "");
        let mut config = Config::from_toml(&text, "test", Some(dir)).unwrap();
        config.tables[0].convention = Kind::DebeziumShaped;
        Engine::on(config, &Tuning::default(), |_| MemorySink::default())
    }

    /// A snapshot (`r`), creates, updates and deletes in Debezium's shape, in two files
    /// delivered in turn and twice: the engine merges them through the convention into the
    /// source's state — the order is the events' (`ts_ms`, then `source.lsn` for events of
    /// one millisecond), not the files' (ordered by file, keys 1 and 4 would end as the
    /// second file left them).
    #[tokio::test]
    async fn a_convention_in_debeziums_shape_merges_through_the_engine() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path());
        let source = engine.config().tables[0].source.clone();
        // The first file (by name) holds the two newest events of keys 1 and 4: key 1's
        // by its log position alone (the same millisecond as the second file's update).
        let first: [Event; 6] = [
            ("r", None, Some((1, "ann")), 1000, 10),
            ("r", None, Some((2, "bob")), 1000, 11),
            ("c", None, Some((3, "cy")), 2000, 20),
            ("u", Some((3, "cy")), Some((3, "cyd")), 2000, 21),
            ("u", Some((1, "anne")), Some((1, "ann-a")), 3000, 35),
            ("u", Some((4, "dee")), Some((4, "dee2")), 5000, 50),
        ];
        let second: [Event; 3] = [
            ("d", Some((2, "bob")), None, 3000, 30),
            ("u", Some((1, "ann")), Some((1, "anne")), 3000, 31),
            ("c", None, Some((4, "dee")), 4000, 40),
        ];
        let storage = Storage::new();
        let (a, b): (Url, Url) = (
            source
                .join("dbserver1.public.t+0+0000000000.parquet")
                .unwrap(),
            source
                .join("dbserver1.public.t+0+0000000004.parquet")
                .unwrap(),
        );
        storage.put(&a, envelope(&first)).await.unwrap();
        storage.put(&b, envelope(&second)).await.unwrap();

        for files in [vec![b.clone()], vec![a.clone(), b.clone()], vec![a.clone()]] {
            let report = engine.process_into(&engine.sink, &files).await;
            assert_eq!(report.failures().count(), 0, "{:?}", report.files);
        }

        let rows: BTreeMap<String, String> = engine
            .sink
            .rows("t", &["id", "name"])
            .into_iter()
            .map(|r| (r[0].clone(), r[1].clone()))
            .collect();
        let want: BTreeMap<String, String> = [("1", "ann-a"), ("3", "cyd"), ("4", "dee2")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(rows, want);
    }

    /// Which files are full loads and what a name says of a file's time are the table's
    /// convention's, for the engine's order and the Delta operations (watermark, reload)
    /// alike: a file named like a DMS full load is changes here (a snapshot is `r` events),
    /// and a DMS time-stamped name tells no time.
    #[test]
    fn file_kinds_and_times_are_the_conventions() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path());
        let debezium = &engine.config().tables[0];
        let mut dms = debezium.clone();
        dms.convention = Kind::Dms;
        let (load, cdc) = ("LOAD00000001.parquet", "20240101-120000000.parquet");
        assert_eq!(crate::source::file_kind(debezium, load), FileKind::Cdc);
        assert_eq!(crate::source::file_kind(&dms, load), FileKind::FullLoad);
        assert_eq!(crate::source::name_time(debezium, cdc), None);
        assert!(crate::source::name_time(&dms, cdc).is_some());
        let url = |n: &str| Url::parse(&format!("s3://r/t/{n}")).unwrap();
        let (a, b) = (url(load), url(cdc));
        let mut files = vec![a.clone(), b.clone()];
        files.sort_by_key(|f| crate::source::apply_order_of(debezium, f));
        assert_eq!(
            files,
            vec![b.clone(), a.clone()],
            "by name: both are changes"
        );
        files.sort_by_key(|f| crate::source::apply_order_of(&dms, f));
        assert_eq!(files, vec![a, b], "the full load first");
    }

    /// An unknown operation and a delete without its `before` row fail the file naming
    /// the row and the column; nothing is merged.
    #[tokio::test]
    async fn a_bad_event_fails_its_file_naming_row_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path());
        let source = engine.config().tables[0].source.clone();
        let storage = Storage::new();
        let cases: [(&str, Vec<Event>, &str); 2] = [
            (
                "x.parquet",
                vec![
                    ("c", None, Some((1, "a")), 1, 1),
                    ("t", None, Some((2, "b")), 2, 2),
                ],
                "row 2, column `op`",
            ),
            (
                "y.parquet",
                vec![("d", None, None, 3, 3)],
                "row 1, column `before`",
            ),
        ];
        for (name, events, at) in cases {
            let url = source.join(name).unwrap();
            storage.put(&url, envelope(&events)).await.unwrap();
            let report = engine.process_into(&engine.sink, &[url]).await;
            match &report.files[0].status {
                FileStatus::Failed { error, .. } => {
                    assert!(matches!(**error, Error::BadInput { .. }), "{error}");
                    assert!(error.to_string().contains(at), "{error} names {at}");
                    assert!(!error.is_retryable());
                }
                other => panic!("{name} fails: {other:?}"),
            }
        }
        assert_eq!(engine.sink.commits("t"), 0);
    }
}
