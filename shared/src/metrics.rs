//! CloudWatch Embedded Metric Format (EMF) lines: printed to stdout by the Lambda, they
//! become metrics (namespace `tributary`, dimension `Table`) that alarms can watch.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::engine::{FileStatus, ProcessReport};

pub const NAMESPACE: &str = "tributary";

/// One EMF document per table touched by the call.
pub fn emf(report: &ProcessReport, now_ms: i64) -> Vec<Value> {
    #[derive(Default)]
    struct M {
        merged: u64,
        failed: u64,
        inserted: u64,
        updated: u64,
        deleted: u64,
        stale: u64,
        blocked: u64,
        attempts: u64,
        duration_ms: u64,
    }
    let mut by: BTreeMap<String, M> = BTreeMap::new();
    for f in &report.files {
        match &f.status {
            FileStatus::Merged { table, .. } => by.entry(table.clone()).or_default().merged += 1,
            FileStatus::Failed { table, .. } => {
                by.entry(table.clone().unwrap_or_else(|| "unknown".into()))
                    .or_default()
                    .failed += 1
            }
            FileStatus::Ignored { .. } => {}
        }
    }
    for t in &report.tables {
        let m = by.entry(t.table.clone()).or_default();
        m.inserted += t.inserted as u64;
        m.updated += t.updated as u64;
        m.deleted += t.deleted as u64;
        m.stale += t.skipped_stale as u64;
        m.blocked += t.blocked_by_tombstone as u64;
        m.attempts += t.commit_attempts as u64;
        m.duration_ms += t.duration_ms;
    }
    let names: [(&str, &str); 9] = [
        ("FilesMerged", "Count"),
        ("FilesFailed", "Count"),
        ("RowsInserted", "Count"),
        ("RowsUpdated", "Count"),
        ("RowsDeleted", "Count"),
        ("RowsSkippedStale", "Count"),
        ("RowsBlockedByTombstone", "Count"),
        ("CommitAttempts", "Count"),
        ("MergeDuration", "Milliseconds"),
    ];
    by.into_iter()
        .map(|(table, m)| {
            json!({
                "_aws": {
                    "Timestamp": now_ms,
                    "CloudWatchMetrics": [{
                        "Namespace": NAMESPACE,
                        "Dimensions": [["Table"]],
                        "Metrics": names.iter().map(|(n, u)| json!({"Name": n, "Unit": u})).collect::<Vec<_>>(),
                    }]
                },
                "Table": table,
                "FilesMerged": m.merged,
                "FilesFailed": m.failed,
                "RowsInserted": m.inserted,
                "RowsUpdated": m.updated,
                "RowsDeleted": m.deleted,
                "RowsSkippedStale": m.stale,
                "RowsBlockedByTombstone": m.blocked,
                "CommitAttempts": m.attempts,
                "MergeDuration": m.duration_ms,
            })
        })
        .collect()
}

/// One EMF document per maintained (or failed) table.
pub fn maintenance_emf(summary: &crate::maintenance::Summary, now_ms: i64) -> Vec<Value> {
    let names: [(&str, &str); 7] = [
        ("MaintenanceFailed", "Count"),
        ("FilesBefore", "Count"),
        ("FilesAfter", "Count"),
        ("FilesCompacted", "Count"),
        ("FilesVacuumed", "Count"),
        ("TombstonesExpired", "Count"),
        ("MaintenanceDuration", "Milliseconds"),
    ];
    let doc = |table: &str, failed: u64, m: Option<&crate::maintenance::MaintenanceReport>| {
        json!({
            "_aws": {
                "Timestamp": now_ms,
                "CloudWatchMetrics": [{
                    "Namespace": NAMESPACE,
                    "Dimensions": [["Table"]],
                    "Metrics": names.iter().map(|(n, u)| json!({"Name": n, "Unit": u})).collect::<Vec<_>>(),
                }]
            },
            "Table": table,
            "MaintenanceFailed": failed,
            "FilesBefore": m.map(|m| m.files_before).unwrap_or_default(),
            "FilesAfter": m.map(|m| m.files_after).unwrap_or_default(),
            "FilesCompacted": m.map(|m| m.files_compacted).unwrap_or_default(),
            "FilesVacuumed": m.map(|m| m.files_vacuumed).unwrap_or_default(),
            "TombstonesExpired": m.map(|m| m.tombstones_expired).unwrap_or_default(),
            "MaintenanceDuration": m.map(|m| m.duration_ms).unwrap_or_default(),
        })
    };
    summary
        .maintained
        .iter()
        .map(|m| doc(&m.table, 0, Some(m)))
        .chain(summary.failed.iter().map(|(t, _)| doc(t, 1, None)))
        .collect()
}
