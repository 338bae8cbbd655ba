//! Cross-table checks of locations: no file may belong to two tables, and no table may write
//! where another table (or its own trigger) lives.
//!
//! Each table has three locations: its `source` prefix, its Delta `target` and its
//! `tombstones` table. Two locations *overlap* when one is inside the other (or they are the
//! same). Allowed: a table's tombstones inside its own target under a hidden folder (name
//! starting with `_`, which readers and VACUUM skip). Everything else that overlaps is
//! refused: a shared tombstone table would let a delete in one table block inserts in the
//! other; a target inside a source would trigger merges from its own writes; a table inside
//! another table's folder would be deleted by that table's VACUUM.

use url::Url;

use super::TableConfig;

/// The folder form of a location: `scheme://host/path/`.
fn dir(u: &Url) -> (String, String, String) {
    let mut p = u.path().to_string();
    if !p.ends_with('/') {
        p.push('/');
    }
    (
        u.scheme().to_string(),
        u.host_str().unwrap_or("").to_string(),
        p,
    )
}

/// Whether one location is inside the other (or they are equal).
fn overlaps(a: &Url, b: &Url) -> bool {
    let (sa, ha, pa) = dir(a);
    let (sb, hb, pb) = dir(b);
    sa == sb && ha == hb && (pa.starts_with(&pb) || pb.starts_with(&pa))
}

/// A table's tombstones in a hidden folder of its own target.
fn hidden_inside(tombstones: &Url, target: &Url) -> bool {
    let (st, ht, pt) = dir(tombstones);
    let (sg, hg, pg) = dir(target);
    st == sg
        && ht == hg
        && pt
            .strip_prefix(&pg)
            .is_some_and(|rest| rest.starts_with('_') && !rest.is_empty())
}

fn named(t: &TableConfig) -> Vec<(&'static str, &Url)> {
    let mut v = vec![("source", &t.source)];
    v.extend(t.target.as_ref().map(|u| ("target", u)));
    v.extend(t.tombstones.as_ref().map(|u| ("tombstones", u)));
    if let Some(h) = &t.history {
        v.push(("history.target", &h.target));
    }
    v
}

/// No two tables may keep the same catalog entry.
fn catalog_entries(tables: &[TableConfig]) -> Result<(), String> {
    let mut seen: std::collections::HashMap<(String, String), &str> = Default::default();
    for t in tables {
        let Some(c) = &t.catalog else { continue };
        for (name, _) in c.entries(t.target.is_some(), t.history.is_some()) {
            if let Some(other) = seen.insert((c.database.clone(), name.clone()), &t.name) {
                return Err(format!(
                    "tables `{other}` and `{}` both keep the catalog entry {}.{name}; set `name` in [table.catalog]",
                    t.name, c.database
                ));
            }
        }
    }
    Ok(())
}

/// Check every pair of locations, within each table and across tables, and the catalog
/// entries.
pub(super) fn check(tables: &[TableConfig]) -> Result<(), String> {
    catalog_entries(tables)?;
    for t in tables {
        within(t)?;
    }
    for (i, a) in tables.iter().enumerate() {
        for b in &tables[i + 1..] {
            for (fa, la) in named(a) {
                for (fb, lb) in named(b) {
                    if overlaps(la, lb) {
                        return Err(format!(
                            "tables `{}` and `{}` overlap: `{fa}` of `{}` ({la}) and `{fb}` of `{}` ({lb}) are the same or one is inside the other; {}",
                            a.name, b.name, a.name, b.name, advice(fa, fb)
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

fn within(t: &TableConfig) -> Result<(), String> {
    let ctx = format!("table `{}`", t.name);
    if let Some(target) = &t.target {
        if overlaps(&t.source, target) {
            return Err(format!(
                "{ctx}: `target` ({target}) and `source` ({}) overlap: the merge would be triggered by its own writes; put the Delta table outside the DMS folder",
                t.source
            ));
        }
    }
    if let Some(tombstones) = &t.tombstones {
        if overlaps(&t.source, tombstones) {
            return Err(format!(
                "{ctx}: `tombstones` ({tombstones}) and `source` ({}) overlap; put the tombstone table outside the DMS folder",
                t.source
            ));
        }
    }
    if let Some(h) = &t.history {
        let mut others = vec![("source", &t.source)];
        others.extend(t.target.as_ref().map(|u| ("target", u)));
        others.extend(t.tombstones.as_ref().map(|u| ("tombstones", u)));
        for (what, l) in others {
            if overlaps(&h.target, l) {
                return Err(format!(
                    "{ctx}: `history.target` ({}) overlaps `{what}` ({l}); give the history table a folder of its own",
                    h.target
                ));
            }
        }
    }
    if let (Some(target), Some(tombstones)) = (&t.target, &t.tombstones) {
        if overlaps(target, tombstones) && !hidden_inside(tombstones, target) {
            return Err(format!(
                "{ctx}: `tombstones` ({tombstones}) overlaps `target` ({target}); use a folder of its own, or a hidden folder (starting with `_`) inside the target"
            ));
        }
    }
    Ok(())
}

fn advice(a: &str, b: &str) -> &'static str {
    match (a, b) {
        ("source", "source") => "each file must belong to exactly one table",
        ("tombstones", "tombstones") => {
            "a shared tombstone table lets a delete in one table block inserts of the same key in the other: give each table its own"
        }
        ("target", "target") => "each table needs its own folder (VACUUM of one would delete the other's files)",
        _ => "give each table its own locations",
    }
}
