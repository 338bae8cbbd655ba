//! An in-memory table format: the test double of [`Sink`] (compiled only for tests). A
//! table is a map from primary key to the row of its newest change, plus the order key of
//! every delete (its tombstone): a change applies only when it is newer than what the key
//! has — the order guard every sink owes the engine. What a second format must implement
//! to take the engine's files, and nothing else.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};
use url::Url;

use super::{Batch, Sink, View, Whole};
use crate::config::TableConfig;
use crate::error::{Error, Result};
use crate::plan::{self, KeyEncoder, PlanOp};
use crate::props::TableProps;
use crate::report::TableReport;
use crate::source::{self, ChangeSet, SeqKind};

#[derive(Default)]
struct Table {
    schema: Option<SchemaRef>,
    kinds: Option<Vec<SeqKind>>,
    /// Key (row-encoded) → (order key, the row in the table's columns).
    rows: BTreeMap<Vec<u8>, (String, RecordBatch)>,
    /// Key → order key of its newest delete.
    deleted: HashMap<Vec<u8>, String>,
    commits: u64,
}

/// See the module documentation.
#[derive(Default)]
pub(crate) struct MemorySink {
    tables: Mutex<HashMap<String, Table>>,
}

impl MemorySink {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, HashMap<String, Table>>> {
        self.tables
            .lock()
            .map_err(|_| Error::internal("memory sink lock poisoned"))
    }

    /// The rows of a table (in key order): each row's `columns`, as text.
    pub(crate) fn rows(&self, table: &str, columns: &[&str]) -> Vec<Vec<String>> {
        let tables = self.tables.lock().expect("lock");
        let Some(t) = tables.get(table) else {
            return Vec::new();
        };
        t.rows
            .values()
            .map(|(_, row)| {
                columns
                    .iter()
                    .map(|c| {
                        let col = row.column_by_name(c).expect("column");
                        let text = arrow::compute::cast(col, &DataType::Utf8).expect("text");
                        text.as_string::<i32>().value(0).to_string()
                    })
                    .collect()
            })
            .collect()
    }

    /// Commits made to a table.
    pub(crate) fn commits(&self, table: &str) -> u64 {
        self.tables
            .lock()
            .expect("lock")
            .get(table)
            .map_or(0, |t| t.commits)
    }
}

impl Sink for MemorySink {
    type Table = ();

    async fn view(&self, cfg: &TableConfig) -> Result<View<()>> {
        let tables = self.lock()?;
        let t = tables.get(&cfg.name);
        let props = t
            .and_then(|t| t.kinds.as_deref())
            .map(|k| TableProps::from_configuration(&TableProps::for_kinds(k)))
            .unwrap_or_default();
        Ok(View {
            table: (),
            schema: t.and_then(|t| t.schema.clone()),
            props,
        })
    }

    async fn check_applied(&self, _: &TableConfig, _: &View<()>, _: &ChangeSet) -> Result<()> {
        Ok(())
    }

    async fn commit(
        &self,
        cfg: &TableConfig,
        batch: &Batch<'_>,
        _loaded: Option<()>,
    ) -> Result<TableReport> {
        let plan = plan::plan(cfg, batch.changes)?;
        let mut report = batch.report(cfg);
        report.superseded_in_batch = plan.superseded;
        let schema = plan.table_schema();
        let rows = plan
            .batch
            .project(
                &schema
                    .fields()
                    .iter()
                    .map(|f| plan.batch.schema().index_of(f.name()))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(Error::arrow)?,
            )
            .map_err(Error::arrow)?;
        let keys = KeyEncoder::new(&plan.batch.schema(), &cfg.primary_key)?.encode(&plan.batch)?;
        let ops = plan.ops()?;
        let seq = plan
            .column(&cfg.writing.sequence_column)?
            .as_string::<i32>()
            .clone();
        let mut tables = self.lock()?;
        let t = tables.entry(cfg.name.clone()).or_default();
        if t.kinds.is_none() {
            t.kinds.clone_from(&batch.kinds);
        }
        if t.schema.is_none() {
            t.schema = Some(schema);
        }
        for (i, key) in keys.iter().enumerate() {
            let (k, s) = (key.as_ref().to_vec(), seq.value(i).to_string());
            let stale = t.rows.get(&k).is_some_and(|(o, _)| *o >= s)
                || t.deleted.get(&k).is_some_and(|o| *o >= s);
            if stale {
                report.skipped_stale += 1;
                continue;
            }
            match ops[i] {
                PlanOp::Delete => {
                    if t.rows.remove(&k).is_some() {
                        report.deleted += 1;
                    }
                    report.tombstones_recorded += 1;
                    t.deleted.insert(k, s);
                }
                PlanOp::Upsert => {
                    match t.rows.insert(k, (s, rows.slice(i, 1))) {
                        Some(_) => report.updated += 1,
                        None => report.inserted += 1,
                    };
                }
            }
        }
        t.commits += 1;
        report.version = Some(t.commits);
        report.commit_attempts = 1;
        Ok(report)
    }

    async fn append_whole(&self, _: &TableConfig, _: &Url, _: &source::RawFile) -> Result<Whole> {
        Ok(Whole::Fallback("the memory sink appends nothing whole"))
    }
}
