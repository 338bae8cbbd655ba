//! Full loads and DMS table reloads.
//!
//! Every full-load file applied to a table is recorded in the commit that applies it, as a
//! Delta application transaction `tributary.load/<file>` whose version is the object's
//! last-modified time (ms). A DMS reload rewrites `LOAD00000001.*`… with the source's current
//! rows: the same names, newer objects. The merge path refuses such a file ([`Error::Reload`]):
//! a reload must be applied as a whole, because rows absent from it must be deleted and that
//! is only known once every file of the reload is there.
//!
//! [`reload`] applies it: the files of the new full load plus every CDC file written since it
//! started become generation g+1 (order keys above everything before, see
//! `source::order`), and one MERGE upserts them and deletes every row of an older
//! generation that they do not contain — one commit, so readers see the table before or
//! after the reload, never in between. Files of older generations that arrive later are
//! already reflected in the reload and change nothing.

use chrono::{DateTime, Utc};
use serde::Serialize;
use url::Url;

use crate::config::TableConfig;
use crate::delta;
use crate::delta::sink::TableView;
use crate::delta::Engine;
use crate::engine::{Batch, TableReport};
use crate::error::{Error, Result};
use crate::plan;
use crate::props::TableProps;
use crate::source::{self, order, FileClass, FileKind};
use crate::storage::{self, Listed};

/// What a reload did.
#[derive(Debug, Clone, Serialize)]
pub struct ReloadReport {
    pub table: String,
    /// The generation the reload became.
    pub generation: u32,
    /// When its first full-load file was written (files written since belong to it).
    pub started: DateTime<Utc>,
    pub load_files: usize,
    pub cdc_files: usize,
    /// Full-load files of an earlier load that the reload did not rewrite (not applied).
    pub earlier_load_files: Vec<String>,
    pub merge: TableReport,
}

/// Apply a DMS table reload: see the module documentation.
pub async fn reload(engine: &Engine, table_name: &str) -> Result<ReloadReport> {
    let cfg = engine.config().table(table_name).ok_or_else(|| {
        Error::config(
            &engine.config().origin,
            format!("no table named `{table_name}` is configured"),
        )
    })?;
    if cfg.history.is_some() {
        return Err(Error::config(
            &cfg.name,
            "applying a reload to a table with a history table is not supported yet: the history would not close the versions of rows the reload deletes",
        ));
    }
    let view = TableView::open(cfg, engine.storage_options()).await?;
    if !delta::exists(&view.table) {
        return Err(Error::config(
            &cfg.name,
            "the Delta table does not exist yet: merge the full load as usual (`tributary merge` of the source prefix, or the S3 events)",
        ));
    }
    let listed = data_files(cfg, engine).await?;
    let (loads, earlier) = new_load(cfg, &view, &listed).await?;
    let started = loads
        .iter()
        .map(|l| l.last_modified)
        .min()
        .ok_or_else(|| Error::internal("a new full load without files"))?;
    let generation = register(&view, started).await?;
    let cdc: Vec<&Listed> = listed
        .iter()
        .filter(|l| {
            let name = storage::file_name(&l.url);
            source::file_kind(cfg, &name) == FileKind::Cdc
                && source::name_time(cfg, &name).unwrap_or(l.last_modified) >= started
        })
        .collect();
    let view = TableView::open(cfg, engine.storage_options()).await?;
    let urls: Vec<Url> = loads
        .iter()
        .chain(cdc.iter())
        .map(|l| l.url.clone())
        .collect();
    // A reload is all or nothing: the first file that cannot be applied fails it.
    // A reload is one commit: its files are read whole (not in slices).
    let read = engine.read_files(cfg, &urls, &view, false).await;
    let (sets, failures) = (read.sets, read.failed);
    let admission = plan::admit(
        sets,
        &cfg.primary_key,
        view.schema.as_deref(),
        view.props.sequence_kinds.as_deref(),
    );
    if let Some((_, e)) = failures.into_iter().chain(admission.rejected).next() {
        return Err(e);
    }
    let batch = Batch {
        changes: &admission.admitted,
        kinds: admission.kinds.clone(),
        delete_unmatched_below: Some(order::generation_floor(generation)),
    };
    // Boxed: a reload future inside the maintenance function's nears rustc's layout depth limit.
    let merge = Box::pin(engine.merge_batch(cfg, &batch, Some(view.table))).await?;
    Ok(ReloadReport {
        table: cfg.name.clone(),
        generation,
        started,
        load_files: loads.len(),
        cdc_files: cdc.len(),
        earlier_load_files: earlier.iter().map(|l| storage::display(&l.url)).collect(),
        merge,
    })
}

/// The data files under the table's source (anything else there is an error, as in the
/// merge path).
async fn data_files(cfg: &TableConfig, engine: &Engine) -> Result<Vec<Listed>> {
    let mut out = Vec::new();
    for l in engine.storage().list_meta(&cfg.source).await? {
        match source::classify(&l.url, &cfg.format) {
            Ok(FileClass::Data) => out.push(l),
            Ok(FileClass::NotData(_)) => {}
            Err(m) => {
                return Err(Error::bad_input(
                    &storage::display(&l.url),
                    crate::error::Location::File,
                    m,
                ))
            }
        }
    }
    Ok(out)
}

/// The full-load files of the new load, and those of an earlier load it did not rewrite.
/// The new load is every file whose object differs from the version the table applied,
/// plus unrecorded files written since the first of those.
async fn new_load<'a>(
    cfg: &TableConfig,
    view: &TableView,
    listed: &'a [Listed],
) -> Result<(Vec<&'a Listed>, Vec<&'a Listed>)> {
    let mut changed = Vec::new();
    let mut unrecorded = Vec::new();
    let mut same = Vec::new();
    for l in listed
        .iter()
        .filter(|l| source::file_kind(cfg, &storage::file_name(&l.url)) == FileKind::FullLoad)
    {
        let id = crate::delta::applied::load_app_id(cfg, &l.url);
        match delta::txn_version(&view.table, &id).await? {
            Some(v) if v == l.last_modified.timestamp_millis() => same.push(l),
            Some(_) => changed.push(l),
            None => unrecorded.push(l),
        }
    }
    let since = changed.iter().map(|l| l.last_modified).min();
    let newest_applied = same.iter().map(|l| l.last_modified).max();
    let (new_unrecorded, old_unrecorded): (Vec<&Listed>, Vec<&Listed>) = unrecorded
        .into_iter()
        .partition(|l| match (since, newest_applied) {
            (Some(s), _) => l.last_modified >= s,
            (None, Some(n)) => l.last_modified > n,
            (None, None) => true,
        });
    changed.extend(new_unrecorded);
    if changed.is_empty() {
        return Err(Error::config(
            &cfg.name,
            format!(
                "no new full load found under {}: every LOAD file there is the version the table applied",
                storage::display(&cfg.source)
            ),
        ));
    }
    same.extend(old_unrecorded);
    Ok((changed, same))
}

/// Register the new generation (idempotent: a re-run after a failed reload reuses it).
async fn register(view: &TableView, started: DateTime<Utc>) -> Result<u32> {
    if let Some((g, s)) = view.props.generations.last() {
        if *s == started {
            return Ok(*g);
        }
    }
    let g = view.props.generation() + 1;
    let mut props = TableProps::for_generation(g, started);
    props.insert(crate::props::LOAD_TRACKING.into(), "true".into());
    delta::set_properties(view.table.clone(), props).await?;
    Ok(g)
}
