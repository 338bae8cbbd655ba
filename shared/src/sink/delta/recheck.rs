//! The post-commit tombstone re-check (docs/design.md, "Deletes and tombstones").
//!
//! A concurrent writer may record a tombstone after this merge read them, and its MERGE may
//! have found no row to delete (ours was not committed yet): then our upsert revived the
//! row. After committing upserts, read the tombstones of our keys again and delete what a
//! newer tombstone supersedes. The deleting writer records its tombstones after its MERGE
//! and then, if the table moved since its read, applies its deletes again
//! (`DeltaSink::reapply_deletes`): one of the two writers always sees the other.

use deltalake::DeltaTable;

use super::TableReport;
use crate::config::TableConfig;
use crate::delta::{self, MergeExtras};
use crate::error::{Error, Result};
use crate::plan::{self, MergePlan};
use crate::tombstones::{self, Tombstones};

/// Rounds of re-checking before giving up (each round means yet another concurrent delete).
const MAX_ROUNDS: u32 = 5;

pub(super) async fn recheck_tombstones(
    table: &TableConfig,
    mut target: DeltaTable,
    plan: &mut MergePlan,
    tombs: &mut Tombstones<'_>,
    files: &[String],
    report: &mut TableReport,
) -> Result<DeltaTable> {
    if plan.upserts == 0 {
        return Ok(target);
    }
    for _ in 0..MAX_ROUNDS {
        // Unchanged tombstone table since the last read: nothing new to apply.
        let Some(read) = tombs.read_if_changed(plan).await? else {
            return Ok(target);
        };
        let Some(mut fix) = tombstones::superseded_upserts(table, plan, &read)? else {
            return Ok(target);
        };
        plan::apply_tombstones(plan, table, &read)?;
        delta::align_to_table(table, &mut fix, &target)?;
        let (t, _, m) =
            super::batch::write(table, target, &fix, files, &MergeExtras::default()).await?;
        target = t;
        report.deleted += m.deleted;
        report.blocked_by_tombstone += fix.deletes;
        report.files_added += m.files_added;
        report.files_removed += m.files_removed;
    }
    Err(Error::Contention {
        table: table.name.clone(),
        attempts: MAX_ROUNDS,
    })
}
