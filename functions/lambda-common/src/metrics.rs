//! CloudWatch Embedded Metric Format (EMF) lines: printed to stdout by the Lambdas, they
//! become metrics that alarms can watch: per table (dimension `Table`) and, for alarms on
//! any table, without dimension. The namespace is `TRIBUTARY_METRICS_NAMESPACE` (the
//! template sets `tributary/<stack>`, so that two stacks stay apart), else `tributary`.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use tributary::maintenance::{MaintenanceReport, Summary};
use tributary::{FileStatus, ProcessReport, TableReport};

/// The namespace when `TRIBUTARY_METRICS_NAMESPACE` is not set.
pub const NAMESPACE: &str = "tributary";

/// The metrics' namespace.
pub fn namespace() -> String {
    std::env::var("TRIBUTARY_METRICS_NAMESPACE")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| NAMESPACE.to_string())
}

const COUNT: &str = "Count";
const MS: &str = "Milliseconds";

/// One EMF document: `(name, unit, value)` metrics for a table.
fn document(table: &str, now_ms: i64, metrics: &[(&str, &str, u64)]) -> Value {
    let mut doc = Map::new();
    doc.insert(
        "_aws".into(),
        json!({
            "Timestamp": now_ms,
            "CloudWatchMetrics": [{
                "Namespace": namespace(),
                // per table, and the same values without dimension (summed over tables)
                "Dimensions": [["Table"], []],
                "Metrics": metrics.iter().map(|(n, u, _)| json!({"Name": n, "Unit": u})).collect::<Vec<_>>(),
            }]
        }),
    );
    doc.insert("Table".into(), json!(table));
    for (name, _, value) in metrics {
        doc.insert((*name).into(), json!(value));
    }
    Value::Object(doc)
}

/// A `WatermarkLagSeconds` document (`now − watermark`, `tributary::watermark`): per table
/// (dimension `Table`), or per group (dimension `Group`, and without dimension: what the
/// template's `WatermarkLagAlarm` watches, its Maximum over the groups). A table's own lag
/// grows while its source has no changes; its group's cut counts it as caught up
/// (`tributary::cut`), so the alarm is on the groups.
fn lag_document(dimension: &str, name: &str, now_ms: i64, lag_seconds: f64) -> Value {
    let dimensions = if dimension == "Group" {
        json!([["Group"], []])
    } else {
        json!([[dimension]])
    };
    json!({
        "_aws": {
            "Timestamp": now_ms,
            "CloudWatchMetrics": [{
                "Namespace": namespace(),
                "Dimensions": dimensions,
                "Metrics": [{"Name": "WatermarkLagSeconds", "Unit": "Seconds"}],
            }]
        },
        dimension: name,
        "WatermarkLagSeconds": lag_seconds.max(0.0),
    })
}

/// The document counting one rejected configuration change (`ConfigRejected`, no
/// dimension): an uploaded configuration that does not load, while the previous one stays
/// in force.
pub fn config_rejected_emf(now_ms: i64) -> Value {
    json!({
        "_aws": {
            "Timestamp": now_ms,
            "CloudWatchMetrics": [{
                "Namespace": namespace(),
                "Dimensions": [[]],
                "Metrics": [{"Name": "ConfigRejected", "Unit": COUNT}],
            }]
        },
        "ConfigRejected": 1,
    })
}

/// A table's merge metrics, summed over a merge call's files and merges.
#[derive(Default)]
struct TableMetrics {
    merged: u64,
    failed: u64,
    inserted: u64,
    updated: u64,
    deleted: u64,
    stale: u64,
    blocked: u64,
    attempts: u64,
    duration_ms: u64,
    versions: u64,
    late_keys: u64,
    catalog_calls: u64,
    catalog_failed: u64,
    widened: u64,
}

impl TableMetrics {
    /// The metrics of every table a merge call touched (files of no table: `unknown`).
    fn by_table(report: &ProcessReport) -> BTreeMap<String, TableMetrics> {
        let mut by: BTreeMap<String, TableMetrics> = BTreeMap::new();
        for f in &report.files {
            match &f.status {
                FileStatus::Merged { table, .. } => {
                    by.entry(table.clone()).or_default().merged += 1
                }
                FileStatus::Failed { table, .. } => {
                    by.entry(table.clone().unwrap_or_else(|| "unknown".into()))
                        .or_default()
                        .failed += 1
                }
                FileStatus::Ignored { .. } => {}
            }
        }
        for t in &report.tables {
            by.entry(t.table.clone()).or_default().add(t);
        }
        by
    }

    /// Adds what the merge of table report `t` did.
    fn add(&mut self, t: &TableReport) {
        self.inserted += t.inserted as u64;
        self.updated += t.updated as u64;
        self.deleted += t.deleted as u64;
        self.stale += t.skipped_stale as u64;
        self.blocked += t.blocked_by_tombstone as u64;
        self.attempts += t.commit_attempts as u64;
        self.duration_ms += t.duration_ms;
        self.widened += t.widened.len() as u64;
        if let Some(h) = &t.history {
            self.widened += h.widened.len() as u64;
            self.versions += h.versions_written as u64;
            self.late_keys += h.late_keys as u64;
        }
        if let Some(c) = &t.catalog {
            self.catalog_calls += c.calls;
            self.catalog_failed += u64::from(c.error.is_some());
        }
    }

    /// The EMF document of `table`'s metrics.
    fn document(&self, table: &str, now_ms: i64) -> Value {
        document(
            table,
            now_ms,
            &[
                ("FilesMerged", COUNT, self.merged),
                ("FilesFailed", COUNT, self.failed),
                ("RowsInserted", COUNT, self.inserted),
                ("RowsUpdated", COUNT, self.updated),
                ("RowsDeleted", COUNT, self.deleted),
                ("RowsSkippedStale", COUNT, self.stale),
                ("RowsBlockedByTombstone", COUNT, self.blocked),
                ("CommitAttempts", COUNT, self.attempts),
                ("MergeDuration", MS, self.duration_ms),
                ("HistoryVersionsWritten", COUNT, self.versions),
                ("HistoryLateKeys", COUNT, self.late_keys),
                ("CatalogCalls", COUNT, self.catalog_calls),
                ("CatalogSyncFailed", COUNT, self.catalog_failed),
                ("ColumnsWidened", COUNT, self.widened),
            ],
        )
    }
}

/// One EMF document per table touched by a merge call.
pub fn emf(report: &ProcessReport, now_ms: i64) -> Vec<Value> {
    let now = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(now_ms).unwrap_or_default();
    let lags: Vec<Value> = report
        .tables
        .iter()
        .filter_map(|t| {
            let lag = t.watermark.as_ref()?.lag_seconds(now)?;
            Some(lag_document("Table", &t.table, now_ms, lag))
        })
        .collect();
    TableMetrics::by_table(report)
        .into_iter()
        .map(|(table, m)| m.document(&table, now_ms))
        .chain(lags)
        .collect()
}

/// One EMF document per maintained (or failed) table.
pub fn maintenance_emf(summary: &Summary, now_ms: i64) -> Vec<Value> {
    let doc = |table: &str, failed: u64, m: Option<&MaintenanceReport>| {
        let v = |f: fn(&MaintenanceReport) -> u64| m.map(f).unwrap_or_default();
        document(
            table,
            now_ms,
            &[
                ("MaintenanceFailed", COUNT, failed),
                ("FilesBefore", COUNT, v(|m| m.files_before as u64)),
                ("FilesAfter", COUNT, v(|m| m.files_after as u64)),
                ("FilesCompacted", COUNT, v(|m| m.files_compacted)),
                ("FilesVacuumed", COUNT, v(|m| m.files_vacuumed as u64)),
                (
                    "TombstonesExpired",
                    COUNT,
                    v(|m| m.tombstones_expired as u64),
                ),
                ("MaintenanceDuration", MS, v(|m| m.duration_ms)),
            ],
        )
    };
    summary
        .maintained
        .iter()
        .map(|m| doc(&m.table, 0, Some(m)))
        .chain(summary.failed.iter().map(|(t, _)| doc(t, 1, None)))
        .chain(summary.catalog.iter().map(|(t, c)| {
            document(
                t,
                now_ms,
                &[
                    ("CatalogCalls", COUNT, c.calls),
                    ("CatalogSyncFailed", COUNT, u64::from(c.error.is_some())),
                ],
            )
        }))
        .chain(watermark_lags(summary, now_ms))
        .collect()
}

/// `WatermarkLagSeconds` of every table and group the run computed a watermark for.
fn watermark_lags(summary: &Summary, now_ms: i64) -> Vec<Value> {
    let Some(w) = &summary.watermarks else {
        return Vec::new();
    };
    let now = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(now_ms).unwrap_or_default();
    let tables = w.tables.iter().filter_map(|(t, p)| {
        p.lag_seconds(now)
            .map(|lag| lag_document("Table", t, now_ms, lag))
    });
    let groups = w.groups.iter().filter_map(|g| {
        g.cut.map(|c| {
            lag_document(
                "Group",
                &g.group,
                now_ms,
                (now - c).num_milliseconds() as f64 / 1000.0,
            )
        })
    });
    tables.chain(groups).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermark_lag_is_per_table_and_per_group_and_the_alarm_watches_the_groups() {
        let t = lag_document("Table", "orders", 7, 12.5);
        assert_eq!(t["WatermarkLagSeconds"], 12.5);
        assert_eq!(t["Table"], "orders");
        assert_eq!(
            t["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["Table"]])
        );
        let g = lag_document("Group", "dms", 7, 90.0);
        assert_eq!(g["Group"], "dms");
        // without dimension: the Maximum over groups, what WatermarkLagAlarm watches
        assert_eq!(
            g["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["Group"], []])
        );
        assert_eq!(
            g["_aws"]["CloudWatchMetrics"][0]["Metrics"],
            json!([{"Name": "WatermarkLagSeconds", "Unit": "Seconds"}])
        );
        let template =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml"))
                .expect("template");
        let alarm = template
            .split("  WatermarkLagAlarm:")
            .nth(1)
            .and_then(|s| s.split("\n\n").next())
            .expect("the template has WatermarkLagAlarm");
        assert!(alarm.contains("MetricName: WatermarkLagSeconds"), "{alarm}");
        assert!(alarm.contains("Statistic: Maximum"), "{alarm}");
        assert!(
            !alarm.contains("Dimensions"),
            "the alarm watches the metric without dimension: {alarm}"
        );
        assert!(
            alarm.contains("Threshold: !Ref WatermarkLagAlarmSeconds"),
            "{alarm}"
        );
        // One datapoint per maintenance run: between two runs the state must stay what the
        // last one reported (notBreaching would go to OK while the cut is still held), and a
        // run reporting the cut caught up must end the ALARM at once, not a period later.
        assert!(alarm.contains("TreatMissingData: ignore"), "{alarm}");
        assert!(alarm.contains("Period: 60\n"), "{alarm}");
    }

    #[test]
    fn documents_declare_every_metric_they_carry() {
        let d = document("t", 7, &[("A", COUNT, 1), ("B", MS, 2)]);
        assert_eq!(d["Table"], "t");
        assert_eq!(d["A"], 1);
        assert_eq!(d["B"], 2);
        let declared = &d["_aws"]["CloudWatchMetrics"][0]["Metrics"];
        assert_eq!(declared[1], json!({"Name": "B", "Unit": "Milliseconds"}));
        assert_eq!(d["_aws"]["Timestamp"], 7);
        // per table, and without dimension (what an alarm over all tables watches)
        assert_eq!(
            d["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["Table"], []])
        );
    }
}
