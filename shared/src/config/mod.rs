//! Table configuration: which DMS folders feed which Delta tables, and how to read them.
//!
//! One TOML file lists the tables. It is loaded from a local path or an `s3://` URI and
//! validated before anything runs; every error says which table and field is wrong and how
//! to fix it. See `docs/configuration.md` for the reference of every field.

mod locations;
mod raw;

use std::path::Path;
use std::time::Duration;

use arrow::datatypes::DataType;
use url::Url;

use crate::error::{Error, Result};

pub use raw::parse_type;

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
    /// Groups of tables read together at one watermark (`[[group]]`; default: one per DMS
    /// task folder).
    pub groups: Vec<GroupConfig>,
}

/// Tables read together at one watermark (`crate::delta::cut`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    pub name: String,
    pub tables: Vec<String>,
    /// Where the group's cut is published (a JSON object).
    pub cut: Url,
    /// DMS's `CdcMaxBatchInterval`: a table whose every file is applied is taken to be
    /// caught up to the group's newest watermark less this.
    pub batch_interval: Duration,
}

/// The codec of the data files tributary writes (`parquet_compression`, default snappy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParquetCompression {
    /// Fast, read everywhere (Redshift Spectrum documents snappy, gzip and bzip2).
    #[default]
    Snappy,
    /// Level 1: on the benchmark table 2.5× smaller than snappy and no slower; read by Athena,
    /// Spark, Trino, DuckDB and delta-rs, not documented for Redshift Spectrum.
    Zstd,
    /// Smaller than snappy, read everywhere, much slower to write.
    Gzip,
}

/// How the order-key columns are encoded in the data files (`order_key_encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OrderKeyEncoding {
    /// PLAIN, the default.
    #[default]
    Plain,
    /// Parquet's DELTA_BYTE_ARRAY (prefix compression: consecutive keys share most of their
    /// text).
    Delta,
}

/// The CDC convention of a table's files: what a row of a change file means
/// (`source::convention`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Convention {
    /// AWS DMS: the operation in `op_column` (I, U, D), `LOAD*` full-load files, CDC files
    /// named by their time or ordered by `sequence_by`, before-image columns.
    #[default]
    Dms,
    /// A convention in Debezium's shape, tests only: `op` (c, u, d, r), the row in the
    /// `before` / `after` structs, ordered by `ts_ms` then `source.lsn`.
    #[cfg(test)]
    DebeziumShaped,
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
    /// Whether full-load files start with a header row (DMS `AddColumnName=true`, or a
    /// load exported with a header while the CDC feed has none).
    pub full_load_header: bool,
    /// Whether CDC files start with a header row.
    pub cdc_header: bool,
    /// Field delimiter (DMS `CsvDelimiter`, default `,`).
    pub delimiter: u8,
    /// Quote character (DMS writes RFC 4180 quoting with `"`).
    pub quote: u8,
    /// Text that stands for NULL (DMS `CsvNullValue`). Default: the empty field, what DMS
    /// writes for NULL when `CsvNullValue` is not set.
    pub null_value: String,
    /// Text DMS writes for a column that is not in the supplemental log (`CsvNoSupValue`,
    /// with `UseCsvNoSupValue=true`): the column's value is not known. A file holding it
    /// fails (per-row "unchanged" values are not applied yet), it is never stored.
    pub no_sup_value: Option<String>,
    /// Whether full-load files carry the `Op` column (DMS `IncludeOpForFullLoad`).
    pub include_op_for_full_load: bool,
    /// Columns of the file after the `Op` column, in file order, with their types.
    /// Required without a header; with a header it gives types by name (others are read
    /// with the Delta table's type when the table exists, else as strings).
    pub columns: Vec<ColumnSpec>,
}

impl CsvOptions {
    /// Whether files of this kind start with a header row.
    pub(crate) fn header(&self, kind: crate::model::FileKind) -> bool {
        match kind {
            crate::model::FileKind::FullLoad => self.full_load_header,
            crate::model::FileKind::Cdc => self.cdc_header,
        }
    }
}

/// A column name and its type, for CSV.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnSpec {
    pub name: String,
    pub data_type: DataType,
}

/// One of the Delta tables tributary keeps for a configured table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Managed {
    /// The current table (`target`).
    Current,
    /// The delete tombstones (`tombstones`).
    Tombstones,
    /// The history (SCD type 2) table (`[table.history] target`).
    History,
    /// The history's change log (`[table.history] changes`).
    ChangeLog,
}

impl Managed {
    /// What the configuration calls it (in messages).
    pub fn describe(self) -> &'static str {
        match self {
            Managed::Current => "target",
            Managed::Tombstones => "tombstones",
            Managed::History => "history target",
            Managed::ChangeLog => "history change log",
        }
    }

    /// Its one label — logs, reports, the Delta table's metadata name: `<table>`,
    /// `<table>_tombstones`, `<table>_history`, `<table>_history_changes`.
    pub fn label(self, table: &str) -> String {
        match self {
            Managed::Current => table.to_string(),
            Managed::Tombstones => format!("{table}_tombstones"),
            Managed::History => format!("{table}_history"),
            Managed::ChangeLog => format!("{table}_history_changes"),
        }
    }
}

/// One source table and its curated Delta table.
#[derive(Debug, Clone)]
pub struct TableConfig {
    pub name: String,
    /// Prefix under which DMS lands this table's files (always ends with `/`).
    pub source: Url,
    /// The current Delta table; `None` for a table that keeps only its history
    /// (`[table.history]` without a table `target`).
    pub target: Option<Url>,
    /// The Delta table of delete tombstones (default: `<target>/_tributary_tombstones`);
    /// `None` without a current table (the history's change log holds the deletes).
    pub tombstones: Option<Url>,
    pub primary_key: Vec<String>,
    pub partition_by: Vec<String>,
    /// Columns that order changes (e.g. DMS `TimestampColumnName` or `AR_H_CHANGE_SEQ`).
    pub sequence_by: Vec<String>,
    /// Source columns not written to the table (DMS metadata). `op_column` is always dropped.
    pub drop_columns: Vec<String>,
    /// Columns renamed at the source: a file's column named like a key is read as the
    /// table's column named by its value (`{ new_name = "old_name" }`), so the table, its
    /// history and change log keep one column across the rename.
    pub rename_columns: std::collections::BTreeMap<String, String>,
    pub op_column: String,
    /// The prefix of DMS's before-image columns (`add-before-image-columns`, e.g. `BI_`):
    /// a `U` whose before-image key differs from its key moves the row to the new key.
    /// Columns with the prefix are not written to the table.
    pub before_image_prefix: Option<String>,
    pub format: Format,
    /// What a row of the table's files means (AWS DMS's convention).
    pub convention: Convention,
    /// How much a merge may take on: retries, slices, how long deletes are remembered.
    pub limits: Limits,
    /// How the table's files and commits are written.
    pub writing: Writing,
    pub maintenance: MaintenanceConfig,
    /// The history (SCD type 2) output, when configured.
    pub history: Option<HistoryConfig>,
    /// The Glue Data Catalog entries kept in step with the table, when configured.
    pub catalog: Option<CatalogConfig>,
}

/// How much a merge may take on (`[table]` / `[defaults]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// How long a delete's tombstone stops late changes of its key
    /// (`tombstone_retention_days`).
    pub tombstone_retention: Duration,
    /// Commit attempts of a merge before it fails retryably (`max_commit_attempts`).
    pub max_commit_attempts: u32,
    /// Files of more rows are merged alone, in slices of about this many rows (one commit
    /// each, after the whole file was checked): memory depends on this, not on the file.
    pub slice_rows: usize,
    /// … or of about this many bytes of decoded (Arrow) data, whichever comes first: wide
    /// tables get shorter slices.
    pub slice_bytes: usize,
}

/// How a table's files and commits are written (`[table]` / `[defaults]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Writing {
    /// Column of the curated table that records the applied change's order key.
    pub sequence_column: String,
    /// Keep `_symlink_format_manifest` up to date after every merge (Athena / Spectrum).
    pub manifests: bool,
    /// Turn on Delta's change data feed (`delta.enableChangeDataFeed`): each merge's
    /// inserts, updates and deletes readable with `table_changes` / `load_cdf`.
    pub change_data_feed: bool,
    /// Merge-on-read (`delta.enableDeletionVectors`): a merge marks the rows it replaces or
    /// deletes in the data file's deletion vector and writes only the new row versions,
    /// instead of rewriting every file that holds a changed row. Needs `manifests = false`.
    pub deletion_vectors: bool,
    /// The codec of the Parquet data files tributary writes (merges, appends, compaction, the
    /// history table; the small tombstone and change-log appends get it when compacted).
    pub compression: ParquetCompression,
    /// How the order-key columns are encoded.
    pub order_key_encoding: OrderKeyEncoding,
}

/// Glue Data Catalog entries kept in step with a table (and its history table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogConfig {
    pub database: String,
    /// The native Delta entry's name (default: the table's name); the manifest entry is
    /// `<name>_manifest`, the history's `<name>_history` (and `<name>_history_manifest`).
    pub name: String,
    /// Keep the native Delta entry (Athena engine 3 and Spark read the Delta log).
    pub delta: bool,
    /// Keep the symlink-manifest entry with its partitions (Redshift Spectrum, older
    /// engines); needs `manifests`.
    pub manifest: bool,
    /// Create the database when it does not exist.
    pub create_database: bool,
    /// Take over entries tributary did not create (otherwise they are an error).
    pub adopt: bool,
}

impl CatalogConfig {
    /// The entries to keep: (name, kind), the current table's when `current`, the history
    /// table's when `history`.
    pub fn entries(&self, current: bool, history: bool) -> Vec<(String, EntryKind)> {
        let mut bases = Vec::new();
        if current {
            bases.push((self.name.clone(), false));
        }
        if history {
            bases.push((format!("{}_history", self.name), true));
        }
        let mut out = Vec::new();
        for (base, of_history) in bases {
            if self.delta {
                out.push((
                    base.clone(),
                    EntryKind::Delta {
                        history: of_history,
                    },
                ));
            }
            if self.manifest {
                out.push((
                    format!("{base}_manifest"),
                    EntryKind::Manifest {
                        history: of_history,
                    },
                ));
            }
        }
        out
    }
}

/// What a catalog entry describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// The Delta table itself (Athena reads the log).
    Delta { history: bool },
    /// The symlink manifests, partitioned like the table.
    Manifest { history: bool },
}

/// Sub-folder of a history table that holds every change applied to it (its own Delta
/// table), from which a key's versions are recomputed when a change arrives late.
pub const CHANGES_DIR: &str = "_tributary_changes";

/// A history (slowly changing dimension type 2) table fed from the same files: one row per
/// version of a source row, with the interval during which it was current.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryConfig {
    /// The Delta table of versions.
    pub target: Url,
    /// The change log the versions are computed from (`<target>/_tributary_changes`).
    pub changes: Url,
    /// When the version became current (the sequence value of its first change).
    pub start_column: String,
    /// When it stopped being current (the next version's start, or the delete's); null for
    /// the current version.
    pub end_column: String,
    /// A boolean column true on the current version, when configured.
    pub current_column: Option<String>,
    /// Which columns open a new version when they change.
    pub track: Track,
    /// What a delete does to the history.
    pub deletes: HistoryDeletes,
    pub partition_by: Vec<String>,
}

/// The columns whose changes open a new version (others update the version in place).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Track {
    All,
    Only(Vec<String>),
    Except(Vec<String>),
}

impl Track {
    /// Whether a change of `column` opens a new version.
    pub fn tracks(&self, column: &str) -> bool {
        match self {
            Track::All => true,
            Track::Only(c) => c.iter().any(|x| x == column),
            Track::Except(c) => !c.iter().any(|x| x == column),
        }
    }
}

/// What a delete does to the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryDeletes {
    /// Close the current version at the delete (default).
    Close,
    /// Close it, and open a version flagged as deleted in this boolean column.
    Flag(String),
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
    /// The Delta table that records what the table applied (its sequence kinds, the
    /// full-load files): the current table, or the history table of a table that keeps
    /// only its history.
    pub fn state_table(&self) -> Result<&Url> {
        match (&self.target, &self.history) {
            (Some(t), _) => Ok(t),
            (None, Some(h)) => Ok(&h.target),
            (None, None) => Err(Error::internal(format!(
                "table `{}` has neither a target nor a history table",
                self.name
            ))),
        }
    }

    /// The managed Delta tables this table has, with their locations, in the order above.
    pub fn managed(&self) -> Vec<(Managed, &Url)> {
        let mut out = Vec::new();
        out.extend(self.target.as_ref().map(|u| (Managed::Current, u)));
        out.extend(self.tombstones.as_ref().map(|u| (Managed::Tombstones, u)));
        if let Some(h) = &self.history {
            out.push((Managed::History, &h.target));
            out.push((Managed::ChangeLog, &h.changes));
        }
        out
    }

    /// The label of one of its managed tables ([`Managed::label`]).
    pub fn label(&self, m: Managed) -> String {
        m.label(&self.name)
    }

    /// Whether an object URI belongs to this table's source prefix.
    pub fn owns(&self, object: &Url) -> bool {
        object.scheme() == self.source.scheme()
            && object.host_str() == self.source.host_str()
            && object.path().starts_with(self.source.path())
    }
}

impl Config {
    /// Parse and validate a configuration text. Relative paths in `source`, `target` and
    /// `tombstones` are resolved against `base_dir` (the config file's folder) when given.
    pub fn from_toml(text: &str, origin: &str, base_dir: Option<&Path>) -> Result<Config> {
        let (tables, groups) = raw::parse(text, base_dir).map_err(|m| Error::config(origin, m))?;
        locations::check(&tables).map_err(|m| Error::config(origin, m))?;
        Ok(Config {
            origin: origin.to_string(),
            tables,
            groups,
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

    /// Every location a table writes (its target, tombstones, history table and change log)
    /// lies under `root` (the functions' `TRIBUTARY_TABLES_LOCATION`: where the stack's
    /// policies let them write); otherwise an error naming the table and location.
    pub fn check_within(&self, root: &Url) -> Result<()> {
        let mut root = root.clone();
        if !root.path().ends_with('/') {
            root.set_path(&format!("{}/", root.path()));
        }
        let inside = |u: &Url| {
            u.scheme() == root.scheme()
                && u.host_str() == root.host_str()
                && format!("{}/", u.path().trim_end_matches('/')).starts_with(root.path())
        };
        for t in &self.tables {
            if let Some((m, url)) = t.managed().into_iter().find(|(_, u)| !inside(u)) {
                let what = m.describe();
                return Err(Error::config(
                    &self.origin,
                    format!(
                        "table `{}`: its {what} {url} is outside {root}, the only place the functions may write (stack parameter TablesPrefix); put the table under it or change the parameter",
                        t.name
                    ),
                ));
            }
        }
        if let Some(g) = self.groups.iter().find(|g| !inside(&g.cut)) {
            return Err(Error::config(
                &self.origin,
                format!(
                    "group `{}`: its cut {} is outside {root}, the only place the functions may write (stack parameter TablesPrefix); set the group's `cut` under it",
                    g.name, g.cut
                ),
            ));
        }
        Ok(())
    }

    /// Every name is a configured table's; otherwise an error naming it and the tables.
    pub fn require_tables(&self, names: &[String], asked_by: &str) -> Result<()> {
        match names.iter().find(|n| self.table(n).is_none()) {
            None => Ok(()),
            Some(name) => Err(Error::config(
                &self.origin,
                format!(
                    "{asked_by} asked for table `{name}`, which is not configured (tables: {})",
                    self.tables
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }

    /// A table by name.
    pub fn table(&self, name: &str) -> Option<&TableConfig> {
        self.tables.iter().find(|t| t.name == name)
    }
}

/// A table section for tests: `[[table]]` named `name`, keyed by `id`, with extra lines.
#[cfg(test)]
pub(crate) fn test_table(name: &str, source: &str, target: &str, extra: &str) -> String {
    format!(
        "[[table]]\nname = \"{name}\"\nsource = \"{source}\"\ntarget = \"{target}\"\nprimary_key = [\"id\"]\n{extra}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build without the `glue` feature has no Glue client: catalog settings are refused
    /// at start-up, naming the feature, rather than failing at the first merge
    /// (`.ci/run` runs this in that build).
    #[cfg(not(feature = "glue"))]
    #[test]
    fn catalog_settings_are_refused_by_a_build_without_glue() {
        let text = test_table(
            "t",
            "s3://raw/t/",
            "s3://cur/t",
            "[table.catalog]\ndatabase = \"db\"",
        );
        let e = Config::from_toml(&text, "t.toml", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("without the `glue` feature"), "{e}");
        assert!(Config::from_toml(
            &test_table("t", "s3://raw/t/", "s3://cur/t", ""),
            "t.toml",
            None
        )
        .is_ok());
    }

    const TWO: &str = r#"
[[table]]
name = "orders"
source = "s3://raw/dms/shop/orders/"
target = "s3://cur/delta/orders"
primary_key = ["id"]

[[table]]
name = "customers"
source = "s3://raw/dms/shop/customers/"
target = "s3://cur/delta/customers"
primary_key = ["id"]

[[table]]
name = "audit"
source = "s3://raw/other/log/audit/"
target = "s3://cur/delta/audit"
primary_key = ["id"]
"#;

    #[test]
    fn tables_of_one_dms_task_folder_form_a_group_by_default() {
        let c = Config::from_toml(TWO, "test", None).unwrap();
        let names: Vec<(&str, Vec<&str>, &str)> = c
            .groups
            .iter()
            .map(|g| {
                (
                    g.name.as_str(),
                    g.tables.iter().map(String::as_str).collect(),
                    g.cut.as_str(),
                )
            })
            .collect();
        assert_eq!(
            names,
            vec![
                (
                    "dms",
                    vec!["orders", "customers"],
                    "s3://cur/delta/_tributary_cuts/dms.json"
                ),
                (
                    "other",
                    vec!["audit"],
                    "s3://cur/delta/_tributary_cuts/other.json"
                ),
            ]
        );
        assert_eq!(c.groups[0].batch_interval, Duration::from_secs(60));
        c.check_within(&Url::parse("s3://cur/delta/").unwrap())
            .unwrap();
    }

    #[test]
    fn configured_groups_are_checked() {
        let ok = format!(
            "{TWO}\n[[group]]\nname = \"all\"\ntables = [\"orders\", \"audit\"]\nbatch_interval_seconds = 30\n"
        );
        let c = Config::from_toml(&ok, "test", None).unwrap();
        assert_eq!(c.groups.len(), 1, "only the configured groups");
        assert_eq!(c.groups[0].batch_interval, Duration::from_secs(30));
        for (extra, says) in [
            ("[[group]]\nname = \"g\"\ntables = [\"nope\"]\n", "`nope`, which is not configured"),
            ("[[group]]\nname = \"g\"\ntables = []\n", "`tables` is empty"),
            (
                "[[group]]\nname = \"g\"\ntables = [\"orders\"]\nbatch_interval_seconds = -1\n",
                "`batch_interval_seconds` must be",
            ),
            (
                "[[group]]\nname = \"g\"\ntables = [\"orders\"]\n[[group]]\nname = \"g\"\ntables = [\"audit\"]\n",
                "used twice",
            ),
        ] {
            let e = Config::from_toml(&format!("{TWO}\n{extra}"), "test", None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{e}");
        }
        let outside = format!(
            "{TWO}\n[[group]]\nname = \"g\"\ntables = [\"orders\"]\ncut = \"s3://cur/elsewhere/g.json\"\n"
        );
        let c = Config::from_toml(&outside, "test", None).unwrap();
        let e = c
            .check_within(&Url::parse("s3://cur/delta/").unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("group `g`") && e.contains("TablesPrefix"), "{e}");
    }

    #[test]
    fn parses_the_sample_events_config_with_defaults() {
        let text = format!(
            "[defaults]\ntombstone_retention_days = 7\n{}",
            crate::demo::S3_CONFIG
        );
        let c = Config::from_toml(&text, "test", None).unwrap();
        let t = &c.tables[0];
        assert_eq!(
            t.source.as_str(),
            "s3://tributary-raw/dms/delta_emr_source/travel_details/"
        );
        assert_eq!(
            t.target.as_ref().unwrap().as_str(),
            "s3://tributary-curated/delta/travel_details"
        );
        assert_eq!(
            t.tombstones.as_ref().unwrap().as_str(),
            "s3://tributary-curated/delta/travel_details/_tributary_tombstones"
        );
        assert_eq!(t.op_column, "Op");
        assert_eq!(t.format, Format::Parquet);
        assert_eq!(t.limits.tombstone_retention, Duration::from_secs(7 * 86400));
        let spec = crate::source::Spec::of(t);
        assert!(!spec.keeps_column("Op"));
        assert!(!spec.keeps_column("update_ts_dms"));
        assert!(spec.keeps_column("destination"));
        let f = Url::parse(
            "s3://tributary-raw/dms/delta_emr_source/travel_details/2022/10/25/x.parquet",
        )
        .unwrap();
        assert_eq!(c.table_for(&f).unwrap().name, "travel_details");
        let other =
            Url::parse("s3://tributary-raw/dms/delta_emr_source/travel_details_v2/x.parquet")
                .unwrap();
        assert!(c.table_for(&other).is_none());
    }

    #[test]
    fn relative_paths_resolve_against_base_dir() {
        let text = test_table("t", "raw/s/t", "curated/t", "");
        let c = Config::from_toml(&text, "x", Some(Path::new("/data/demo"))).unwrap();
        assert_eq!(c.tables[0].source.as_str(), "file:///data/demo/raw/s/t/");
        assert_eq!(
            c.tables[0].target.as_ref().unwrap().as_str(),
            "file:///data/demo/curated/t"
        );
    }

    fn err_of(text: &str) -> String {
        Config::from_toml(text, "cfg.toml", None)
            .unwrap_err()
            .to_string()
    }

    /// The error for table `t` (source `s3://b/raw/`, target `s3://c/t`) with extra lines.
    fn err_with(extra: &str) -> String {
        err_of(&test_table("t", "s3://b/raw/", "s3://c/t", extra))
    }

    #[test]
    fn tables_outside_the_writable_prefix_are_refused() {
        let text = test_table("t", "s3://b/raw/", "s3://c/delta/t", "");
        let config = Config::from_toml(&text, "test", None).unwrap();
        let at = |u: &str| config.check_within(&Url::parse(u).unwrap());
        assert!(at("s3://c/").is_ok());
        assert!(at("s3://c/delta/").is_ok());
        assert!(at("s3://c/delta").is_ok());
        let e = at("s3://c/tables/").unwrap_err().to_string();
        assert!(
            e.contains("table `t`: its target s3://c/delta/t is outside s3://c/tables/"),
            "{e}"
        );
        assert!(at("s3://other/").is_err());
        assert!(at("s3://c/delta/t/x/").is_err());
        // A prefix is a folder, not a string prefix: s3://c/del does not hold s3://c/delta/t.
        assert!(at("s3://c/del").is_err());
    }

    #[test]
    fn errors_say_how_to_fix() {
        assert!(err_of("").contains("add at least one [[table]]"));
        let e = err_of(&test_table("t", "s3://b/raw/", "s3://b/raw/curated", ""));
        assert!(e.contains("overlap"), "{e}");
        let e = err_of(&test_table("t", "s3://b/raw/", "s3://c/t", "").replace("[\"id\"]", "[]"));
        assert!(e.contains("`primary_key` is empty"), "{e}");
        let e = err_with("format = \"csv\"\n[table.csv]\nheader = false");
        assert!(e.contains("needs csv.columns"), "{e}");
        let e = err_with("format = \"csv\"\n[table.csv]\nheader = true\ncdc_header = false");
        assert!(
            e.contains("csv.cdc_header = false needs csv.columns"),
            "{e}"
        );
        let e = err_with(
            "sequence_by = [\"seq\"]\nformat = \"csv\"\n[table.csv]\nheader = true\ncolumns = [{ name = \"id\", type = \"int64\" }]",
        );
        assert!(
            e.contains("`sequence_by` column `seq` has no type in csv.columns"),
            "{e}"
        );
        let e = err_with(
            "format = \"csv\"\n[table.csv]\nheader = true\nnull_value = \"\"\nno_sup_value = \"\"",
        );
        assert!(e.contains("csv.no_sup_value is empty"), "{e}");
        let e = err_with(
            "format = \"csv\"\n[table.csv]\nheader = true\nnull_value = \"NULL\"\nno_sup_value = \"NULL\"",
        );
        assert!(
            e.contains("csv.no_sup_value and csv.null_value are both \"NULL\""),
            "{e}"
        );
        let e = err_with("drop_columns = [\"id\"]");
        assert!(e.contains("cannot also be dropped"), "{e}");
        let e = err_with("rename_columns = { a = \"c\", b = \"c\" }");
        assert!(e.contains("two names are mapped to the column `c`"), "{e}");
        let e = err_with("rename_columns = { a = \"b\", b = \"c\" }");
        assert!(e.contains("`b` is renamed itself"), "{e}");
        let e = err_with("rename_columns = { id = \"key\" }");
        assert!(
            e.contains("settings name the table's column (`key`)"),
            "{e}"
        );
        let e = err_with("rename_columns = { a = \"a\" }");
        assert!(e.contains("renames nothing"), "{e}");
        let e = err_with("primary_kee = [\"x\"]");
        assert!(e.contains("unknown field"), "{e}");
        let two = test_table("a", "s3://b/raw/", "s3://c/a", "")
            + &test_table("b", "s3://b/raw/x/", "s3://c/b", "");
        assert!(err_of(&two).contains("each file must belong to exactly one table"));
        assert!(
            err_of(&two.replace("raw/x/", "raw2/").replace("\"b\"", "\"a\""))
                .contains("used twice")
        );
        let e = err_of(&test_table("t", "gs://b/raw/", "s3://c/t", ""));
        assert!(e.contains("not supported"), "{e}");
    }

    #[test]
    fn overlapping_locations_are_refused() {
        let two = |a_extra: &str, b_extra: &str, b_target: &str| {
            test_table("a", "s3://raw/a/", "s3://cur/a", a_extra)
                + &test_table("b", "s3://raw/b/", b_target, b_extra)
        };
        let shared = "tombstones = \"s3://cur/tombs\"";
        let e = err_of(&two(shared, shared, "s3://cur/b"));
        assert!(e.contains("shared tombstone table"), "{e}");
        let e = err_of(&two("", "", "s3://cur/a/nested"));
        assert!(e.contains("VACUUM"), "{e}");
        let e = err_of(&two("", "tombstones = \"s3://cur/a/_t\"", "s3://cur/b"));
        assert!(e.contains("overlap"), "{e}");
        let e = err_of(&two("tombstones = \"s3://raw/a/t\"", "", "s3://cur/b"));
        assert!(e.contains("DMS folder"), "{e}");
        let e = err_of(&two("tombstones = \"s3://cur/a\"", "", "s3://cur/b"));
        assert!(e.contains("hidden folder"), "{e}");
        assert!(Config::from_toml(
            &two("tombstones = \"s3://cur/a/_deletes\"", "", "s3://cur/b"),
            "x",
            None
        )
        .is_ok());
        let e = err_of(
            &test_table("t", "s3://r/t/", "s3://c/t", "").replace("\"id\"", "\"deleted_at\""),
        );
        assert!(e.contains("clashes with the tombstone table"), "{e}");
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

    /// Two tables (`Trips-2024` and `b`) with extra lines each, after `defaults`.
    #[cfg(feature = "glue")]
    fn two(a: &str, b: &str, defaults: &str) -> String {
        format!(
            "{defaults}\n{}{}",
            test_table("Trips-2024", "s3://r/a/", "s3://c/a", a),
            test_table("b", "s3://r/b/", "s3://c/b", b)
        )
    }

    #[test]
    #[cfg(feature = "glue")]
    fn catalog_settings_default_per_table_and_are_checked() {
        let c = Config::from_toml(
            &two("", "", "[defaults.catalog]\ndatabase = \"lake\""),
            "x",
            None,
        )
        .unwrap();
        let a = c.tables[0].catalog.clone().unwrap();
        assert_eq!(
            a,
            CatalogConfig {
                database: "lake".into(),
                name: "trips_2024".into(),
                delta: true,
                manifest: true,
                create_database: false,
                adopt: false,
            }
        );
        assert_eq!(
            a.entries(true, true),
            vec![
                ("trips_2024".into(), EntryKind::Delta { history: false }),
                (
                    "trips_2024_manifest".into(),
                    EntryKind::Manifest { history: false }
                ),
                (
                    "trips_2024_history".into(),
                    EntryKind::Delta { history: true }
                ),
                (
                    "trips_2024_history_manifest".into(),
                    EntryKind::Manifest { history: true }
                ),
            ]
        );
        // a table's own settings win over the defaults; without any, no catalog
        let c = Config::from_toml(
            &two(
                "[table.catalog]\ndatabase = \"other\"\nmanifest = false",
                "",
                "",
            ),
            "x",
            None,
        )
        .unwrap();
        assert_eq!(c.tables[0].catalog.as_ref().unwrap().database, "other");
        assert!(!c.tables[0].catalog.as_ref().unwrap().manifest);
        assert!(c.tables[1].catalog.is_none());
        // without manifests, no manifest entry by default; asking for one is an error
        let c = Config::from_toml(
            &two(
                "manifests = false\n[table.catalog]\ndatabase = \"d\"",
                "",
                "",
            ),
            "x",
            None,
        )
        .unwrap();
        assert!(!c.tables[0].catalog.as_ref().unwrap().manifest);
    }

    #[test]
    #[cfg(feature = "glue")]
    fn catalog_settings_errors_say_how_to_fix() {
        for (a, b, defaults, want) in [
            (
                "[table.catalog]\nname = \"x\"",
                "",
                "",
                "`database` is missing",
            ),
            (
                "[table.catalog]\ndatabase = \"Lake\"",
                "",
                "",
                "lower-case letters",
            ),
            (
                "manifests = false\n[table.catalog]\ndatabase = \"d\"\nmanifest = true",
                "",
                "",
                "needs the table's `manifests = true`",
            ),
            (
                "[table.catalog]\ndatabase = \"d\"\ndelta = false\nmanifest = false",
                "",
                "",
                "nothing to keep",
            ),
            (
                "[table.catalog]\nname = \"b\"",
                "",
                "[defaults.catalog]\ndatabase = \"d\"",
                "both keep the catalog entry d.b",
            ),
            (
                "",
                "",
                "[defaults.catalog]\ndatabase = \"d\"\nname = \"t\"",
                "cannot be set in [defaults.catalog]",
            ),
            (
                "[table.catalog]\ndatabase = \"d\"\nadopt = \"yes\"",
                "",
                "",
                "adopt",
            ),
        ] {
            let e = err_of(&two(a, b, defaults));
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    /// #46: deletion vectors need the manifests off (a manifest lists whole files, its
    /// readers would see the deleted rows), by name at start-up; defaults may set both.
    #[test]
    fn deletion_vectors_are_refused_with_manifests() {
        let table = |extra: &str| {
            format!(
                "[[table]]\nname = \"t\"\nsource = \"s3://b/raw/\"\ntarget = \"s3://b/t\"\nprimary_key = [\"id\"]\nsequence_by = [\"ts\"]\n{extra}"
            )
        };
        let e = err_of(&table("deletion_vectors = true\n"));
        assert!(
            e.contains("`deletion_vectors = true` needs `manifests = false`"),
            "{e}"
        );
        let c = Config::from_toml(
            &table("deletion_vectors = true\nmanifests = false\n"),
            "cfg.toml",
            None,
        )
        .unwrap();
        assert!(c.tables[0].writing.deletion_vectors);
        let c = Config::from_toml(
            &format!(
                "[defaults]\ndeletion_vectors = true\nmanifests = false\n{}",
                table("")
            ),
            "cfg.toml",
            None,
        )
        .unwrap();
        assert!(c.tables[0].writing.deletion_vectors);
        assert!(
            !Config::from_toml(&table(""), "cfg.toml", None)
                .unwrap()
                .tables[0]
                .writing
                .deletion_vectors
        );
    }

    #[test]
    #[cfg(feature = "glue")]
    fn a_table_without_target_keeps_only_its_history() {
        let only = |extra: &str| {
            format!(
                "[[table]]\nname = \"t\"\nsource = \"s3://b/raw/\"\nprimary_key = [\"id\"]\nsequence_by = [\"ts\"]\n{extra}"
            )
        };
        let history = "[table.history]\ntarget = \"s3://c/t_history\"\n";
        let c = Config::from_toml(&only(history), "cfg.toml", None).unwrap();
        let t = &c.tables[0];
        assert_eq!((t.target.as_ref(), t.tombstones.as_ref()), (None, None));
        assert_eq!(t.state_table().unwrap().as_str(), "s3://c/t_history");
        assert!(c.check_within(&Url::parse("s3://c/").unwrap()).is_ok());
        let e = err_of(&only(""));
        assert!(
            e.contains("`target` is missing") && e.contains("[table.history]"),
            "{e}"
        );
        let e = err_of(&only(&format!("tombstones = \"s3://c/tombs\"\n{history}")));
        assert!(e.contains("remove `tombstones`"), "{e}");
        let e = err_of(&only(&format!("change_data_feed = true\n{history}")));
        assert!(
            e.contains("`change_data_feed` applies to the current table"),
            "{e}"
        );
        let catalog = "[table.catalog]\ndatabase = \"lake\"\n";
        let c = Config::from_toml(&only(&format!("{history}{catalog}")), "cfg.toml", None).unwrap();
        let entries = c.tables[0].catalog.as_ref().unwrap().entries(false, true);
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["t_history", "t_history_manifest"]);
    }
}
