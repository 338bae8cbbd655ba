//! Error types. Every error that concerns one input file names that file; errors about
//! rows or columns name them too. [`Error::is_retryable`] tells a caller whether trying the
//! same input again may succeed (storage hiccups, commit conflicts) or not (bad data).

use std::fmt;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

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

    /// An input file is malformed or does not fit the table. Not retryable: the file
    /// has to be fixed (or the configuration changed) and replayed.
    #[error("bad input file {file}{location}: {message}")]
    BadInput {
        file: String,
        location: Location,
        message: String,
    },

    /// Reading or writing storage failed (network, permissions, missing object).
    #[error("storage error on {uri}: {source}")]
    Storage {
        uri: String,
        #[source]
        source: deltalake::ObjectStoreError,
    },

    /// The Delta table rejected the operation.
    #[error("delta table {table}: {source}")]
    Delta {
        table: String,
        #[source]
        source: deltalake::DeltaTableError,
    },

    /// The change set does not fit the table's schema (type change, missing key, ...).
    #[error("table {table}: schema mismatch: {message}")]
    Schema { table: String, message: String },

    /// Concurrent writers kept winning; the change was not applied and must be retried.
    #[error("table {table}: gave up after {attempts} commit conflicts; nothing was applied, retry the event")]
    Contention { table: String, attempts: u32 },

    /// Anything else: a bug or an unexpected state. Message says what.
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// Whether trying the same input again can succeed without anybody changing anything.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Config { .. } | Error::BadInput { .. } | Error::Schema { .. } => false,
            Error::Storage { source, .. } => !matches!(
                source,
                deltalake::ObjectStoreError::NotFound { .. }
                    | deltalake::ObjectStoreError::InvalidPath { .. }
                    | deltalake::ObjectStoreError::NotSupported { .. }
            ),
            Error::Delta { source, .. } => delta_error_is_retryable(source),
            Error::Contention { .. } => true,
            Error::Internal(_) => false,
        }
    }

    /// A short machine-readable class for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Config { .. } => "config",
            Error::BadInput { .. } => "bad_input",
            Error::Storage { .. } => "storage",
            Error::Delta { .. } => "delta",
            Error::Schema { .. } => "schema",
            Error::Contention { .. } => "contention",
            Error::Internal(_) => "internal",
        }
    }

    pub(crate) fn bad_input(file: &str, location: Location, message: impl Into<String>) -> Self {
        Error::BadInput {
            file: file.to_string(),
            location,
            message: message.into(),
        }
    }

    pub(crate) fn config(origin: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            origin: origin.into(),
            message: message.into(),
        }
    }

    pub(crate) fn delta(table: &str, source: deltalake::DeltaTableError) -> Self {
        Error::Delta {
            table: table.to_string(),
            source,
        }
    }

    pub(crate) fn storage(uri: impl Into<String>, source: deltalake::ObjectStoreError) -> Self {
        Error::Storage {
            uri: uri.into(),
            source,
        }
    }
}

/// True when a delta-rs error is a commit race that a reload-and-retry resolves.
pub(crate) fn is_commit_conflict(err: &deltalake::DeltaTableError) -> bool {
    use deltalake::kernel::transaction::TransactionError;
    use deltalake::DeltaTableError as E;
    match err {
        E::VersionAlreadyExists(_) => true,
        E::Transaction { source } => matches!(
            source,
            TransactionError::CommitConflict(_)
                | TransactionError::VersionAlreadyExists(_)
                | TransactionError::MaxCommitAttempts(_)
        ),
        _ => false,
    }
}

fn delta_error_is_retryable(err: &deltalake::DeltaTableError) -> bool {
    use deltalake::DeltaTableError as E;
    if is_commit_conflict(err) {
        return true;
    }
    matches!(
        err,
        E::ObjectStore { .. } | E::Io { .. } | E::Transaction { .. }
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
    fn contention_is_retryable() {
        let e = Error::Contention {
            table: "t".into(),
            attempts: 3,
        };
        assert!(e.is_retryable());
    }
}
