//! A group's cut: one source time that every table of a group has reached, and for each
//! table the Delta version at which it reached it, so a downstream job can read all of them
//! as of one source moment with plain time travel (docs/design.md, "Watermarks").
//!
//! The cut is the least of the tables' watermarks, where a table whose every file is
//! applied (nothing waits under its source) counts as caught up to the group's newest
//! watermark less the DMS batch interval: a source table without changes writes no files,
//! and would otherwise hold the group back for ever. A table with a file not applied holds
//! the cut at its watermark, and the cut names that file.
//!
//! Published by the maintenance run as a JSON object (`[[group]] cut`, default
//! `<the tables' folder>/_tributary_cuts/<group>.json`), and shown by `tributary status`.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::{Config, GroupConfig, TableConfig};
use crate::delta;
use crate::delta::watermark::{self, Held, Progress};
use crate::error::Result;
use crate::storage::{self, Storage};

/// A table's watermark and its Delta table (`None`: not created yet), by table name.
type State = HashMap<String, (Progress, Option<deltalake::DeltaTable>)>;

/// A group's table and its state (`None`: its watermark could not be computed).
type Member<'a> = (
    &'a TableConfig,
    Option<&'a (Progress, Option<deltalake::DeltaTable>)>,
);

/// Commits looked back over to find the version at which a table reached the cut.
const LOOK_BACK: u64 = 200;

/// One table at its group's cut.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TableCut {
    pub table: String,
    /// The Delta table to read (the current table; the history table of a table that
    /// keeps only its history).
    pub location: String,
    /// The Delta version to read the table at (`None`: the table does not exist yet, or the
    /// group has no cut).
    pub version: Option<u64>,
    /// The table's own watermark at that version: every change up to it is in; changes
    /// after the cut up to it may be too (files end at different times in each table).
    pub through: Option<DateTime<Utc>>,
    /// The table's watermark now.
    pub watermark: Option<DateTime<Utc>>,
    /// Every file under the table's source is applied.
    pub caught_up: bool,
    /// The file that holds the table's watermark.
    pub held_by: Option<Held>,
}

/// A group's cut.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GroupCut {
    pub group: String,
    /// Every change the group's tables' sources committed up to this time is in every
    /// table at its `version` (`None`: a table has no watermark yet).
    pub cut: Option<DateTime<Utc>>,
    pub computed_at: DateTime<Utc>,
    /// `computed_at − cut`, in seconds: what `WatermarkLagSeconds` reports for the group.
    pub lag_seconds: Option<f64>,
    /// The latest `through` less the cut: how far past the cut the tables may reach.
    pub consistent_within_seconds: Option<f64>,
    /// The table whose watermark is the cut, when a file holds it.
    pub held_by: Option<String>,
    /// Where the cut is published.
    pub published_at: String,
    pub tables: Vec<TableCut>,
}

/// The watermarks of every configured table (moved and recorded where they can move when
/// `advance`; read only otherwise) and the cut of every group.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Watermarks {
    pub tables: Vec<(String, Progress)>,
    pub groups: Vec<GroupCut>,
    /// (table, error) of tables whose watermark could not be computed.
    pub failed: Vec<(String, String)>,
}

/// The watermarks of `only` (every table when empty) and, with `groups`, the cuts of the
/// groups they are in (with every table of those groups).
pub async fn compute(
    config: &Config,
    storage: &Storage,
    options: &HashMap<String, String>,
    only: &[String],
    advance: bool,
    groups: bool,
    now: DateTime<Utc>,
) -> Watermarks {
    let wanted = |t: &str| {
        only.is_empty()
            || only.iter().any(|o| o == t)
            || (groups
                && config.groups.iter().any(|g| {
                    g.tables.iter().any(|x| x == t) && g.tables.iter().any(|x| only.contains(x))
                }))
    };
    let mut out = Watermarks::default();
    let mut state: State = HashMap::new();
    for cfg in config.tables.iter().filter(|t| wanted(&t.name)) {
        match table(cfg, storage, options, advance, now).await {
            Ok((p, t)) => {
                out.tables.push((cfg.name.clone(), p.clone()));
                state.insert(cfg.name.clone(), (p, t));
            }
            Err(e) => {
                tracing::error!(table = %cfg.name, error = %e, "watermark not computed");
                out.failed.push((cfg.name.clone(), e.to_string()));
            }
        }
    }
    for g in config
        .groups
        .iter()
        .filter(|g| groups && g.tables.iter().any(|t| wanted(t)))
    {
        match group(config, g, &state, now).await {
            Ok(c) => out.groups.push(c),
            Err(e) => out
                .failed
                .push((format!("group {}", g.name), e.to_string())),
        }
    }
    out
}

async fn table(
    cfg: &TableConfig,
    storage: &Storage,
    options: &HashMap<String, String>,
    advance: bool,
    now: DateTime<Utc>,
) -> Result<(Progress, Option<deltalake::DeltaTable>)> {
    let t = delta::open(cfg.state_table()?, options).await?;
    if !delta::exists(&t) {
        let (p, _) = watermark::progress(storage, cfg, &t, now).await?;
        return Ok((p, None));
    }
    if advance {
        let (t, p) = watermark::advance(storage, cfg, t, now).await?;
        Ok((p, Some(t)))
    } else {
        let (p, _) = watermark::progress(storage, cfg, &t, now).await?;
        Ok((p, Some(t)))
    }
}

async fn group(
    config: &Config,
    g: &GroupConfig,
    state: &State,
    now: DateTime<Utc>,
) -> Result<GroupCut> {
    let interval = chrono::Duration::from_std(g.batch_interval).unwrap_or_default();
    let members: Vec<Member<'_>> = g
        .tables
        .iter()
        .filter_map(|n| config.table(n))
        .map(|c| (c, state.get(&c.name)))
        .collect();
    let newest = members
        .iter()
        .filter_map(|(_, s)| s.and_then(|(p, _)| p.watermark))
        .max();
    // Each table's standing in the group: its watermark, or — every file applied — the
    // group's newest less the batch interval.
    let mut cut: Option<DateTime<Utc>> = None;
    let mut held_by = None;
    let mut complete = !members.is_empty();
    for (c, s) in &members {
        let Some((p, _)) = s else {
            complete = false;
            continue;
        };
        let standing = match (p.watermark, p.caught_up, newest) {
            (w, true, Some(n)) => Some(w.map_or(n - interval, |w| w.max(n - interval))),
            (w, _, _) => w,
        };
        let Some(standing) = standing else {
            complete = false;
            if p.held_by.is_some() {
                held_by = Some(c.name.clone());
            }
            continue;
        };
        if cut.is_none_or(|x| standing < x) {
            cut = Some(standing);
            held_by = p.held_by.as_ref().map(|_| c.name.clone());
        }
    }
    let cut = cut.filter(|_| complete);
    let mut tables = Vec::new();
    for (c, s) in &members {
        let location = c.state_table().map(storage::display).unwrap_or_default();
        let (p, t) = match s {
            Some((p, t)) => (Some(p), t.as_ref()),
            None => (None, None),
        };
        let (version, through) = match (cut, t) {
            (Some(cut), Some(t)) => reached(t, cut, p.and_then(|p| p.watermark)).await?,
            _ => (None, None),
        };
        tables.push(TableCut {
            table: c.name.clone(),
            location,
            version,
            through,
            watermark: p.and_then(|p| p.watermark),
            caught_up: p.is_some_and(|p| p.caught_up),
            held_by: p.and_then(|p| p.held_by.clone()),
        });
    }
    let consistent_within_seconds = cut.and_then(|c| {
        tables
            .iter()
            .filter_map(|t| t.through)
            .max()
            .map(|m| ((m - c).num_milliseconds().max(0)) as f64 / 1000.0)
    });
    Ok(GroupCut {
        group: g.name.clone(),
        cut,
        computed_at: now,
        lag_seconds: cut.map(|c| (now - c).num_milliseconds() as f64 / 1000.0),
        consistent_within_seconds,
        held_by: held_by.filter(|_| cut.is_some() || !complete),
        published_at: storage::display(&g.cut),
        tables,
    })
}

/// The version at which `t` reached `cut`: the oldest commit of its watermark at or after
/// the cut since the last one before it (the table holds the least past the cut there),
/// with the watermark it recorded. A table whose watermark is behind the cut (it is caught
/// up) is read at its current version.
async fn reached(
    t: &deltalake::DeltaTable,
    cut: DateTime<Utc>,
    watermark: Option<DateTime<Utc>>,
) -> Result<(Option<u64>, Option<DateTime<Utc>>)> {
    let current = (t.version(), watermark);
    if watermark.is_none_or(|w| w < cut) {
        return Ok(current);
    }
    let mut found = None;
    for (v, at) in watermark::history(t, LOOK_BACK).await? {
        if at < cut {
            break;
        }
        found = Some((Some(v), Some(at)));
    }
    Ok(found.unwrap_or(current))
}

/// Write each group's cut to its location (a JSON object).
pub async fn publish(storage: &Storage, config: &Config, w: &Watermarks) -> Vec<(String, String)> {
    let mut failed = Vec::new();
    for c in &w.groups {
        let Some(g) = config.groups.iter().find(|g| g.name == c.group) else {
            continue;
        };
        let body = match serde_json::to_vec_pretty(c) {
            Ok(b) => b,
            Err(e) => {
                failed.push((format!("group {}", c.group), e.to_string()));
                continue;
            }
        };
        if let Err(e) = storage.put(&g.cut, body.into()).await {
            tracing::error!(group = %c.group, error = %e, "cut not published");
            failed.push((format!("group {}", c.group), e.to_string()));
        }
    }
    failed
}
