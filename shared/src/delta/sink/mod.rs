//! Delta Lake, the table format tributary writes: the `Sink` the engine merges through.
//!
//! - `batch`: the commit pipeline of a batch — plan, tombstones (pending, then confirmed),
//!   the write path chosen once (append, copy-on-write rewrite, delta-rs MERGE), retries with
//!   re-screening, the history, and the post-commit observers (`crate::delta::pipeline::publish`);
//! - `whole`: a large file appended whole in one commit;
//! - `recheck`: the post-commit tombstone re-check.

mod batch;
mod recheck;
mod whole;

use std::collections::HashMap;
use std::sync::Arc;

use deltalake::DeltaTable;
use url::Url;

use crate::config::TableConfig;
use crate::delta;
use crate::delta::catalog::Catalog;
use crate::error::Result;
use crate::report::{FileOutcome, FileStatus, TableReport, WritePath};
use crate::sink::{rescreen, screen, slices_of, Batch, Screened, Sink, View, Whole};
use crate::source::{self, ChangeSet};
use crate::storage::Storage;

/// A Delta table as a call reads it.
pub(crate) type TableView = View<DeltaTable>;

impl View<DeltaTable> {
    /// The table's state table (the current table, or the history of a history-only one).
    pub(crate) async fn open(cfg: &TableConfig, options: &HashMap<String, String>) -> Result<Self> {
        let table = delta::open(cfg.state_table()?, options).await?;
        Ok(View {
            schema: delta::arrow_schema(&table),
            props: delta::props(&table),
            table,
        })
    }
}

/// The Delta Lake sink: delta-rs options, the storage the tables live on, the Glue catalog
/// the commits' observers keep in step.
#[derive(Debug, Clone)]
pub struct DeltaSink {
    pub(crate) storage: Arc<Storage>,
    pub(crate) options: Arc<HashMap<String, String>>,
    pub(crate) catalog: Arc<Catalog>,
    /// Test code run at [`crate::delta::testing::Point`]s of this sink's commits.
    #[cfg(test)]
    pub(crate) hooks: crate::delta::testing::Hooks,
}

impl DeltaSink {
    pub(crate) fn new(storage: Arc<Storage>, catalog: Catalog) -> Self {
        DeltaSink {
            options: Arc::new(storage.options().clone()),
            storage,
            catalog: Arc::new(catalog),
            #[cfg(test)]
            hooks: Default::default(),
        }
    }

    /// Screening of change sets on a view (see [`super::screen`]).
    async fn screen(
        &self,
        table: &TableConfig,
        view: &TableView,
        sets: Vec<ChangeSet>,
    ) -> (Vec<ChangeSet>, Vec<FileOutcome>) {
        screen(self, table, view, sets).await
    }
}

impl Sink for DeltaSink {
    type Table = DeltaTable;

    async fn view(&self, cfg: &TableConfig) -> Result<TableView> {
        TableView::open(cfg, &self.options).await
    }

    async fn check_applied(
        &self,
        cfg: &TableConfig,
        view: &TableView,
        cs: &ChangeSet,
    ) -> Result<()> {
        crate::delta::applied::check_load_file(cfg, &view.table, &view.props, cs).await?;
        crate::delta::applied::check(cfg, &view.table, &crate::delta::applied::Identity::of(cs))
            .await
    }

    async fn commit(
        &self,
        cfg: &TableConfig,
        batch: &Batch<'_>,
        loaded: Option<DeltaTable>,
    ) -> Result<TableReport> {
        self.merge_batch(cfg, batch, loaded).await
    }

    async fn append_whole(
        &self,
        cfg: &TableConfig,
        file: &Url,
        raw: &source::RawFile,
    ) -> Result<Whole> {
        self.append_file_whole(cfg, file, raw).await
    }
}

/// [`rescreen`]'s check that needs the log: no other version of a file was applied since
/// it was screened (a concurrent writer; see `applied`).
pub(crate) async fn rescreen_contents(
    table: &TableConfig,
    target: &DeltaTable,
    files: &[Screened],
) -> Result<()> {
    for f in files {
        crate::delta::applied::check(table, target, &f.id).await?;
    }
    Ok(())
}
