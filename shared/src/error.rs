//! Error types. Every error that concerns one input file names that file; errors about
//! rows or columns name them too. [`Error::is_retryable`] tells a caller whether trying the
//! same input again may succeed (storage hiccups, commit conflicts) or not (bad data).

use std::fmt;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a table format's refusal may end ([`Error::Table`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableFailure {
    /// Another writer committed first: reading the table again and retrying resolves it.
    Conflict,
    /// Storage or service trouble that may pass: trying again may succeed.
    Transient,
    /// What the table is refuses it (a feature this writer lacks, `appendOnly`, a corrupt
    /// log): the same every time.
    Permanent,
}

/// Where in an input file a problem was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// The whole file.
    File,
    /// One column of the file.
    Column(String),
    /// One data row (1-based, header not counted) and, when known, a column.
    Row { row: usize, column: Option<String> },
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File => Ok(()),
            Location::Column(c) => write!(f, ", column `{c}`"),
            Location::Row { row, column: None } => write!(f, ", row {row}"),
            Location::Row {
                row,
                column: Some(c),
            } => write!(f, ", row {row}, column `{c}`"),
        }
    }
}

/// All errors of the library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is invalid; the message says how to fix it.
    #[error("configuration error in {origin}: {message}")]
    Config { origin: String, message: String },

    /// A file that no table of the configuration in force owns, while a newer
    /// configuration does not load (or cannot be read): whether it is to be merged is not
    /// known yet. Retryable: once a configuration loads, the retry merges or ignores it.
    #[error("{file}: no table of the configuration in force owns it, and {why}; it is not ignored while that is so: once the configuration loads, the retried message is merged or ignored by it")]
    Unowned { file: String, why: String },

    /// An input file is malformed or does not fit the table. Not retryable: the file
    /// has to be fixed (or the configuration changed) and replayed.
    #[error("bad input file {file}{location}: {}", crate::redact::text(.message))]
    BadInput {
        file: String,
        location: Location,
        message: String,
    },

    /// A file's column has another type than the table's column, the change is not a
    /// lossless widening (those are applied), and the values do not fit the table's type.
    /// Not retryable: the way forward is a reload of the table or a new table.
    #[error("type change in {file}: column `{column}` is {} in the table but {} in the file, and {}{}; {TYPE_CHANGE_HELP}", .change.table_type, .change.file_type, row_text(.row), crate::redact::text(&.change.reason))]
    TypeChange {
        file: String,
        column: String,
        /// The first row (1-based) whose value does not fit, when known.
        row: Option<usize>,
        change: Box<TypeChange>,
    },

    /// Reading or writing storage failed (network, permissions, missing object).
    #[error("storage error on {uri}: {source}")]
    Storage {
        uri: String,
        #[source]
        source: object_store::Error,
    },

    /// The table format rejected the operation (`format`: `delta`; the format's own error is
    /// the source, classified where it is made, e.g. `Error::delta`).
    #[error("{format} table {table}: {source}")]
    Table {
        table: String,
        format: &'static str,
        outcome: TableFailure,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The change set does not fit the table's schema (type change, missing key, ...).
    #[error("table {table}: schema mismatch: {}", crate::redact::text(.message))]
    Schema { table: String, message: String },

    /// Concurrent writers kept winning; the change was not applied and must be retried.
    #[error("table {table}: gave up after {attempts} commit conflicts; nothing was applied, retry the event")]
    Contention { table: String, attempts: u32 },

    /// A widening's rewrite of the table's data files did not finish before the invocation's
    /// deadline ([`crate::budget`]): the files rewritten so far are staged (written, not
    /// committed; readers see the table as it was) and the next attempt goes on from them.
    #[error("table {table}: widening {columns}: {staged} of {total} data files rewritten so far (staged in {state}, not committed: the table is unchanged), and the invocation's time is up; the next attempt goes on from there")]
    Widening {
        table: String,
        columns: String,
        staged: usize,
        total: usize,
        state: String,
    },

    /// A DMS reload of the table was applied while the files were being merged: they were
    /// screened against the table before it, so nothing was applied; retried, they are
    /// screened again (a file of the older load then changes nothing).
    #[error("table {table}: a DMS reload was applied while {file} was being merged; nothing was applied, retry the event (files of the older load then change nothing)")]
    Reloaded { table: String, file: String },

    /// A full-load file belongs to a new full load (a DMS table reload) that has not been
    /// applied yet: a reload is applied as a whole (`tributary reload`). Not retryable.
    #[error("table {table}: {file} belongs to a new full load (a DMS table reload): {message}")]
    Reload {
        table: String,
        file: String,
        message: String,
    },

    /// A CDC file the table already applied was overwritten with other contents: its old rows
    /// took effect, and the new ones would be ordered as them (the same file, the same row
    /// numbers), so applying it would apply only part of it. Nothing of it is applied. Not
    /// retryable.
    #[error("table {table}: {file} was merged before with other contents (the object was overwritten after it was applied): its old rows took effect and the new ones would be ordered as them, so nothing of this version was applied; write corrections as a new CDC file (a later name), or reload the table (`tributary reload`)")]
    Reuploaded { table: String, file: String },

    /// The file was written before the tombstone horizon (deletes recorded up to then may
    /// have been forgotten, so applying it could revive a deleted row), or before the
    /// horizon of the records of applied files without a record (it could be a re-upload of
    /// a file whose record expired; see `applied`). Not retryable.
    #[error("table {table}: {file} was written at {written}, before the horizon {horizon} (the table's tombstones of deletes before it, or its records of the files it applied, may have expired, so applying this file could revive deleted rows or apply half of a re-uploaded file): if it is a re-delivery of a file already merged, nothing needs doing; otherwise reload the table (`tributary reload`) and raise `tombstone_retention_days`")]
    TooLate {
        table: String,
        file: String,
        written: String,
        horizon: String,
    },

    /// The table has a feature tributary cannot honour in what was asked of it (e.g. symlink
    /// manifests of a table whose files have deletion vectors). Not retryable: it stays so
    /// until the table or the configuration changes.
    #[error("table {table}: {feature}: {way_forward}")]
    Unsupported {
        table: String,
        feature: String,
        way_forward: String,
    },

    /// Maintenance could not rewrite a data file of the table.
    #[error("compaction: {file}: {}", crate::redact::text(.message))]
    Compaction { file: String, message: String },

    /// A data file of the Delta table could not be read for a copy-on-write rewrite.
    #[error("table {table}: data file {file} could not be read: {}", crate::redact::text(.message))]
    DataFile {
        table: String,
        file: String,
        message: String,
    },

    /// A local file-system operation failed.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// An Arrow computation failed (a bug or an unexpected state; the source says what).
    #[error("{context}: {}", crate::redact::text(&.source.to_string()))]
    Arrow {
        context: String,
        #[source]
        source: arrow::error::ArrowError,
    },

    /// A Glue Data Catalog entry could not be brought in step with its table. Never fails a
    /// merge (the commit stands; the next sync repairs the entry).
    #[error("Glue catalog entry {entry}: {message}")]
    Catalog {
        entry: String,
        message: String,
        retryable: bool,
    },

    /// A broken invariant (a bug). Never built from another error: those keep their source.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The two types of a refused type change ([`Error::TypeChange`]), and why a value does not
/// fit.
#[derive(Debug)]
pub struct TypeChange {
    pub table_type: String,
    pub file_type: String,
    pub reason: String,
}

fn row_text(row: &Option<usize>) -> String {
    match row {
        Some(r) => format!("row {r} does not fit: "),
        None => "its values do not fit: ".to_string(),
    }
}

/// What a refused type change says to do.
pub(crate) const TYPE_CHANGE_HELP: &str = "tributary widens a column on its own only where no value can be lost (a larger integer, float to double, an integer or a decimal into a decimal with at least as many digits before and after the point); to take this type, reload the table (docs/operations.md, \"Table reloads\") or write to a new table";

impl Error {
    /// Whether trying the same input again can succeed without anybody changing anything.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Config { .. }
            | Error::BadInput { .. }
            | Error::TypeChange { .. }
            | Error::Schema { .. }
            | Error::Reload { .. }
            | Error::TooLate { .. }
            | Error::Reuploaded { .. }
            | Error::Io { .. }
            | Error::Compaction { .. }
            | Error::Unsupported { .. }
            | Error::Arrow { .. }
            | Error::Internal(_) => false,
            Error::Storage { source, .. } => object_store_is_retryable(source),
            Error::Table { outcome, .. } => *outcome != TableFailure::Permanent,
            // A storage hiccup or a corrupt file: trying again is harmless either way.
            Error::Contention { .. }
            | Error::Widening { .. }
            | Error::Unowned { .. }
            | Error::Reloaded { .. }
            | Error::DataFile { .. } => true,
            Error::Catalog { retryable, .. } => *retryable,
        }
    }

    /// A short machine-readable class for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Config { .. } => "config",
            Error::Unowned { .. } => "unowned",
            Error::BadInput { .. } => "bad_input",
            Error::TypeChange { .. } => "type_change",
            Error::Storage { .. } => "storage",
            Error::Table { format, .. } => format,
            Error::Schema { .. } => "schema",
            Error::Contention { .. } => "contention",
            Error::Widening { .. } => "widening",
            Error::Reload { .. } => "reload",
            Error::Reloaded { .. } => "reloaded",
            Error::TooLate { .. } => "too_late",
            Error::Reuploaded { .. } => "reuploaded",
            Error::Io { .. } => "io",
            Error::Compaction { .. } => "compaction",
            Error::Unsupported { .. } => "unsupported",
            Error::DataFile { .. } => "data_file",
            Error::Arrow { .. } => "arrow",
            Error::Catalog { .. } => "catalog",
            Error::Internal(_) => "internal",
        }
    }

    /// The error with its row number moved by `by` (a slice's rows are numbered from its
    /// first row in the file).
    pub(crate) fn shift_rows(self, by: usize) -> Self {
        match self {
            Error::BadInput {
                file,
                location: Location::Row { row, column },
                message,
            } => Error::BadInput {
                file,
                location: Location::Row {
                    row: row + by,
                    column,
                },
                message,
            },
            Error::TypeChange {
                file,
                column,
                row: Some(row),
                change,
            } => Error::TypeChange {
                file,
                column,
                row: Some(row + by),
                change,
            },
            e => e,
        }
    }

    pub(crate) fn catalog(entry: &str, message: impl Into<String>, retryable: bool) -> Self {
        Error::Catalog {
            entry: entry.to_string(),
            message: message.into(),
            retryable,
        }
    }

    /// A broken invariant (a bug).
    pub fn internal(message: impl Into<String>) -> Self {
        Error::Internal(message.into())
    }

    /// An Arrow error in planning (no more context than the operation's own message).
    pub(crate) fn arrow(source: arrow::error::ArrowError) -> Self {
        Error::Arrow {
            context: "arrow computation failed".into(),
            source,
        }
    }

    pub(crate) fn bad_input(file: &str, location: Location, message: impl Into<String>) -> Self {
        Error::BadInput {
            file: file.to_string(),
            location,
            message: message.into(),
        }
    }

    /// An invalid configuration (or environment): `origin` names where, `message` how to
    /// fix it.
    pub fn config(origin: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            origin: origin.into(),
            message: message.into(),
        }
    }

    pub(crate) fn storage(uri: impl Into<String>, source: object_store::Error) -> Self {
        Error::Storage {
            uri: uri.into(),
            source,
        }
    }
}

/// Whether a storage failure may pass on its own (network, throttling) or needs a person
/// (missing object, permissions, an invalid path).
pub(crate) fn object_store_is_retryable(e: &object_store::Error) -> bool {
    !matches!(
        e,
        object_store::Error::NotFound { .. }
            | object_store::Error::InvalidPath { .. }
            | object_store::Error::NotSupported { .. }
            | object_store::Error::NotImplemented { .. }
            | object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_message_names_file_row_and_column() {
        let e = Error::bad_input(
            "s3://raw/a/b/20221025-1.parquet",
            Location::Row {
                row: 7,
                column: Some("Op".into()),
            },
            "unknown operation 'X' (expected I, U or D)",
        );
        assert_eq!(
            e.to_string(),
            "bad input file s3://raw/a/b/20221025-1.parquet, row 7, column `Op`: unknown operation 'X' (expected I, U or D)"
        );
        assert!(!e.is_retryable());
        assert_eq!(e.kind(), "bad_input");
    }

    #[test]
    fn retryability_follows_the_source_error() {
        use object_store::Error as ObjectStoreError;
        let transient = || ObjectStoreError::Generic {
            store: "S3",
            source: "connection reset".into(),
        };
        let missing = || ObjectStoreError::NotFound {
            path: "k".into(),
            source: "no such key".into(),
        };
        assert!(Error::storage("s3://b/k", transient()).is_retryable());
        assert!(!Error::storage("s3://b/k", missing()).is_retryable());
        assert!(!Error::arrow(arrow::error::ArrowError::ComputeError("x".into())).is_retryable());
        use std::error::Error as _;
        assert!(
            Error::storage("s3://b/k", missing()).source().is_some(),
            "the source is kept"
        );
    }

    #[test]
    fn contention_is_retryable() {
        let e = Error::Contention {
            table: "t".into(),
            attempts: 3,
        };
        assert!(e.is_retryable());
    }
}
