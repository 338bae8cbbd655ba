#![warn(unreachable_pub)]
//! tributary: keep Delta Lake tables exactly in sync with operational databases by merging
//! the change-data-capture files AWS DMS lands in S3.
//!
//! The modules form layers, each importing only those below it (docs/design.md,
//! "Layers"), bottom up:
//!
//! 1. `error` ([`Error`]) and `model`: the vocabulary every layer shares (file and sequence
//!    kinds, tributary's column names); [`budget`] (the time an invocation has left);
//! 2. [`storage`] (`file://` and `s3://` objects), [`config`] (the typed configuration and
//!    each table's managed Delta tables), `props` (what a table's properties record),
//!    `coerce` (exact value conversion), `stats` (exact decimal statistics);
//! 3. `source` (DMS readers and order keys) and `plan` (admission, latest change per key,
//!    the MERGE source): pure, no table I/O;
//! 4. the table format: [`delta`] (open, create, MERGE, append, query), [`logcache`],
//!    `retry` (the one conflict-retry policy and commit loop), [`manifest`], `datafile`,
//!    `rewrite` (the MERGE as a copy-on-write rewrite);
//! 5. state: `tombstones` (deletes that stop late upserts reviving rows) and `applied`
//!    (the files a table applied: full loads, CDC files by digest);
//! 6. the commit pipeline's shared part, `commit` (the table before and after a commit, the
//!    post-commit observers), [`catalog`] (Glue entries), [`history`] (SCD type 2), and
//!    `report` (what a merge call and each commit report);
//! 7. `sink`: the table format behind the engine — the `Sink` trait (a table's view, the
//!    files it applied, one commit per batch, a large file appended whole) and its Delta
//!    Lake implementation (`sink::delta`: the commit pipeline), plus an in-memory test
//!    double;
//! 8. `engine` ([`Engine`]): routing, reading, screening, batching, large files, bad-file
//!    isolation — through a `Sink` only;
//! 9. operations: [`reload`] (DMS table reloads), [`maintenance`], [`status`], [`demo`].
//!
//! Above them, not in this crate: the Lambda adapter (`tributary-lambda`,
//! `functions/lambda-common`) — event payloads to object URIs, the configuration in force,
//! FIFO forwarding, metrics — and the CLI; both call the [`Engine`] and the operations.

mod applied;
pub mod budget;
pub mod catalog;
mod coerce;
mod commit;
pub mod config;
mod constraints;
pub mod cut;
mod datafile;
pub mod delta;
pub mod demo;
mod engine;
mod error;
pub mod history;
#[cfg(test)]
mod layers;
pub mod logcache;
pub mod maintenance;
pub mod manifest;
mod model;
mod plan;
mod props;
pub mod redact;
pub mod reload;
mod report;
mod retry;
mod rewrite;
pub mod scan;
mod sink;
mod source;
mod stats;
pub mod status;
pub mod storage;
#[cfg(test)]
mod testing;
mod tombstones;
pub mod tuning;
pub mod watermark;
mod widen;

pub use config::{Config, Managed, TableConfig};
pub use deltalake;
pub use engine::{
    Engine, EngineBuilder, FileOutcome, FileStatus, Phases, ProcessReport, TableReport, WritePath,
};
pub use error::{Error, Location, Result, TableFailure};
pub use props::TableProps;
pub use source::{apply_order, FileCounts, SeqKind};

/// Default log filter of the functions: tributary's own `info` lines; `warn` for libraries,
/// minus the kernel's error line when a table does not exist yet (tributary creates it; real
/// failures come back as errors and are logged). Commit conflicts are tributary's own
/// (conflict, retry n of m at INFO; giving up at WARN; a failed file at ERROR). A version checksum file
/// (`_delta_log/<v>.crc`, optional in the protocol) the kernel cannot parse — Spark 3.1's have
/// no `metadata` field — is skipped and the table read from its log: the kernel's WARN (with
/// a stack trace where RUST_BACKTRACE is set) came at every load of such a table and asks
/// nothing of anybody, so it is off.
pub const LOG_FILTER: &str = "warn,tributary=info,tributary_merge=info,tributary_maintenance=info,\
buoyant_kernel::snapshot::builder=off,buoyant_kernel::crc::reader=off";

/// The CLI's default log filter (stderr): libraries' warnings only.
pub const CLI_LOG_FILTER: &str =
    "warn,tributary=off,buoyant_kernel::snapshot::builder=off,buoyant_kernel::crc::reader=off";
