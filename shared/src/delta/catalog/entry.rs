//! What the catalog should say about a table: the entries' columns (Hive/Glue types mapped
//! from the Delta schema), partition keys, location, formats and parameters — derived from a
//! Delta table version, without calling Glue.

use std::collections::{BTreeSet, HashMap};

use arrow::datatypes::{DataType, Schema, TimeUnit};
use deltalake::DeltaTable;

use crate::config::EntryKind;
use crate::delta;
use crate::delta::manifest::{Partition, MANIFEST_DIR};
use crate::error::{Error, Result};

/// Parameter tributary sets on every entry it creates (an entry without it is not ours).
pub(crate) const MANAGED: &str = "tributary.managed";
/// Parameters recording which Delta table and version an entry was written from: a sync
/// never replaces an entry written from a newer version of the same table (two merges
/// syncing concurrently cannot leave the older schema behind).
pub(crate) const DELTA_TABLE_ID: &str = "tributary.delta_table_id";
pub(crate) const DELTA_VERSION: &str = "tributary.delta_version";

const PARQUET_SERDE: &str = "org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe";
const PARQUET_INPUT: &str = "org.apache.hadoop.hive.ql.io.parquet.MapredParquetInputFormat";
const PARQUET_OUTPUT: &str = "org.apache.hadoop.hive.ql.io.parquet.MapredParquetOutputFormat";
const SYMLINK_INPUT: &str = "org.apache.hadoop.hive.ql.io.SymlinkTextInputFormat";
const IGNORE_KEY_OUTPUT: &str = "org.apache.hadoop.hive.ql.io.HiveIgnoreKeyTextOutputFormat";

/// A catalog entry as it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Desired {
    pub(crate) name: String,
    pub(crate) columns: Vec<(String, String)>,
    pub(crate) partition_keys: Vec<(String, String)>,
    pub(crate) location: String,
    pub(crate) input_format: &'static str,
    pub(crate) output_format: &'static str,
    pub(crate) serde: &'static str,
    pub(crate) parameters: Vec<(String, String)>,
    pub(crate) serde_parameters: Vec<(String, String)>,
    /// The Delta table's id and the version this entry describes.
    pub(crate) table_id: String,
    pub(crate) version: u64,
}

/// A catalog entry as Glue has it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Existing {
    /// (name, type, comment)
    pub(crate) columns: Vec<(String, String, Option<String>)>,
    pub(crate) partition_keys: Vec<(String, String)>,
    pub(crate) location: Option<String>,
    pub(crate) input_format: Option<String>,
    pub(crate) output_format: Option<String>,
    pub(crate) serde: Option<String>,
    pub(crate) serde_parameters: HashMap<String, String>,
    pub(crate) parameters: HashMap<String, String>,
    pub(crate) table_type: Option<String>,
    #[cfg_attr(
        not(feature = "glue"),
        allow(dead_code, reason = "read by the SDK's update call")
    )]
    pub(crate) version_id: Option<String>,
}

/// A partition of a manifest entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct GluePartition {
    pub(crate) values: Vec<String>,
    pub(crate) location: String,
}

/// What to do with an existing entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    UpToDate,
    Update,
    /// Written from a newer version of the same Delta table: leave it.
    Newer,
    /// Not created by tributary, and adoption is off.
    NotOurs,
}

impl Existing {
    pub(crate) fn managed(&self) -> bool {
        self.parameters.get(MANAGED).map(String::as_str) == Some("true")
    }

    pub(crate) fn verdict(&self, d: &Desired, adopt: bool) -> Verdict {
        if !self.managed() && !adopt {
            return Verdict::NotOurs;
        }
        let same_table = self.parameters.get(DELTA_TABLE_ID) == Some(&d.table_id);
        let written_from = self
            .parameters
            .get(DELTA_VERSION)
            .and_then(|v| v.parse::<u64>().ok());
        if self.managed() && same_table && written_from.is_some_and(|v| v > d.version) {
            return Verdict::Newer;
        }
        if self.matches(d) {
            Verdict::UpToDate
        } else {
            Verdict::Update
        }
    }

    /// Whether the entry says what `d` says (names compared as Glue and Athena do, without
    /// case; parameters others added are left alone).
    fn matches(&self, d: &Desired) -> bool {
        let same = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
        let columns = self.columns.len() == d.columns.len()
            && self
                .columns
                .iter()
                .zip(&d.columns)
                .all(|((n, t, _), (dn, dt))| same(n, dn) && same(t, dt));
        let keys = self.partition_keys.len() == d.partition_keys.len()
            && self
                .partition_keys
                .iter()
                .zip(&d.partition_keys)
                .all(|((n, t), (dn, dt))| same(n, dn) && same(t, dt));
        let has = |m: &HashMap<String, String>, kv: &[(String, String)]| {
            kv.iter().all(|(k, v)| m.get(k) == Some(v))
        };
        columns
            && keys
            && self.location.as_deref() == Some(d.location.as_str())
            && self.input_format.as_deref() == Some(d.input_format)
            && self.output_format.as_deref() == Some(d.output_format)
            && self.serde.as_deref() == Some(d.serde)
            && self.table_type.as_deref() == Some(TABLE_TYPE)
            && has(&self.serde_parameters, &d.serde_parameters)
            && has(&self.parameters, &d.parameters)
    }
}

impl Desired {
    /// The parameters to write: those already on the entry (other tools' included), then
    /// tributary's.
    pub(crate) fn parameters_over(&self, existing: Option<&Existing>) -> HashMap<String, String> {
        let mut p = existing.map(|e| e.parameters.clone()).unwrap_or_default();
        p.extend(self.parameters.iter().cloned());
        p.insert(DELTA_TABLE_ID.into(), self.table_id.clone());
        p.insert(DELTA_VERSION.into(), self.version.to_string());
        p
    }
}

/// Glue's table type of every entry.
pub(crate) const TABLE_TYPE: &str = "EXTERNAL_TABLE";

/// The Hive/Glue type of a Delta column.
pub(crate) fn hive_type(dt: &DataType) -> Result<String> {
    Ok(match dt {
        DataType::Boolean => "boolean".into(),
        DataType::Int8 => "tinyint".into(),
        DataType::Int16 => "smallint".into(),
        DataType::Int32 => "int".into(),
        DataType::Int64 => "bigint".into(),
        DataType::Float32 => "float".into(),
        DataType::Float64 => "double".into(),
        DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => format!("decimal({p},{s})"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "binary".into(),
        DataType::Date32 | DataType::Date64 => "date".into(),
        DataType::Timestamp(TimeUnit::Microsecond | TimeUnit::Millisecond, _) => "timestamp".into(),
        DataType::Struct(fields) => format!(
            "struct<{}>",
            fields
                .iter()
                .map(|f| Ok(format!("{}:{}", f.name(), hive_type(f.data_type())?)))
                .collect::<Result<Vec<_>>>()?
                .join(",")
        ),
        DataType::List(f) | DataType::LargeList(f) => {
            format!("array<{}>", hive_type(f.data_type())?)
        }
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => format!(
                "map<{},{}>",
                hive_type(kv[0].data_type())?,
                hive_type(kv[1].data_type())?
            ),
            other => return Err(no_type(other)),
        },
        other => return Err(no_type(other)),
    })
}

fn no_type(dt: &DataType) -> Error {
    Error::internal(format!("the Delta type {dt} has no Glue type"))
}

fn columns(schema: &Schema, keep: impl Fn(&str) -> bool) -> Result<Vec<(String, String)>> {
    schema
        .fields()
        .iter()
        .filter(|f| keep(f.name()))
        .map(|f| Ok((f.name().clone(), hive_type(f.data_type())?)))
        .collect()
}

/// `s3://…/table/` of a table (with a trailing slash) and of its manifest folder.
fn location(table: &DeltaTable, sub: Option<&str>) -> String {
    let mut u = table.table_url().to_string();
    if !u.ends_with('/') {
        u.push('/');
    }
    if let Some(s) = sub {
        u.push_str(s);
        u.push('/');
    }
    u
}

/// The entry for a table version.
pub(crate) fn desired(table: &DeltaTable, name: &str, kind: EntryKind) -> Result<Desired> {
    let schema = delta::arrow_schema(table)
        .ok_or_else(|| Error::internal(format!("{name}: the table has no schema yet")))?;
    let parts = delta::partition_columns(table)?;
    let label = table.table_url().to_string();
    let snapshot = table.snapshot().map_err(|e| Error::delta(&label, e))?;
    let table_id = snapshot.metadata().id().to_string();
    let version = table.version().unwrap_or_default();
    let managed = (MANAGED.to_string(), "true".to_string());
    // What a reader needs, said on the entry when the table has reader features (deletion
    // vectors: Athena engine 3, Spark with Delta 2.3+, Trino, DuckDB, Python deltalake).
    let protocol = snapshot.protocol();
    let (reader_features, _) = delta::feature_names(protocol);
    let readers = (!reader_features.is_empty()).then(|| {
        [
            (
                "delta.minReaderVersion".to_string(),
                protocol.min_reader_version().to_string(),
            ),
            (
                "delta.readerFeatures".to_string(),
                reader_features.join(","),
            ),
        ]
    });
    Ok(match kind {
        EntryKind::Delta { .. } => Desired {
            name: name.to_string(),
            columns: columns(&schema, |_| true)?,
            partition_keys: vec![],
            location: location(table, None),
            input_format: PARQUET_INPUT,
            output_format: PARQUET_OUTPUT,
            serde: PARQUET_SERDE,
            parameters: vec![
                ("EXTERNAL".into(), "TRUE".into()),
                ("table_type".into(), "DELTA".into()),
                ("spark.sql.sources.provider".into(), "delta".into()),
                managed,
            ]
            .into_iter()
            .chain(readers.into_iter().flatten())
            .collect(),
            serde_parameters: vec![("path".into(), location(table, None))],
            table_id,
            version,
        },
        EntryKind::Manifest { .. } => Desired {
            name: name.to_string(),
            columns: columns(&schema, |c| !parts.iter().any(|p| p == c))?,
            partition_keys: parts
                .iter()
                .map(|p| {
                    let f = schema.field_with_name(p).map_err(Error::arrow)?;
                    Ok((p.clone(), hive_type(f.data_type())?))
                })
                .collect::<Result<_>>()?,
            location: location(table, Some(MANIFEST_DIR)),
            input_format: SYMLINK_INPUT,
            output_format: IGNORE_KEY_OUTPUT,
            serde: PARQUET_SERDE,
            parameters: vec![("EXTERNAL".into(), "TRUE".into()), managed],
            serde_parameters: vec![],
            table_id,
            version,
        },
    })
}

/// A manifest entry's partition: its values (Hive's null value for nulls) and location.
pub(crate) fn partition(table: &DeltaTable, p: &Partition) -> GluePartition {
    let values =
        p.0.iter()
            .map(|(_, v)| match v {
                Some(v) if !v.is_empty() => v.clone(),
                _ => "__HIVE_DEFAULT_PARTITION__".to_string(),
            })
            .collect();
    GluePartition {
        values,
        location: format!("{}{}/", location(table, Some(MANIFEST_DIR)), p.folder()),
    }
}

/// The partitions of a table version (none when it is not partitioned).
pub(crate) fn partitions(table: &DeltaTable) -> Result<BTreeSet<GluePartition>> {
    if delta::partition_columns(table)?.is_empty() {
        return Ok(BTreeSet::new());
    }
    Ok(crate::delta::manifest::live_files(table)?
        .iter()
        .map(|f| partition(table, &f.partition))
        .collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::Field;

    use super::*;

    #[test]
    fn every_type_the_readers_produce_has_a_glue_type() {
        let cases = [
            (DataType::Boolean, "boolean"),
            (DataType::Int8, "tinyint"),
            (DataType::Int16, "smallint"),
            (DataType::Int32, "int"),
            (DataType::Int64, "bigint"),
            (DataType::Float32, "float"),
            (DataType::Float64, "double"),
            (DataType::Decimal128(20, 0), "decimal(20,0)"),
            (DataType::Decimal128(10, 2), "decimal(10,2)"),
            (DataType::Utf8, "string"),
            (DataType::Binary, "binary"),
            (DataType::Date32, "date"),
            (
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                "timestamp",
            ),
            (
                DataType::Timestamp(TimeUnit::Microsecond, None),
                "timestamp",
            ),
        ];
        for (dt, want) in cases {
            assert_eq!(hive_type(&dt).unwrap(), want, "{dt}");
        }
        // every type a new column can get (coerce::delta_type) maps
        for dt in [
            DataType::UInt64,
            DataType::UInt32,
            DataType::Float16,
            DataType::Date64,
            DataType::LargeUtf8,
            DataType::Time64(TimeUnit::Microsecond),
            DataType::Timestamp(TimeUnit::Nanosecond, None),
        ] {
            let delta = crate::coerce::delta_type(&dt).unwrap();
            assert!(hive_type(&delta).is_ok(), "{dt} → {delta}");
        }
        let nested = DataType::Struct(
            vec![
                Field::new("a", DataType::Int32, true),
                Field::new_list("b", Field::new("item", DataType::Utf8, true), true),
            ]
            .into(),
        );
        assert_eq!(hive_type(&nested).unwrap(), "struct<a:int,b:array<string>>");
        let map = DataType::Map(
            Arc::new(Field::new(
                "entries",
                DataType::Struct(
                    vec![
                        Field::new("key", DataType::Utf8, false),
                        Field::new("value", DataType::Int64, true),
                    ]
                    .into(),
                ),
                false,
            )),
            false,
        );
        assert_eq!(hive_type(&map).unwrap(), "map<string,bigint>");
        assert!(hive_type(&DataType::Duration(TimeUnit::Second)).is_err());
    }

    fn desired_entry() -> Desired {
        Desired {
            name: "trips".into(),
            columns: vec![
                ("trip_id".into(), "int".into()),
                ("fare".into(), "decimal(10,2)".into()),
            ],
            partition_keys: vec![],
            location: "s3://c/trips/".into(),
            input_format: PARQUET_INPUT,
            output_format: PARQUET_OUTPUT,
            serde: PARQUET_SERDE,
            parameters: vec![
                ("table_type".into(), "DELTA".into()),
                (MANAGED.into(), "true".into()),
            ],
            serde_parameters: vec![("path".into(), "s3://c/trips/".into())],
            table_id: "id-1".into(),
            version: 7,
        }
    }

    /// The entry as Glue would return it after tributary wrote `d` (plus what other tools
    /// add: a parameter, a column comment).
    fn written(d: &Desired) -> Existing {
        let mut parameters = d.parameters_over(None);
        parameters.insert("classification".into(), "parquet".into());
        Existing {
            columns: d
                .columns
                .iter()
                .map(|(n, t)| (n.to_uppercase(), t.clone(), Some("a comment".into())))
                .collect(),
            partition_keys: d.partition_keys.clone(),
            location: Some(d.location.clone()),
            input_format: Some(d.input_format.into()),
            output_format: Some(d.output_format.into()),
            serde: Some(d.serde.into()),
            serde_parameters: d.serde_parameters.iter().cloned().collect(),
            parameters,
            table_type: Some(TABLE_TYPE.into()),
            version_id: Some("3".into()),
        }
    }

    /// #46: the Delta entry of a table with deletion vectors says what its readers need
    /// (reader version 3 with `deletionVectors`); a table without reader features says
    /// nothing more than before.
    #[tokio::test]
    async fn the_entry_of_a_table_with_deletion_vectors_says_what_readers_need() {
        let dir = tempfile::tempdir().unwrap();
        let url = url::Url::from_directory_path(dir.path()).unwrap();
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, true)]);
        let (t, _) =
            delta::open_or_create(&url, &HashMap::new(), "t", &schema, &[], HashMap::new())
                .await
                .unwrap();
        let kind = EntryKind::Delta { history: false };
        let before = desired(&t, "t", kind).unwrap();
        assert!(!before
            .parameters
            .iter()
            .any(|(k, _)| k.starts_with("delta.")));
        let t = delta::set_properties(t, crate::props::TableProps::for_deletion_vectors())
            .await
            .unwrap();
        let after = desired(&t, "t", kind).unwrap();
        let p: HashMap<_, _> = after.parameters.into_iter().collect();
        assert_eq!(
            p.get("delta.minReaderVersion").map(String::as_str),
            Some("3")
        );
        assert_eq!(
            p.get("delta.readerFeatures").map(String::as_str),
            Some("deletionVectors")
        );
    }

    #[test]
    fn an_entry_is_replaced_only_when_it_differs_and_is_ours() {
        let d = desired_entry();
        let e = written(&d);
        // what tributary wrote, with others' additions and names in another case: in step
        assert_eq!(e.verdict(&d, false), Verdict::UpToDate);
        // a later version with the same schema: still in step (no call)
        let later = Desired {
            version: 9,
            ..d.clone()
        };
        assert_eq!(e.verdict(&later, false), Verdict::UpToDate);
        // a new column → update; the parameters others set are kept
        let mut wider = later.clone();
        wider.columns.push(("channel".into(), "string".into()));
        assert_eq!(e.verdict(&wider, false), Verdict::Update);
        let p = wider.parameters_over(Some(&e));
        assert_eq!(p["classification"], "parquet");
        assert_eq!(p[DELTA_VERSION], "9");
        // an older version than the one the entry was written from: left alone...
        let mut older = wider.clone();
        older.version = 5;
        assert_eq!(e.verdict(&older, false), Verdict::Newer);
        // ...unless the Delta table was re-created (another id): its versions start over
        older.table_id = "id-2".into();
        assert_eq!(e.verdict(&older, false), Verdict::Update);
        // drift made by hand (a type, the location, a parameter) → update
        for drift in [
            |e: &mut Existing| e.columns[1].1 = "double".into(),
            |e: &mut Existing| e.location = Some("s3://elsewhere/".into()),
            |e: &mut Existing| {
                e.parameters.remove("table_type");
            },
            |e: &mut Existing| e.serde_parameters.clear(),
            |e: &mut Existing| e.table_type = Some("VIRTUAL_VIEW".into()),
        ] {
            let mut changed = e.clone();
            drift(&mut changed);
            assert_eq!(changed.verdict(&d, false), Verdict::Update);
        }
        // somebody else's entry: never replaced unless adopted
        let mut theirs = e.clone();
        theirs.parameters.remove(MANAGED);
        assert_eq!(theirs.verdict(&d, false), Verdict::NotOurs);
        assert_eq!(theirs.verdict(&d, true), Verdict::Update);
        assert_eq!(d.parameters_over(Some(&theirs))[MANAGED], "true");
    }
}
