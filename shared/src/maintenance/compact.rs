//! Compaction of small files, committed by tributary itself.
//!
//! delta-rs's OPTIMIZE cannot be used here: it commits without the application transaction
//! ids of the commit properties, and its conflict checker ignores removes that do not change
//! data — so two OPTIMIZEs of the same files both commit and every compacted row is there
//! twice (docs/design.md, "Concurrency"). This module reads a partition's small files,
//! writes them again through delta-rs's `DeltaWriter` (the same Parquet writer and file
//! statistics as every other write), and commits removes and adds with `dataChange = false`
//! and the [`super::MAINTENANCE_APP_ID`] transaction id, so that two compactions based on
//! the same version conflict, and a compaction that lost a file to a merge conflicts too.

use deltalake::datafile::writer::DeltaWriter;
use deltalake::kernel::transaction::CommitBuilder;
use deltalake::kernel::{Action, LogicalFileView};
use deltalake::protocol::DeltaOperation;
use deltalake::DeltaTable;

use crate::error::{Error, Result};
use crate::manifest::Partition;

/// Files of one partition to compact together (each bin becomes files near the target).
pub(super) struct CompactionPlan {
    pub(super) partition: Partition,
    pub(super) bins: Vec<Vec<LogicalFileView>>,
}

/// The partition's files smaller than `target`, binned greedily (in log order) up to
/// `target` bytes; bins of one file are dropped (nothing to gain).
pub(super) fn plan(
    table: &DeltaTable,
    partition: &Partition,
    target: u64,
) -> Result<CompactionPlan> {
    let label = table.table_url().to_string();
    let snapshot = table.snapshot().map_err(|e| Error::delta(&label, e))?;
    let columns = snapshot.metadata().partition_columns().to_vec();
    let mut bins: Vec<Vec<LogicalFileView>> = vec![vec![]];
    let mut bin_size = 0u64;
    for f in snapshot.log_data().iter() {
        let p = Partition::of(&f, &columns);
        let size = f.size().max(0) as u64;
        if &p != partition || size >= target {
            continue;
        }
        if bin_size + size > target && !bins.last().is_some_and(Vec::is_empty) {
            bins.push(vec![]);
            bin_size = 0;
        }
        bin_size += size;
        if let Some(b) = bins.last_mut() {
            b.push(f);
        }
    }
    bins.retain(|b| b.len() >= 2);
    Ok(CompactionPlan {
        partition: partition.clone(),
        bins,
    })
}

/// Rewrite the plan's bins and commit: returns the number of files removed.
pub(super) async fn execute(
    table: &DeltaTable,
    plan: CompactionPlan,
    (target, props): (u64, parquet::file::properties::WriterProperties),
    commit: deltalake::kernel::transaction::CommitProperties,
) -> Result<u64> {
    if plan.bins.is_empty() {
        return Ok(0);
    }
    let label = table.table_url().to_string();
    let delta_err = |e| Error::delta(&label, e);
    let snapshot = table.snapshot().map_err(delta_err)?;
    let store = table.log_store().object_store(None);
    let schema = snapshot.snapshot().arrow_schema();
    let mut actions = Vec::new();
    let mut removed = 0u64;
    for bin in &plan.bins {
        let config = crate::delta::writer_config(
            snapshot,
            Some(props.clone()),
            std::num::NonZeroU64::new(target),
        );
        let mut writer = DeltaWriter::new(store.clone(), config);
        for f in bin {
            let batches = crate::datafile::read(store.clone(), f, &schema, &plan.partition)
                .await
                .map_err(|e| Error::Compaction {
                    file: e.file,
                    message: e.message,
                })?;
            for batch in batches {
                writer.write(&batch).await.map_err(delta_err)?;
            }
            actions.push(Action::Remove(f.remove_action(false)));
            removed += 1;
        }
        for mut add in writer.close().await.map_err(delta_err)? {
            add.data_change = false;
            actions.push(Action::Add(add));
        }
    }
    CommitBuilder::from(commit)
        .with_actions(actions)
        .build(
            Some(snapshot),
            table.log_store(),
            DeltaOperation::Optimize {
                predicate: Some(plan.partition.folder()),
                target_size: target as i64,
            },
        )
        .await
        .map_err(delta_err)?;
    Ok(removed)
}
