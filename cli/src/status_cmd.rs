//! `tributary status`: each table's state, for people (default) or scripts (`--json`).

use anyhow::Result;
use chrono::{DateTime, Utc};
use tributary::catalog::EntryStatus;
use tributary::cut::GroupCut;
use tributary::status::{table_status, Drift, Freshness, ManifestStatus, TableStatus};
use tributary::watermark::Progress;
use tributary::Engine;

pub(crate) async fn run(config: &str, tables: &[String], json: bool) -> Result<()> {
    let engine = Engine::from_config_location(config).await?;
    engine.config().require_tables(tables, "status")?;
    let now = Utc::now();
    let cuts = tributary::cut::compute(
        engine.config(),
        engine.storage(),
        engine.storage_options(),
        tables,
        false,
        true,
        now,
    )
    .await;
    let mut all = Vec::new();
    for cfg in engine
        .config()
        .tables
        .iter()
        .filter(|c| tables.is_empty() || tables.contains(&c.name))
    {
        let catalog = cfg.catalog.as_ref().map(|_| engine.catalog());
        let st = table_status(
            cfg,
            engine.storage_options(),
            engine.storage(),
            catalog,
            now,
        )
        .await?;
        let mut st = st;
        st.cuts = cuts
            .groups
            .iter()
            .filter(|g| g.tables.iter().any(|t| t.table == cfg.name))
            .cloned()
            .collect();
        if !json {
            print(&st, now);
        }
        all.push(st);
    }
    if json {
        out!("{}", serde_json::to_string_pretty(&all)?);
    }
    Ok(())
}

/// `1234567` → `1,234,567`.
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn ago(seconds: f64) -> String {
    let s = seconds.abs();
    let text = if s < 120.0 {
        format!("{s:.1} s")
    } else if s < 7200.0 {
        format!("{:.1} min", s / 60.0)
    } else if s < 172_800.0 {
        format!("{:.1} h", s / 3600.0)
    } else {
        format!("{:.1} days", s / 86_400.0)
    };
    if seconds < 0.0 {
        format!("{text} ahead of this clock")
    } else {
        format!("{text} behind")
    }
}

/// Prints a table's state for people: one labelled line per aspect.
fn print(st: &TableStatus, now: DateTime<Utc>) {
    out!("{}  {}", st.table, st.target);
    if !st.exists {
        out!("  not created yet (no file merged)");
        return;
    }
    print_version_and_size(st, now);
    out!("  freshness   {}", freshness_text(&st.freshness));
    if let Some(w) = &st.watermark {
        out!("  watermark   {}", watermark_text(w, now));
    }
    for g in &st.cuts {
        out!("  group {}  {}", g.group, cut_text(g, &st.table));
    }
    out!("  tombstones  {}", tombstones_text(st));
    out!("  manifests   {}", manifests_text(st.manifests.as_ref()));
    out!(
        "  change feed {}",
        if st.change_data_feed { "on" } else { "off" }
    );
    if let Some(t) = st.adopted {
        out!(
            "  adopted     {} (created by another writer; its rows then rank below every change)",
            t.to_rfc3339()
        );
    }
    if let Some(d) = &st.drift {
        print_drift(d);
    }
    if let Some(entries) = &st.catalog {
        for e in entries {
            out!("  catalog     {}", catalog_text(e));
        }
    }
}

/// Prints the table's version (and last commit) and its rows, files, bytes and partitions.
fn print_version_and_size(st: &TableStatus, now: DateTime<Utc>) {
    let commit = st
        .last_commit
        .map(|t| {
            format!(
                ", last commit {} ({})",
                t.format("%Y-%m-%d %H:%M:%S UTC"),
                ago((now - t).num_milliseconds() as f64 / 1000.0).replace("behind", "ago")
            )
        })
        .unwrap_or_default();
    out!(
        "  version     {}{commit}",
        st.version.map(|v| v.to_string()).unwrap_or_default()
    );
    out!(
        "  {:<12}{} in {} files, {} ({} small), {} partition(s)",
        if st.history_only { "versions" } else { "rows" },
        thousands(st.rows),
        thousands(st.files),
        bytes(st.bytes),
        thousands(st.small_files),
        st.partitions
    );
    if st.files_with_vectors > 0 {
        out!(
            "  {:<12}{} file(s) with a deletion vector, deleting {} row(s) (maintenance rewrites those past 5 %)",
            "vectors",
            thousands(st.files_with_vectors),
            thousands(st.rows_deleted_by_vectors)
        );
    }
}

/// The newest change applied, the file it came from and how far behind it is (`-` when
/// nothing is known).
fn freshness_text(f: &Freshness) -> String {
    if f.full_load_only {
        return "full load only (no CDC change applied yet)".to_string();
    }
    let mut parts = Vec::new();
    if let Some(s) = &f.newest_sequence {
        parts.push(format!("newest change {s}"));
    }
    if let Some(file) = &f.newest_file {
        parts.push(format!("from {file}"));
    }
    if let Some(b) = f.behind_seconds {
        parts.push(ago(b));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// A point in time and how far behind it is, or `none yet`.
fn point_text(at: Option<DateTime<Utc>>, lag_seconds: Option<f64>) -> String {
    match (at, lag_seconds) {
        (Some(t), Some(lag)) => format!("{} ({})", t.to_rfc3339(), ago(lag)),
        _ => "none yet".to_string(),
    }
}

/// The table's watermark and what holds it.
fn watermark_text(w: &Progress, now: DateTime<Utc>) -> String {
    let at = point_text(w.watermark, w.lag_seconds(now));
    let state = match &w.held_by {
        Some(h) => format!(
            "held by {} (written {}): {}",
            h.file,
            h.written.to_rfc3339(),
            h.reason
        ),
        None if w.caught_up => "every file under the source is applied".to_string(),
        None => "-".to_string(),
    };
    format!("{at}; {state}")
}

/// Group `g`'s cut, the version of `table` to read at it, and the table holding the cut.
fn cut_text(g: &GroupCut, table: &str) -> String {
    let at = point_text(g.cut, g.lag_seconds);
    let version = g
        .tables
        .iter()
        .find(|t| t.table == table)
        .and_then(|t| t.version)
        .map_or_else(
            || "-".to_string(),
            |v| format!("read this table at version {v}"),
        );
    let held = g
        .held_by
        .as_ref()
        .map(|t| format!("; held by table {t}"))
        .unwrap_or_default();
    format!("cut {at}; {version}{held}")
}

/// The delete tombstones the table keeps.
fn tombstones_text(st: &TableStatus) -> String {
    if st.history_only {
        "none kept (history table only: its change log keeps the deletes)".to_string()
    } else {
        format!(
            "{} recorded (a re-delivered delete counts again)",
            thousands(st.tombstones)
        )
    }
}

/// Whether the symlink manifests are kept and list exactly the live files.
fn manifests_text(m: Option<&ManifestStatus>) -> String {
    match m {
        None => "off".to_string(),
        Some(m) if m.exact => "exact (list the live files)".to_string(),
        Some(m) => format!(
            "DIFFER in {} partition(s): {} (the next merge of the table or maintenance rewrites them)",
            m.differing_partitions.len(),
            m.differing_partitions.join(", ")
        ),
    }
}

/// Prints the columns the recent source files lack and those added since the table was
/// created.
fn print_drift(d: &Drift) {
    let missing = if d.missing_from_recent_files.is_empty() {
        "none".to_string()
    } else {
        d.missing_from_recent_files.join(", ")
    };
    out!(
        "  drift       columns the last {} source file(s) lack: {missing} (dropped or renamed at the source; see rename_columns)",
        d.files.len()
    );
    match &d.added_since_created {
        Some(a) if !a.is_empty() => {
            out!(
                "              added since the table was created: {}",
                a.join(", ")
            )
        }
        _ => {}
    }
}

/// A catalog entry's state and, for partitioned tables, how its partitions compare.
fn catalog_text(e: &EntryStatus) -> String {
    let parts = e
        .partitions
        .as_ref()
        .map(|p| {
            format!(
                ", partitions {} in the catalog / {} in the table, {} differing",
                p.in_catalog, p.in_table, p.differing
            )
        })
        .unwrap_or_default();
    format!("{}: {}{parts}", e.entry, e.state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * 1024 * 1024 + 512 * 1024), "3.5 MB");
        assert_eq!(ago(29.5), "29.5 s behind");
        assert_eq!(ago(7200.0), "2.0 h behind");
    }
}
