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

use crate::delta::writer::Writer;
use deltalake::kernel::{Action, LogicalFileView};
use deltalake::protocol::DeltaOperation;
use deltalake::DeltaTable;

use crate::delta::manifest::Partition;
use crate::error::{Error, Result};

/// Files to compact, per partition (each bin becomes files near the target).
pub(super) struct CompactionPlan {
    pub(super) partitions: Vec<(Partition, Vec<Vec<LogicalFileView>>)>,
}

impl CompactionPlan {
    /// Partitions with at least one bin.
    pub(super) fn len(&self) -> usize {
        self.partitions.len()
    }
}

/// The files smaller than `target` in each of `partitions`, and those whose deletion vector
/// is to be materialised (`every_vector`: any vector, as the manifests need; else past
/// `vectors::MATERIALISE_SHARE`), binned greedily (in log order) up to `target` bytes; bins
/// of one file without such a vector are dropped (nothing to gain), and so are partitions
/// left without a bin.
pub(super) fn plan(
    table: &DeltaTable,
    partitions: &[Partition],
    target: u64,
    every_vector: bool,
) -> Result<CompactionPlan> {
    let materialise = |f: &LogicalFileView| {
        f.deletion_vector_descriptor().is_some() && (every_vector || materialise(f))
    };
    let label = table.table_url().to_string();
    let snapshot = table.snapshot().map_err(|e| Error::delta(&label, e))?;
    let columns = snapshot.metadata().partition_columns().to_vec();
    // Per partition: its bins and the size of the last one.
    let mut bins: std::collections::BTreeMap<Partition, (Vec<Vec<LogicalFileView>>, u64)> =
        partitions
            .iter()
            .map(|p| (p.clone(), (vec![vec![]], 0)))
            .collect();
    for f in snapshot.log_data().iter() {
        let size = f.size().max(0) as u64;
        let vector = materialise(&f);
        if size >= target && !vector {
            continue;
        }
        let Some((b, bin_size)) = bins.get_mut(&Partition::of(&f, &columns)) else {
            continue;
        };
        if *bin_size + size > target && !b.last().is_some_and(Vec::is_empty) {
            b.push(vec![]);
            *bin_size = 0;
        }
        *bin_size += size;
        if let Some(last) = b.last_mut() {
            last.push(f);
        }
    }
    let partitions = bins
        .into_iter()
        .filter_map(|(p, (mut b, _))| {
            b.retain(|b| b.len() >= 2 || b.iter().any(&materialise));
            (!b.is_empty()).then_some((p, b))
        })
        .collect();
    Ok(CompactionPlan { partitions })
}

/// Rewrite the plan's bins and commit with the application transaction `guard`: returns
/// the number of files removed and the table after the commit.
pub(super) async fn execute(
    table: DeltaTable,
    plan: CompactionPlan,
    (target, props): (u64, parquet::file::properties::WriterProperties),
    guard: deltalake::kernel::Transaction,
) -> Result<(u64, DeltaTable)> {
    if plan.partitions.is_empty() {
        return Ok((0, table));
    }
    let label = table.table_url().to_string();
    let delta_err = |e| Error::delta(&label, e);
    let snapshot = table.snapshot().map_err(delta_err)?;
    let store = table.log_store().object_store(None);
    let table_files = crate::delta::datafile::TableFiles::of(&table);
    let schema = snapshot.snapshot().arrow_schema();
    let mut actions = Vec::new();
    let mut removed = 0u64;
    // Collected first: an iterator adapter's closure held across the awaits below would make
    // the future not `Send`.
    let bins: Vec<(&Partition, &Vec<LogicalFileView>)> = plan
        .partitions
        .iter()
        .flat_map(|(p, bins)| bins.iter().map(move |b| (p, b)))
        .collect();
    for (partition, bin) in bins {
        let config = crate::delta::writer_config(
            snapshot,
            Some(props.clone()),
            std::num::NonZeroU64::new(target),
        );
        let mut writer = Writer::new(store.clone(), config);
        for f in bin {
            let batches =
                table_files
                    .read(f, &schema, partition)
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
    let operation = DeltaOperation::Optimize {
        predicate: Some(
            plan.partitions
                .iter()
                .map(|(p, _)| p.folder())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        target_size: target as i64,
    };
    // It read the files it removes: a concurrent commit removing one of them conflicts.
    let read = crate::delta::Read::Nothing;
    let table =
        crate::delta::commit_actions(&label, table, actions, operation, read, &[], &[guard])
            .await?;
    Ok((removed, table))
}

/// Whether a file's deletion vector deletes enough of its rows to rewrite it without them
/// (`vectors::materialise`), when it is not small.
fn materialise(f: &LogicalFileView) -> bool {
    f.deletion_vector_descriptor().is_some_and(|d| {
        crate::delta::vectors::materialise(
            d.cardinality.max(0) as u64,
            f.num_records().map(|n| n as u64),
        )
    })
}
