//! CDC conventions: what a row of a change file means, whatever the file's encoding.
//!
//! A decoder (`parquet`, `csv`) turns a file's bytes into batches; a [`Convention`] says
//! what the batches' rows are — each row's operation, which of its columns are the table's,
//! which columns order the changes, which files are full loads, what a file's name says of
//! its time, and any change a row implies beyond itself. Everything after (keys checked,
//! order keys, the table's columns converted exactly, counts) is the same for every
//! convention ([`super::to_change_set`]).
//!
//! AWS DMS is the one convention of the product ([`super::dms::Dms`]); a test convention in
//! Debezium's shape (`super::debezium`) shows the seam: it merges through the engine with
//! no edit outside `source/` and `config/`.

use arrow::array::RecordBatch;
use chrono::{DateTime, Utc};

use super::{ChangeOp, FileInfo, Ordering, Spec};
use crate::config::Convention as Kind;
use crate::error::Result;
use crate::model::FileKind;

/// What a convention makes of a decoded batch.
pub(super) struct Changes {
    /// The rows, one per change, as flat columns under the table's names (the table's
    /// columns, plus any the convention orders by or that the table drops).
    pub(super) rows: RecordBatch,
    /// Each row's operation.
    pub(super) ops: Vec<ChangeOp>,
    /// Per column, the rows whose value the file does not carry (see
    /// [`super::ChangeSet::absent`]).
    pub(super) absent: Vec<(String, Vec<bool>)>,
    /// The columns of `rows` that order a CDC file's changes, most significant first (the
    /// first is also a history version's start).
    pub(super) sequence: Vec<String>,
    /// Columns of `rows` that are the convention's own, never the table's.
    pub(super) own: Vec<String>,
}

/// A CDC convention: see the module documentation.
pub(super) trait Convention: Sync {
    /// A file's kind, from its name.
    fn kind(&self, file_name: &str) -> FileKind;

    /// When a CDC file's changes were written, when its name says.
    fn name_time(&self, file_name: &str) -> Option<DateTime<Utc>>;

    /// Refuse, before reading it, a file whose changes could not be ordered.
    fn check_orderable(
        &self,
        name: &str,
        file_name: &str,
        kind: FileKind,
        cfg: &Spec,
    ) -> Result<()>;

    /// A batch of the file as changes.
    fn changes(&self, f: &FileInfo<'_>, raw: RecordBatch, cfg: &Spec) -> Result<Changes>;

    /// Changes the rows imply beyond themselves, appended after them with the order keys
    /// of the rows that imply them (DMS: an update that changes the key deletes the old
    /// key). `rows` is [`Changes::rows`]; `data`, `ops` and `ordering` the curated changes.
    fn implied(
        &self,
        _file: &str,
        _rows: &RecordBatch,
        _cfg: &Spec,
        curated: Curated,
    ) -> Result<Curated> {
        Ok(curated)
    }
}

/// A batch's changes in the table's columns, their operations and order.
pub(super) struct Curated {
    pub(super) data: RecordBatch,
    pub(super) ops: Vec<ChangeOp>,
    pub(super) ordering: Ordering,
}

/// The convention a table's files follow.
pub(super) fn of(cfg: &Spec) -> &'static dyn Convention {
    of_kind(cfg.convention)
}

/// The convention of this kind.
pub(super) fn of_kind(kind: Kind) -> &'static dyn Convention {
    match kind {
        Kind::Dms => &super::dms::Dms,
        #[cfg(test)]
        Kind::DebeziumShaped => &super::debezium::DebeziumShaped,
    }
}
