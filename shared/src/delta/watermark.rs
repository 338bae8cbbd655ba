//! A table's watermark: the time T such that every CDC file of the table under its source
//! whose DMS name time is ≤ T has been applied (full-load files count before every CDC
//! file). It advances only over a gap-free prefix of the source's files: a file not applied
//! yet (in flight, failed, in the dead-letter queue) holds it back, and [`Progress`] names
//! that file.
//!
//! ## Where it is kept
//!
//! In the table, as the Delta application transaction `tributary.watermark`: any reader and
//! any instance sees the same value, and a checkpoint keeps it. Its version is the
//! watermark's microseconds (DMS names carry at most six decimals) shifted left by 8 bits, with the source's folder layout in the
//! low 8 ([`Layout`]): larger is later, and the layout tells where to list from. Which files
//! are applied is what the merges already record (`applied`: one transaction per CDC file,
//! one per full-load file).
//!
//! ## How it advances
//!
//! After every commit of the table (`pipeline::publish`) and in every maintenance run:
//! list the source *from the watermark on* (S3 `start-after`, or one listing per date
//! folder where the folders do not sort by time), then walk the CDC files after the
//! watermark in time order, looking each up in the table's records, until the first one
//! not applied. When that moves the watermark, one commit of the transaction alone records
//! it. Two writers that both move it conflict on the transaction id (delta-rs's
//! `ConcurrentTransaction`), and the later one computes again on the newer table: the value
//! never goes backwards, and every value was true of the table it was committed on. A crash
//! before that commit leaves the watermark behind, never ahead: the next merge or
//! maintenance run moves it.
//!
//! ## What it cannot know
//!
//! - A file that never reached S3 (a DMS task stopped) does not hold the watermark: the
//!   watermark says what the source prefix holds, and the freshness alarm (`now − T`) is what
//!   tells a stopped task.
//! - A source with no changes writes no files, so its watermark stands still; a group's cut
//!   (`cut`) counts a table with every file applied as caught up with the group.
//! - A file whose record expired (written before the records' horizon, `applied`) counts
//!   as applied: it was merged, or a merge refuses it as too late. A table that recorded no
//!   files before it was upgraded holds its watermark at the first file merged before then,
//!   until that file passes the horizon.

use chrono::{DateTime, Datelike, Duration, Timelike, Utc};
use deltalake::kernel::Transaction;
use deltalake::DeltaTable;
use url::Url;

use crate::config::TableConfig;
use crate::delta;
use crate::delta::retry::Retry;
use crate::error::{Error, Result};
use crate::model::FileKind;
pub use crate::report::{Held, Progress};
use crate::source::order::dms_file_time;
use crate::source::{self, classify, FileClass};
use crate::storage::{self, Listed, Storage};

/// The application-transaction id of the watermark.
pub(crate) const APP_ID: &str = crate::model::WATERMARK_APP_ID;

/// Keys per page of an S3 listing (what [`Progress::list_requests`] counts by).
const PAGE: usize = 1000;

/// How DMS lays out a table's CDC files (`DatePartitionEnabled`, `DatePartitionSequence`,
/// `DatePartitionDelimiter`), as far as listing from a time needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Not known: the whole source is listed.
    Unknown,
    /// Files directly under the table's folder (names sort by time).
    Flat,
    /// Files under date folders.
    Dated(Sequence, Delimiter),
}

/// `DatePartitionSequence`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sequence {
    Yyyymmdd,
    Yyyymmddhh,
    Yyyymm,
    Mmyyyydd,
    Ddmmyyyy,
}

/// `DatePartitionDelimiter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delimiter {
    Slash,
    Underscore,
    Dash,
    None,
}

const SEQUENCES: [Sequence; 5] = [
    Sequence::Yyyymmdd,
    Sequence::Yyyymmddhh,
    Sequence::Yyyymm,
    Sequence::Mmyyyydd,
    Sequence::Ddmmyyyy,
];
const DELIMITERS: [Delimiter; 4] = [
    Delimiter::Slash,
    Delimiter::Underscore,
    Delimiter::Dash,
    Delimiter::None,
];

impl Layout {
    fn code(self) -> i64 {
        match self {
            Layout::Unknown => 0,
            Layout::Flat => 1,
            Layout::Dated(s, d) => {
                let s = SEQUENCES.iter().position(|x| *x == s).unwrap_or(0) as i64;
                let d = DELIMITERS.iter().position(|x| *x == d).unwrap_or(0) as i64;
                2 + s * 4 + d
            }
        }
    }

    fn of_code(c: i64) -> Layout {
        match c {
            1 => Layout::Flat,
            2..=21 => {
                let i = (c - 2) as usize;
                Layout::Dated(SEQUENCES[i / 4], DELIMITERS[i % 4])
            }
            _ => Layout::Unknown,
        }
    }

    /// The layout of a file at `rel` (its path under the table's source), when its folders
    /// are the date of its DMS name in one of DMS's sequences.
    pub fn detect(rel: &str) -> Layout {
        let (dir, name) = match rel.rsplit_once('/') {
            Some((d, n)) => (d, n),
            None => ("", rel),
        };
        let Some(t) = dms_file_time(name) else {
            return Layout::Unknown;
        };
        if dir.is_empty() {
            return Layout::Flat;
        }
        for s in SEQUENCES {
            for d in DELIMITERS {
                if folder(s, d, t) == dir {
                    return Layout::Dated(s, d);
                }
            }
        }
        Layout::Unknown
    }
}

/// The date folder of time `t` (UTC).
fn folder(s: Sequence, d: Delimiter, t: DateTime<Utc>) -> String {
    let (y, m, day, h) = (
        format!("{:04}", t.year()),
        format!("{:02}", t.month()),
        format!("{:02}", t.day()),
        format!("{:02}", t.hour()),
    );
    let parts: Vec<&str> = match s {
        Sequence::Yyyymmdd => vec![&y, &m, &day],
        Sequence::Yyyymmddhh => vec![&y, &m, &day, &h],
        Sequence::Yyyymm => vec![&y, &m],
        Sequence::Mmyyyydd => vec![&m, &y, &day],
        Sequence::Ddmmyyyy => vec![&day, &m, &y],
    };
    let sep = match d {
        Delimiter::Slash => "/",
        Delimiter::Underscore => "_",
        Delimiter::Dash => "-",
        Delimiter::None => "",
    };
    parts.join(sep)
}

/// The watermark as recorded in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) at: DateTime<Utc>,
    pub(crate) layout: Layout,
}

impl Stored {
    /// The application transaction that records it.
    pub(crate) fn txn(self) -> Transaction {
        Transaction::new_with_last_update(
            APP_ID,
            self.encode(),
            Some(Utc::now().timestamp_millis()),
        )
    }

    pub(crate) fn encode(self) -> i64 {
        (self.at.timestamp_micros() << 8) | self.layout.code()
    }

    pub(crate) fn decode(v: i64) -> Option<Stored> {
        Some(Stored {
            at: DateTime::<Utc>::from_timestamp_micros(v >> 8)?,
            layout: Layout::of_code(v & 0xff),
        })
    }
}

/// The watermark recorded in `table` (`None`: none yet).
pub(crate) async fn stored(table: &DeltaTable) -> Result<Option<Stored>> {
    if !delta::exists(table) {
        return Ok(None);
    }
    Ok(delta::txn_version(table, APP_ID)
        .await?
        .and_then(Stored::decode))
}

/// A candidate file under the source.
struct Found {
    url: Url,
    rel: String,
    kind: FileKind,
    written: DateTime<Utc>,
    last_modified: DateTime<Utc>,
    problem: Option<String>,
}

/// The listing from the stored watermark: the source's data files after it, and what the
/// listing took.
struct Listing {
    found: Vec<Found>,
    /// Keys listed, and the S3 LIST requests that took.
    listed: usize,
    requests: usize,
}

/// What listing from the stored watermark finds: the source's data files after it.
async fn list_after(
    storage: &Storage,
    cfg: &TableConfig,
    from: Option<Stored>,
    now: DateTime<Utc>,
) -> Result<Listing> {
    let pages = list_pages(storage, &cfg.source, from, now).await?;
    let requests = pages.iter().map(|l| l.len().div_ceil(PAGE).max(1)).sum();
    let base = storage::display(&cfg.source);
    let mut listed = 0;
    let mut out = Vec::new();
    for l in pages.into_iter().flatten() {
        listed += 1;
        let problem = match classify(&l.url, &cfg.format) {
            Ok(FileClass::NotData(_)) => continue,
            Ok(FileClass::Data) => None,
            Err(e) => Some(e),
        };
        let key = storage::display(&l.url);
        let rel = key.strip_prefix(&base).unwrap_or(&key).to_string();
        let name = storage::file_name(&l.url);
        let kind = source::file_kind(cfg, &name);
        let written = match kind {
            FileKind::Cdc => source::name_time(cfg, &name).unwrap_or(l.last_modified),
            FileKind::FullLoad => l.last_modified,
        };
        out.push(Found {
            url: l.url,
            rel,
            kind,
            written,
            last_modified: l.last_modified,
            problem,
        });
    }
    out.sort_by(|a, b| (a.written, &a.rel).cmp(&(b.written, &b.rel)));
    out.dedup_by(|a, b| a.rel == b.rel);
    Ok(Listing {
        found: out,
        listed,
        requests,
    })
}

/// The listings (pages of objects) that reach every file after the stored watermark.
async fn list_pages(
    storage: &Storage,
    source: &Url,
    from: Option<Stored>,
    now: DateTime<Utc>,
) -> Result<Vec<Vec<Listed>>> {
    let (at, s, d) = match from {
        None
        | Some(Stored {
            layout: Layout::Unknown,
            ..
        }) => return Ok(vec![storage.list_meta(source).await?]),
        Some(Stored {
            at,
            layout: Layout::Flat,
        }) => {
            // Names sort by time: start a second before the watermark's file.
            let start = storage::join(
                source,
                &(at - Duration::seconds(1))
                    .format("%Y%m%d-%H%M%S")
                    .to_string(),
            );
            return Ok(vec![storage.list_meta_after(source, Some(&start)).await?]);
        }
        Some(Stored {
            at,
            layout: Layout::Dated(s, d),
        }) => (at, s, d),
    };
    // An hour's slack: DMS puts a file in its changes' commit date folder, which may be the
    // one before the file's name time.
    let from = at - Duration::hours(1);
    if let Sequence::Yyyymmdd | Sequence::Yyyymmddhh | Sequence::Yyyymm = s {
        // The folders sort by time: list from the watermark's folder on (the listing also
        // reaches full-load files, which sort after digits).
        let start = storage::join(source, &folder(s, d, from));
        return Ok(vec![storage.list_meta_after(source, Some(&start)).await?]);
    }
    // They do not: one listing per day folder since, and the table folder itself for
    // full-load files.
    let mut pages = vec![storage.list_shallow(source).await?];
    let mut day = from.date_naive();
    let last = (now + Duration::days(1)).date_naive();
    while day <= last {
        let t = day.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc();
        let prefix = storage::join(source, &format!("{}/", folder(s, d, t)));
        pages.push(storage.list_meta(&prefix).await?);
        match day.succ_opt() {
            Some(next) => day = next,
            None => break,
        }
    }
    Ok(pages)
}

/// The table's watermark at `now` as its records and the source's files show it: the
/// stored one, moved over every applied file after it up to the first one not applied.
/// Reads only.
pub(crate) async fn progress(
    storage: &Storage,
    cfg: &TableConfig,
    table: &DeltaTable,
    now: DateTime<Utc>,
) -> Result<(Progress, Option<Stored>)> {
    progress_with(storage, cfg, table, now, &[]).await
}

/// The watermark a commit that also records `txns` moves, to carry in that commit (one
/// commit per merge): its transaction pushed onto `txns`, and the progress. `None` when it
/// does not move, when the table keeps only its history, or when it cannot be computed now
/// (logged; the post-commit step tries on its own).
pub(crate) async fn carried(
    storage: &Storage,
    cfg: &TableConfig,
    table: &DeltaTable,
    txns: &mut Vec<Transaction>,
) -> Option<(Progress, Stored)> {
    cfg.target.as_ref()?;
    let progress = progress_with(storage, cfg, table, Utc::now(), txns);
    match Box::pin(progress).await {
        Ok((p, Some(next))) if p.advanced => {
            txns.push(next.txn());
            Some((p, next))
        }
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(table = %cfg.name, error = %e, "watermark not computed before the commit; computing it after");
            None
        }
    }
}

/// [`progress`] as it will be once a commit recording `also` (the records of the files it
/// applies) lands: the watermark a merge commits with its own changes (#43 item 8). Planned
/// ([`Walk::plan`]: the stored watermark, the files after it), walked ([`Walk::full_loads`],
/// [`Walk::cdc`]), and its progress put together from what the walk found.
pub(crate) async fn progress_with(
    storage: &Storage,
    cfg: &TableConfig,
    table: &DeltaTable,
    now: DateTime<Utc>,
    also: &[Transaction],
) -> Result<(Progress, Option<Stored>)> {
    let walk = Walk::plan(storage, cfg, table, now, also).await?;
    let mut p = Progress {
        watermark: walk.stored.map(|s| s.at),
        listed: walk.listing.listed,
        list_requests: walk.listing.requests,
        ..Progress::default()
    };
    let (held, lookups) = walk.full_loads().await?;
    p.lookups = lookups;
    if let Some(held) = held {
        p.held_by = Some(held);
        p.caught_up = false;
        return Ok((p, walk.stored));
    }
    let cdc = walk.cdc().await?;
    p.lookups += cdc.lookups;
    p.files_waiting = cdc.waiting;
    let (mut watermark, mut layout) = (walk.stored.map(|s| s.at), walk.stored.map(|s| s.layout));
    if let Some(f) = cdc.prefix.last() {
        watermark = Some(f.written);
        p.file = Some(storage::display(&f.url));
    }
    for f in &cdc.prefix {
        let detected = Layout::detect(&f.rel);
        if detected != Layout::Unknown {
            layout = Some(detected);
        } else if layout.is_none() {
            layout = Some(Layout::Unknown);
        }
    }
    p.held_by = cdc.held;
    p.caught_up = p.held_by.is_none();
    p.advanced = watermark != walk.stored.map(|s| s.at);
    p.watermark = watermark;
    let next = watermark.map(|at| Stored {
        at,
        layout: layout.unwrap_or(Layout::Unknown),
    });
    Ok((p, next))
}

/// A watermark computation's plan: the stored watermark, the source's files after it, and
/// which files without a record count as applied.
struct Walk<'a> {
    cfg: &'a TableConfig,
    table: &'a DeltaTable,
    /// Records a commit about to land adds.
    also: &'a [Transaction],
    stored: Option<Stored>,
    listing: Listing,
    /// A file without a record, written before the records' horizon of a table that has
    /// recorded its files since before it, may be one whose record expired: it counts as
    /// applied (a merge would refuse it as too late). Any other file without a record is
    /// not applied.
    unrecorded_before: DateTime<Utc>,
    exists: bool,
}

/// The CDC files after the watermark as a walk finds them.
struct CdcWalk<'a> {
    /// Applied, without a gap, in order.
    prefix: Vec<&'a Found>,
    /// The first one not applied.
    held: Option<Held>,
    /// Files behind it found applied (the first few looked up only).
    waiting: usize,
    lookups: usize,
}

impl<'a> Walk<'a> {
    async fn plan(
        storage: &Storage,
        cfg: &'a TableConfig,
        table: &'a DeltaTable,
        now: DateTime<Utc>,
        also: &'a [Transaction],
    ) -> Result<Walk<'a>> {
        let stored = stored(table).await?;
        let listing = list_after(storage, cfg, stored, now).await?;
        let retention =
            Duration::from_std(crate::delta::applied::record_retention(cfg)).unwrap_or_default();
        let horizon = now - retention;
        let unrecorded_before = match delta::props(table).file_records_since {
            Some(since) if since < horizon => horizon,
            _ => DateTime::<Utc>::MIN_UTC,
        };
        Ok(Walk {
            cfg,
            table,
            also,
            stored,
            listing,
            unrecorded_before,
            exists: delta::exists(table),
        })
    }

    /// The version recorded for `id`: by the commit about to land, else by the table.
    async fn recorded(&self, id: String) -> Result<Option<i64>> {
        match self.also.iter().find(|t| t.app_id == id) {
            Some(t) => Ok(Some(t.version)),
            None if self.exists => delta::txn_version(self.table, &id).await,
            None => Ok(None),
        }
    }

    /// Full loads first: the first one not applied holds everything. With the lookups made.
    async fn full_loads(&self) -> Result<(Option<Held>, usize)> {
        let mut lookups = 0;
        let loads = self.listing.found.iter();
        for f in loads.filter(|f| f.kind == FileKind::FullLoad) {
            if self.stored.is_some_and(|s| f.last_modified <= s.at) {
                continue;
            }
            let applied = if f.problem.is_some() {
                false
            } else {
                lookups += 1;
                self.recorded(crate::delta::applied::load_app_id(self.cfg, &f.url))
                    .await?
                    == Some(f.last_modified.timestamp_millis())
            };
            if !applied {
                let reason = f.problem.clone().unwrap_or_else(|| {
                    if self.stored.is_some() {
                        "a full-load file not applied: a table reload (`tributary reload`)".into()
                    } else {
                        "a full-load file not applied yet".into()
                    }
                });
                let held = Held {
                    file: storage::display(&f.url),
                    written: f.written,
                    reason,
                };
                return Ok((Some(held), lookups));
            }
        }
        Ok((None, lookups))
    }

    /// The CDC files after the watermark: the applied prefix up to the first one not
    /// applied, and what waits behind it.
    async fn cdc(&self) -> Result<CdcWalk<'_>> {
        let mut w = CdcWalk {
            prefix: Vec::new(),
            held: None,
            waiting: 0,
            lookups: 0,
        };
        let watermark = self.stored.map(|s| s.at);
        for f in self
            .listing
            .found
            .iter()
            .filter(|f| f.kind == FileKind::Cdc)
        {
            if watermark.is_some_and(|at| f.written <= at) {
                continue;
            }
            if w.held.is_some() {
                // Behind the gap: count what waits (a few lookups at most).
                if w.waiting < 3 {
                    w.lookups += 1;
                    let id = crate::delta::applied::app_id(self.cfg, &f.url);
                    if self.recorded(id).await?.is_some() {
                        w.waiting += 1;
                    }
                }
                continue;
            }
            let applied = match &f.problem {
                Some(_) => false,
                None if self.exists && f.written < self.unrecorded_before => true,
                None => {
                    w.lookups += 1;
                    let id = crate::delta::applied::app_id(self.cfg, &f.url);
                    self.recorded(id).await?.is_some()
                }
            };
            if applied {
                w.prefix.push(f);
            } else {
                w.held = Some(Held {
                    file: storage::display(&f.url),
                    written: f.written,
                    reason: f.problem.clone().unwrap_or_else(|| {
                        "not applied: in flight, failed, or in the dead-letter queue".into()
                    }),
                });
            }
        }
        // Files of the same time as the first one not applied are not covered by a
        // watermark at that time: the watermark stops before them.
        if let Some(h) = &w.held {
            while w.prefix.last().is_some_and(|f| f.written >= h.written) {
                w.prefix.pop();
            }
        }
        Ok(w)
    }
}

/// [`progress`], and when the watermark moved, a commit of it (retried on the newer table
/// when another writer moved it meanwhile). The table after it, and the progress.
pub(crate) async fn advance(
    storage: &Storage,
    cfg: &TableConfig,
    table: DeltaTable,
    now: DateTime<Utc>,
) -> Result<(DeltaTable, Progress)> {
    let (out, _) = Retry::new(&cfg.name, cfg.limits.max_commit_attempts)
        .run("watermark", |n| {
            let mut table = table.clone();
            async move {
                if n > 1 {
                    delta::refresh(&mut table, &cfg.name).await?;
                }
                let (p, next) = progress(storage, cfg, &table, now).await?;
                let Some(next) = next.filter(|_| p.advanced) else {
                    return Ok((table, p));
                };
                let txn = next.txn();
                let info = serde_json::json!({ "at": next.at.to_rfc3339(), "file": p.file });
                let table =
                    delta::commit_txns_with(table, vec![txn], Some(("tributary.watermark", info)))
                        .await?;
                Ok((table, p))
            }
        })
        .await?;
    Ok(out)
}

/// The versions of `table`'s last `limit` commits that moved its watermark, newest first:
/// (version, watermark).
pub(crate) async fn history(table: &DeltaTable, limit: u64) -> Result<Vec<(u64, DateTime<Utc>)>> {
    let Some(latest) = table.version() else {
        return Ok(Vec::new());
    };
    let label = table.table_url().to_string();
    let mut out = Vec::new();
    let first = latest.saturating_sub(limit.saturating_sub(1));
    for v in (first..=latest).rev() {
        let bytes = match table.log_store().read_commit_entry(v).await {
            Ok(Some(b)) => b,
            Ok(None) => break,
            Err(e) => return Err(Error::delta(&label, e)),
        };
        for line in bytes.split(|b| *b == b'\n') {
            let Ok(value) = serde_json::from_slice::<serde_json::Value>(line) else {
                continue;
            };
            let Some(txn) = value.get("txn") else {
                continue;
            };
            if txn.get("appId").and_then(|a| a.as_str()) != Some(APP_ID) {
                continue;
            }
            if let Some(s) = txn
                .get("version")
                .and_then(|v| v.as_i64())
                .and_then(Stored::decode)
            {
                out.push((v, s.at));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn a_layout_is_told_from_a_files_folders() {
        assert_eq!(Layout::detect("20261201-101010123.parquet"), Layout::Flat);
        assert_eq!(
            Layout::detect("2026/12/01/20261201-101010123.parquet"),
            Layout::Dated(Sequence::Yyyymmdd, Delimiter::Slash)
        );
        assert_eq!(
            Layout::detect("2026-12-01-10/20261201-101010123.csv"),
            Layout::Dated(Sequence::Yyyymmddhh, Delimiter::Dash)
        );
        assert_eq!(
            Layout::detect("01122026/20261201-101010123.csv"),
            Layout::Dated(Sequence::Ddmmyyyy, Delimiter::None)
        );
        assert_eq!(Layout::detect("LOAD00000001.parquet"), Layout::Unknown);
        assert_eq!(
            Layout::detect("elsewhere/20261201-101010123.parquet"),
            Layout::Unknown
        );
    }

    #[test]
    fn the_stored_value_keeps_its_time_and_layout_and_sorts_by_time() {
        for code in 0..=21 {
            let l = Layout::of_code(code);
            assert_eq!(l.code(), code, "{l:?}");
            let s = Stored {
                at: t("2026-12-01T10:10:10.123Z"),
                layout: l,
            };
            assert_eq!(Stored::decode(s.encode()), Some(s));
        }
        let early = Stored {
            at: t("2026-12-01T10:10:10.123Z"),
            layout: Layout::Dated(Sequence::Ddmmyyyy, Delimiter::None),
        };
        let late = Stored {
            at: t("2026-12-01T10:10:10.123001Z"),
            layout: Layout::Unknown,
        };
        assert!(early.encode() < late.encode());
        assert!(early.encode() >= 0);
    }
}
