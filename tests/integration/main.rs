#![allow(
    clippy::too_many_lines,
    reason = "a test reads as one scenario, setup to assertions"
)]
//! The integration tests of tributary on a local store, as one test binary (each binary
//! links deltalake and all it depends on: one link instead of several saves minutes per build).
//!
//! - `merge`: the merge engine on hand-written DMS files;
//! - `convergence`: random histories delivered shuffled, duplicated and concurrently;
//! - `integrity`: regressions of the data-integrity edges (types, batching, skipped files…);
//! - `types`: property test of the readers and type coercion;
//! - `history`: history (SCD type 2) tables against a model;
//! - `large`: files larger than a slice, merged in slices;
//! - `reload`: DMS table reloads;
//! - `reupload`: CDC files overwritten after they were merged;
//! - `widen`: source columns widened while replication runs (#26);
//! - `watermark`: watermarks and group cuts (#27);
//! - `onepath`: the merges that were delta-rs's MERGE, through the rewrite (#43);
//! - `existing`: tables tributary did not create (adoption, INT96, constraints, appendOnly);
//! - `maintenance`: compaction, vacuum, tombstones, manifests, maintenance racing merges.

mod convergence;
mod existing;
mod history;
mod integrity;
mod large;
mod maintenance;
mod merge;
mod onepath;
mod reload;
mod reupload;
mod types;
mod vectors;
mod watermark;
mod widen;
