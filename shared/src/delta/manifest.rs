//! Symlink manifests (`_symlink_format_manifest/<partition>/manifest`) for Athena and
//! Redshift Spectrum: one absolute data-file URI per line, exactly the live files of a
//! committed version.
//!
//! Written incrementally after each merge (only the partitions the commit touched) and in
//! full by maintenance (which also deletes manifests of partitions that have no files left).
//! Writers race: after writing, the writer reloads the table and, if a newer version exists,
//! rewrites its partitions from it, so the last write of every partition reflects the
//! newest version.
//!
//! Partitions are carried as [`Partition`] values (the Delta log's values, null included);
//! the folder name is derived from them by one rule (Hive escaping) and never parsed back.
//!
//! **The version marker.** `_tributary_manifests_version` (beside `_delta_log`) records the
//! table version
//! the manifests describe: every commit up to it has had its partitions' manifests written
//! (from that version or a later one). It is written after the manifests, never moved back
//! (a conditional write), and read by every merge — also one that commits nothing, such as
//! the retry of a merge that crashed between its commit and its manifests. A merge that
//! finds it behind the table rewrites the partitions the commits in between touched (read
//! from their commit files), or every manifest when the marker is missing or the gap is
//! long ([`catch_up`]): one GET per merge in the normal case, one PUT more after a commit.
//! It is not in `_symlink_format_manifest/`, which manifest-table readers (Athena, Redshift
//! Spectrum) read as a whole for an unpartitioned table; Delta readers never list the table
//! folder, and VACUUM skips names starting with `_`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use deltalake::kernel::Action;
use deltalake::DeltaTable;
use url::Url;

use crate::error::{Error, Result};
use crate::storage::{self, Storage, Tagged};

/// Folder of the manifests inside the table.
pub const MANIFEST_DIR: &str = "_symlink_format_manifest";
/// The marker, in the table's folder beside [`MANIFEST_DIR`], that records the table
/// version the manifests describe (see the module documentation).
pub const VERSION_MARKER: &str = "_tributary_manifests_version";
/// Commits a catch-up reads from the log; a longer gap regenerates every manifest.
const MAX_GAP: u64 = 100;
/// Reads and conditional writes of the marker while other writers keep changing it.
const MARKER_ATTEMPTS: usize = 5;
/// Hive's folder name for a null partition value.
const NULL_FOLDER: &str = "__HIVE_DEFAULT_PARTITION__";

/// The partition values of a file, in the table's partition-column order (`None` = null).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Partition(pub Vec<(String, Option<String>)>);

impl Partition {
    /// A data file's partition (the values as written in the log; `columns` the table's
    /// partition columns, in order).
    pub(crate) fn of(f: &deltalake::kernel::LogicalFileView, columns: &[String]) -> Partition {
        let mut values = f.partition_values_map();
        Partition(
            columns
                .iter()
                .map(|c| (c.clone(), values.remove(c).flatten()))
                .collect(),
        )
    }

    /// The Hive partition folder: `col=value/…` with Hive's escaping (empty when the table
    /// is not partitioned).
    pub fn folder(&self) -> String {
        self.0
            .iter()
            .map(|(c, v)| {
                let v = match v {
                    Some(v) if !v.is_empty() => hive_escape(v),
                    _ => NULL_FOLDER.to_string(),
                };
                format!("{}={}", hive_escape(c), v)
            })
            .collect::<Vec<_>>()
            .join("/")
    }
}

/// A live data file of a table version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LiveFile {
    pub partition: Partition,
    /// The object key relative to the table (or an absolute URI), decoded.
    pub path: String,
    pub size: i64,
    /// Whether a deletion vector deletes rows of it (compaction rewrites it without them).
    pub deletion_vector: bool,
    /// The rows its deletion vector deletes (0 without one).
    pub deleted_rows: u64,
    /// The rows of the file (its statistics' `numRecords`, deleted rows included), if known.
    pub rows: Option<u64>,
}

impl LiveFile {
    /// Whether compaction rewrites the file without its deleted rows even when it is not
    /// small: see [`crate::delta::vectors::materialise`].
    pub fn vector_to_materialise(&self) -> bool {
        self.deletion_vector && crate::delta::vectors::materialise(self.deleted_rows, self.rows)
    }
}

/// Outcome of a manifest sync.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct ManifestReport {
    /// Version the manifests reflect.
    pub(crate) version: u64,
    pub(crate) written: usize,
    pub(crate) deleted: usize,
}

/// Hive-style escaping of a partition value in a folder name.
fn hive_escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if c.is_control() || "\"#%'*/:=?\\\u{7f}{[]^".contains(c) {
            for b in c.to_string().as_bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The live files of the table's loaded version, with their partitions.
pub fn live_files(table: &DeltaTable) -> Result<Vec<LiveFile>> {
    let label = table.table_url().to_string();
    let snapshot = table.snapshot().map_err(|e| Error::delta(&label, e))?;
    let columns = snapshot.metadata().partition_columns().to_vec();
    let mut out: Vec<LiveFile> = snapshot
        .log_data()
        .iter()
        .map(|f| LiveFile {
            partition: Partition::of(&f, &columns),
            path: f.path().into_owned(),
            size: f.size(),
            deletion_vector: f.deletion_vector_descriptor().is_some(),
            deleted_rows: f
                .deletion_vector_descriptor()
                .map_or(0, |d| d.cardinality.max(0) as u64),
            rows: f.num_records().map(|n| n as u64),
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Partitions whose file sets differ between two versions.
pub(crate) fn touched_partitions(before: &[LiveFile], after: &[LiveFile]) -> BTreeSet<Partition> {
    let a: BTreeSet<&LiveFile> = before.iter().collect();
    let b: BTreeSet<&LiveFile> = after.iter().collect();
    a.symmetric_difference(&b)
        .map(|f| f.partition.clone())
        .collect()
}

/// `table/segments…` as a URL (segments are decoded keys).
fn under_table<'a>(table: &DeltaTable, segments: impl IntoIterator<Item = &'a str>) -> Url {
    let mut u = table.table_url().clone();
    if let Ok(mut s) = u.path_segments_mut() {
        s.pop_if_empty().extend(segments);
    }
    u
}

/// Absolute URI of a data file.
pub(crate) fn file_uri(table: &DeltaTable, path: &str) -> String {
    if path.contains("://") {
        return path.to_string();
    }
    under_table(table, path.trim_start_matches('/').split('/')).to_string()
}

fn manifest_url(table: &DeltaTable, folder: &str) -> Url {
    let mut segments = vec![MANIFEST_DIR];
    segments.extend(folder.split('/').filter(|s| !s.is_empty()));
    segments.push("manifest");
    under_table(table, segments)
}

/// Write (or delete, when a partition has no files) the manifests of `partitions`
/// (`None` = every partition, and delete manifests of partitions that are gone) from the
/// table's loaded version.
async fn write_from(
    storage: &Storage,
    table: &DeltaTable,
    partitions: Option<&BTreeSet<Partition>>,
) -> Result<ManifestReport> {
    refuse_deletion_vectors(table)?;
    let by_folder = expected_manifests(table)?;
    let mut report = ManifestReport {
        version: table.version().unwrap_or_default(),
        ..Default::default()
    };
    let wanted: BTreeSet<String> = match partitions {
        Some(p) => p.iter().map(Partition::folder).collect(),
        None => by_folder.keys().cloned().collect(),
    };
    for folder in &wanted {
        let url = manifest_url(table, folder);
        match by_folder.get(folder) {
            Some(uris) => {
                let mut body = uris.join("\n");
                body.push('\n');
                storage.put(&url, Bytes::from(body)).await?;
                report.written += 1;
            }
            None => report.deleted += usize::from(storage.delete_if_exists(&url).await?),
        }
    }
    if partitions.is_none() {
        // Remove manifests of partitions that no longer have files (or were never ours).
        for (folder, url) in list_manifests(storage, table).await? {
            if !by_folder.contains_key(&folder) {
                report.deleted += usize::from(storage.delete_if_exists(&url).await?);
            }
        }
    }
    Ok(report)
}

/// A manifest lists whole files: one whose deletion vector deletes rows would give its
/// readers (Athena's and Redshift Spectrum's manifest tables) rows the table no longer has.
/// Refused by name while any live file has one (a table Spark or Databricks wrote).
fn refuse_deletion_vectors(table: &DeltaTable) -> Result<()> {
    let label = table.table_url().to_string();
    let snapshot = table.snapshot().map_err(|e| Error::delta(&label, e))?;
    let with = snapshot
        .log_data()
        .iter()
        .filter(|f| f.deletion_vector_descriptor().is_some())
        .count();
    if with == 0 {
        return Ok(());
    }
    Err(Error::Unsupported {
        table: label,
        feature: format!("{with} data files have deletion vectors, which a symlink manifest cannot express (its readers would see the deleted rows)"),
        way_forward: "the manifests were left as they were; read the table with a Delta reader (Athena's or Spark's Delta support, not the manifest), or set `manifests = false` for it, or rewrite those files without their deleted rows (tributary's merges do, file by file; Spark's REORG TABLE … APPLY (PURGE) does it at once)".to_string(),
    })
}

/// Existing manifests: (partition folder, URL); none when the folder does not exist.
async fn list_manifests(storage: &Storage, table: &DeltaTable) -> Result<Vec<(String, Url)>> {
    let mut prefix = under_table(table, [MANIFEST_DIR]);
    prefix.set_path(&format!("{}/", prefix.path()));
    let base = storage::object_path(&prefix)?;
    Ok(storage
        .list(&prefix)
        .await?
        .into_iter()
        .filter_map(|url| {
            let key = storage::object_path(&url).ok()?;
            let rel = key
                .as_ref()
                .strip_prefix(base.as_ref())?
                .trim_start_matches('/');
            let folder = rel.strip_suffix("manifest")?.trim_end_matches('/');
            Some((folder.to_string(), url))
        })
        .collect())
}

/// Bring manifests up to date for `partitions` (`None` = all, with stale deletion), then
/// re-check: while the table has moved past the version written, rewrite from the newest.
/// Returns the table at the version the manifests were last written for.
pub(crate) async fn sync(
    storage: &Storage,
    mut table: DeltaTable,
    partitions: Option<&BTreeSet<Partition>>,
) -> Result<(ManifestReport, DeltaTable)> {
    let label = table.table_url().to_string();
    let mut total = ManifestReport::default();
    for _ in 0..10 {
        let r = write_from(storage, &table, partitions).await?;
        total.written += r.written;
        total.deleted += r.deleted;
        total.version = r.version;
        let before = table.version();
        table
            .update_state()
            .await
            .map_err(|e| Error::delta(&label, e))?;
        if table.version() == before {
            return Ok((total, table));
        }
    }
    Err(Error::Contention {
        table: label,
        attempts: 10,
    })
}

/// [`sync`] of every manifest (deleting those of partitions without files), then the
/// version marker: what maintenance runs.
pub(crate) async fn sync_all(
    storage: &Storage,
    table: DeltaTable,
) -> Result<(ManifestReport, DeltaTable)> {
    let marker = read_marker(storage, &table).await?;
    let (report, table) = sync(storage, table, None).await?;
    advance_marker(storage, &table, report.version, marker).await?;
    Ok((report, table))
}

/// What commits the manifests did not reflect changed (a catch-up found them behind: a
/// crash or a failure between a commit and its manifests, or a writer without them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Behind {
    /// Nothing: the manifests were at the version the merge read.
    #[default]
    No,
    /// The commits in between added or removed files of these partitions, and changed the
    /// table's metadata (schema, properties) when `metadata`.
    Known(Gap),
    /// The marker was missing, or the log could not say: every manifest was regenerated.
    Unknown,
}

/// What a run of commits changed, read from their commit files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Gap {
    pub(crate) partitions: BTreeSet<Partition>,
    pub(crate) metadata: bool,
}

/// The marker as read: the version it records (`None`: no marker, or one that does not
/// read as a version) and the object, for the conditional write after it.
#[derive(Debug, Clone, Default)]
struct Marker {
    version: Option<u64>,
    seen: Option<Tagged>,
}

fn marker_url(table: &DeltaTable) -> Url {
    under_table(table, [VERSION_MARKER])
}

async fn read_marker(storage: &Storage, table: &DeltaTable) -> Result<Marker> {
    let seen = storage.get_tagged(&marker_url(table)).await?;
    let version = seen
        .as_ref()
        .and_then(|t| std::str::from_utf8(&t.body).ok())
        .and_then(|s| s.trim().parse::<u64>().ok());
    Ok(Marker { version, seen })
}

/// The table version the manifests record that they describe (`None`: no marker).
pub async fn recorded_version(storage: &Storage, table: &DeltaTable) -> Result<Option<u64>> {
    Ok(read_marker(storage, table).await?.version)
}

/// Record that the manifests describe `version`, unless the marker already says so or
/// more (another writer's): a write conditional on the marker as read, read again and
/// compared when another writer changed it in between. Never moves the marker back.
async fn advance_marker(
    storage: &Storage,
    table: &DeltaTable,
    version: u64,
    mut marker: Marker,
) -> Result<()> {
    let url = marker_url(table);
    for _ in 0..MARKER_ATTEMPTS {
        if marker.version.is_some_and(|v| v >= version) {
            return Ok(());
        }
        let body = Bytes::from(format!("{version}\n"));
        if storage.put_if(&url, body, marker.seen.as_ref()).await? {
            return Ok(());
        }
        marker = read_marker(storage, table).await?;
    }
    // Others keep advancing it: they cover this version or will (the next merge checks).
    tracing::warn!(marker = %storage::display(&url), version, "manifest version marker kept changing; left to the other writers");
    Ok(())
}

/// What the commits after `from` up to `to` changed, from their commit files (which the
/// log cache mostly holds already: loading the table read them). `None` when the log cannot
/// say: a commit file already cleaned up, a remove without partition values.
async fn changes_between(table: &DeltaTable, from: u64, to: u64) -> Result<Option<Gap>> {
    let label = table.table_url().to_string();
    let snapshot = table.snapshot().map_err(|e| Error::delta(&label, e))?;
    let columns = snapshot.metadata().partition_columns().to_vec();
    let partition = |values: Option<&HashMap<String, Option<String>>>| -> Option<Partition> {
        if columns.is_empty() {
            return Some(Partition::default());
        }
        let values = values?;
        Some(Partition(
            columns
                .iter()
                .map(|c| (c.clone(), values.get(c).cloned().flatten()))
                .collect(),
        ))
    };
    let store = table.log_store();
    let mut gap = Gap::default();
    for v in from.saturating_add(1)..=to {
        let Some(bytes) = store
            .read_commit_entry(v)
            .await
            .map_err(|e| Error::delta(&label, e))?
        else {
            return Ok(None);
        };
        let actions =
            deltalake::logstore::get_actions(v, &bytes).map_err(|e| Error::delta(&label, e))?;
        for action in actions {
            let p = match action {
                Action::Add(a) => partition(Some(&a.partition_values)),
                Action::Remove(r) => partition(r.partition_values.as_ref()),
                Action::Metadata(_) => {
                    gap.metadata = true;
                    continue;
                }
                _ => continue,
            };
            match p {
                Some(p) => gap.partitions.insert(p),
                None => return Ok(None),
            };
        }
    }
    Ok(Some(gap))
}

/// What a merge that committed read first: the version and its live files.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Since<'a> {
    pub(crate) version: Option<u64>,
    pub(crate) files: &'a [LiveFile],
}

/// Bring the manifests to the table's loaded version after a merge: one that committed
/// (`since`: what it read first; its commit's partitions are the difference of the live
/// files) or one that changed nothing (`None`: a re-delivery, the retry of a merge that
/// crashed after its commit). Reads the version marker (one GET); when it is behind what
/// the merge's own commit explains, the partitions of the commits in between are rewritten
/// too (read from the log), or every manifest when the marker is missing or the gap is
/// longer than [`MAX_GAP`]. Returns what was written, what the manifests were behind (the
/// catalog follows it) and the marker write that records the version covered (one PUT),
/// for after the catalog (`None`: the marker is up to date).
pub(crate) async fn catch_up(
    storage: &Storage,
    table: DeltaTable,
    since: Option<Since<'_>>,
) -> Result<(ManifestReport, Behind, Option<Pending>)> {
    let Some(version) = table.version() else {
        return Ok((ManifestReport::default(), Behind::No, None));
    };
    let marker = read_marker(storage, &table).await?;
    // A table created empty (version 0, no file: how tributary creates tables) has no
    // manifest to describe: no marker there is a marker at 0.
    let empty_at_zero = match since {
        Some(s) => s.version == Some(0) && s.files.is_empty(),
        None => version == 0 && live_files(&table)?.is_empty(),
    };
    let recorded = marker.version.or(empty_at_zero.then_some(0));
    if recorded.is_some_and(|r| r >= version) {
        let report = ManifestReport {
            version,
            ..Default::default()
        };
        return Ok((report, Behind::No, None));
    }
    let (partitions, behind) = match (recorded, since) {
        (Some(r), Some(s)) if s.version.is_some_and(|b| r >= b) => (
            Some(touched_partitions(s.files, &live_files(&table)?)),
            Behind::No,
        ),
        (Some(r), _) if version - r <= MAX_GAP => {
            match changes_between(&table, r, version).await? {
                // Commits that changed no file and no metadata (transaction ids only).
                Some(gap) if gap == Gap::default() => (Some(BTreeSet::new()), Behind::No),
                Some(gap) => (Some(gap.partitions.clone()), Behind::Known(gap)),
                None => (None, Behind::Unknown),
            }
        }
        _ => (None, Behind::Unknown),
    };
    if behind != Behind::No {
        tracing::warn!(table = %table.table_url(), recorded = ?marker.version, version, partitions = partitions.as_ref().map(BTreeSet::len), "manifests behind the table (a crash or failure after a commit): rewriting them");
    }
    let (report, newest) = match &partitions {
        Some(p) if p.is_empty() => {
            let report = ManifestReport {
                version,
                ..Default::default()
            };
            (report, table)
        }
        p => sync(storage, table, p.as_ref()).await?,
    };
    // Every manifest was written from `report.version`; the partitions only cover the
    // commits up to the version the merge loaded (later ones are their writers' to cover).
    let covered = match partitions {
        None => report.version,
        Some(_) => version,
    };
    let pending = Pending {
        table: newest,
        version: covered,
        marker,
    };
    Ok((report, behind, Some(pending)))
}

/// The version marker a catch-up owes, written by [`Pending::record`] once the caller's
/// other post-commit steps (the catalog) are done too: a crash before it leaves the marker
/// behind, and the next merge then redoes the manifests and the catalog of those commits.
pub(crate) struct Pending {
    table: DeltaTable,
    version: u64,
    marker: Marker,
}

impl Pending {
    /// Record the version covered (never moving the marker back).
    pub(crate) async fn record(self, storage: &Storage) -> Result<()> {
        advance_marker(storage, &self.table, self.version, self.marker).await
    }
}

/// The manifests on storage: partition folder → sorted URIs (for tests and checks).
pub async fn read_manifests(
    storage: &Storage,
    table: &DeltaTable,
) -> Result<BTreeMap<String, Vec<String>>> {
    let mut out = BTreeMap::new();
    for (folder, url) in list_manifests(storage, table).await? {
        let body = storage.get(&url).await?;
        let text = String::from_utf8_lossy(&body);
        let mut lines: Vec<String> = text
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        lines.sort();
        out.insert(folder, lines);
    }
    Ok(out)
}

/// What the manifests should say for the table's loaded version: partition folder →
/// sorted URIs.
pub fn expected_manifests(table: &DeltaTable) -> Result<BTreeMap<String, Vec<String>>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in live_files(table)? {
        out.entry(f.partition.folder())
            .or_default()
            .push(file_uri(table, &f.path));
    }
    for v in out.values_mut() {
        v.sort();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(v: Option<&str>) -> Partition {
        Partition(vec![("r".into(), v.map(str::to_string))])
    }

    #[test]
    fn folders_escape_like_hive_and_name_nulls() {
        assert_eq!(hive_escape("New York"), "New York");
        assert_eq!(hive_escape("a/b=c%?#"), "a%2Fb%3Dc%25%3F%23");
        assert_eq!(part(Some("a/b")).folder(), "r=a%2Fb");
        assert_eq!(part(None).folder(), "r=__HIVE_DEFAULT_PARTITION__");
        assert_eq!(Partition::default().folder(), "");
    }

    /// Two writers syncing different versions: the one that read the marker before the
    /// other wrote it, with an older version, must not move it back.
    #[tokio::test]
    async fn the_version_marker_never_moves_back() {
        let dir = tempfile::tempdir().unwrap();
        let url = Url::from_directory_path(dir.path()).unwrap();
        let table = crate::delta::open(&url, &Default::default()).await.unwrap();
        let storage = Storage::new();
        assert_eq!(recorded_version(&storage, &table).await.unwrap(), None);
        let early = read_marker(&storage, &table).await.unwrap();
        let m = read_marker(&storage, &table).await.unwrap();
        advance_marker(&storage, &table, 5, m).await.unwrap();
        assert_eq!(recorded_version(&storage, &table).await.unwrap(), Some(5));
        // The slower writer read "no marker" and covered only version 3.
        advance_marker(&storage, &table, 3, early).await.unwrap();
        assert_eq!(recorded_version(&storage, &table).await.unwrap(), Some(5));
        let m = read_marker(&storage, &table).await.unwrap();
        advance_marker(&storage, &table, 7, m).await.unwrap();
        assert_eq!(recorded_version(&storage, &table).await.unwrap(), Some(7));
        // Not a manifest: never listed as one.
        assert!(list_manifests(&storage, &table).await.unwrap().is_empty());
    }

    #[test]
    fn touched_is_symmetric_difference() {
        let f = |p: &str, n: &str| LiveFile {
            partition: part(Some(p)),
            path: n.into(),
            size: 1,
            deletion_vector: false,
            deleted_rows: 0,
            rows: None,
        };
        let before = vec![f("A", "1"), f("B", "2")];
        let after = vec![f("A", "1"), f("C", "3")];
        let t = touched_partitions(&before, &after);
        assert_eq!(
            t.into_iter().map(|p| p.folder()).collect::<Vec<_>>(),
            vec!["r=B".to_string(), "r=C".to_string()]
        );
    }
}
