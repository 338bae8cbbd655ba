//! A table's state for the operator (`tributary status`): version and last commit, rows
//! and files (small files: below the maintenance target size, what OPTIMIZE would
//! compact), freshness (the newest change applied, from the order keys of the table's rows
//! and of its delete tombstones, and how far it is behind now), tombstones, whether the
//! symlink manifests list exactly the live files, and the Glue catalog entries' state.
//! Read-only: nothing is written, nothing is repaired.

use std::collections::HashMap;

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int64Type};
use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Serialize;

use crate::config::TableConfig;
use crate::delta;
use crate::delta::catalog::{Catalog, EntryStatus};
use crate::delta::manifest;
use crate::error::{Error, Result};
use crate::source::order::dms_file_time;
use crate::source::SeqKind;
use crate::storage::{self, Storage};

/// One table's state.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TableStatus {
    pub table: String,
    pub target: String,
    /// `false` when no file was merged yet (the other figures are then empty).
    pub exists: bool,
    pub version: Option<u64>,
    /// When the last commit was written.
    pub last_commit: Option<DateTime<Utc>>,
    pub rows: u64,
    pub files: u64,
    pub bytes: u64,
    /// Live files below the maintenance target size (`target_file_size_mb`).
    pub small_files: u64,
    /// Live files with a deletion vector, and the rows those vectors delete (merge-on-read,
    /// or another writer's DELETE); maintenance rewrites the files whose vectors delete more
    /// than 5 % of their rows.
    pub files_with_vectors: u64,
    pub rows_deleted_by_vectors: u64,
    pub partitions: u64,
    pub freshness: Freshness,
    /// Delete tombstones kept (rows of the tombstone table: two per delete, pending and
    /// applied; duplicates included).
    pub tombstones: u64,
    /// `None` when the table keeps no manifests (`manifests = false`).
    pub manifests: Option<ManifestStatus>,
    /// `None` without `[table.catalog]`.
    pub catalog: Option<Vec<EntryStatus>>,
    /// `delta.enableChangeDataFeed` is on.
    pub change_data_feed: bool,
    /// When tributary adopted the table (another writer created it; `None`: tributary did).
    pub adopted: Option<DateTime<Utc>>,
    /// The table keeps only its history table (no `target`): `target` is the history
    /// table, `rows` its versions, and no tombstones are kept.
    pub history_only: bool,
    /// Schema drift: the table's columns against its recent source files (`None`: no
    /// Parquet source file in the last commits to compare with).
    pub drift: Option<Drift>,
    /// The table's watermark (`crate::delta::watermark`) as its records and its source show it now:
    /// every CDC file written up to it is applied; `held_by` names the first file that is
    /// not.
    pub watermark: Option<crate::delta::watermark::Progress>,
    /// The cuts of the groups the table is in (`crate::delta::cut`; filled by `tributary status`).
    pub cuts: Vec<crate::delta::cut::GroupCut>,
}

/// The table's columns against the source files its last commits merged (their Parquet
/// footers, one ranged read each): what the source stopped sending and what it started to.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Drift {
    /// The source files compared (the newest few the table's last commits merged).
    pub files: Vec<String>,
    /// Columns of the table that none of those files carries: dropped at the source, or
    /// renamed (a rename arrives as a new column; `rename_columns` keeps one column). The
    /// table keeps their values; new rows leave them empty.
    pub missing_from_recent_files: Vec<String>,
    /// Columns the table gained after it was created (new at the source, or a rename's
    /// new name); `None` when the table's first version is no longer in its log.
    pub added_since_created: Option<Vec<String>>,
}

/// How many of the table's last commits' source files [`Drift`] compares.
const DRIFT_FILES: usize = 5;

/// The newest change the table reflects.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Freshness {
    /// The sequence value(s) (`sequence_by`) of the newest applied CDC change, as written in
    /// the order key (timestamps as `YYYY-MM-DD HH:MM:SS.ffffff` UTC); `None` when only
    /// full-load rows were applied.
    pub newest_sequence: Option<String>,
    /// The DMS file that change came from.
    pub newest_file: Option<String>,
    /// The newest change's time: its sequence value when that is a timestamp, else the
    /// time in its DMS file name.
    pub newest_change_at: Option<DateTime<Utc>>,
    /// How far behind now that is, in seconds.
    pub behind_seconds: Option<f64>,
    /// Only full-load rows were applied so far.
    pub full_load_only: bool,
}

/// Whether `_symlink_format_manifest/` lists exactly the live files.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ManifestStatus {
    pub exact: bool,
    /// Partition folders whose manifest is missing, stale or left over.
    pub differing_partitions: Vec<String>,
    /// The table version the manifests record that they describe
    /// (`_tributary_manifests_version`; `None`: not recorded yet). Behind the table's
    /// version after a crash between a commit and its manifests: the next merge of the
    /// table catches up.
    pub recorded_version: Option<u64>,
}

impl TableStatus {
    /// The status of a table not read yet: nothing known but its name and place.
    fn of(cfg: &TableConfig) -> Result<TableStatus> {
        Ok(TableStatus {
            table: cfg.name.clone(),
            target: storage::display(cfg.state_table()?),
            exists: false,
            version: None,
            last_commit: None,
            rows: 0,
            files: 0,
            bytes: 0,
            small_files: 0,
            files_with_vectors: 0,
            rows_deleted_by_vectors: 0,
            partitions: 0,
            freshness: Freshness::default(),
            tombstones: 0,
            manifests: None,
            catalog: None,
            change_data_feed: false,
            adopted: None,
            history_only: cfg.target.is_none(),
            drift: None,
            watermark: None,
            cuts: Vec::new(),
        })
    }
}

/// The table's rows and its newest change's order key (a history table's newest change
/// closed a version or was its last).
async fn rows_and_newest_change(
    cfg: &TableConfig,
    table: &deltalake::DeltaTable,
) -> Result<(u64, Option<String>)> {
    match cfg.target {
        Some(_) => {
            count_and_max(table, &[&cfg.writing.sequence_column], |c| Ok(c[0].clone())).await
        }
        None => {
            let columns = [
                crate::delta::history::END_SEQ_COLUMN,
                crate::delta::history::LAST_SEQ_COLUMN,
            ];
            count_and_max(table, &columns, |c| {
                let end = cast(&c[0], &DataType::Utf8).map_err(Error::arrow)?;
                let last = cast(&c[1], &DataType::Utf8).map_err(Error::arrow)?;
                let (end, last) = (end.as_string::<i32>(), last.as_string::<i32>());
                let coalesced: arrow::array::StringArray =
                    end.iter().zip(last.iter()).map(|(e, l)| e.or(l)).collect();
                Ok(Arc::new(coalesced))
            })
            .await
        }
    }
}

/// The state of `cfg`'s table at `now`. `catalog` reads the Glue entries (when the table
/// has catalog settings).
pub async fn table_status(
    cfg: &TableConfig,
    options: &HashMap<String, String>,
    storage: &Storage,
    catalog: Option<&Catalog>,
    now: DateTime<Utc>,
) -> Result<TableStatus> {
    let mut st = TableStatus::of(cfg)?;
    let table = delta::open(cfg.state_table()?, options).await?;
    st.watermark = Some(
        crate::delta::watermark::progress(storage, cfg, &table, now)
            .await?
            .0,
    );
    if !delta::exists(&table) {
        return Ok(st);
    }
    st.exists = true;
    st.version = table.version();
    st.last_commit = {
        use futures::StreamExt;
        let mut history = table.history(Some(1));
        match history.next().await {
            Some(Ok(info)) => info.timestamp.and_then(DateTime::from_timestamp_millis),
            _ => None,
        }
    };
    let props = delta::props(&table);
    st.change_data_feed = props.change_data_feed;
    st.adopted = props.adopted;
    st.drift = drift(cfg, options, storage, &table).await?;
    file_figures(cfg, &table, &mut st)?;
    let (rows, newest_row) = rows_and_newest_change(cfg, &table).await?;
    st.rows = rows;
    let (tombstones, newest_delete) = tombstone_figures(cfg, options, st.last_commit).await?;
    st.tombstones = tombstones;
    let newest = newest_row.into_iter().chain(newest_delete).max();
    let kind = props
        .sequence_kinds
        .as_ref()
        .and_then(|k| k.first().copied());
    st.freshness = freshness(newest.as_deref(), kind, now);
    if cfg.writing.manifests {
        st.manifests = Some(manifest_status(storage, &table).await?);
    }
    if let Some(catalog) = catalog {
        // A catalog that cannot be read is this table's state, not the command's failure.
        st.catalog = catalog.status(cfg, options).await.unwrap_or_else(|e| {
            Some(vec![EntryStatus {
                entry: cfg
                    .catalog
                    .as_ref()
                    .map_or_else(String::new, |c| c.database.clone()),
                state: format!("cannot be read: {e}"),
                partitions: None,
            }])
        });
    }
    Ok(st)
}

/// [`Drift`]: the table's columns (tributary's own left out) against the Parquet source files
/// of its last commits (`tributary.files` in their commit info).
async fn drift(
    cfg: &TableConfig,
    options: &HashMap<String, String>,
    storage: &Storage,
    table: &deltalake::DeltaTable,
) -> Result<Option<Drift>> {
    use futures::StreamExt;
    let mut files: Vec<String> = Vec::new();
    let mut history = table.history(Some(20));
    while let Some(Ok(info)) = history.next().await {
        let merged = info
            .info
            .get("tributary.files")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .filter(|f| f.ends_with(".parquet") && !files.iter().any(|g| g == f))
            .map(str::to_string)
            .collect::<Vec<_>>();
        files.extend(merged);
        if files.len() >= DRIFT_FILES {
            break;
        }
    }
    files.truncate(DRIFT_FILES);
    let mut seen: std::collections::BTreeSet<String> = Default::default();
    let mut compared = Vec::new();
    for f in files {
        let url = if f.contains("://") {
            url::Url::parse(&f).ok()
        } else {
            url::Url::from_file_path(&f).ok()
        };
        let Some(url) = url else { continue };
        let Ok(Some(columns)) = parquet_columns(storage, &url).await else {
            // Gone (expired from the raw bucket) or unreadable: not compared.
            continue;
        };
        for c in columns {
            let c = cfg.rename_columns.get(&c).cloned().unwrap_or(c);
            seen.insert(c.to_lowercase());
        }
        compared.push(f);
    }
    if compared.is_empty() {
        return Ok(None);
    }
    let own = |c: &str| crate::plan::is_internal(c) || c == cfg.writing.sequence_column;
    let columns: Vec<String> = delta::arrow_schema(table)
        .map(|s| s.fields().iter().map(|f| f.name().clone()).collect())
        .unwrap_or_default();
    let missing = columns
        .iter()
        .filter(|c| !own(c) && !seen.contains(&c.to_lowercase()))
        .cloned()
        .collect();
    let first = delta::open_version(cfg.state_table()?, options, 0)
        .await
        .ok();
    let added = first.and_then(|t| delta::arrow_schema(&t)).map(|s| {
        columns
            .iter()
            .filter(|c| !own(c) && s.field_with_name(c).is_err())
            .cloned()
            .collect()
    });
    Ok(Some(Drift {
        files: compared,
        missing_from_recent_files: missing,
        added_since_created: added,
    }))
}

/// The column names of a Parquet object, from its footer (`None`: not Parquet).
async fn parquet_columns(storage: &Storage, url: &url::Url) -> Result<Option<Vec<String>>> {
    use object_store::ObjectStoreExt;
    let store = storage.store(url)?;
    let path = storage::object_path(url)?;
    let meta = store
        .head(&path)
        .await
        .map_err(|e| Error::storage(url.as_str(), e))?;
    let footer = crate::delta::stats::read_footer(store.as_ref(), &path, meta.size)
        .await
        .map_err(|e| Error::storage(url.as_str(), e))?;
    Ok(footer.map(|m| {
        m.file_metadata()
            .schema_descr()
            .root_schema()
            .get_fields()
            .iter()
            .map(|f| f.name().to_string())
            .collect()
    }))
}

/// Tombstones kept, and the newest order key among those applied. A delete's tombstone is
/// recorded just before the commit that applies it: tombstones recorded after the last
/// commit belong to a merge not committed (yet), not counted.
async fn tombstone_figures(
    cfg: &TableConfig,
    options: &HashMap<String, String>,
    last_commit: Option<DateTime<Utc>>,
) -> Result<(u64, Option<String>)> {
    let Some(url) = &cfg.tombstones else {
        return Ok((0, None));
    };
    let tombs = delta::open(url, options).await?;
    if !delta::exists(&tombs) {
        return Ok((0, None));
    }
    // The newest delete the table has applied (recorded by its last commit).
    let applied_by = last_commit.map(|t| t.timestamp_micros());
    let columns = [
        crate::delta::tombstones::DELETED_AT_COLUMN,
        &cfg.writing.sequence_column,
    ];
    count_and_max(&tombs, &columns, |c| {
        let at = cast(&c[0], &DataType::Int64).map_err(Error::arrow)?;
        let at = at.as_primitive::<Int64Type>();
        let seq = cast(&c[1], &DataType::Utf8).map_err(Error::arrow)?;
        let seq = seq.as_string::<i32>();
        let applied: arrow::array::StringArray = seq
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.filter(|_| applied_by.is_some_and(|t| at.is_valid(i) && at.value(i) <= t))
            })
            .collect();
        Ok(Arc::new(applied))
    })
    .await
}

/// Live files, bytes, small files and partitions.
fn file_figures(
    cfg: &TableConfig,
    table: &deltalake::DeltaTable,
    st: &mut TableStatus,
) -> Result<()> {
    let files = manifest::live_files(table)?;
    st.files = files.len() as u64;
    st.bytes = files.iter().map(|f| f.size.max(0) as u64).sum();
    let target = cfg.maintenance.target_file_size.max(1);
    st.small_files = files.iter().filter(|f| (f.size as u64) < target).count() as u64;
    st.files_with_vectors = files.iter().filter(|f| f.deletion_vector).count() as u64;
    st.rows_deleted_by_vectors = files.iter().map(|f| f.deleted_rows).sum();
    st.partitions = files
        .iter()
        .map(|f| &f.partition)
        .collect::<std::collections::BTreeSet<_>>()
        .len() as u64;
    Ok(())
}

/// The manifests on storage against what they should say for the table's version.
async fn manifest_status(
    storage: &Storage,
    table: &deltalake::DeltaTable,
) -> Result<ManifestStatus> {
    let want = manifest::expected_manifests(table)?;
    let have = manifest::read_manifests(storage, table).await?;
    let mut differing: Vec<String> = want
        .iter()
        .filter(|(k, v)| have.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .chain(have.keys().filter(|k| !want.contains_key(*k)).cloned())
        .collect();
    differing.sort();
    differing.dedup();
    Ok(ManifestStatus {
        exact: differing.is_empty(),
        differing_partitions: differing,
        recorded_version: manifest::recorded_version(storage, table).await?,
    })
}

/// Rows of the table, and the greatest of `value` over them (a column computed from the
/// table's `columns`; compared in its type, given as text).
async fn count_and_max(
    table: &deltalake::DeltaTable,
    columns: &[&str],
    value: impl Fn(&[ArrayRef]) -> Result<ArrayRef>,
) -> Result<(u64, Option<String>)> {
    let mut rows = 0u64;
    let mut maxima: Vec<ArrayRef> = Vec::new();
    crate::delta::scan::Scan::columns(columns)
        .each(table, |b| {
            rows += b.num_rows() as u64;
            maxima.extend(greatest(&value(b.columns())?)?);
            Ok(true)
        })
        .await?;
    let maxima: Vec<&dyn Array> = maxima.iter().map(|a| a.as_ref()).collect();
    let newest = match maxima.is_empty() {
        true => None,
        false => greatest(&arrow::compute::concat(&maxima).map_err(Error::arrow)?)?,
    };
    let newest = match newest {
        Some(m) => {
            let m = cast(&m, &DataType::Utf8).map_err(Error::arrow)?;
            Some(m.as_string::<i32>().value(0).to_string())
        }
        None => None,
    };
    Ok((rows, newest))
}

/// The greatest non-null value of `a` (a one-row array), if any.
fn greatest(a: &ArrayRef) -> Result<Option<ArrayRef>> {
    if a.null_count() == a.len() {
        return Ok(None);
    }
    let options = arrow::compute::SortOptions {
        descending: true,
        nulls_first: false,
    };
    let idx = arrow::compute::sort_to_indices(a, Some(options), Some(1)).map_err(Error::arrow)?;
    Ok(Some(a.slice(idx.value(0) as usize, 1)))
}

/// Freshness from the greatest order key (source/order.rs has the layout).
fn freshness(key: Option<&str>, kind: Option<SeqKind>, now: DateTime<Utc>) -> Freshness {
    let Some(key) = key else {
        return Freshness::default();
    };
    // Generation ≥ 2: `2 <g> ` before the generation-1 layout.
    let rest = match key.strip_prefix("2 ") {
        Some(r) => r.split_once(' ').map_or("", |(_, r)| r),
        None => key,
    };
    let Some(cdc) = rest.strip_prefix("1 ") else {
        return Freshness {
            full_load_only: true,
            ..Freshness::default()
        };
    };
    // `<sequence values> <file name> <row>`; no sequence values without `sequence_by`.
    let mut parts = cdc.rsplitn(3, ' ');
    let _row = parts.next();
    let file = parts.next().map(str::to_string);
    let values = parts.next().map(str::to_string).filter(|v| !v.is_empty());
    let at = match (&values, kind) {
        (Some(v), Some(SeqKind::Timestamp)) => {
            NaiveDateTime::parse_from_str(v.get(..26).unwrap_or(v), "%Y-%m-%d %H:%M:%S%.6f")
                .ok()
                .map(|t| t.and_utc())
        }
        _ => None,
    }
    .or_else(|| file.as_deref().and_then(dms_file_time));
    Freshness {
        newest_sequence: values,
        newest_file: file,
        newest_change_at: at,
        behind_seconds: at.map(|t| (now - t).num_milliseconds() as f64 / 1000.0),
        full_load_only: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_reads_the_order_key() {
        let now = DateTime::parse_from_rfc3339("2024-01-01T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let f = freshness(
            Some("1 2024-01-01 09:59:30.500000 20240101-0959000000.parquet 0000000007"),
            Some(SeqKind::Timestamp),
            now,
        );
        assert_eq!(
            f.newest_sequence.as_deref(),
            Some("2024-01-01 09:59:30.500000")
        );
        assert_eq!(
            f.newest_file.as_deref(),
            Some("20240101-0959000000.parquet")
        );
        assert_eq!(f.behind_seconds, Some(29.5));
        // Integer sequences: the time comes from the DMS file name.
        let f = freshness(
            Some("2 00000002 1 00000000000000000042 20240101-0958000000.csv 0000000001"),
            Some(SeqKind::Integer),
            now,
        );
        assert_eq!(f.newest_sequence.as_deref(), Some("00000000000000000042"));
        assert_eq!(f.behind_seconds, Some(120.0));
        // No sequence_by.
        let f = freshness(Some("1 20240101-0959000000.csv 0000000001"), None, now);
        assert_eq!(f.newest_sequence, None);
        assert_eq!(f.behind_seconds, Some(60.0));
        // A full load's key, in the layout written before the file's rows shared one, and now.
        assert!(freshness(Some("0 LOAD00000001.parquet 0000000001"), None, now).full_load_only);
        assert!(freshness(Some("0 LOAD00000001.parquet"), None, now).full_load_only);
        assert!(freshness(Some("2 00000002 0 LOAD00000001.parquet"), None, now).full_load_only);
        assert_eq!(freshness(None, None, now), Freshness::default());
    }
}
