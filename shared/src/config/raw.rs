//! The TOML form of the configuration and its resolution into [`TableConfig`]s: defaults
//! applied, URIs resolved, every field checked with a message that says how to fix it.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use arrow::datatypes::{DataType, TimeUnit};
use serde::Deserialize;
use url::Url;

use super::{
    CatalogConfig, ColumnSpec, CsvOptions, Format, GroupConfig, HistoryConfig, HistoryDeletes,
    Limits, MaintenanceConfig, OrderKeyEncoding, ParquetCompression, TableConfig, Track, Writing,
    CHANGES_DIR, DEFAULT_SEQUENCE_COLUMN, TOMBSTONE_DIR,
};
use crate::model::RESERVED_PREFIX;

/// Rows of a large file merged per commit (see `TableConfig::slice_rows`).
const DEFAULT_SLICE_ROWS: usize = 500_000;
/// Decoded megabytes of a large file merged per commit (see `TableConfig::slice_bytes`).
const DEFAULT_SLICE_MB: f64 = 64.0;
use crate::model::DELETED_AT_COLUMN;

type Msg<T> = std::result::Result<T, String>;

/// Default `tombstone_retention_days`: longer than anything the template lets an event wait
/// (14 days in the queue, then up to 14 more after a DLQ redrive), with a week to spare.
pub(super) const DEFAULT_TOMBSTONE_RETENTION_DAYS: f64 = 35.0;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    defaults: RawDefaults,
    #[serde(default, rename = "table")]
    tables: Vec<RawTable>,
    #[serde(default, rename = "group")]
    groups: Vec<RawGroup>,
}

/// `[[group]]`: tables read together at one watermark (`crate::delta::cut`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    name: String,
    tables: Vec<String>,
    cut: Option<String>,
    batch_interval_seconds: Option<f64>,
}

/// Default `batch_interval_seconds`: DMS's default `CdcMaxBatchInterval`.
const DEFAULT_BATCH_INTERVAL_SECONDS: f64 = 60.0;

/// The fields `[defaults]` may set for every table, declared once for both structs (serde
/// cannot `flatten` them into the table together with `deny_unknown_fields`).
macro_rules! with_tuning_fields {
    ($(#[$meta:meta])* struct $name:ident { $($(#[$fmeta:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        struct $name {
            $($(#[$fmeta])* $field: $ty,)*
            tombstone_retention_days: Option<f64>,
            max_commit_attempts: Option<u32>,
            slice_rows: Option<usize>,
            slice_mb: Option<f64>,
            op_column: Option<String>,
            before_image_prefix: Option<String>,
            sequence_column: Option<String>,
            manifests: Option<bool>,
            change_data_feed: Option<bool>,
            deletion_vectors: Option<bool>,
            parquet_compression: Option<ParquetCompression>,
            order_key_encoding: Option<OrderKeyEncoding>,
            merge_engine: Option<String>,
            target_file_size_mb: Option<f64>,
            vacuum_retention_hours: Option<f64>,
            min_vacuum_retention_hours: Option<f64>,
        }
    };
}

with_tuning_fields! {
    #[derive(Debug, Default, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct RawDefaults {
        catalog: Option<RawCatalog>,
    }
}

/// `[table.catalog]` / `[defaults.catalog]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCatalog {
    database: Option<String>,
    name: Option<String>,
    delta: Option<bool>,
    manifest: Option<bool>,
    create_database: Option<bool>,
    adopt: Option<bool>,
}

with_tuning_fields! {
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct RawTable {
        name: String,
        source: String,
        target: Option<String>,
        tombstones: Option<String>,
        primary_key: Vec<String>,
        #[serde(default)]
        partition_by: Vec<String>,
        #[serde(default)]
        sequence_by: Vec<String>,
        #[serde(default)]
        drop_columns: Vec<String>,
        #[serde(default)]
        rename_columns: std::collections::BTreeMap<String, String>,
        #[serde(default)]
        format: RawFormat,
        csv: Option<RawCsv>,
        history: Option<RawHistory>,
        catalog: Option<RawCatalog>,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHistory {
    target: String,
    start_column: Option<String>,
    end_column: Option<String>,
    current_column: Option<String>,
    track_columns: Option<Vec<String>>,
    track_except: Option<Vec<String>>,
    deletes: Option<RawDeletes>,
    deleted_column: Option<String>,
    partition_by: Option<Vec<String>>,
}

/// `rename_columns = { <name in the files> = "<the table's column>" }`: each a real rename
/// (two names), no two names onto one column, no chain, and the other settings name the
/// table's columns (a renamed name is only ever seen in files).
fn check_renames(t: &RawTable, op_column: &str) -> Result<(), String> {
    let mut targets = std::collections::BTreeSet::new();
    for (from, to) in &t.rename_columns {
        let hint = "rename_columns maps a column's name in the files to the table's column: { <name in the files> = \"<table column>\" }";
        if from.is_empty() || to.is_empty() || from == to {
            return Err(format!(
                "`rename_columns`: `{from}` = `{to}` renames nothing; {hint}"
            ));
        }
        if !targets.insert(to.to_lowercase()) {
            return Err(format!("`rename_columns`: two names are mapped to the column `{to}`; a file could carry both, and the table has one column"));
        }
        if t.rename_columns.contains_key(to) {
            return Err(format!("`rename_columns`: `{to}` is renamed itself (`{from}` -> `{to}` -> …); map every name in the files straight to the table's column"));
        }
        if from == op_column {
            return Err(format!(
                "`rename_columns`: `{from}` is the operation column"
            ));
        }
        let used = t
            .primary_key
            .iter()
            .chain(&t.partition_by)
            .chain(&t.sequence_by)
            .chain(&t.drop_columns);
        if let Some(c) = used.into_iter().find(|c| *c == from) {
            return Err(format!("`rename_columns` renames `{c}` to `{to}`, but another setting names `{c}`: settings name the table's column (`{to}`)"));
        }
    }
    Ok(())
}

/// `format`: the input files' format (the CSV options are in `[table.csv]`).
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawFormat {
    #[default]
    #[serde(alias = "Parquet", alias = "PARQUET")]
    Parquet,
    #[serde(alias = "Csv", alias = "CSV")]
    Csv,
}

/// `[table.history] deletes`: what a delete does to the history.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawDeletes {
    /// The key's current version is closed.
    #[default]
    Close,
    /// A version flagged deleted is added (`deleted_column`).
    Flag,
}

impl RawTable {
    /// The table's own settings of the fields `[defaults]` may set.
    fn tuning(&self) -> RawDefaults {
        RawDefaults {
            catalog: self.catalog.clone(),
            tombstone_retention_days: self.tombstone_retention_days,
            max_commit_attempts: self.max_commit_attempts,
            slice_rows: self.slice_rows,
            slice_mb: self.slice_mb,
            op_column: self.op_column.clone(),
            before_image_prefix: self.before_image_prefix.clone(),
            sequence_column: self.sequence_column.clone(),
            manifests: self.manifests,
            change_data_feed: self.change_data_feed,
            deletion_vectors: self.deletion_vectors,
            parquet_compression: self.parquet_compression,
            order_key_encoding: self.order_key_encoding,
            merge_engine: self.merge_engine.clone(),
            target_file_size_mb: self.target_file_size_mb,
            vacuum_retention_hours: self.vacuum_retention_hours,
            min_vacuum_retention_hours: self.min_vacuum_retention_hours,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCsv {
    #[serde(default)]
    header: bool,
    /// Overrides `header` for full-load (`LOAD*`) files.
    full_load_header: Option<bool>,
    /// Overrides `header` for CDC files.
    cdc_header: Option<bool>,
    delimiter: Option<String>,
    quote: Option<String>,
    null_value: Option<String>,
    /// DMS `CsvNoSupValue` (with `UseCsvNoSupValue=true`).
    no_sup_value: Option<String>,
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

/// Parse the text into resolved tables (cross-table checks are `locations::check`).
pub(super) fn parse(
    text: &str,
    base_dir: Option<&Path>,
) -> Msg<(Vec<TableConfig>, Vec<GroupConfig>)> {
    let raw: RawConfig =
        toml::from_str(text).map_err(|e| format!("not valid TOML for tributary: {e}"))?;
    if raw.tables.is_empty() {
        return Err(
            "no tables configured: add at least one [[table]] section (see docs/configuration.md)"
                .into(),
        );
    }
    let mut names = HashSet::new();
    let mut tables = Vec::with_capacity(raw.tables.len());
    for t in raw.tables {
        let name = t.name.clone();
        let table =
            resolve(t, &raw.defaults, base_dir).map_err(|m| format!("table `{name}`: {m}"))?;
        if !names.insert(table.name.clone()) {
            return Err(format!(
                "table name `{}` is used twice; names must be unique",
                table.name
            ));
        }
        tables.push(table);
    }
    let groups = if raw.groups.is_empty() {
        default_groups(&tables)
    } else {
        let mut names = HashSet::new();
        let mut out = Vec::new();
        for g in raw.groups {
            let name = g.name.clone();
            let group =
                resolve_group(g, &tables, base_dir).map_err(|m| format!("group `{name}`: {m}"))?;
            if !names.insert(group.name.clone()) {
                return Err(format!(
                    "group name `{}` is used twice; names must be unique",
                    group.name
                ));
            }
            out.push(group);
        }
        out
    };
    Ok((tables, groups))
}

fn resolve_group(g: RawGroup, tables: &[TableConfig], base_dir: Option<&Path>) -> Msg<GroupConfig> {
    check_name(&g.name)?;
    if g.tables.is_empty() {
        return Err("`tables` is empty: name the tables read together".into());
    }
    let mut members = Vec::new();
    for t in &g.tables {
        if !tables.iter().any(|c| &c.name == t) {
            return Err(format!(
                "`tables` names `{t}`, which is not configured (tables: {})",
                tables
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if !members.contains(t) {
            members.push(t.clone());
        }
    }
    let interval = g
        .batch_interval_seconds
        .unwrap_or(DEFAULT_BATCH_INTERVAL_SECONDS);
    if !(interval.is_finite() && interval >= 0.0) {
        return Err("`batch_interval_seconds` must be a number of seconds, 0 or more (DMS's CdcMaxBatchInterval; default 60)".into());
    }
    let chosen: Vec<&TableConfig> = tables
        .iter()
        .filter(|t| members.contains(&t.name))
        .collect();
    let cut = match &g.cut {
        Some(c) => resolve_uri(c, base_dir).map_err(|m| format!("`cut`: {m}"))?,
        None => default_cut(&g.name, &chosen).ok_or_else(|| {
            "the tables are not under one location, so there is no default for `cut`: give the JSON object's location (e.g. cut = \"s3://my-curated-bucket/delta/_tributary_cuts/<group>.json\")".to_string()
        })?,
    };
    Ok(GroupConfig {
        name: g.name,
        tables: members,
        cut,
        batch_interval: std::time::Duration::from_secs_f64(interval),
    })
}

/// Without `[[group]]`: one group per DMS task folder (`bucketFolder`: the tables' sources
/// less their `<schema>/<table>/`), named after its last folder (or the bucket).
fn default_groups(tables: &[TableConfig]) -> Vec<GroupConfig> {
    let mut by_folder: Vec<(Url, Vec<String>)> = Vec::new();
    for t in tables {
        let mut folder = t.source.clone();
        let segments: Vec<String> = t
            .source
            .path_segments()
            .map(|s| s.filter(|x| !x.is_empty()).map(str::to_string).collect())
            .unwrap_or_default();
        let keep = segments.len().saturating_sub(2);
        folder.set_path(&format!(
            "/{}",
            segments[..keep]
                .iter()
                .map(|s| format!("{s}/"))
                .collect::<String>()
        ));
        match by_folder.iter_mut().find(|(f, _)| *f == folder) {
            Some((_, names)) => names.push(t.name.clone()),
            None => by_folder.push((folder, vec![t.name.clone()])),
        }
    }
    let mut used = HashSet::new();
    let mut out = Vec::new();
    for (folder, names) in by_folder {
        let last = folder
            .path_segments()
            .and_then(|mut s| s.rfind(|x| !x.is_empty()).map(str::to_string))
            .or_else(|| folder.host_str().map(str::to_string))
            .unwrap_or_else(|| "default".into());
        let mut name: String = last
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let mut n = 2;
        while !used.insert(name.clone()) {
            name = format!("{last}-{n}");
            n += 1;
        }
        let chosen: Vec<&TableConfig> = tables.iter().filter(|t| names.contains(&t.name)).collect();
        let Some(cut) = default_cut(&name, &chosen) else {
            continue;
        };
        out.push(GroupConfig {
            name,
            tables: names,
            cut,
            batch_interval: std::time::Duration::from_secs_f64(DEFAULT_BATCH_INTERVAL_SECONDS),
        });
    }
    out
}

/// `<the folder holding the tables>/_tributary_cuts/<group>.json`, when they share one.
fn default_cut(group: &str, tables: &[&TableConfig]) -> Option<Url> {
    let mut common: Option<(Url, Vec<String>)> = None;
    for t in tables {
        let u = t.state_table().ok()?;
        let segs: Vec<String> = u
            .path_segments()?
            .filter(|x| !x.is_empty())
            .map(str::to_string)
            .collect();
        let parent = segs[..segs.len().saturating_sub(1)].to_vec();
        common = Some(match common {
            None => (u.clone(), parent),
            Some((c, p)) => {
                if c.scheme() != u.scheme() || c.host_str() != u.host_str() {
                    return None;
                }
                let n = p.iter().zip(&parent).take_while(|(a, b)| a == b).count();
                (c, p[..n].to_vec())
            }
        });
    }
    let (mut u, segs) = common?;
    let path: String = segs.iter().map(|s| format!("/{s}")).collect();
    u.set_path(&format!("{path}/_tributary_cuts/{group}.json"));
    Some(u)
}

fn resolve(t: RawTable, d: &RawDefaults, base_dir: Option<&Path>) -> Msg<TableConfig> {
    check_name(&t.name)?;
    let (source, target, tombstones) = locations(&t, base_dir)?;
    let tuning = t.tuning();
    let op_column = pick(&tuning.op_column, &d.op_column).unwrap_or_else(|| "Op".into());
    let before_image_prefix = pick(&tuning.before_image_prefix, &d.before_image_prefix);
    if before_image_prefix.as_deref().is_some_and(|p| p.is_empty()) {
        return Err("`before_image_prefix` is empty; use DMS's column-prefix (default \"BI_\") or remove it".into());
    }
    let sequence_column = pick(&tuning.sequence_column, &d.sequence_column)
        .unwrap_or_else(|| DEFAULT_SEQUENCE_COLUMN.into());
    check_columns(&t, &op_column, &sequence_column)?;
    let history = match &t.history {
        Some(h) => Some(
            history(h, &t, base_dir, &sequence_column)
                .map_err(|m| format!("[table.history]: {m}"))?,
        ),
        None => None,
    };
    let manifests = pick(&tuning.manifests, &d.manifests).unwrap_or(true);
    let compression = pick(&tuning.parquet_compression, &d.parquet_compression).unwrap_or_default();
    let order_key_encoding =
        pick(&tuning.order_key_encoding, &d.order_key_encoding).unwrap_or_default();
    if pick(&tuning.merge_engine, &d.merge_engine).is_some() {
        return Err("`merge_engine` was removed: every merge takes tributary's own write path (delta-rs's MERGE is no longer in the build); delete the key".into());
    }
    let change_data_feed = pick(&tuning.change_data_feed, &d.change_data_feed).unwrap_or(false);
    if change_data_feed && target.is_none() {
        return Err("`change_data_feed` applies to the current table, and this table keeps only its history (no `target`): remove it, or read the history table's versions instead".into());
    }
    let deletion_vectors = pick(&tuning.deletion_vectors, &d.deletion_vectors).unwrap_or(false);
    if deletion_vectors && target.is_none() {
        return Err("`deletion_vectors` applies to the current table, and this table keeps only its history (no `target`): remove it".into());
    }
    if deletion_vectors && manifests {
        return Err("`deletion_vectors = true` needs `manifests = false`: a symlink manifest lists whole data files, so Athena manifest tables and Redshift Spectrum reading it would see the rows the vectors delete; set `manifests = false` (read the table with a Delta reader: Spark, Databricks, Trino, DuckDB, Python deltalake), or leave `deletion_vectors` off".into());
    }
    let catalog = catalog(
        &t.name,
        tuning.catalog.as_ref(),
        d.catalog.as_ref(),
        manifests,
    )
    .map_err(|m| format!("[table.catalog]: {m}"))?;
    let format = format(t.format, t.csv)?;
    check_csv_order_keys(&t.sequence_by, &format)?;
    let (tombstone_retention, max_commit_attempts, slice_rows, slice_bytes) = limits(&tuning, d)?;
    let maintenance = maintenance(&tuning, d)?;

    Ok(TableConfig {
        name: t.name,
        source,
        target,
        tombstones,
        primary_key: t.primary_key,
        partition_by: t.partition_by,
        sequence_by: t.sequence_by,
        drop_columns: t.drop_columns,
        rename_columns: t.rename_columns,
        op_column,
        convention: super::Convention::Dms,
        before_image_prefix,
        format,
        limits: Limits {
            tombstone_retention,
            max_commit_attempts,
            slice_rows,
            slice_bytes,
        },
        writing: Writing {
            sequence_column,
            manifests,
            change_data_feed,
            deletion_vectors,
            compression,
            order_key_encoding,
        },
        maintenance,
        history,
        catalog,
    })
}

/// A CSV table's `sequence_by` columns have types in `csv.columns`: every CSV value is
/// text, and an undeclared order key would order "10" before "9".
fn check_csv_order_keys(sequence_by: &[String], format: &Format) -> Msg<()> {
    let Format::Csv(opts) = format else {
        return Ok(());
    };
    match sequence_by
        .iter()
        .find(|c| !opts.columns.iter().any(|s| &s.name == *c))
    {
        Some(c) => Err(format!(
            "`sequence_by` column `{c}` has no type in csv.columns, so its CSV text would be compared as text (\"10\" before \"9\": the older change wins); declare it, e.g. columns = [{{ name = \"{c}\", type = \"timestamp\" }}] (or \"int64\"; \"string\" only for values that order as text, such as DMS's fixed-width AR_H_CHANGE_SEQ)"
        )),
        None => Ok(()),
    }
}

/// The table's limits: tombstone retention, commit attempts, slice rows and slice bytes.
fn limits(tuning: &RawDefaults, d: &RawDefaults) -> Msg<(Duration, u32, usize, usize)> {
    let tombstone_days = pick(
        &tuning.tombstone_retention_days,
        &d.tombstone_retention_days,
    )
    .unwrap_or(DEFAULT_TOMBSTONE_RETENTION_DAYS);
    let max_commit_attempts =
        pick(&tuning.max_commit_attempts, &d.max_commit_attempts).unwrap_or(30);
    if max_commit_attempts == 0 {
        return Err("`max_commit_attempts` must be at least 1".into());
    }
    let slice_rows = pick(&tuning.slice_rows, &d.slice_rows).unwrap_or(DEFAULT_SLICE_ROWS);
    if slice_rows < 1024 {
        return Err(format!(
            "`slice_rows` is {slice_rows}; use at least 1024 (the default, {DEFAULT_SLICE_ROWS}, keeps a merge near 0.5 GB for a table of ten columns)"
        ));
    }
    let slice_mb = positive(
        pick(&tuning.slice_mb, &d.slice_mb).unwrap_or(DEFAULT_SLICE_MB),
        "slice_mb",
    )?;
    let retention = positive(tombstone_days, "tombstone_retention_days")? * 86_400.0;
    Ok((
        Duration::from_secs_f64(retention),
        max_commit_attempts,
        slice_rows,
        (slice_mb * 1024.0 * 1024.0) as usize,
    ))
}

fn pick<T: Clone>(table: &Option<T>, default: &Option<T>) -> Option<T> {
    table.clone().or_else(|| default.clone())
}

fn positive(v: f64, field: &str) -> Msg<f64> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(format!("`{field}` is {v}; it must be a positive number"))
    }
}

fn check_name(name: &str) -> Msg<()> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
    {
        return Err(
            "`name` must be non-empty and use only letters, digits, `_`, `-` or `.`".into(),
        );
    }
    Ok(())
}

/// `source` (always ending with `/`), `target` and `tombstones` (no trailing slash; none
/// for a table that keeps only its history).
fn locations(t: &RawTable, base_dir: Option<&Path>) -> Msg<(Url, Option<Url>, Option<Url>)> {
    let mut source = resolve_uri(&t.source, base_dir).map_err(|m| format!("`source`: {m}"))?;
    if !source.path().ends_with('/') {
        let p = format!("{}/", source.path());
        source.set_path(&p);
    }
    let target = match &t.target {
        Some(s) => Some(trim_trailing_slash(
            resolve_uri(s, base_dir).map_err(|m| format!("`target`: {m}"))?,
        )),
        None if t.history.is_some() => None,
        None => return Err("`target` is missing: give the Delta table's location (e.g. target = \"s3://my-curated-bucket/delta/<table>\"), or add a [table.history] to keep only a history table".into()),
    };
    let tombstones = match (&t.tombstones, &target) {
        (Some(s), Some(_)) => Some(trim_trailing_slash(
            resolve_uri(s, base_dir).map_err(|m| format!("`tombstones`: {m}"))?,
        )),
        (None, Some(target)) => Some(crate::storage::join(target, TOMBSTONE_DIR)),
        (Some(_), None) => return Err("`tombstones` is set but `target` is not: a table that keeps only its history table records its deletes in the history's change log; remove `tombstones`".into()),
        (None, None) => None,
    };
    Ok((source, target, tombstones))
}

fn check_columns(t: &RawTable, op_column: &str, sequence_column: &str) -> Msg<()> {
    if t.primary_key.is_empty() {
        return Err(
            "`primary_key` is empty: list the source table's primary key column(s), e.g. primary_key = [\"id\"]".into(),
        );
    }
    check_unique(&t.primary_key, "primary_key")?;
    check_unique(&t.partition_by, "partition_by")?;
    check_unique(&t.sequence_by, "sequence_by")?;
    if sequence_column.is_empty() {
        return Err("`sequence_column` is empty".into());
    }
    check_renames(t, op_column)?;
    for c in t.primary_key.iter().chain(&t.partition_by) {
        if c == op_column || t.drop_columns.contains(c) {
            return Err(format!(
                "column `{c}` is a key or partition column and cannot also be dropped (remove it from `drop_columns`)"
            ));
        }
        if c == sequence_column {
            return Err(format!(
                "column `{c}` clashes with the internal sequence column; set `sequence_column` to another name"
            ));
        }
        if c.starts_with(RESERVED_PREFIX) {
            return Err(format!(
                "column `{c}`: names starting with `{RESERVED_PREFIX}` are reserved for tributary's own columns"
            ));
        }
    }
    if t.primary_key.iter().any(|k| k == DELETED_AT_COLUMN) {
        return Err(format!(
            "a primary key column named `{DELETED_AT_COLUMN}` clashes with the tombstone table's column of that name"
        ));
    }
    if t.sequence_by.iter().any(|s| s == op_column) {
        return Err(format!(
            "`sequence_by` cannot contain the operation column `{op_column}`"
        ));
    }
    Ok(())
}

fn history(
    h: &RawHistory,
    t: &RawTable,
    base_dir: Option<&Path>,
    seq_column: &str,
) -> Msg<HistoryConfig> {
    if t.sequence_by.is_empty() {
        return Err("a history table needs `sequence_by` (its intervals are the sequence values of the changes)".into());
    }
    let target = trim_trailing_slash(
        resolve_uri(&h.target, base_dir).map_err(|m| format!("`target`: {m}"))?,
    );
    let track = match (&h.track_columns, &h.track_except) {
        (Some(_), Some(_)) => return Err("set `track_columns` or `track_except`, not both".into()),
        (Some(c), None) => {
            check_unique(c, "track_columns")?;
            Track::Only(c.clone())
        }
        (None, Some(c)) => {
            check_unique(c, "track_except")?;
            Track::Except(c.clone())
        }
        (None, None) => Track::All,
    };
    let deletes = match (h.deletes.unwrap_or_default(), &h.deleted_column) {
        (RawDeletes::Close, None) => HistoryDeletes::Close,
        (RawDeletes::Close, Some(_)) => {
            return Err("`deleted_column` needs deletes = \"flag\"".into())
        }
        (RawDeletes::Flag, c) => {
            HistoryDeletes::Flag(c.clone().unwrap_or_else(|| "__DELETED".into()))
        }
    };
    let h = HistoryConfig {
        changes: crate::storage::join(&target, CHANGES_DIR),
        target,
        start_column: h
            .start_column
            .clone()
            .unwrap_or_else(|| "__START_AT".into()),
        end_column: h.end_column.clone().unwrap_or_else(|| "__END_AT".into()),
        current_column: h.current_column.clone(),
        track,
        deletes,
        partition_by: h
            .partition_by
            .clone()
            .unwrap_or_else(|| t.partition_by.clone()),
    };
    let mut own = vec![h.start_column.clone(), h.end_column.clone()];
    own.extend(h.current_column.clone());
    if let HistoryDeletes::Flag(c) = &h.deletes {
        own.push(c.clone());
    }
    check_unique(&own, "the history columns")?;
    for c in &own {
        if t.primary_key.contains(c) || c == seq_column || c.starts_with(RESERVED_PREFIX) {
            return Err(format!("column `{c}` clashes with a key, the sequence column or tributary's own columns; choose another name"));
        }
    }
    Ok(h)
}

/// The table's catalog settings, each field from the table or else `[defaults.catalog]`.
fn catalog(
    table: &str,
    t: Option<&RawCatalog>,
    d: Option<&RawCatalog>,
    manifests: bool,
) -> Msg<Option<CatalogConfig>> {
    if t.is_none() && d.is_none() {
        return Ok(None);
    }
    if !cfg!(feature = "glue") {
        return Err("this tributary was built without the `glue` feature, which keeps Glue Data Catalog entries: build it with the default features, or remove the catalog settings".into());
    }
    let (t, d) = (
        t.cloned().unwrap_or_default(),
        d.cloned().unwrap_or_default(),
    );
    if d.name.is_some() {
        return Err("`name` cannot be set in [defaults.catalog] (every table needs an entry of its own); set it in the table's [table.catalog]".into());
    }
    let Some(database) = pick(&t.database, &d.database) else {
        return Err("`database` is missing: name the Glue database to keep the table in".into());
    };
    let name = t
        .name
        .unwrap_or_else(|| table.to_ascii_lowercase().replace(['-', '.'], "_"));
    for (field, v) in [("database", &database), ("name", &name)] {
        if v.is_empty()
            || !v
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(format!(
                "`{field}` is {v:?}; Glue and Athena names use lower-case letters, digits and `_`"
            ));
        }
    }
    let manifest = pick(&t.manifest, &d.manifest).unwrap_or(manifests);
    if manifest && !manifests {
        return Err("`manifest = true` needs the table's `manifests = true` (the manifest entry reads them)".into());
    }
    let c = CatalogConfig {
        database,
        name,
        delta: pick(&t.delta, &d.delta).unwrap_or(true),
        manifest,
        create_database: pick(&t.create_database, &d.create_database).unwrap_or(false),
        adopt: pick(&t.adopt, &d.adopt).unwrap_or(false),
    };
    if !c.delta && !c.manifest {
        return Err("both `delta` and `manifest` are false: nothing to keep in the catalog".into());
    }
    Ok(Some(c))
}

fn format(format: RawFormat, csv: Option<RawCsv>) -> Msg<Format> {
    match format {
        RawFormat::Parquet if csv.is_some() => Err("a [table.csv] section is given but `format` is \"parquet\"; set format = \"csv\" or remove the section".into()),
        RawFormat::Parquet => Ok(Format::Parquet),
        RawFormat::Csv => Ok(Format::Csv(csv_options(csv)?)),
    }
}

fn maintenance(t: &RawDefaults, d: &RawDefaults) -> Msg<MaintenanceConfig> {
    let target_mb = positive(
        pick(&t.target_file_size_mb, &d.target_file_size_mb).unwrap_or(128.0),
        "target_file_size_mb",
    )?;
    let vacuum_h = positive(
        pick(&t.vacuum_retention_hours, &d.vacuum_retention_hours).unwrap_or(168.0),
        "vacuum_retention_hours",
    )?;
    let min_vacuum_h = positive(
        pick(&t.min_vacuum_retention_hours, &d.min_vacuum_retention_hours).unwrap_or(168.0),
        "min_vacuum_retention_hours",
    )?;
    Ok(MaintenanceConfig {
        target_file_size: (target_mb * 1024.0 * 1024.0) as u64,
        vacuum_retention: Duration::from_secs_f64(vacuum_h * 3600.0),
        min_vacuum_retention: Duration::from_secs_f64(min_vacuum_h * 3600.0),
    })
}

fn check_unique(cols: &[String], field: &str) -> Msg<()> {
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

fn csv_options(raw: Option<RawCsv>) -> Msg<CsvOptions> {
    let raw = raw.ok_or_else(|| {
        "format = \"csv\" needs a [table.csv] section (at least `header` and, without a header, `columns`)".to_string()
    })?;
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
    let full_load_header = raw.full_load_header.unwrap_or(raw.header);
    let cdc_header = raw.cdc_header.unwrap_or(raw.header);
    if (!full_load_header || !cdc_header) && columns.is_empty() {
        let which = match (full_load_header, cdc_header) {
            (false, false) => "csv.header = false",
            (false, true) => "csv.full_load_header = false",
            _ => "csv.cdc_header = false",
        };
        return Err(format!("{which} needs csv.columns: list the file's columns after `Op`, in order, e.g. columns = [{{ name = \"id\", type = \"int64\" }}]"));
    }
    // DMS's documented default for `CsvNullValue` is `NULL`, but what it writes without the
    // setting — every real DMS CSV file seen — is an unquoted empty field.
    let null_value = raw.null_value.unwrap_or_default();
    if let Some(ns) = &raw.no_sup_value {
        if ns.is_empty() {
            return Err("csv.no_sup_value is empty; give the text of the DMS endpoint's CsvNoSupValue (e.g. \"__NOSUP__\"), or leave the field out".into());
        }
        if *ns == null_value {
            return Err(format!("csv.no_sup_value and csv.null_value are both {ns:?}: a value could not tell NULL from \"not in the supplemental log\"; give DMS (CsvNoSupValue / CsvNullValue) two different texts"));
        }
    }
    Ok(CsvOptions {
        full_load_header,
        cdc_header,
        delimiter,
        quote,
        null_value,
        no_sup_value: raw.no_sup_value,
        include_op_for_full_load: raw.include_op_for_full_load,
        columns,
    })
}

fn single_byte(v: Option<String>, field: &str, default: u8) -> Msg<u8> {
    match v {
        None => Ok(default),
        Some(s) if s == "\\t" => Ok(b'\t'),
        Some(s) if s.len() == 1 && s.is_ascii() => Ok(s.as_bytes()[0]),
        Some(s) => Err(format!(
            "csv.{field} must be one ASCII character (or \"\\t\"), got {s:?}"
        )),
    }
}

/// Parse a column type name as used in `csv.columns`.
pub fn parse_type(s: &str) -> Msg<DataType> {
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
        _ if t.starts_with("decimal(") && t.ends_with(')') => parse_decimal(s, &t)?,
        _ => {
            return Err(format!(
                "unknown type {s:?}; use string, boolean, int8, int16, int32, int64, float, double, date, timestamp, timestamp_ntz, binary or decimal(p,s)"
            ))
        }
    };
    Ok(dt)
}

fn parse_decimal(s: &str, t: &str) -> Msg<DataType> {
    let inner = &t["decimal(".len()..t.len() - 1];
    let (p, sc) = inner.split_once(',').ok_or_else(|| {
        format!("decimal needs precision and scale, e.g. decimal(10,2), got {s:?}")
    })?;
    let p: u8 = p
        .trim()
        .parse()
        .map_err(|_| format!("bad decimal precision in {s:?}"))?;
    let sc: i8 = sc
        .trim()
        .parse()
        .map_err(|_| format!("bad decimal scale in {s:?}"))?;
    if p == 0 || p > 38 || sc < 0 || sc as u8 > p {
        return Err(format!(
            "decimal({p},{sc}) is out of range (1 ≤ precision ≤ 38, 0 ≤ scale ≤ precision)"
        ));
    }
    Ok(DataType::Decimal128(p, sc))
}

fn resolve_uri(s: &str, base_dir: Option<&Path>) -> Msg<Url> {
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
