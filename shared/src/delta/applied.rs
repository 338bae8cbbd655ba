//! Which files a table applied, recorded in the commits that apply them (Delta application
//! transactions): full-load files by modification time (a rewritten one is a DMS table
//! reload, see `reload`), CDC files by the contents they were applied with.
//!
//! ## Full-load files
//!
//! Every full-load file applied is recorded as `tributary.load/<file>` whose version is the
//! object's last-modified time (ms), without expiry. The merge path refuses a full-load
//! file of a newer load ([`check_load_file`]): a reload is applied as a whole.
//!
//! ## CDC files
//!
//! DMS never rewrites a CDC file, but a user fixing one may overwrite it in place. Its rows'
//! order keys come from the file (its name, or its sequence values, and row numbers), so the
//! new object's rows would be ordered as the old ones: rows the old version had are skipped
//! as already applied, rows it lacked are added — a half-applied correction (#23, item 5).
//!
//! So every CDC file a commit applies is recorded in that commit, as a Delta application
//! transaction `tributary.file/<path under the source>` whose version is the first 63 bits
//! of the object's SHA-256 and whose `lastUpdated` is the commit time. Before a file is
//! merged, and again before each retried commit, its digest is compared with the recorded
//! one: the same contents are a re-delivery (merging again changes nothing), other contents
//! are refused by name ([`Error::Reuploaded`]) and nothing of them is applied. The contents,
//! not the ETag or the modification time, identify the version: copying an object onto
//! itself (to send its event again) keeps it.
//!
//! The records expire with the table's `delta.setTransactionRetentionDuration`: the
//! tombstone retention plus a week ([`record_retention`]), so the log does not keep one per
//! file ever merged (at one file a minute that is ~60k records, a ~4.6 MB checkpoint). A
//! file without a record is then either new or one whose record expired; a DMS-named file
//! written before `now − record retention` is refused as [`Error::TooLate`] when the table
//! has recorded its files for longer than that (`tributary.fileRecordsSince`) — so a file
//! that is accepted always has its record, whatever the maintenance cadence, while a new
//! table still takes a backfill of old files. (The tombstone horizon refuses such files
//! anyway once maintenance has run.) Full-load files are recorded apart, by modification
//! time, without expiry (`reload`: a rewritten LOAD file is a DMS table reload).

use std::collections::HashMap;
use std::time::Duration;

use deltalake::kernel::Transaction;
use deltalake::DeltaTable;
use url::Url;

use chrono::{DateTime, Utc};

use crate::config::TableConfig;
use crate::delta;
use crate::error::{Error, Result};
use crate::props::TableProps;
pub(crate) use crate::sink::Identity;
use crate::source::{ChangeSet, Digest, FileKind};
use crate::storage;

/// Application-transaction id that records a full-load file.
pub(crate) fn load_app_id(cfg: &TableConfig, file: &Url) -> String {
    let key = storage::display(file);
    let base = storage::display(&cfg.source);
    format!("tributary.load/{}", key.strip_prefix(&base).unwrap_or(&key))
}

/// The transaction identifying a full-load file's version (whichever slice `cs` is).
pub(crate) fn file_txn(cfg: &TableConfig, cs: &ChangeSet) -> Option<Transaction> {
    if cs.kind != FileKind::FullLoad {
        return None;
    }
    let t = cs.last_modified?;
    Some(Transaction::new(
        load_app_id(cfg, &cs.file),
        t.timestamp_millis(),
    ))
}

fn reload_error(cfg: &TableConfig, file: &Url, message: String) -> Error {
    Error::Reload {
        table: cfg.name.clone(),
        file: storage::display(file),
        message,
    }
}

fn how_to_apply(cfg: &TableConfig) -> String {
    if cfg.history.is_some() {
        return "tributary cannot apply a reload to a table with a history table yet (the history would not close the versions of the rows the reload deletes): nothing of it was applied; the file stays in the dead-letter queue (docs/design.md, \"Full loads and DMS table reloads\")".to_string();
    }
    format!(
        "once DMS reports the table's reload complete, apply it as a whole with `tributary reload --config <config> {}` (or the maintenance function with {{\"reload\": \"{}\"}}), then redrive the dead-letter queue",
        cfg.name, cfg.name
    )
}

/// Refuse a full-load file that belongs to a full load newer than the one applied.
pub(crate) async fn check_load_file(
    cfg: &TableConfig,
    table: &DeltaTable,
    props: &TableProps,
    cs: &ChangeSet,
) -> Result<()> {
    if cs.kind != FileKind::FullLoad || !delta::exists(table) {
        return Ok(());
    }
    if !props.load_tracking {
        return Err(reload_error(
            cfg,
            &cs.file,
            format!(
                "the table does not record the full-load files it applied (it was created by an older tributary or another writer), so a reload cannot be told from a re-delivery; {}",
                how_to_apply(cfg)
            ),
        ));
    }
    let Some(txn) = file_txn(cfg, cs) else {
        return Err(reload_error(
            cfg,
            &cs.file,
            "the object has no modification time to identify it by".into(),
        ));
    };
    match delta::txn_version(table, &txn.app_id).await? {
        Some(v) if v != txn.version => Err(reload_error(
            cfg,
            &cs.file,
            format!(
                "the table applied a version of this file written at {}, and this one was written at {}: DMS wrote a new full load; {}",
                millis(v),
                millis(txn.version),
                how_to_apply(cfg)
            ),
        )),
        _ => Ok(()),
    }
}

fn millis(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339())
        .unwrap_or_else(|| ms.to_string())
}

/// Delta's table property that lets application transactions expire.
pub(crate) const TXN_RETENTION: &str = "delta.setTransactionRetentionDuration";

/// Application-transaction id that records a CDC file.
pub(crate) fn app_id(cfg: &TableConfig, file: &Url) -> String {
    let key = storage::display(file);
    let base = storage::display(&cfg.source);
    format!("tributary.file/{}", key.strip_prefix(&base).unwrap_or(&key))
}

/// The transaction version that stands for `digest` (non-negative).
fn version(digest: &Digest) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(b) & i64::MAX
}

/// The record of the CDC file `cs` is read from, for the commit that applies the file
/// (whichever of its slices `cs` is): `None` for a full-load file or contents without a
/// digest.
pub(crate) fn record(cfg: &TableConfig, cs: &ChangeSet) -> Option<Transaction> {
    if cs.kind != FileKind::Cdc {
        return None;
    }
    let d = cs.digest.as_ref()?;
    Some(Transaction::new_with_last_update(
        app_id(cfg, &cs.file),
        version(d),
        Some(chrono::Utc::now().timestamp_millis()),
    ))
}

/// Refuse a CDC file whose name the table applied with other contents.
pub(crate) async fn check(cfg: &TableConfig, table: &DeltaTable, f: &Identity) -> Result<()> {
    if f.kind != FileKind::Cdc || !delta::exists(table) {
        return Ok(());
    }
    let Some(d) = f.digest.as_ref() else {
        return Ok(());
    };
    match delta::txn_version(table, &app_id(cfg, &f.file)).await? {
        Some(v) if v != version(d) => Err(Error::Reuploaded {
            table: cfg.name.clone(),
            file: storage::display(&f.file),
        }),
        Some(_) => Ok(()),
        None => check_unrecorded(cfg, &delta::props(table), f, Utc::now()),
    }
}

/// A file without a record, written before the records' horizon (`now − record
/// retention`) of a table that has recorded its files since before it: its record may have
/// expired, so it cannot be told from a re-upload ([`Error::TooLate`]).
fn check_unrecorded(
    cfg: &TableConfig,
    props: &TableProps,
    f: &Identity,
    now: DateTime<Utc>,
) -> Result<()> {
    let (Some(since), Some(written)) = (props.file_records_since, f.written) else {
        return Ok(());
    };
    let Ok(retention) = chrono::Duration::from_std(record_retention(cfg)) else {
        return Ok(());
    };
    let horizon = now - retention;
    if written < horizon && since < horizon {
        return Err(Error::TooLate {
            table: cfg.name.clone(),
            file: storage::display(&f.file),
            written: written.to_rfc3339(),
            horizon: horizon.to_rfc3339(),
        });
    }
    Ok(())
}

/// Files whose rows changed nothing produce no MERGE commit; their records are still
/// written (reload and re-upload detection need them), in a commit of their own. Such a
/// commit conflicts with no concurrent write: a caller that relies on its commit
/// conflicting with a concurrent one must not take it for one (`reapply_deletes`).
pub(crate) async fn record_unrecorded(
    target: DeltaTable,
    txns: &[Transaction],
    read_version: Option<u64>,
) -> Result<DeltaTable> {
    if txns.is_empty() || target.version() != read_version {
        return Ok(target);
    }
    let mut missing = Vec::new();
    for t in txns {
        if delta::txn_version(&target, &t.app_id).await? != Some(t.version) {
            missing.push(t.clone());
        }
    }
    if missing.is_empty() {
        return Ok(target);
    }
    delta::commit_txns(target, missing).await
}

/// How long a CDC file's record is kept: the tombstone retention plus a week (the tombstone
/// horizon moves by maintenance, in steps of at most a day; the week is its slack).
pub(crate) fn record_retention(cfg: &TableConfig) -> Duration {
    cfg.limits.tombstone_retention + Duration::from_secs(7 * 86_400)
}

/// [`record_retention`] as a Delta interval.
pub(crate) fn retention(cfg: &TableConfig) -> String {
    interval(record_retention(cfg))
}

fn interval(d: Duration) -> String {
    format!("interval {} seconds", d.as_secs().max(1))
}

/// The properties of a table that records its CDC files from now on: the records'
/// expiry ([`retention`]) and since when they are kept.
pub(crate) fn new_table_properties(cfg: &TableConfig) -> HashMap<String, String> {
    let mut p = TableProps::for_file_records(Utc::now());
    p.insert(TXN_RETENTION.to_string(), retention(cfg));
    p
}

/// Whether the loaded table lets its application transactions expire.
pub(crate) fn has_retention(table: &DeltaTable) -> bool {
    table
        .snapshot()
        .is_ok_and(|s| s.metadata().configuration().contains_key(TXN_RETENTION))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_stands_as_a_non_negative_version_of_its_first_63_bits() {
        let mut d = [0u8; 32];
        d[0] = 0xff;
        d[7] = 0x01;
        assert_eq!(version(&d), 0x7f00_0000_0000_0001);
        d[31] = 0xff;
        assert_eq!(
            version(&d),
            0x7f00_0000_0000_0001,
            "only the first 8 bytes count"
        );
        assert_eq!(version(&[0u8; 32]), 0);
    }

    #[test]
    fn the_retention_is_a_delta_interval() {
        assert_eq!(
            interval(Duration::from_secs(14 * 86_400)),
            "interval 1209600 seconds"
        );
        assert_eq!(interval(Duration::from_millis(10)), "interval 1 seconds");
    }

    /// An unrecorded DMS-named file older than the records' horizon is refused only when
    /// the table has recorded its files since before that horizon (a new table takes a
    /// backfill of old files; a file whose record may have expired is not applied as new).
    #[test]
    fn an_unrecorded_file_older_than_the_records_is_too_late_only_on_a_table_that_kept_them() {
        let text = crate::config::test_table("t", "raw/t/", "curated/t", "");
        let dir = tempfile::tempdir().unwrap();
        let config = crate::Config::from_toml(&text, "test", Some(dir.path())).unwrap();
        let cfg = &config.tables[0];
        let now = Utc::now();
        let days = |d: i64| now - chrono::Duration::days(d);
        let retention = record_retention(cfg).as_secs() as i64 / 86_400;
        let file = |written: DateTime<Utc>| Identity {
            file: Url::parse("s3://b/raw/t/20200101-000000000.parquet").unwrap(),
            kind: FileKind::Cdc,
            digest: Some([1; 32]),
            written: Some(written),
        };
        let since = |t: Option<DateTime<Utc>>| TableProps {
            file_records_since: t,
            ..Default::default()
        };
        let old = file(days(retention + 1));
        let young = file(days(retention - 1));
        let long_kept = since(Some(days(retention + 30)));
        let e = check_unrecorded(cfg, &long_kept, &old, now).unwrap_err();
        assert_eq!(e.kind(), "too_late", "{e}");
        assert!(check_unrecorded(cfg, &long_kept, &young, now).is_ok());
        // A new table (or one upgraded lately), and one without records: a backfill.
        assert!(check_unrecorded(cfg, &since(Some(days(1))), &old, now).is_ok());
        assert!(check_unrecorded(cfg, &since(None), &old, now).is_ok());
    }
}
