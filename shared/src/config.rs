//! Table configuration: which DMS folders feed which Delta tables, and how to read them.
//!
//! One TOML file lists the tables. It is loaded from a local path or an `s3://` URI and
//! validated before anything runs; every error says which table and field is wrong and how
//! to fix it. See `docs/configuration.md` for the reference of every field.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use arrow::datatypes::{DataType, TimeUnit};
use serde::Deserialize;
use url::Url;

use crate::error::{Error, Result};

/// Name of the column that stores, in every curated row, the order key of the change that
/// produced it. Merges apply a change only when its order key is greater.
pub const DEFAULT_SEQUENCE_COLUMN: &str = "_tributary_seq";
/// Sub-folder of the target table that holds the delete tombstones (its own Delta table).
/// Names starting with `_` are hidden from readers and from VACUUM of the main table.
pub const TOMBSTONE_DIR: &str = "_tributary_tombstones";

/// The whole configuration file.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was loaded from (for messages).
    pub origin: String,
    pub tables: Vec<TableConfig>,
}

/// Input file format.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    Parquet,
    Csv(CsvOptions),
}

/// How to read DMS CSV files.
#[derive(Debug, Clone, PartialEq)]
pub struct CsvOptions {
    /// Whether files start with a header row (DMS `AddColumnName=true`).
    pub header: bool,
    /// Field delimiter (DMS `CsvDelimiter`, default `,`).
    pub delimiter: u8,
    /// Quote character (DMS writes RFC 4180 quoting with `"`).
    pub quote: u8,
    /// Text that stands for NULL (DMS `CsvNullValue`, default `NULL`).
    pub null_value: String,
    /// Whether full-load files carry the `Op` column (DMS `IncludeOpForFullLoad`).
    pub include_op_for_full_load: bool,
    /// Columns of the file after the `Op` column, in file order, with their types.
    /// Required without a header; with a header it gives types by name (others are read
    /// with the Delta table's type when the table exists, else as strings).
    pub columns: Vec<ColumnSpec>,
}

/// A column name and its type, for CSV.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnSpec {
    pub name: String,
    pub data_type: DataType,
}

/// One source table and its curated Delta table.
#[derive(Debug, Clone)]
pub struct TableConfig {
    pub name: String,
    /// Prefix under which DMS lands this table's files (always ends with `/`).
    pub source: Url,
    /// The Delta table.
    pub target: Url,
    /// The Delta table of delete tombstones (default: `<target>/_tributary_tombstones`).
    pub tombstones: Url,
    pub primary_key: Vec<String>,
    pub partition_by: Vec<String>,
    /// Columns that order changes (e.g. DMS `TimestampColumnName` or `AR_H_CHANGE_SEQ`).
    pub sequence_by: Vec<String>,
    /// Source columns not written to the table (DMS metadata). `op_column` is always dropped.
    pub drop_columns: Vec<String>,
    pub op_column: String,
    /// Column of the curated table that records the applied change's order key.
    pub sequence_column: String,
    pub format: Format,
    pub tombstone_retention: Duration,
    pub max_commit_attempts: u32,
    /// Keep `_symlink_format_manifest` up to date after every merge (Athena / Spectrum).
    pub manifests: bool,
    pub maintenance: MaintenanceConfig,
}

/// What the maintenance function does to a table.
#[derive(Debug, Clone, PartialEq)]
pub struct MaintenanceConfig {
    /// Compaction target size of data files, in bytes.
    pub target_file_size: u64,
    /// VACUUM deletes unreferenced files older than this.
    pub vacuum_retention: Duration,
    /// VACUUM refuses a shorter retention unless forced.
    pub min_vacuum_retention: Duration,
}

impl TableConfig {
    /// Whether `column` (a source column) is written to the curated table.
    pub fn keeps_column(&self, column: &str) -> bool {
        column != self.op_column && !self.drop_columns.iter().any(|c| c == column)
    }

    /// Whether an object URI belongs to this table's source prefix.
    pub fn owns(&self, object: &Url) -> bool {
        object.scheme() == self.source.scheme()
            && object.host_str() == self.source.host_str()
            && object.path().starts_with(self.source.path())
    }
}

// ---- raw (serde) form -------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    defaults: RawDefaults,
    #[serde(default, rename = "table")]
    tables: Vec<RawTable>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    tombstone_retention_days: Option<f64>,
    max_commit_attempts: Option<u32>,
    op_column: Option<String>,
    sequence_column: Option<String>,
    manifests: Option<bool>,
    target_file_size_mb: Option<f64>,
    vacuum_retention_hours: Option<f64>,
    min_vacuum_retention_hours: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    name: String,
    source: String,
    target: String,
    tombstones: Option<String>,
    primary_key: Vec<String>,
    #[serde(default)]
    partition_by: Vec<String>,
    #[serde(default)]
    sequence_by: Vec<String>,
    #[serde(default)]
    drop_columns: Vec<String>,
    op_column: Option<String>,
    sequence_column: Option<String>,
    #[serde(default = "default_format")]
    format: String,
    csv: Option<RawCsv>,
    tombstone_retention_days: Option<f64>,
    max_commit_attempts: Option<u32>,
    manifests: Option<bool>,
    target_file_size_mb: Option<f64>,
    vacuum_retention_hours: Option<f64>,
    min_vacuum_retention_hours: Option<f64>,
}

fn default_format() -> String {
    "parquet".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCsv {
    #[serde(default)]
    header: bool,
    delimiter: Option<String>,
    quote: Option<String>,
    null_value: Option<String>,
    #[serde(default)]
    include_op_for_full_load: bool,
    #[serde(default)]
    columns: Vec<RawColumn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawColumn {
    name: String,
    #[serde(rename = "type")]
    data_type: String,
}

impl Config {
    /// Parse and validate a configuration text. Relative paths in `source`, `target` and
    /// `tombstones` are resolved against `base_dir` (the config file's folder) when given.
    pub fn from_toml(text: &str, origin: &str, base_dir: Option<&Path>) -> Result<Config> {
        let raw: RawConfig = toml::from_str(text)
            .map_err(|e| Error::config(origin, format!("not valid TOML for tributary: {e}")))?;
        let err = |msg: String| Error::config(origin, msg);
        if raw.tables.is_empty() {
            return Err(err(
                "no tables configured: add at least one [[table]] section (see docs/configuration.md)".into(),
            ));
        }
        let d = raw.defaults;
        let mut tables = Vec::with_capacity(raw.tables.len());
        for t in raw.tables {
            let ctx = format!("table `{}`", t.name);
            let terr = |msg: String| err(format!("{ctx}: {msg}"));
            if t.name.is_empty()
                || !t
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
            {
                return Err(terr(
                    "`name` must be non-empty and use only letters, digits, `_`, `-` or `.`".into(),
                ));
            }
            let mut source =
                resolve_uri(&t.source, base_dir).map_err(|m| terr(format!("`source`: {m}")))?;
            if !source.path().ends_with('/') {
                let p = format!("{}/", source.path());
                source.set_path(&p);
            }
            let target =
                resolve_uri(&t.target, base_dir).map_err(|m| terr(format!("`target`: {m}")))?;
            let target = trim_trailing_slash(target);
            let tombstones = match &t.tombstones {
                Some(s) => trim_trailing_slash(
                    resolve_uri(s, base_dir).map_err(|m| terr(format!("`tombstones`: {m}")))?,
                ),
                None => join(&target, TOMBSTONE_DIR),
            };
            let target_dir = format!("{}/", target.path());
            if target.scheme() == source.scheme()
                && target.host_str() == source.host_str()
                && (target_dir.starts_with(source.path()) || source.path().starts_with(&target_dir))
            {
                return Err(terr(format!(
                    "`target` ({target}) and `source` ({source}) overlap: the merge would be triggered by its own writes; put the Delta table outside the DMS folder"
                )));
            }
            if t.primary_key.is_empty() {
                return Err(terr(
                    "`primary_key` is empty: list the source table's primary key column(s), e.g. primary_key = [\"id\"]".into(),
                ));
            }
            let op_column = t
                .op_column
                .or_else(|| d.op_column.clone())
                .unwrap_or_else(|| "Op".to_string());
            let sequence_column = t
                .sequence_column
                .or_else(|| d.sequence_column.clone())
                .unwrap_or_else(|| DEFAULT_SEQUENCE_COLUMN.to_string());
            check_unique(&t.primary_key, "primary_key").map_err(terr)?;
            check_unique(&t.partition_by, "partition_by").map_err(terr)?;
            check_unique(&t.sequence_by, "sequence_by").map_err(terr)?;
            for c in t.primary_key.iter().chain(&t.partition_by) {
                if *c == op_column || t.drop_columns.contains(c) {
                    return Err(terr(format!(
                        "column `{c}` is a key or partition column and cannot also be dropped (remove it from `drop_columns`)"
                    )));
                }
                if *c == sequence_column {
                    return Err(terr(format!(
                        "column `{c}` clashes with the internal sequence column; set `sequence_column` to another name"
                    )));
                }
            }
            if t.sequence_by.contains(&op_column) {
                return Err(terr(format!(
                    "`sequence_by` cannot contain the operation column `{op_column}`"
                )));
            }
            let format = match t.format.to_ascii_lowercase().as_str() {
                "parquet" => {
                    if t.csv.is_some() {
                        return Err(terr("a [table.csv] section is given but `format` is \"parquet\"; set format = \"csv\" or remove the section".into()));
                    }
                    Format::Parquet
                }
                "csv" => Format::Csv(csv_options(t.csv).map_err(terr)?),
                other => {
                    return Err(terr(format!(
                        "`format` is \"{other}\"; use \"parquet\" or \"csv\""
                    )))
                }
            };
            let days = t
                .tombstone_retention_days
                .or(d.tombstone_retention_days)
                .unwrap_or(7.0);
            if !(days.is_finite() && days > 0.0) {
                return Err(terr(format!(
                    "`tombstone_retention_days` is {days}; it must be a positive number of days (default 7)"
                )));
            }
            let max_commit_attempts = t
                .max_commit_attempts
                .or(d.max_commit_attempts)
                .unwrap_or(30);
            if max_commit_attempts == 0 {
                return Err(terr("`max_commit_attempts` must be at least 1".into()));
            }
            let positive = |v: f64, field: &str| -> Result<f64> {
                if v.is_finite() && v > 0.0 {
                    Ok(v)
                } else {
                    Err(terr(format!(
                        "`{field}` is {v}; it must be a positive number"
                    )))
                }
            };
            let target_mb = positive(
                t.target_file_size_mb
                    .or(d.target_file_size_mb)
                    .unwrap_or(128.0),
                "target_file_size_mb",
            )?;
            let vacuum_h = positive(
                t.vacuum_retention_hours
                    .or(d.vacuum_retention_hours)
                    .unwrap_or(168.0),
                "vacuum_retention_hours",
            )?;
            let min_vacuum_h = positive(
                t.min_vacuum_retention_hours
                    .or(d.min_vacuum_retention_hours)
                    .unwrap_or(168.0),
                "min_vacuum_retention_hours",
            )?;
            tables.push(TableConfig {
                name: t.name,
                source,
                target,
                tombstones,
                primary_key: t.primary_key,
                partition_by: t.partition_by,
                sequence_by: t.sequence_by,
                drop_columns: t.drop_columns,
                op_column,
                sequence_column,
                format,
                tombstone_retention: Duration::from_secs_f64(days * 86_400.0),
                max_commit_attempts,
                manifests: t.manifests.or(d.manifests).unwrap_or(true),
                maintenance: MaintenanceConfig {
                    target_file_size: (target_mb * 1024.0 * 1024.0) as u64,
                    vacuum_retention: Duration::from_secs_f64(vacuum_h * 3600.0),
                    min_vacuum_retention: Duration::from_secs_f64(min_vacuum_h * 3600.0),
                },
            });
        }
        let mut names = HashSet::new();
        for t in &tables {
            if !names.insert(t.name.as_str()) {
                return Err(err(format!(
                    "table name `{}` is used twice; names must be unique",
                    t.name
                )));
            }
        }
        for (i, a) in tables.iter().enumerate() {
            for b in &tables[i + 1..] {
                if a.source.scheme() == b.source.scheme()
                    && a.source.host_str() == b.source.host_str()
                    && (a.source.path().starts_with(b.source.path())
                        || b.source.path().starts_with(a.source.path()))
                {
                    return Err(err(format!(
                        "tables `{}` and `{}` have overlapping `source` prefixes ({} and {}); each file must belong to exactly one table",
                        a.name, b.name, a.source, b.source
                    )));
                }
                if a.target == b.target {
                    return Err(err(format!(
                        "tables `{}` and `{}` write the same `target` {}",
                        a.name, b.name, a.target
                    )));
                }
            }
        }
        Ok(Config {
            origin: origin.to_string(),
            tables,
        })
    }

    /// Load from a local path (relative table locations resolve against its folder).
    pub fn from_path(path: &Path) -> Result<Config> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::config(&origin, format!("cannot read the file: {e}")))?;
        let base = path
            .canonicalize()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf));
        Config::from_toml(&text, &origin, base.as_deref())
    }

    /// The table whose source prefix holds this object, if any.
    pub fn table_for(&self, object: &Url) -> Option<&TableConfig> {
        self.tables.iter().find(|t| t.owns(object))
    }

    /// A table by name.
    pub fn table(&self, name: &str) -> Option<&TableConfig> {
        self.tables.iter().find(|t| t.name == name)
    }
}

fn check_unique(cols: &[String], field: &str) -> std::result::Result<(), String> {
    let mut seen = HashSet::new();
    for c in cols {
        if c.is_empty() {
            return Err(format!("`{field}` contains an empty column name"));
        }
        if !seen.insert(c) {
            return Err(format!("`{field}` lists column `{c}` twice"));
        }
    }
    Ok(())
}

fn csv_options(raw: Option<RawCsv>) -> std::result::Result<CsvOptions, String> {
    let raw = raw.ok_or_else(|| {
        "format = \"csv\" needs a [table.csv] section (at least `header` and, without a header, `columns`)".to_string()
    })?;
    let single_byte =
        |v: Option<String>, field: &str, default: u8| -> std::result::Result<u8, String> {
            match v {
                None => Ok(default),
                Some(s) if s == "\\t" => Ok(b'\t'),
                Some(s) if s.len() == 1 && s.is_ascii() => Ok(s.as_bytes()[0]),
                Some(s) => Err(format!(
                    "csv.{field} must be one ASCII character (or \"\\t\"), got {s:?}"
                )),
            }
        };
    let delimiter = single_byte(raw.delimiter, "delimiter", b',')?;
    let quote = single_byte(raw.quote, "quote", b'"')?;
    let mut columns = Vec::with_capacity(raw.columns.len());
    for c in raw.columns {
        let data_type = parse_type(&c.data_type)
            .map_err(|m| format!("csv.columns: column `{}`: {m}", c.name))?;
        columns.push(ColumnSpec {
            name: c.name,
            data_type,
        });
    }
    check_unique(
        &columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
        "csv.columns",
    )?;
    if !raw.header && columns.is_empty() {
        return Err("csv.header = false needs csv.columns: list the file's columns after `Op`, in order, e.g. columns = [{ name = \"id\", type = \"int64\" }]".into());
    }
    Ok(CsvOptions {
        header: raw.header,
        delimiter,
        quote,
        null_value: raw.null_value.unwrap_or_else(|| "NULL".to_string()),
        include_op_for_full_load: raw.include_op_for_full_load,
        columns,
    })
}

/// Parse a column type name as used in `csv.columns`.
pub fn parse_type(s: &str) -> std::result::Result<DataType, String> {
    let t = s.trim().to_ascii_lowercase();
    let dt = match t.as_str() {
        "string" | "varchar" | "text" | "utf8" => DataType::Utf8,
        "boolean" | "bool" => DataType::Boolean,
        "int8" | "tinyint" | "byte" => DataType::Int8,
        "int16" | "smallint" | "short" => DataType::Int16,
        "int32" | "int" | "integer" => DataType::Int32,
        "int64" | "bigint" | "long" => DataType::Int64,
        "float" | "float32" | "real" => DataType::Float32,
        "double" | "float64" => DataType::Float64,
        "date" => DataType::Date32,
        "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        "timestamp_ntz" => DataType::Timestamp(TimeUnit::Microsecond, None),
        "binary" => DataType::Binary,
        _ if t.starts_with("decimal(") && t.ends_with(')') => {
            let inner = &t["decimal(".len()..t.len() - 1];
            let (p, s) = inner
                .split_once(',')
                .ok_or_else(|| format!("decimal needs precision and scale, e.g. decimal(10,2), got {s:?}"))?;
            let p: u8 = p.trim().parse().map_err(|_| format!("bad decimal precision in {s:?}"))?;
            let sc: i8 = s.trim().parse().map_err(|_| format!("bad decimal scale in {s:?}"))?;
            if p == 0 || p > 38 || sc < 0 || sc as u8 > p {
                return Err(format!("decimal({p},{sc}) is out of range (1 ≤ precision ≤ 38, 0 ≤ scale ≤ precision)"));
            }
            DataType::Decimal128(p, sc)
        }
        _ => {
            return Err(format!(
                "unknown type {s:?}; use string, boolean, int8, int16, int32, int64, float, double, date, timestamp, timestamp_ntz, binary or decimal(p,s)"
            ))
        }
    };
    Ok(dt)
}

fn resolve_uri(s: &str, base_dir: Option<&Path>) -> std::result::Result<Url, String> {
    if s.is_empty() {
        return Err("is empty".into());
    }
    if let Ok(u) = Url::parse(s) {
        if u.scheme().len() > 1 {
            return match u.scheme() {
                "s3" | "s3a" | "file" => {
                    if u.scheme() != "file" && u.host_str().unwrap_or("").is_empty() {
                        Err(format!("{s:?} has no bucket; use s3://bucket/prefix/"))
                    } else {
                        Ok(u)
                    }
                }
                other => Err(format!(
                    "scheme `{other}` is not supported; use s3://bucket/prefix, file:///abs/path or a path"
                )),
            };
        }
    }
    let p = Path::new(s);
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        match base_dir {
            Some(b) => b.join(p),
            None => std::env::current_dir()
                .map_err(|e| format!("cannot resolve relative path {s:?}: {e}"))?
                .join(p),
        }
    };
    Url::from_file_path(&abs).map_err(|_| format!("cannot turn {} into a file URL", abs.display()))
}

fn trim_trailing_slash(mut u: Url) -> Url {
    let p = u.path().trim_end_matches('/').to_string();
    if !p.is_empty() {
        u.set_path(&p);
    }
    u
}

/// `base` + `/name` for a URL without a trailing slash.
pub(crate) fn join(base: &Url, name: &str) -> Url {
    let mut u = base.clone();
    let p = format!("{}/{}", base.path().trim_end_matches('/'), name);
    u.set_path(&p);
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = r#"
[defaults]
tombstone_retention_days = 7

[[table]]
name = "travel_details"
source = "s3://raw-bucket/dms/delta_emr_source/travel_details"
target = "s3://curated-bucket/travel_details/"
primary_key = ["trip_id"]
partition_by = ["route_id"]
sequence_by = ["update_ts_dms"]
drop_columns = ["schema_name", "table_name", "update_ts_dms"]
"#;

    #[test]
    fn parses_seed_config_with_defaults() {
        let c = Config::from_toml(SEED, "test", None).unwrap();
        let t = &c.tables[0];
        assert_eq!(
            t.source.as_str(),
            "s3://raw-bucket/dms/delta_emr_source/travel_details/"
        );
        assert_eq!(t.target.as_str(), "s3://curated-bucket/travel_details");
        assert_eq!(
            t.tombstones.as_str(),
            "s3://curated-bucket/travel_details/_tributary_tombstones"
        );
        assert_eq!(t.op_column, "Op");
        assert_eq!(t.format, Format::Parquet);
        assert_eq!(t.tombstone_retention, Duration::from_secs(7 * 86400));
        assert!(!t.keeps_column("Op"));
        assert!(!t.keeps_column("update_ts_dms"));
        assert!(t.keeps_column("destination"));
        let f =
            Url::parse("s3://raw-bucket/dms/delta_emr_source/travel_details/2022/10/25/x.parquet")
                .unwrap();
        assert_eq!(c.table_for(&f).unwrap().name, "travel_details");
        let other =
            Url::parse("s3://raw-bucket/dms/delta_emr_source/travel_details_v2/x.parquet").unwrap();
        assert!(c.table_for(&other).is_none());
    }

    #[test]
    fn relative_paths_resolve_against_base_dir() {
        let text = r#"
[[table]]
name = "t"
source = "raw/s/t"
target = "curated/t"
primary_key = ["id"]
"#;
        let c = Config::from_toml(text, "x", Some(Path::new("/data/demo"))).unwrap();
        assert_eq!(c.tables[0].source.as_str(), "file:///data/demo/raw/s/t/");
        assert_eq!(c.tables[0].target.as_str(), "file:///data/demo/curated/t");
    }

    fn err_of(text: &str) -> String {
        Config::from_toml(text, "cfg.toml", None)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn errors_say_how_to_fix() {
        assert!(err_of("").contains("add at least one [[table]]"));
        let e = err_of(
            r#"[[table]]
name = "t"
source = "s3://b/raw/"
target = "s3://b/raw/curated"
primary_key = ["id"]"#,
        );
        assert!(e.contains("overlap"), "{e}");
        let e = err_of(
            r#"[[table]]
name = "t"
source = "s3://b/raw/"
target = "s3://c/t"
primary_key = []"#,
        );
        assert!(e.contains("`primary_key` is empty"), "{e}");
        let e = err_of(
            r#"[[table]]
name = "t"
source = "s3://b/raw/"
target = "s3://c/t"
primary_key = ["id"]
format = "csv"
[table.csv]
header = false"#,
        );
        assert!(e.contains("needs csv.columns"), "{e}");
        let e = err_of(
            r#"[[table]]
name = "t"
source = "s3://b/raw/"
target = "s3://c/t"
primary_key = ["id"]
drop_columns = ["id"]"#,
        );
        assert!(e.contains("cannot also be dropped"), "{e}");
        let e = err_of(
            r#"[[table]]
name = "t"
source = "s3://b/raw/"
target = "s3://c/t"
primary_key = ["id"]
primary_kee = ["x"]"#,
        );
        assert!(e.contains("unknown field"), "{e}");
        let two = r#"[[table]]
name = "a"
source = "s3://b/raw/"
target = "s3://c/a"
primary_key = ["id"]
[[table]]
name = "b"
source = "s3://b/raw/x/"
target = "s3://c/b"
primary_key = ["id"]"#;
        assert!(err_of(two).contains("overlapping `source` prefixes"));
        assert!(
            err_of(&two.replace("raw/x/", "raw2/").replace("\"b\"", "\"a\""))
                .contains("used twice")
        );
        let e = err_of(
            r#"[[table]]
name = "t"
source = "gs://b/raw/"
target = "s3://c/t"
primary_key = ["id"]"#,
        );
        assert!(e.contains("not supported"), "{e}");
    }

    #[test]
    fn csv_types_parse() {
        assert_eq!(
            parse_type("decimal(10, 2)").unwrap(),
            DataType::Decimal128(10, 2)
        );
        assert_eq!(parse_type("BIGINT").unwrap(), DataType::Int64);
        assert!(parse_type("decimal(50,2)").is_err());
        assert!(parse_type("uuid").unwrap_err().contains("unknown type"));
    }
}
