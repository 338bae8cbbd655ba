//! tributary's own Delta commit: the protocol check, the commit file, the put-if-absent
//! of the next version, the conflict check against the commits that won meanwhile, and
//! the checkpoint. delta-rs's `CommitBuilder` does this too, but without DataFusion it
//! refuses every table with CHECK constraints, invariants, the change data feed or
//! generated columns (writer versions 3–6 included), and its conflict checker skips
//! concurrent appends into what a commit read. tributary checks constraints and writes the
//! change data feed itself (`constraints`, `rewrite`), and knows what each commit read: a
//! key range, the whole table, or nothing.
//!
//! Conflicts, for each commit that won since the snapshot the actions were made from:
//! - a `metaData` or `protocol` action: the actions were made for another schema;
//! - a `remove` of a file this commit removes (two rewrites of one file);
//! - an `add` with changed data whose key range may overlap the range this commit read
//!   (statistics missing or not bounding the key: it may), or any such `add` when it read
//!   the whole table;
//! - a `txn` of an application id this commit records (the same CDC file applied twice);
//!   the watermark's id alone is dropped instead (publish moves it after, `watermark`).
//!
//! A conflict is the commit-conflict error the engine re-plans on; no conflict, the same
//! actions are committed at the next free version.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use deltalake::kernel::transaction::{CommitConflictError, TransactionError};
use deltalake::kernel::{Action, CommitInfo, Transaction};
use deltalake::logstore::{CommitOrBytes, LogStore, LogStoreRef};
use deltalake::protocol::DeltaOperation;
use deltalake::DeltaTable;
use object_store::ObjectStoreExt;
use serde_json::Value;

use crate::delta::scan::{KeyBound, KeyRange};
use crate::error::{Error, Result};

/// How many times a commit is tried at the next free version before the engine's retry
/// takes over (each try after a conflict check of the commits that won).
const ATTEMPTS: usize = 16;

/// Strings in Delta statistics may be truncated prefixes: a maximum this long may be less
/// than the column's largest value, so it bounds nothing.
const TRUNCATED_AT: usize = 32;

/// What a commit's actions were made from, beyond the files it removes.
#[derive(Debug, Clone)]
pub(crate) enum Read {
    /// Nothing but the snapshot's schema: a blind append, application transactions,
    /// metadata, a compaction (its removes are its reads).
    Nothing,
    /// The rows whose `column` is in `range`.
    Keys { column: String, range: KeyRange },
    /// Every row of the table.
    Table,
}

/// A commit of `actions` on the table's loaded snapshot.
pub(crate) struct Commit<'a> {
    /// Names the table in errors.
    pub(crate) label: &'a str,
    pub(crate) actions: Vec<Action>,
    /// For the commit info (its name and parameters).
    pub(crate) operation: DeltaOperation,
    pub(crate) read: Read,
    /// Application transactions recorded with the actions.
    pub(crate) txns: Vec<Transaction>,
    /// More commit-info entries (tributary's engine, the CDC files merged, …).
    pub(crate) info: Vec<(String, Value)>,
}

impl<'a> Commit<'a> {
    /// A commit with no application transaction and tributary as the engine.
    pub(crate) fn of(
        label: &'a str,
        actions: Vec<Action>,
        operation: DeltaOperation,
        read: Read,
    ) -> Commit<'a> {
        Commit {
            label,
            actions,
            operation,
            read,
            txns: vec![],
            info: vec![],
        }
    }
}

/// What a commit needs of the table it was made on.
struct Base {
    version: u64,
    /// What the schema says of decimal bounds (`stats`).
    known: crate::delta::stats::Known,
    checkpoint_every: u64,
    /// tributary writes the table's checkpoints (not a v2-checkpoint table's).
    checkpoints: bool,
}

impl Base {
    /// The table's version and settings, once the commit is checked against the table
    /// (its features, `appendOnly`).
    fn of(table: &DeltaTable, actions: &[Action], label: &str) -> Result<Base> {
        let state = table.snapshot().map_err(|e| Error::delta(label, e))?;
        super::refuse_unwritable(table, label)?;
        refuse_append_only(state, actions, label)?;
        let checkpoint_every = state
            .metadata()
            .configuration()
            .get(super::CHECKPOINT_INTERVAL)
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|v| *v > 0)
            .unwrap_or(100);
        let wide = crate::delta::stats::arrow_has_wide_decimal(&state.snapshot().arrow_schema());
        let known = match wide {
            true => crate::delta::stats::Known::Wide,
            false => crate::delta::stats::Known::Exact,
        };
        Ok(Base {
            version: state.version(),
            known,
            checkpoint_every,
            checkpoints: super::classic_checkpoints(table),
        })
    }
}

/// Commit on the table's loaded snapshot; returns the table at the new version.
pub(crate) async fn commit(mut table: DeltaTable, c: Commit<'_>) -> Result<DeltaTable> {
    let label = c.label;
    let base = Base::of(&table, &c.actions, label)?;
    // Boxed: a commit's future sits inside every writer's (the history's nest deeply).
    let version = Box::pin(put(&table.log_store(), &c, &base)).await?;
    table
        .update_incremental(Some(version))
        .await
        .map_err(|e| Error::delta(label, e))?;
    // delta-rs's rule (the version after a multiple of the interval), so that a table keeps
    // its checkpoints where they were.
    if (version + 1) % base.checkpoint_every == 0 && base.checkpoints {
        deltalake::checkpoints::create_checkpoint(&table, None)
            .await
            .map_err(|e| Error::delta(label, e))?;
    }
    Ok(table)
}

/// Put the commit at the next free version, checking the commits that won each race
/// ([module](self)); returns the version it got.
async fn put(log_store: &LogStoreRef, c: &Commit<'_>, base: &Base) -> Result<u64> {
    let label = c.label;
    let mut txns = c.txns.clone();
    let mut pending = pending_file(log_store, c, base, &txns).await?;
    let mine = Mine::of(&c.actions, &txns);
    let (mut checked, mut version) = (base.version, base.version + 1);
    for _ in 0..ATTEMPTS {
        match log_store
            .write_commit_entry(version, pending.entry(), pending.operation_id)
            .await
        {
            Ok(()) => return Ok(version),
            Err(TransactionError::VersionAlreadyExists(_)) => {}
            Err(e) => {
                pending.abort(log_store, version).await;
                return Err(Error::delta(label, e.into()));
            }
        }
        let latest = log_store
            .get_latest_version(version)
            .await
            .map_err(|e| Error::delta(label, e))?;
        let before = txns.len();
        while checked < latest {
            checked += 1;
            let winner = log_store
                .read_commit_entry(checked)
                .await
                .map_err(|e| Error::delta(label, e))?
                .unwrap_or_default();
            if let Err(conflict) = check(&winner, &mine, &c.read, &mut txns) {
                pending.abort(log_store, version).await;
                tracing::debug!(table = %label, version = checked, ?conflict, "commit conflict");
                let e = TransactionError::CommitConflict(conflict);
                return Err(Error::delta(label, e.into()));
            }
        }
        if txns.len() != before {
            pending.abort(log_store, version).await;
            pending = pending_file(log_store, c, base, &txns).await?;
        }
        version = latest + 1;
    }
    pending.abort(log_store, version).await;
    let e = TransactionError::MaxCommitAttempts(ATTEMPTS as i32);
    Err(Error::delta(label, e.into()))
}

/// The commit file with `txns`, exact statistics, ready for the log store.
async fn pending_file(
    log_store: &LogStoreRef,
    c: &Commit<'_>,
    base: &Base,
    txns: &[Transaction],
) -> Result<Pending> {
    let bytes = commit_bytes(
        &c.actions,
        &c.operation,
        txns,
        &c.info,
        base.version,
        &c.read,
    )?;
    let bytes = exact_stats(log_store, bytes, base.known, c.label).await?;
    Pending::new(log_store, bytes).await
}

/// An append-only table (`delta.appendOnly = true`) takes no remove of data: refused by
/// name, not retryable.
fn refuse_append_only(
    state: &deltalake::table::state::DeltaTableState,
    actions: &[Action],
    label: &str,
) -> Result<()> {
    let append_only = state
        .metadata()
        .configuration()
        .get("delta.appendOnly")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if append_only
        && actions
            .iter()
            .any(|a| matches!(a, Action::Remove(r) if r.data_change))
    {
        return Err(Error::Unsupported {
            table: label.to_string(),
            feature: "the table is append-only (delta.appendOnly = true) and this change updates or deletes rows".into(),
            way_forward: "nothing was written; turn the property off (ALTER TABLE … SET TBLPROPERTIES ('delta.appendOnly' = 'false')) if the table may change, or merge into a new table, then replay the file".into(),
        });
    }
    Ok(())
}

/// The commit file: commit info first, then the actions and the transactions.
fn commit_bytes(
    actions: &[Action],
    operation: &DeltaOperation,
    txns: &[Transaction],
    info: &[(String, Value)],
    read_version: u64,
    read: &Read,
) -> Result<Bytes> {
    let mut commit_info: CommitInfo = operation.get_commit_info();
    commit_info.timestamp = Some(chrono::Utc::now().timestamp_millis());
    commit_info.engine_info = Some(format!("tributary/{}", env!("CARGO_PKG_VERSION")));
    commit_info.read_version = Some(read_version);
    commit_info.is_blind_append = Some(
        matches!(read, Read::Nothing) && !actions.iter().any(|a| matches!(a, Action::Remove(_))),
    );
    commit_info.info = info.iter().cloned().collect::<HashMap<_, _>>();
    let ser = |a: &Action| {
        serde_json::to_string(a).map_err(|e| Error::Internal(format!("a Delta action: {e}")))
    };
    let mut lines = vec![ser(&Action::CommitInfo(commit_info))?];
    for a in actions {
        lines.push(ser(a)?);
    }
    for t in txns {
        lines.push(ser(&Action::Txn(t.clone()))?);
    }
    Ok(Bytes::from(lines.join("\n")))
}

/// The commit file with exact decimal bounds in every `add` (`stats`): delta-rs's writer
/// bounds decimals as `f64`, inexact past 15 digits; the footers have the exact values.
async fn exact_stats(
    log_store: &LogStoreRef,
    bytes: Bytes,
    known: crate::delta::stats::Known,
    label: &str,
) -> Result<Bytes> {
    let store = log_store.object_store(None);
    let path = object_store::path::Path::from("_delta_log/00000000000000000000.json");
    let (fixed, _) = crate::delta::stats::exact_commit(store.as_ref(), &path, &bytes, known)
        .await
        .map_err(|e| Error::storage(label, e))?;
    Ok(fixed.unwrap_or(bytes))
}

/// The commit file as the log store takes it: its bytes (stores with put-if-absent) or a
/// temporary file it renames (the others), as delta-rs's commit does.
struct Pending {
    entry: CommitOrBytes,
    operation_id: uuid::Uuid,
}

impl Pending {
    async fn new(log_store: &LogStoreRef, bytes: Bytes) -> Result<Pending> {
        let operation_id = uuid::Uuid::new_v4();
        let entry = if ["LakeFSLogStore", "DefaultLogStore"].contains(&log_store.name().as_str()) {
            CommitOrBytes::LogBytes(bytes)
        } else {
            let path = object_store::path::Path::from_iter([
                "_delta_log",
                &format!("_commit_{}.json.tmp", uuid::Uuid::new_v4()),
            ]);
            log_store
                .object_store(Some(operation_id))
                .put(&path, bytes.into())
                .await
                .map_err(|e| Error::storage(path.to_string(), e))?;
            CommitOrBytes::TmpCommit(path)
        };
        Ok(Pending {
            entry,
            operation_id,
        })
    }

    fn entry(&self) -> CommitOrBytes {
        self.entry.clone()
    }

    /// Remove the temporary file, if any (best effort: vacuum removes what is left).
    async fn abort(&self, log_store: &LogStoreRef, version: u64) {
        if matches!(self.entry, CommitOrBytes::TmpCommit(_)) {
            let _ = log_store
                .abort_commit_entry(version, self.entry.clone(), self.operation_id)
                .await;
        }
    }
}

/// What the conflict check needs of this commit's actions.
struct Mine {
    removes: HashSet<String>,
    /// The watermark's transaction may be left out on a clash (the commit has more to it).
    watermark_optional: bool,
}

impl Mine {
    fn of(actions: &[Action], txns: &[Transaction]) -> Mine {
        let watermark = |t: &Transaction| t.app_id == crate::model::WATERMARK_APP_ID;
        Mine {
            watermark_optional: !actions.is_empty() || !txns.iter().all(watermark),
            removes: actions
                .iter()
                .filter_map(|a| match a {
                    Action::Remove(r) => Some(decoded(&r.path)),
                    _ => None,
                })
                .collect(),
        }
    }
}

/// A path as the log writes it, percent-decoded (writers differ in what they encode).
fn decoded(path: &str) -> String {
    percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .map(|p| p.into_owned())
        .unwrap_or_else(|_| path.to_string())
}

/// Whether a commit that won conflicts with this one ([module](self)); the watermark's
/// transaction is dropped from `txns` on a clash when the commit has more to it (a commit
/// of the watermark alone conflicts).
fn check(
    winner: &[u8],
    mine: &Mine,
    read: &Read,
    txns: &mut Vec<Transaction>,
) -> std::result::Result<(), CommitConflictError> {
    let text = String::from_utf8_lossy(winner);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(action) = serde_json::from_str::<Value>(line) else {
            return Err(CommitConflictError::CorruptedState {
                source: format!("a commit line is not JSON: {line:.80}").into(),
            });
        };
        if action.get("metaData").is_some() {
            return Err(CommitConflictError::MetadataChanged);
        }
        if let Some(p) = action.get("protocol") {
            return Err(CommitConflictError::ProtocolChanged(p.to_string()));
        }
        if let Some(r) = action.get("remove") {
            let path = r["path"].as_str().map(decoded).unwrap_or_default();
            if mine.removes.contains(&path) {
                return Err(CommitConflictError::ConcurrentDeleteDelete);
            }
        }
        if let Some(a) = action.get("add") {
            if a["dataChange"].as_bool() != Some(false) && may_hold(a, read) {
                return Err(CommitConflictError::ConcurrentAppend);
            }
        }
        if let Some(t) = action.get("txn") {
            let id = t["appId"].as_str().unwrap_or_default();
            if txns.iter().any(|m| m.app_id == id) {
                if id != crate::model::WATERMARK_APP_ID || !mine.watermark_optional {
                    return Err(CommitConflictError::ConcurrentTransaction);
                }
                txns.retain(|m| m.app_id != id);
            }
        }
    }
    Ok(())
}

/// Whether an added file may hold a row this commit read: its statistics' bounds of the
/// read key overlap the read range (no statistics, no bound: it may).
fn may_hold(add: &Value, read: &Read) -> bool {
    let (column, range) = match read {
        Read::Nothing => return false,
        Read::Table => return true,
        Read::Keys { column, range } => (column, range),
    };
    let stats = add["stats"]
        .as_str()
        .and_then(|s| serde_json::from_str::<Value>(s).ok());
    let Some(stats) = stats else {
        return true;
    };
    let bound = |which: &str, lower: bool| -> Option<KeyBound> {
        let v = stats.get(which)?.get(column)?;
        match (&range.lo, v) {
            (KeyBound::Int(_), Value::Number(n)) => n.as_i64().map(KeyBound::Int),
            (KeyBound::Text(_), Value::String(s)) if lower || s.chars().count() < TRUNCATED_AT => {
                Some(KeyBound::Text(s.clone()))
            }
            _ => None,
        }
    };
    match (bound("minValues", true), bound("maxValues", false)) {
        (Some(lo), Some(hi)) => range.overlaps(&KeyRange { lo, hi }),
        (Some(lo), None) => lo <= range.hi,
        (None, Some(hi)) => range.lo <= hi,
        (None, None) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(stats: &str, data_change: bool) -> Vec<u8> {
        serde_json::json!({"add": {"path": "a.parquet", "dataChange": data_change, "stats": stats}})
            .to_string()
            .into_bytes()
    }

    fn keys(lo: i64, hi: i64) -> Read {
        Read::Keys {
            column: "id".into(),
            range: KeyRange {
                lo: KeyBound::Int(lo),
                hi: KeyBound::Int(hi),
            },
        }
    }

    fn none() -> Mine {
        Mine {
            removes: HashSet::new(),
            watermark_optional: true,
        }
    }

    #[test]
    fn an_append_into_the_range_read_conflicts_and_one_beside_it_does_not() {
        let stats = r#"{"numRecords":2,"minValues":{"id":5},"maxValues":{"id":9}}"#;
        let mut t = vec![];
        assert!(matches!(
            check(&add(stats, true), &none(), &keys(1, 5), &mut t),
            Err(CommitConflictError::ConcurrentAppend)
        ));
        assert!(check(&add(stats, true), &none(), &keys(10, 20), &mut t).is_ok());
        // A compaction's add holds rows the table had: no new data.
        assert!(check(&add(stats, false), &none(), &keys(1, 5), &mut t).is_ok());
        // Without statistics it may hold anything; a blind append read nothing.
        assert!(check(&add("", true), &none(), &keys(10, 20), &mut t).is_err());
        assert!(check(&add(stats, true), &none(), &Read::Nothing, &mut t).is_ok());
        assert!(check(&add(stats, true), &none(), &Read::Table, &mut t).is_err());
    }

    #[test]
    fn a_truncated_string_maximum_bounds_nothing() {
        let long = "m".repeat(TRUNCATED_AT);
        let stats =
            serde_json::json!({"minValues": {"id": "a"}, "maxValues": {"id": long}}).to_string();
        let read = Read::Keys {
            column: "id".into(),
            range: KeyRange {
                lo: KeyBound::Text("n".into()),
                hi: KeyBound::Text("p".into()),
            },
        };
        assert!(check(&add(&stats, true), &none(), &read, &mut vec![]).is_err());
    }

    #[test]
    fn removes_metadata_and_transactions_conflict_but_the_watermark_is_dropped() {
        let mine = Mine {
            removes: HashSet::from(["p=1/a b.parquet".to_string()]),
            watermark_optional: true,
        };
        let remove = br#"{"remove":{"path":"p%3D1/a%20b.parquet","dataChange":true}}"#;
        assert!(matches!(
            check(remove, &mine, &Read::Nothing, &mut vec![]),
            Err(CommitConflictError::ConcurrentDeleteDelete)
        ));
        let meta = br#"{"metaData":{"id":"x"}}"#;
        assert!(check(meta, &none(), &Read::Nothing, &mut vec![]).is_err());
        let txn = |id: &str| format!(r#"{{"txn":{{"appId":"{id}","version":3}}}}"#);
        let mut txns = vec![Transaction::new("tributary.applied.x", 1)];
        assert!(matches!(
            check(
                txn("tributary.applied.x").as_bytes(),
                &none(),
                &Read::Nothing,
                &mut txns
            ),
            Err(CommitConflictError::ConcurrentTransaction)
        ));
        let mut txns = vec![
            Transaction::new(crate::model::WATERMARK_APP_ID, 1),
            Transaction::new("tributary.applied.x", 1),
        ];
        let w = txn(crate::model::WATERMARK_APP_ID);
        assert!(check(w.as_bytes(), &none(), &Read::Nothing, &mut txns).is_ok());
        assert_eq!(txns.len(), 1);
        // A commit of the watermark alone conflicts: its writer computes it again.
        let mut alone = vec![Transaction::new(crate::model::WATERMARK_APP_ID, 1)];
        let only = Mine::of(&[], &alone);
        assert!(check(w.as_bytes(), &only, &Read::Nothing, &mut alone).is_err());
    }

    /// `Op, ts, id, v` rows of one CDC file.
    fn cdc(ts: &str, rows: &[(&str, i64, i64)]) -> arrow::array::RecordBatch {
        use arrow::array::{ArrayRef, Int64Array, StringArray};
        arrow::array::RecordBatch::try_from_iter([
            (
                "Op",
                std::sync::Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0)))
                    as ArrayRef,
            ),
            (
                "ts",
                std::sync::Arc::new(StringArray::from_iter_values(rows.iter().map(|_| ts))),
            ),
            (
                "id",
                std::sync::Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            ),
            (
                "v",
                std::sync::Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
            ),
        ])
        .unwrap()
    }

    /// Two merges insert the same new key at once: each planned on a table without it (so
    /// each appends, declaring the key range it read). The one that commits second must
    /// conflict — the winner added a file whose key statistics overlap its range — and
    /// re-plan, finding the newer row: one row for the key, the newer change's. delta-rs's
    /// conflict checker does not check appends into a read range without DataFusion; had
    /// this commit missed it, the table would hold the key twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_insert_into_the_range_a_merge_read_makes_it_conflict_and_replan() {
        use crate::delta::testing::{Hook, Point};
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().unwrap();
        let (config, _) = crate::delta::testing::merged_table(
            dir.path(),
            &cdc("2024-01-01 00:00:00", &[("I", 10, 0), ("I", 20, 0)]),
        )
        .await;
        let src = &config.tables[0].source;
        let storage = crate::storage::Storage::new();
        let older = src.join("20240101-0000000002.parquet").unwrap();
        let newer = src.join("20240101-0000000003.parquet").unwrap();
        for (url, b) in [
            (&older, cdc("2024-01-01 00:00:01", &[("I", 15, 1)])),
            (&newer, cdc("2024-01-01 00:00:02", &[("U", 15, 2)])),
        ] {
            let bytes = crate::demo::to_parquet(&b).unwrap();
            storage.put(url, bytes).await.unwrap();
        }
        let first = crate::Engine::new(config.clone());
        let second = crate::Engine::new(config.clone());
        let (hook, fired) = Hook::once(move || {
            let (second, newer) = (second.clone(), newer.clone());
            async move {
                let r = second.process(&[newer]).await;
                assert_eq!(r.failures().count(), 0, "{:?}", r.files);
                assert_eq!(r.tables[0].inserted, 1);
            }
        });
        first.hooks().set(Point::BeforeMerge, "", hook);
        let r = first.process(&[older]).await;
        assert_eq!(r.failures().count(), 0, "{:?}", r.files);
        assert!(fired.load(Ordering::SeqCst));
        assert!(
            r.tables[0].commit_attempts >= 2,
            "the first merge conflicted: {:?}",
            r.tables[0]
        );
        let t = crate::delta::open(
            config.tables[0].target.as_ref().unwrap(),
            &Default::default(),
        )
        .await
        .unwrap();
        let b = crate::delta::testing::table_batch(&t, &["id", "v"], &["id"]).await;
        let rows = crate::delta::testing::text_values(&b);
        let text = |id: &str, v: &str| vec![Some(id.to_string()), Some(v.to_string())];
        assert_eq!(
            rows,
            vec![text("10", "0"), text("15", "2"), text("20", "0")]
        );
    }
}
