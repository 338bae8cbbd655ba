//! tributary: keep Delta Lake tables exactly in sync with operational databases by merging
//! the change-data-capture files AWS DMS lands in S3.
//!
//! Modules, one per concept:
//! - [`config`]: the table configuration file;
//! - [`source`]: DMS Parquet/CSV readers (full load and CDC);
//! - [`plan`]: latest change per key, MERGE source;
//! - [`delta`]: Delta table creation and MERGE;
//! - [`tombstones`]: the delete tombstones that stop late upserts reviving rows;
//! - [`engine`]: routing, batching, retries, bad-file isolation;
//! - [`events`]: Lambda event payloads (S3, SQS, EventBridge) → object URIs;
//! - [`storage`]: `file://` and `s3://` access;
//! - [`demo`]: the seed scenario generator.

pub mod coerce;
pub mod config;
pub mod delta;
pub mod demo;
pub mod engine;
pub mod error;
pub mod events;
pub mod lambda;
pub mod maintenance;
pub mod manifest;
pub mod metrics;
pub mod plan;
pub mod props;
pub mod reload;
mod retry;
pub mod source;
pub mod storage;
pub mod tombstones;

pub use config::{Config, TableConfig};
pub use deltalake;
pub use engine::{Engine, FileOutcome, FileStatus, ProcessReport, TableReport};
pub use error::{Error, Result};

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
