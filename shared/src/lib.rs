#![warn(unreachable_pub)]
// Without a table format (`--no-default-features`) nothing outside the crate reaches the
// engine: that build exists to show that the engine, the readers and the planner need no
// format, and their tests run on the in-memory sink (`.ci/run`); their code is unused there.
#![cfg_attr(not(feature = "delta"), allow(dead_code, unreachable_pub))]
//! tributary: keep Delta Lake tables exactly in sync with operational databases by merging
//! the change-data-capture files AWS DMS lands in S3.
//!
//! The modules form layers, each importing only those below it (docs/design.md,
//! "Layers", held by a test), bottom up:
//!
//! 1. `error` ([`Error`]), `model`, [`redact`], [`budget`]: the vocabulary every layer
//!    shares;
//! 2. [`storage`] (`file://` and `s3://` objects), [`tuning`], [`config`] (the typed
//!    configuration), `props` (what a table's properties record), `coerce` (exact value
//!    conversion);
//! 3. `source` (decoders, CDC conventions — AWS DMS's — and order keys), `plan` (admission,
//!    latest change per key, the merge's source), [`demo`]: pure, no table I/O; `report`
//!    (what a call reports);
//! 4. `sink`: the table format behind the engine — the `Sink` trait (a table's view, the
//!    files it applied, one commit per batch, a large file appended whole), screening
//!    written once over it, and an in-memory test double;
//! 5. [`engine`] (`Engine<S>`): routing, reading, screening, batching, large files, bad-file
//!    isolation — through its sink only;
//! 6. [`delta`], behind the `delta` feature (default): Delta Lake, the only code that names
//!    `deltalake` — tables, the log cache, scans, the rewrite, tombstones, applied files,
//!    the watermark, history tables, the Glue catalog, the Delta sink, [`Engine`]
//!    (`Engine<DeltaSink>`), and the operations: [`reload`], [`maintenance`], [`status`],
//!    [`cut`] (re-exported here).
//!
//! Above them, not in this crate: the Lambda adapter (`tributary-lambda`,
//! `functions/lambda-common`) — event payloads to object URIs, the configuration in force,
//! FIFO forwarding, metrics — and the CLI; both call the [`Engine`] and the operations.

pub mod budget;
mod coerce;
pub mod config;
#[cfg(feature = "delta")]
pub mod delta;
pub mod demo;
pub mod engine;
mod error;
#[cfg(test)]
mod layers;
mod model;
mod plan;
mod props;
pub mod redact;
mod report;
mod sink;
mod source;
pub mod storage;
pub mod tuning;

pub use config::{Config, Managed, TableConfig};
#[cfg(feature = "delta")]
pub use delta::{
    catalog, cut, history, logcache, maintenance, manifest, reload, scan, status, watermark,
    Engine, EngineBuilder,
};
#[cfg(feature = "delta")]
pub use deltalake;
pub use engine::{FileOutcome, FileStatus, Phases, ProcessReport, TableReport, WritePath};
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
