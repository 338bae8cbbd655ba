//! The post-commit tombstone re-check (docs/design.md, "Deletes and tombstones").
//!
//! A concurrent writer may record a tombstone after this merge read them, and its MERGE may
//! have found no row to delete (ours was not committed yet): then our upsert revived the
//! row. After committing upserts, read the tombstones of our keys again and delete what a
//! newer tombstone supersedes. The deleting writer records its tombstones after its MERGE
//! and then, if the table moved since its read, applies its deletes again
//! (`DeltaSink::reapply_deletes`): one of the two writers always sees the other.

use deltalake::DeltaTable;

use crate::config::TableConfig;
use crate::delta::tombstones::{self, Tombstones};
use crate::delta::{self, MergeExtras};
use crate::error::{Error, Result};
use crate::plan::{self, MergePlan};

/// What a re-check deleted (rows a newer tombstone superseded) and the files it changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rechecked {
    pub(super) deleted: usize,
    /// Rows of the plan the tombstones turned into deletes.
    pub(super) blocked: usize,
    pub(super) files_added: usize,
    pub(super) files_removed: usize,
}

impl std::ops::AddAssign for Rechecked {
    fn add_assign(&mut self, o: Self) {
        self.deleted += o.deleted;
        self.blocked += o.blocked;
        self.files_added += o.files_added;
        self.files_removed += o.files_removed;
    }
}

/// Rounds of re-checking before giving up (each round means yet another concurrent delete).
const MAX_ROUNDS: u32 = 5;

pub(super) async fn recheck_tombstones(
    table: &TableConfig,
    mut target: DeltaTable,
    plan: &mut MergePlan,
    tombs: &mut Tombstones<'_>,
    files: &[String],
) -> Result<(DeltaTable, Rechecked)> {
    let mut done = Rechecked::default();
    if plan.upserts == 0 {
        return Ok((target, done));
    }
    for _ in 0..MAX_ROUNDS {
        // Unchanged tombstone table since the last read: nothing new to apply.
        let Some(read) = tombs.read_if_changed(plan).await? else {
            return Ok((target, done));
        };
        let Some(mut fix) = tombstones::superseded_upserts(table, plan, &read)? else {
            return Ok((target, done));
        };
        plan::apply_tombstones(plan, table, &read)?;
        delta::align_to_table(table, &mut fix, &target)?;
        let (t, _, m) =
            super::batch::write(table, target, &fix, files, &MergeExtras::default()).await?;
        target = t;
        done += Rechecked {
            deleted: m.deleted,
            blocked: fix.deletes,
            files_added: m.files_added,
            files_removed: m.files_removed,
        };
    }
    Err(Error::Contention {
        table: table.name.clone(),
        attempts: MAX_ROUNDS,
    })
}
