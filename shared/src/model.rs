//! The vocabulary every layer shares: kinds of files and sequence values, and the names of
//! tributary's own columns. Imports nothing of the crate: the bottom layer.

use std::fmt;

/// Prefix reserved for tributary's own columns; source columns may not use it.
pub(crate) const RESERVED_PREFIX: &str = "_tributary_";
/// The application transaction id of a table's watermark.
pub(crate) const WATERMARK_APP_ID: &str = "tributary.watermark";

/// History table: order key of the last change a version absorbed.
pub const LAST_SEQ_COLUMN: &str = "_tributary_last_seq";
/// History table: order key of the change that closed a version.
pub const END_SEQ_COLUMN: &str = "_tributary_end_seq";

/// Column of the tombstone table holding the wall-clock time a delete was recorded.
pub(crate) const DELETED_AT_COLUMN: &str = "deleted_at";

/// Whether a file is part of a full load (`LOAD*`) or a CDC file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum FileKind {
    FullLoad,
    Cdc,
}

impl FileKind {
    /// DMS names full-load files `LOAD00000001.*`; everything else is CDC.
    pub(crate) fn of(file_name: &str) -> FileKind {
        if file_name.starts_with("LOAD") {
            FileKind::FullLoad
        } else {
            FileKind::Cdc
        }
    }
}

/// How the values of a sequence column are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqKind {
    /// Instants (timestamps, dates, timestamp-like text), as UTC.
    Timestamp,
    /// Integers (any width, signed or not).
    Integer,
    /// Text compared as it is (e.g. DMS `AR_H_CHANGE_SEQ`).
    Text,
}

impl SeqKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SeqKind::Timestamp => "timestamp",
            SeqKind::Integer => "integer",
            SeqKind::Text => "text",
        }
    }

    pub fn parse(s: &str) -> Option<SeqKind> {
        match s.trim() {
            "timestamp" => Some(SeqKind::Timestamp),
            "integer" => Some(SeqKind::Integer),
            "text" => Some(SeqKind::Text),
            _ => None,
        }
    }
}

impl fmt::Display for SeqKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
