//! What every commit of a managed table shares, whichever writer made it (a batch MERGE, a
//! whole-file append, a history MERGE): the table as the writer first read it, the table
//! after, and the post-commit observers that follow the commit — the manifests, the Glue
//! entries, then the manifests' version marker — in one place ([`publish`]), after the
//! table's watermark (`watermark`).
//!
//! The observers never fail the merge (it is committed): a failure is logged and reported,
//! and the version marker, not moved, makes the next merge of the table catch up
//! (docs/design.md, "Crash windows").

use deltalake::DeltaTable;

use crate::config::TableConfig;
use crate::delta;
use crate::delta::catalog::{Catalog, CatalogReport};
use crate::delta::manifest;
use crate::delta::watermark::{self, Progress};
use crate::error::Result;
use crate::storage::Storage;

/// Which of a configured table's Delta tables with manifests and a catalog entry a commit
/// is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// The current table.
    Current,
    /// The history (SCD type 2) table.
    History,
}

impl Output {
    fn is_history(self) -> bool {
        self == Output::History
    }

    /// Whether this is the table that keeps `cfg`'s state (its file records, its watermark).
    fn is_state(self, cfg: &TableConfig) -> bool {
        match self {
            Output::Current => cfg.target.is_some(),
            Output::History => cfg.target.is_none(),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Output::Current => "",
            Output::History => " history",
        }
    }
}

/// The table as a writer first read it: what the observers compare the final table with.
/// The first attempt's, not the last's: an attempt that committed and then failed leaves
/// its commit in the table, and the retry's own read already contains it.
#[derive(Clone)]
pub(crate) struct Before {
    pub(crate) version: Option<u64>,
    schema: Option<arrow::datatypes::SchemaRef>,
    /// Live files (only when manifests are on: nothing else needs them).
    files: Vec<manifest::LiveFile>,
}

impl Before {
    /// The table as it is now (live files only when manifests are on).
    pub(crate) fn of(cfg: &TableConfig, table: &DeltaTable) -> Result<Self> {
        Ok(Before {
            version: table.version(),
            schema: delta::arrow_schema(table),
            files: if cfg.writing.manifests {
                manifest::live_files(table)?
            } else {
                Vec::new()
            },
        })
    }
}

/// A writer's result as the observers see it: the table after it and, when it committed,
/// the table before (`None`: nothing committed — a re-delivery, or the retry of a merge
/// that crashed after its commit).
pub(crate) struct Committed {
    pub(crate) before: Option<Before>,
    pub(crate) after: DeltaTable,
    /// The version a MERGE read (`None`: not a MERGE).
    pub(crate) read: Option<u64>,
    /// The watermark the commit carried (computed before it, with its files applied).
    pub(crate) watermark: Option<(Progress, watermark::Stored)>,
}

impl Committed {
    /// `after`, with `before` kept when a commit happened since it.
    pub(crate) fn since(before: Before, after: DeltaTable) -> Self {
        let committed = after.version() != before.version;
        Committed {
            before: committed.then_some(before),
            after,
            read: None,
            watermark: None,
        }
    }
}

/// What the observers did.
#[derive(Debug, Default)]
pub(crate) struct Published {
    pub(crate) manifests_written: usize,
    pub(crate) manifests_deleted: usize,
    /// The manifests were behind the table (a crash or a failure between an earlier commit
    /// and its manifests) and were brought up to date, with the catalog entries.
    pub(crate) caught_up: bool,
    /// Why the manifests could not be updated, or their marker not written.
    pub(crate) manifest_error: Option<String>,
    pub(crate) catalog: Option<CatalogReport>,
    pub(crate) manifests_ms: u64,
    pub(crate) catalog_ms: u64,
    /// The table's watermark after the commit (on the table that keeps the state: the
    /// current table, or the history table of a table that keeps only its history).
    pub(crate) watermark: Option<Progress>,
    /// Why the watermark could not be computed or recorded.
    pub(crate) watermark_error: Option<String>,
    pub(crate) watermark_ms: u64,
}

/// After a commit (or none): the manifests of the partitions it touched — and of those
/// earlier commits touched when the manifests are behind them ([`manifest::catch_up`]) —
/// then the catalog entries, for the commit and for what the manifests were behind, then
/// the marker (until it is written, the next merge redoes the manifests and the catalog).
pub(crate) async fn publish(
    storage: &Storage,
    catalog: &Catalog,
    cfg: &TableConfig,
    output: Output,
    m: &Committed,
) -> Published {
    let mut out = Published::default();
    // The watermark first: its commit (when it moves) is then part of what the manifests'
    // marker records, and the next merge does not take it for a commit they are behind.
    let t = std::time::Instant::now();
    let mut after = m.after.clone();
    // A merge's commit carries the watermark it moves (one commit per merge); only when
    // it did not land (a concurrent writer moved it first) is it committed on its own.
    let carried = match &m.watermark {
        Some((p, next)) => watermark::stored(&after)
            .await
            .ok()
            .flatten()
            .filter(|s| s == next)
            .map(|_| p.clone()),
        None => None,
    };
    if let Some(p) = carried {
        out.watermark = Some(p);
    } else if output.is_state(cfg) {
        match watermark::advance(storage, cfg, after.clone(), chrono::Utc::now()).await {
            Ok((table, p)) => {
                after = table;
                out.watermark = Some(p);
            }
            Err(e) => {
                tracing::error!(table = %cfg.name, error = %e, "watermark not recorded; the next merge of the table or the maintenance run moves it");
                out.watermark_error = Some(e.to_string());
            }
        }
    }
    out.watermark_ms = t.elapsed().as_millis() as u64;
    let t = std::time::Instant::now();
    let (mut behind, mut pending) = (manifest::Behind::No, None);
    if cfg.writing.manifests {
        let since = m.before.as_ref().map(|b| manifest::Since {
            version: b.version,
            files: &b.files,
        });
        match manifest::catch_up(storage, after.clone(), since).await {
            Ok((w, b, p)) => {
                out.manifests_written = w.written;
                out.manifests_deleted = w.deleted;
                out.caught_up = b != manifest::Behind::No;
                (behind, pending) = (b, p);
            }
            Err(e) => {
                tracing::error!(table = %cfg.name, output = output.label(), error = %e, "manifests not updated; the next merge of the table or the maintenance run rewrites them");
                out.manifest_error = Some(e.to_string());
            }
        }
    }
    out.manifests_ms = t.elapsed().as_millis() as u64;
    if cfg.catalog.is_some() {
        let t = std::time::Instant::now();
        let history = output.is_history();
        if let Some(b) = &m.before {
            let r = catalog
                .after_commit(cfg, history, b.schema.as_ref(), &b.files, &after)
                .await;
            absorb(&mut out.catalog, r);
        }
        let r = catalog.catch_up(cfg, history, &behind, &after).await;
        absorb(&mut out.catalog, r);
        out.catalog_ms = t.elapsed().as_millis() as u64;
    }
    if let Some(p) = pending {
        if let Err(e) = p.record(storage).await {
            tracing::error!(table = %cfg.name, output = output.label(), error = %e, "manifest version marker not written; the next merge of the table rewrites the manifests of this commit");
            out.manifest_error = Some(e.to_string());
        }
    }
    out
}

/// Add a catalog sync's report to one kept so far.
pub(crate) fn absorb(into: &mut Option<CatalogReport>, r: Option<CatalogReport>) {
    if let Some(r) = r {
        into.get_or_insert_with(Default::default).absorb(&r);
    }
}
