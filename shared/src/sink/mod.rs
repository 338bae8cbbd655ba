//! The table format behind the merge engine: what the engine asks of the tables it keeps,
//! whatever format they are in (docs/design.md, "Layers").
//!
//! The engine (routing, reading, screening, grouping, large files, bad-file isolation) sees
//! a table only through [`Sink`]: a [`View`] of it for screening and admission, the check of
//! the files it applied, one commit per [`Batch`], and a large file appended whole where the
//! format can. Delta Lake is the one implementation (`crate::delta::sink::DeltaSink`: the commit
//! pipeline — write path, retries, tombstones, history, post-commit observers); an Iceberg
//! sink would be another, and so is the in-memory test double (`memory::MemorySink`),
//! which the engine's tests run on.

#[cfg(test)]
pub(crate) mod memory;

use chrono::{DateTime, Utc};
use url::Url;

use crate::config::TableConfig;
use crate::error::{Error, Result};
use crate::props::TableProps;
use crate::report::{FileOutcome, TableReport};
use crate::source::{self, ChangeSet, Digest, FileKind, SeqKind};
use crate::storage;

/// A table format: see the module documentation.
pub(crate) trait Sink: Sync {
    /// A handle on a table as last read (for Delta, the loaded `DeltaTable`).
    type Table: Send + Sync;

    /// The table as the files of a call are screened and admitted on: its columns and
    /// tributary's properties (`schema` is `None` while the table does not exist).
    async fn view(&self, cfg: &TableConfig) -> Result<View<Self::Table>>;

    /// Screening against what the table records of the files it applied: a full-load file
    /// of a reload not applied yet, a CDC file applied before with other contents
    /// (`reuploaded`), an unrecorded file older than the records (`too_late`).
    async fn check_applied(
        &self,
        cfg: &TableConfig,
        view: &View<Self::Table>,
        cs: &ChangeSet,
    ) -> Result<()>;

    /// One batch of admitted change sets into the table: one commit (and its retries).
    /// `loaded` is the table the batch was screened on, for the first attempt.
    async fn commit(
        &self,
        cfg: &TableConfig,
        batch: &Batch<'_>,
        loaded: Option<Self::Table>,
    ) -> Result<TableReport>;

    /// A file larger than a slice applied as one append, reading it once, where the format
    /// and the table allow; else [`Whole::Fallback`] and the engine merges it slice by slice.
    async fn append_whole(
        &self,
        cfg: &TableConfig,
        file: &Url,
        raw: &source::RawFile,
    ) -> Result<Whole>;
}

/// A table as a call reads it (see [`Sink::view`]).
pub(crate) struct View<T> {
    pub(crate) table: T,
    pub(crate) schema: Option<arrow::datatypes::SchemaRef>,
    pub(crate) props: TableProps,
}

impl<T> View<T> {
    /// The table, when it exists (for a commit's first attempt).
    pub(crate) fn loaded(self) -> Option<T> {
        self.schema.is_some().then_some(self.table)
    }
}

/// What one commit applies.
#[derive(Debug, Clone)]
pub(crate) struct Batch<'a> {
    /// Admitted change sets (see [`crate::plan::admit`]).
    pub changes: &'a [ChangeSet],
    /// The sequence kinds the batch establishes: recorded on a table that has none.
    pub kinds: Option<Vec<SeqKind>>,
    /// A reload: delete rows below this order key that no change matches.
    pub delete_unmatched_below: Option<String>,
}

impl Batch<'_> {
    /// A report of the batch's files and rows, nothing applied yet.
    pub(crate) fn report(&self, table: &TableConfig) -> TableReport {
        TableReport {
            table: table.name.clone(),
            files: self.changes.len(),
            source_rows: self.changes.iter().map(|c| c.counts.rows).sum(),
            ..Default::default()
        }
    }

    /// The batch's files, as logs and commits name them.
    pub(crate) fn file_names(&self) -> Vec<String> {
        self.changes
            .iter()
            .map(|c| storage::display(&c.file))
            .collect()
    }
}

/// How a whole-file append ended ([`Sink::append_whole`]).
pub(crate) enum Whole {
    /// Applied in one commit (the report), or settled by screening (`None`); the file's
    /// outcome.
    Done(Option<Box<TableReport>>, Vec<FileOutcome>),
    /// Not appendable as a whole: merge it slice by slice.
    Fallback(&'static str),
}

/// Refuse files that cannot be applied safely: written before the tombstone horizon (they
/// could revive a deleted row), full-load files of a reload not applied yet, CDC files
/// applied before with other contents ([`Sink::check_applied`]). Files of a generation older
/// than the table's are already reflected by the reload that replaced it: they are done,
/// with nothing to change. The files kept, and the outcomes of those screening settled.
pub(crate) async fn screen<S: Sink>(
    sink: &S,
    table: &TableConfig,
    view: &View<S::Table>,
    sets: Vec<ChangeSet>,
) -> (Vec<ChangeSet>, Vec<FileOutcome>) {
    let mut kept = Vec::with_capacity(sets.len());
    let mut outcomes = Vec::new();
    for cs in sets {
        // A file of a generation older than the table's: a reload already reflects it.
        if cs.generation < view.props.generation() {
            tracing::info!(table = %table.name, file = %storage::display(&cs.file), generation = cs.generation, current = view.props.generation(), "older than the table's full load (a reload reflects it); nothing to change");
            outcomes.extend(FileOutcome::merged(table, std::slice::from_ref(&cs)));
            continue;
        }
        let verdict = match check_horizon(table, &view.props, &cs.file, cs.written) {
            Ok(()) => sink.check_applied(table, view, &cs).await,
            Err(e) => Err(e),
        };
        match verdict {
            Ok(()) => kept.push(cs),
            Err(e) => {
                FileOutcome::log_failure(&table.name, &cs.file, &e);
                outcomes.push(FileOutcome::failed(
                    cs.file,
                    &table.name,
                    std::sync::Arc::new(e),
                ));
            }
        }
    }
    (kept, outcomes)
}

/// What screening decided a file on ([`screen`]), checked again before a commit.
#[derive(Debug, Clone)]
pub(crate) struct Screened {
    pub(crate) id: Identity,
    written: Option<chrono::DateTime<chrono::Utc>>,
    generation: u32,
}

impl Screened {
    pub(crate) fn of(cs: &ChangeSet) -> Self {
        Screened {
            id: Identity::of(cs),
            written: cs.written,
            generation: cs.generation,
        }
    }
}

/// The screening of files, checked again against the table a commit is about to be based
/// on: a DMS reload (a newer generation) or a tombstone horizon moved since would make them
/// inapplicable — a reload deletes rows without tombstones, so an older file committed
/// after it could bring them back.
pub(crate) fn rescreen<'a>(
    table: &TableConfig,
    props: &TableProps,
    files: impl IntoIterator<Item = &'a Screened>,
) -> Result<()> {
    for f in files {
        check_horizon(table, props, &f.id.file, f.written)?;
        if f.generation < props.generation() {
            return Err(Error::Reloaded {
                table: table.name.clone(),
                file: storage::display(&f.id.file),
            });
        }
    }
    Ok(())
}

/// A large file opened for reading in the table's slices.
pub(crate) fn slices_of<T>(
    table: &TableConfig,
    view: &View<T>,
    file: &Url,
    raw: &source::RawFile,
) -> Result<source::Slices> {
    source::Slices::open(
        file,
        raw,
        source::Spec::of(table),
        view.schema.as_deref(),
        &view.props,
        table.limits.slice_rows,
        table.limits.slice_bytes,
    )
}

/// What identifies a file's version: its name, its kind, its digest; and when it was
/// written (the DMS file-name time, else its modification time).
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) file: Url,
    pub(crate) kind: FileKind,
    pub(crate) digest: Option<Digest>,
    pub(crate) written: Option<DateTime<Utc>>,
}

impl Identity {
    pub(crate) fn of(cs: &ChangeSet) -> Self {
        Identity {
            file: cs.file.clone(),
            kind: cs.kind,
            digest: cs.digest,
            written: cs.written,
        }
    }
}

/// Refuse a file written before the table's tombstone horizon: a delete of one of its keys
/// may have been recorded and forgotten since, and applying the file could revive the row.
pub(crate) fn check_horizon(
    cfg: &TableConfig,
    props: &TableProps,
    file: &url::Url,
    written: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<()> {
    match (props.tombstone_horizon, written) {
        (Some(h), Some(w)) if w <= h => Err(Error::TooLate {
            table: cfg.name.clone(),
            file: crate::storage::display(file),
            written: w.to_rfc3339(),
            horizon: h.to_rfc3339(),
        }),
        _ => Ok(()),
    }
}
