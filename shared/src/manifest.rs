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

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use deltalake::DeltaTable;
use url::Url;

use crate::error::{Error, Result};
use crate::storage::{self, Storage};

/// Folder of the manifests inside the table.
pub const MANIFEST_DIR: &str = "_symlink_format_manifest";
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

    #[test]
    fn touched_is_symmetric_difference() {
        let f = |p: &str, n: &str| LiveFile {
            partition: part(Some(p)),
            path: n.into(),
            size: 1,
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
