#![warn(unreachable_pub)]
//! tributary: keep Delta Lake tables exactly in sync with operational databases by merging
//! the change-data-capture files AWS DMS lands in S3.
//!
//! The modules, in the order a file flows through them (docs/design.md, "Pipeline"):
//!
//! 1. [`config`]: the table configuration — which DMS folder feeds which Delta table;
//! 2. [`lambda`]: the Lambda plumbing — event payloads to object URIs, the configuration in
//!    force (reloaded when it changes), FIFO forwarding, metrics;
//! 3. `engine`: routing files to tables, screening, batching, retries, bad-file isolation,
//!    large files appended whole (`whole`) ([`Engine`]);
//! 4. [`storage`]: `file://` and `s3://` objects;
//! 5. `source`: DMS readers (Parquet, CSV, CSV.gz) and order keys;
//! 6. `coerce`: Delta types and exact value conversion;
//! 7. `plan`: admission of a batch, latest change per key, the MERGE source;
//! 8. `tombstones`: the delete tombstones that stop late upserts reviving rows;
//! 9. [`delta`]: Delta tables — open, create, MERGE, query; `rewrite`: the MERGE executed as
//!    a copy-on-write rewrite of the files holding the plan's keys (most merges), reading
//!    data files through `datafile` (shared with compaction);
//! 10. [`history`]: history (SCD type 2) tables fed from the same batches;
//! 11. [`manifest`]: symlink manifests for Athena and Redshift Spectrum;
//! 12. [`catalog`]: Glue Data Catalog entries kept in step with the tables;
//! 13. [`reload`]: DMS table reloads (full-load generations);
//! 14. [`maintenance`]: compaction, checkpoints, vacuum, tombstone expiry, manifests,
//!     catalog reconciliation;
//! 15. [`status`]: a table's state for the operator (read only).
//!
//! Beside the flow: `props` (what tributary records in a table's properties), `retry` (the
//! one commit-conflict retry policy), `error` ([`Error`]), [`demo`] (the seed scenario).

mod applied;
pub mod catalog;
mod coerce;
mod commit;
pub mod config;
mod datafile;
pub mod delta;
pub mod demo;
mod engine;
mod error;
pub mod history;
pub mod lambda;
pub mod logcache;
pub mod maintenance;
pub mod manifest;
mod model;
mod plan;
mod props;
pub mod reload;
mod retry;
mod rewrite;
mod source;
mod stats;
pub mod status;
pub mod storage;
#[cfg(test)]
mod testing;
mod tombstones;

pub use config::{Config, Managed, TableConfig};
pub use deltalake;
pub use engine::{Engine, FileOutcome, FileStatus, Phases, ProcessReport, TableReport, WritePath};
pub use error::{Error, Location, Result};
pub use props::TableProps;
pub use source::{FileCounts, SeqKind};

/// Default log filter of the functions: tributary's own `info` lines; `warn` for libraries,
/// minus delta-rs's per-merge metric warning and the kernel's error line when a table does
/// not exist yet (tributary creates it; real failures come back as errors and are logged).
/// delta-rs's transaction module logs handled commit conflicts at ERROR (with a "Help:"
/// paragraph) and the retries at WARN: tributary logs its own decision instead (conflict,
/// retry n of m at INFO; giving up at WARN; a failed file at ERROR).
pub const LOG_FILTER: &str = "warn,tributary=info,tributary_merge=info,tributary_maintenance=info,\
deltalake_core::operations::merge=error,deltalake_core::kernel::transaction=off,\
buoyant_kernel::snapshot::builder=off";

/// The CLI's default log filter (stderr): libraries' warnings only.
pub const CLI_LOG_FILTER: &str = "warn,tributary=off,deltalake_core::operations::merge=error,\
deltalake_core::kernel::transaction=off,buoyant_kernel::snapshot::builder=off";
