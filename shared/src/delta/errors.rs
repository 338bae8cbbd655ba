//! delta-rs's errors as tributary's format-neutral [`Error::Table`]: each classified where it
//! is made — a commit race another attempt resolves, a failure that may pass, or a refusal
//! that is the same every time — with the delta-rs error kept as the source.

use crate::error::{object_store_is_retryable, Error, TableFailure};

impl Error {
    /// A delta-rs error of the table `table`.
    pub(crate) fn delta(table: &str, source: deltalake::DeltaTableError) -> Self {
        let outcome = if is_commit_conflict(&source) {
            TableFailure::Conflict
        } else if delta_error_is_retryable(&source) {
            TableFailure::Transient
        } else {
            TableFailure::Permanent
        };
        Error::Table {
            table: table.to_string(),
            format: "delta",
            outcome,
            source: Box::new(source),
        }
    }
}

/// True when a delta-rs error is a commit race that a reload-and-retry resolves.
fn is_commit_conflict(err: &deltalake::DeltaTableError) -> bool {
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
    match err {
        _ if is_commit_conflict(err) => true,
        E::ObjectStore { source } => object_store_is_retryable(source),
        E::Io { .. } => true,
        E::Transaction { source } => transaction_error_is_retryable(source),
        _ => false,
    }
}

/// A commit refused by what the table is (features this writer lacks, `appendOnly`) fails
/// the same way every time: not retryable. Storage and log-store failures are.
fn transaction_error_is_retryable(err: &deltalake::kernel::transaction::TransactionError) -> bool {
    use deltalake::kernel::transaction::TransactionError as T;
    match err {
        T::DeltaTableAppendOnly
        | T::UnsupportedTableFeatures(_)
        | T::TableFeaturesRequired(_)
        | T::SerializeLogJson { .. } => false,
        T::ObjectStore { source } => object_store_is_retryable(source),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table's features this writer lacks and `appendOnly` refuse every attempt alike
    /// (#43): before, they were retried for about 70 minutes before the dead-letter queue.
    #[test]
    fn refusals_by_what_the_table_is_are_not_retryable() {
        use deltalake::kernel::transaction::TransactionError as T;
        let delta = |source| Error::delta("t", deltalake::DeltaTableError::Transaction { source });
        for e in [T::DeltaTableAppendOnly, T::UnsupportedTableFeatures(vec![])] {
            let e = delta(e);
            assert!(!e.is_retryable(), "{e}");
        }
        assert!(delta(T::MaxCommitAttempts(15)).is_retryable());
        assert!(delta(T::VersionAlreadyExists(3)).is_retryable());
    }

    #[test]
    fn a_storage_failure_under_delta_rs_follows_the_storage_rule() {
        let transient = object_store::Error::Generic {
            store: "S3",
            source: "connection reset".into(),
        };
        let e = Error::delta(
            "t",
            deltalake::DeltaTableError::ObjectStore { source: transient },
        );
        assert!(e.is_retryable() && !crate::delta::is_conflict(&e), "{e}");
        assert_eq!(e.kind(), "delta");
        assert!(e.to_string().starts_with("delta table t: "), "{e}");
    }
}
