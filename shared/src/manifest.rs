//! Symlink manifests (`_symlink_format_manifest/<partition>/manifest`) for Athena and
//! Redshift Spectrum: one absolute data-file URI per line, exactly the live files of a
//! committed version.
//!
//! Written incrementally after each merge (only the partitions the commit touched) and in
//! full by maintenance (which also deletes manifests of partitions that have no files left).
//! Writers race: after writing, the writer reloads the table and, if a newer version exists,
//! rewrites its partitions from it, so the last write of every partition reflects the
//! newest version.

use std::collections::{BTreeMap, BTreeSet};

use arrow::array::{Array, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int64Type};
use bytes::Bytes;
use deltalake::DeltaTable;
use object_store::ObjectStoreExt;
use url::Url;

use crate::error::{Error, Result};
use crate::storage::{self, Storage};

/// Folder of the manifests inside the table.
pub const MANIFEST_DIR: &str = "_symlink_format_manifest";

/// A live data file of a table version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LiveFile {
    /// Partition folder (`col=value/…`, empty when unpartitioned).
    pub partition: String,
    /// Path as in the Delta log (relative to the table, or absolute).
    pub path: String,
    pub size: i64,
}

/// Outcome of a manifest sync.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ManifestReport {
    /// Version the manifests reflect.
    pub version: u64,
    pub written: usize,
    pub deleted: usize,
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

/// The live files of the table's loaded version, with their partition folders.
pub fn live_files(table: &DeltaTable) -> Result<Vec<LiveFile>> {
    let label = table.table_url().to_string();
    let snapshot = table.snapshot().map_err(|e| Error::delta(&label, e))?;
    let parts: Vec<String> = snapshot
        .metadata()
        .partition_columns()
        .iter()
        .map(|c| c.to_string())
        .collect();
    let batch = snapshot
        .add_actions_table(true)
        .map_err(|e| Error::delta(&label, e))?;
    let col = |name: &str| {
        batch
            .column_by_name(name)
            .cloned()
            .ok_or_else(|| Error::Internal(format!("add actions of {label} lack column {name}")))
    };
    let paths = cast(&col("path")?, &DataType::Utf8).map_err(|e| Error::Internal(e.to_string()))?;
    let paths = paths.as_string::<i32>();
    let sizes =
        cast(&col("size_bytes")?, &DataType::Int64).map_err(|e| Error::Internal(e.to_string()))?;
    let sizes = sizes.as_primitive::<Int64Type>();
    let mut part_values = Vec::with_capacity(parts.len());
    for p in &parts {
        let a = cast(&col(&format!("partition.{p}"))?, &DataType::Utf8)
            .map_err(|e| Error::Internal(e.to_string()))?;
        part_values.push(a);
    }
    let mut out = Vec::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        let partition = parts
            .iter()
            .zip(&part_values)
            .map(|(p, a)| {
                let a = a.as_string::<i32>();
                let v = if a.is_null(i) {
                    "__HIVE_DEFAULT_PARTITION__".to_string()
                } else {
                    hive_escape(a.value(i))
                };
                format!("{}={}", hive_escape(p), v)
            })
            .collect::<Vec<_>>()
            .join("/");
        out.push(LiveFile {
            partition,
            path: paths.value(i).to_string(),
            size: sizes.value(i),
        });
    }
    out.sort();
    Ok(out)
}

/// Partitions whose file sets differ between two versions.
pub fn touched_partitions(before: &[LiveFile], after: &[LiveFile]) -> BTreeSet<String> {
    let a: BTreeSet<&LiveFile> = before.iter().collect();
    let b: BTreeSet<&LiveFile> = after.iter().collect();
    a.symmetric_difference(&b)
        .map(|f| f.partition.clone())
        .collect()
}

fn table_dir(table: &DeltaTable) -> Url {
    let mut u = table.table_url().clone();
    if !u.path().ends_with('/') {
        let p = format!("{}/", u.path());
        u.set_path(&p);
    }
    u
}

/// Absolute URI of a data file.
pub fn file_uri(table: &DeltaTable, path: &str) -> String {
    if path.contains("://") {
        return path.to_string();
    }
    format!("{}{}", table_dir(table), path.trim_start_matches('/'))
}

fn manifest_url(table: &DeltaTable, partition: &str) -> Url {
    let mut u = table_dir(table);
    let p = if partition.is_empty() {
        format!("{}{MANIFEST_DIR}/manifest", u.path())
    } else {
        format!("{}{MANIFEST_DIR}/{partition}/manifest", u.path())
    };
    u.set_path(&p);
    u
}

/// Write (or delete, when a partition has no files) the manifests of `partitions`
/// (`None` = every partition, and delete manifests of partitions that are gone) from the
/// table's loaded version.
async fn write_from(
    storage: &Storage,
    table: &DeltaTable,
    partitions: Option<&BTreeSet<String>>,
) -> Result<ManifestReport> {
    let files = live_files(table)?;
    let mut by_part: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for f in &files {
        by_part
            .entry(f.partition.as_str())
            .or_default()
            .push(file_uri(table, &f.path));
    }
    let mut report = ManifestReport {
        version: table.version().unwrap_or_default(),
        ..Default::default()
    };
    let wanted: BTreeSet<String> = match partitions {
        Some(p) => p.clone(),
        None => by_part.keys().map(|k| k.to_string()).collect(),
    };
    for part in &wanted {
        let url = manifest_url(table, part);
        match by_part.get(part.as_str()) {
            Some(uris) => {
                let mut body = uris.join("\n");
                body.push('\n');
                storage.put(&url, Bytes::from(body)).await?;
                report.written += 1;
            }
            None => {
                if delete_if_exists(storage, &url).await? {
                    report.deleted += 1;
                }
            }
        }
    }
    if partitions.is_none() {
        // Remove manifests of partitions that no longer have files (or were never ours).
        for (part, url) in list_manifests(storage, table).await? {
            if !by_part.contains_key(part.as_str()) && delete_if_exists(storage, &url).await? {
                report.deleted += 1;
            }
        }
    }
    Ok(report)
}

/// Existing manifests: (partition folder, URL), none when the folder does not exist.
async fn list_manifests(storage: &Storage, table: &DeltaTable) -> Result<Vec<(String, Url)>> {
    let mut prefix = table_dir(table);
    let p = format!("{}{MANIFEST_DIR}/", prefix.path());
    prefix.set_path(&p);
    let listed = match storage.list(&prefix).await {
        Ok(v) => v,
        Err(Error::Storage {
            source: deltalake::ObjectStoreError::NotFound { .. },
            ..
        }) => vec![],
        Err(e) => return Err(e),
    };
    Ok(listed
        .into_iter()
        .map(|url| {
            let rel = url.path().strip_prefix(prefix.path()).unwrap_or("");
            let part = rel
                .strip_suffix("manifest")
                .unwrap_or(rel)
                .trim_end_matches('/');
            (storage::percent_decode(part), url)
        })
        .collect())
}

async fn delete_if_exists(storage: &Storage, url: &Url) -> Result<bool> {
    let store = storage.store(url)?;
    let path = storage::object_path(url)?;
    match store.delete(&path).await {
        Ok(()) => Ok(true),
        Err(deltalake::ObjectStoreError::NotFound { .. }) => Ok(false),
        Err(e) => Err(Error::storage(storage::display(url), e)),
    }
}

/// Bring manifests up to date for `partitions` (`None` = all, with stale deletion), then
/// re-check: while the table has moved past the version written, rewrite from the newest.
pub async fn sync(
    storage: &Storage,
    mut table: DeltaTable,
    partitions: Option<&BTreeSet<String>>,
) -> Result<ManifestReport> {
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
            return Ok(total);
        }
    }
    Err(Error::Internal(format!(
        "{label}: the table kept changing while writing manifests; they will be rewritten by the next merge or maintenance run"
    )))
}

/// Read a manifest's URIs (for tests and checks).
pub async fn read_manifests(
    storage: &Storage,
    table: &DeltaTable,
) -> Result<BTreeMap<String, Vec<String>>> {
    let mut out = BTreeMap::new();
    for (part, url) in list_manifests(storage, table).await? {
        let body = storage.get(&url).await?;
        let text = String::from_utf8_lossy(&body);
        let mut lines: Vec<String> = text
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        lines.sort();
        out.insert(part, lines);
    }
    Ok(out)
}

/// What the manifests should say for the table's loaded version.
pub fn expected_manifests(table: &DeltaTable) -> Result<BTreeMap<String, Vec<String>>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in live_files(table)? {
        out.entry(f.partition.clone())
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

    #[test]
    fn escapes_like_hive() {
        assert_eq!(hive_escape("New York"), "New York");
        assert_eq!(hive_escape("a/b=c"), "a%2Fb%3Dc");
    }

    #[test]
    fn touched_is_symmetric_difference() {
        let f = |p: &str, n: &str| LiveFile {
            partition: p.into(),
            path: n.into(),
            size: 1,
        };
        let before = vec![f("r=A", "1"), f("r=B", "2")];
        let after = vec![f("r=A", "1"), f("r=C", "3")];
        let t = touched_partitions(&before, &after);
        assert_eq!(
            t.into_iter().collect::<Vec<_>>(),
            vec!["r=B".to_string(), "r=C".to_string()]
        );
    }
}
