//! The Glue Data Catalog kept in step with the Delta tables: per configured table, the
//! native Delta entry (Athena engine 3, Spark) and/or the symlink-manifest entry with its
//! partitions (Redshift Spectrum, older engines), and the same for a history table.
//!
//! When Glue is called:
//! - a table is created → its entries are created (and the database, when allowed);
//! - a commit changed the schema → the entries are updated; a commit changed the set of
//!   partitions → the manifest entry's partitions are added / removed;
//! - anything else → no call: a merge that changes nothing in the catalog makes no Glue
//!   call. Whether a commit changed the schema or the partitions is read from the table
//!   before and after the commit, not from a cache, so a cold start costs nothing either.
//!
//! A failed sync never fails the merge (the commit stands): it is logged, reported
//! (`CatalogSyncFailed`), and the entry is marked for a full sync by the next merge of the
//! table in this process; the maintenance run and `tributary catalog sync` reconcile
//! everything (drift, entries deleted by hand, missed partitions).
//!
//! An entry tributary did not create (no `tributary.managed` parameter) is never replaced,
//! unless the table's `adopt = true`.

mod entry;
// The Glue API on the AWS SDK, or — built without the `glue` feature — the same calls
// refusing by name (and `[table.catalog]` refused at start-up, `config`).
#[cfg_attr(not(feature = "glue"), path = "glue_off.rs")]
mod glue;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use arrow::datatypes::SchemaRef;
use deltalake::DeltaTable;
use serde::Serialize;

use crate::config::{CatalogConfig, EntryKind, TableConfig};
use crate::delta;
use crate::delta::manifest::{Behind, LiveFile};
use crate::error::{Error, Result};
pub use crate::report::CatalogReport;
use entry::{Desired, GluePartition, Verdict};
use glue::{Connection, Glue};

/// How a Glue call failed, for the callers that handle some failures.
#[derive(Debug)]
#[cfg_attr(
    not(feature = "glue"),
    allow(dead_code, reason = "only the SDK's answers are told apart")
)]
pub(crate) enum Failure {
    NotFound,
    AlreadyExists,
    /// Somebody else updated the entry since it was read (optimistic concurrency).
    Concurrent,
    Other(Box<Error>),
}

impl Failure {
    pub(crate) fn into_error(self, entry: &str, what: &str) -> Error {
        match self {
            Failure::Other(e) => *e,
            f => Error::catalog(entry, format!("{what}: {f:?}"), true),
        }
    }
}

/// Attempts of an entry's read-compare-write when another writer changes it in between.
const ENTRY_ATTEMPTS: usize = 3;

/// The state of one Glue entry ([`Catalog::status`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EntryStatus {
    /// `database.name`.
    pub entry: String,
    /// `in step`, `missing`, `drifted …`, …
    pub state: String,
    /// For manifest entries: partitions in the catalog and in the table.
    pub partitions: Option<PartitionCounts>,
}

/// A manifest entry's partitions against the table's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionCounts {
    pub in_catalog: usize,
    pub in_table: usize,
    /// Partitions missing, left over or at a wrong location.
    pub differing: usize,
}

/// The catalog client and what this process still owes the catalog. Built once per cold
/// start; the AWS configuration (credentials, region, endpoint overrides such as
/// `AWS_ENDPOINT_URL_GLUE`) is loaded on the first call, so a deployment without catalog
/// settings never loads it.
#[derive(Debug)]
pub struct Catalog {
    connection: Connection,
    /// Entries (`database.name`) whose last sync failed: the next merge syncs them fully.
    dirty: Mutex<BTreeSet<String>>,
}

impl Default for Catalog {
    fn default() -> Self {
        Self::from_env()
    }
}

impl Catalog {
    /// A client configured from the environment (as the AWS CLI is), on first use.
    pub fn from_env() -> Self {
        Catalog {
            connection: Connection::new(),
            dirty: Mutex::new(BTreeSet::new()),
        }
    }

    /// A client with this AWS configuration (tests, embedding).
    #[cfg(feature = "glue")]
    pub fn from_sdk_config(config: aws_config::SdkConfig) -> Self {
        Catalog {
            connection: Connection::with(config),
            ..Self::from_env()
        }
    }

    async fn glue(&self) -> Glue {
        self.connection.glue().await
    }

    fn is_dirty(&self, key: &str) -> bool {
        self.dirty.lock().map(|d| d.contains(key)).unwrap_or(true)
    }

    fn mark(&self, key: &str, failed: bool) {
        if let Ok(mut d) = self.dirty.lock() {
            if failed {
                d.insert(key.to_string());
            } else {
                d.remove(key);
            }
        }
    }

    /// After this process created the table (or the history table): create its entries.
    pub(crate) async fn created(
        &self,
        cfg: &TableConfig,
        history: bool,
        table: &DeltaTable,
    ) -> Option<CatalogReport> {
        let c = cfg.catalog.as_ref()?;
        let glue = self.glue().await;
        let mut report = CatalogReport::default();
        let mut unreachable = false;
        for (name, kind) in entries(cfg, c, history) {
            if unreachable {
                self.skip(c, &name, &mut report);
                continue;
            }
            let res = async {
                let d = entry::desired(table, &name, kind)?;
                let sync = EntrySync::new(&glue, c, &d);
                sync.ensure(&mut report).await?;
                if matches!(kind, EntryKind::Manifest { .. }) {
                    let parts = entry::partitions(table)?;
                    sync.add(parts.into_iter().collect(), &mut report).await?;
                }
                Ok(())
            }
            .await;
            unreachable = self.record(cfg, c, &name, res, &mut report);
        }
        report.calls = glue.calls();
        Some(report)
    }

    /// After a commit: sync what the commit changed in the catalog (nothing for most
    /// commits: then no Glue call at all), and anything an earlier sync failed to.
    pub(crate) async fn after_commit(
        &self,
        cfg: &TableConfig,
        history: bool,
        schema_before: Option<&SchemaRef>,
        files_before: &[LiveFile],
        after: &DeltaTable,
    ) -> Option<CatalogReport> {
        let c = cfg.catalog.as_ref()?;
        let schema_changed = match (schema_before, delta::arrow_schema(after)) {
            (Some(a), Some(b)) => a.fields() != b.fields(),
            (None, None) => false,
            _ => true,
        };
        let mut plans = Vec::new();
        for (name, kind) in entries(cfg, c, history) {
            let key = format!("{}.{name}", c.database);
            let dirty = self.is_dirty(&key);
            let manifest = matches!(kind, EntryKind::Manifest { .. });
            let (added, removed) = if manifest && !dirty {
                match partition_diff(after, files_before) {
                    Ok(d) => d,
                    Err(e) => {
                        plans.push((name, kind, Plan::Failed(e)));
                        continue;
                    }
                }
            } else {
                (Vec::new(), Vec::new())
            };
            let plan = if dirty {
                Plan::Full
            } else if schema_changed || !added.is_empty() || !removed.is_empty() {
                Plan::Changes {
                    entry: schema_changed,
                    added,
                    removed,
                }
            } else {
                continue;
            };
            plans.push((name, kind, plan));
        }
        Some(self.run(cfg, c, plans, after).await)
    }

    /// After the manifests of a table were found behind it (a crash or a failure between
    /// a commit and its post-commit steps, which the retry does not commit again): sync what
    /// the commits in between changed — the partitions whose files they added or removed
    /// (registered where the table has files now, removed where it has none) and the
    /// entries when one changed the metadata — or every entry fully when that is not known.
    /// `None` (no Glue call) when nothing was behind or the table has no catalog settings.
    pub(crate) async fn catch_up(
        &self,
        cfg: &TableConfig,
        history: bool,
        behind: &Behind,
        table: &DeltaTable,
    ) -> Option<CatalogReport> {
        let c = cfg.catalog.as_ref()?;
        let gap = match behind {
            Behind::No => return None,
            Behind::Known(g) => Some(g),
            Behind::Unknown => None,
        };
        let mut plans = Vec::new();
        for (name, kind) in entries(cfg, c, history) {
            let Some(g) = gap else {
                plans.push((name, kind, Plan::Full));
                continue;
            };
            let (added, removed) = if matches!(kind, EntryKind::Manifest { .. }) {
                match gap_partitions(table, g) {
                    Ok(d) => d,
                    Err(e) => {
                        plans.push((name, kind, Plan::Failed(e)));
                        continue;
                    }
                }
            } else {
                (Vec::new(), Vec::new())
            };
            if g.metadata || !added.is_empty() || !removed.is_empty() {
                let plan = Plan::Changes {
                    entry: g.metadata,
                    added,
                    removed,
                };
                plans.push((name, kind, plan));
            }
        }
        Some(self.run(cfg, c, plans, table).await)
    }

    /// Carry out the entries' plans (none: no Glue call) on `after`.
    async fn run(
        &self,
        cfg: &TableConfig,
        c: &CatalogConfig,
        plans: Vec<(String, EntryKind, Plan)>,
        after: &DeltaTable,
    ) -> CatalogReport {
        if plans.is_empty() {
            return CatalogReport::default();
        }
        let glue = self.glue().await;
        let mut report = CatalogReport::default();
        let mut unreachable = false;
        for (name, kind, plan) in plans {
            if unreachable {
                self.skip(c, &name, &mut report);
                continue;
            }
            let res = async {
                let d = entry::desired(after, &name, kind)?;
                EntrySync::new(&glue, c, &d)
                    .apply(plan, kind, after, &mut report)
                    .await
            }
            .await;
            unreachable = self.record(cfg, c, &name, res, &mut report);
        }
        report.calls = glue.calls();
        report
    }

    /// The state of the table's entries (and its history table's), read only: nothing is
    /// created or corrected. `None` when the table has no catalog settings.
    pub async fn status(
        &self,
        cfg: &TableConfig,
        options: &HashMap<String, String>,
    ) -> Result<Option<Vec<EntryStatus>>> {
        let Some(c) = cfg.catalog.as_ref() else {
            return Ok(None);
        };
        let glue = self.glue().await;
        let mut out = Vec::new();
        let targets = tables_of(cfg);
        for (history, url) in targets {
            let table = delta::open(url, options).await?;
            for (name, kind) in entries(cfg, c, history) {
                let entry = format!("{}.{name}", c.database);
                let mut st = EntryStatus {
                    entry: entry.clone(),
                    state: String::new(),
                    partitions: None,
                };
                if !delta::exists(&table) {
                    st.state = "table not created yet".into();
                    out.push(st);
                    continue;
                }
                let d = entry::desired(&table, &name, kind)?;
                st.state = match glue.get_table(&c.database, &name).await {
                    Err(Failure::NotFound) => "missing".into(),
                    Err(f) => return Err(f.into_error(&entry, "GetTable")),
                    Ok(existing) => match existing.verdict(&d, c.adopt) {
                        Verdict::UpToDate => "in step".into(),
                        Verdict::Update => "drifted (the next sync corrects it)".into(),
                        Verdict::Newer => "written from a newer table version".into(),
                        Verdict::NotOurs => "not created by tributary (adopt = false)".into(),
                    },
                };
                if matches!(kind, EntryKind::Manifest { .. }) && st.state != "missing" {
                    let have: BTreeSet<(Vec<String>, String)> = glue
                        .get_partitions(&c.database, &name)
                        .await
                        .map_err(|f| f.into_error(&entry, "GetPartitions"))?
                        .into_iter()
                        .map(|p| (p.values, p.location))
                        .collect();
                    let want: BTreeSet<(Vec<String>, String)> = entry::partitions(&table)?
                        .into_iter()
                        .map(|p| (p.values, p.location))
                        .collect();
                    st.partitions = Some(PartitionCounts {
                        in_catalog: have.len(),
                        in_table: want.len(),
                        differing: have.symmetric_difference(&want).count(),
                    });
                }
                out.push(st);
            }
        }
        Ok(Some(out))
    }

    /// Bring every entry of the table (and of its history table) in step with the tables
    /// as they are now: create missing entries, correct drifted ones, add and remove
    /// partitions. Tables that do not exist yet are skipped. `None` when the table has no
    /// catalog settings; a failed entry is in the report's `error`.
    pub async fn reconcile(
        &self,
        cfg: &TableConfig,
        options: &HashMap<String, String>,
    ) -> Result<Option<CatalogReport>> {
        let Some(c) = cfg.catalog.as_ref() else {
            return Ok(None);
        };
        let targets = tables_of(cfg);
        let mut tables = Vec::new();
        for (history, url) in targets {
            let table = delta::open(url, options).await?;
            if delta::exists(&table) {
                tables.push((history, table));
            }
        }
        let glue = self.glue().await;
        let mut report = CatalogReport::default();
        for (history, table) in &tables {
            for (name, kind) in entries(cfg, c, *history) {
                let res = async {
                    let d = entry::desired(table, &name, kind)?;
                    EntrySync::new(&glue, c, &d)
                        .full(kind, table, &mut report)
                        .await
                }
                .await;
                self.record(cfg, c, &name, res, &mut report);
            }
        }
        report.calls = glue.calls();
        Ok(Some(report))
    }

    /// Log a failed entry sync and mark it for the next one.
    /// Returns whether Glue looks unreachable (a retryable failure: network, throttling,
    /// service errors), so that the rest of a merge's entries are not tried one by one.
    fn record(
        &self,
        cfg: &TableConfig,
        c: &CatalogConfig,
        name: &str,
        res: Result<()>,
        report: &mut CatalogReport,
    ) -> bool {
        let key = format!("{}.{name}", c.database);
        match res {
            Ok(()) => {
                self.mark(&key, false);
                false
            }
            Err(e) => {
                let unreachable = matches!(e, Error::Catalog { .. }) && e.is_retryable();
                tracing::error!(table = %cfg.name, entry = %key, error = %e, kind = e.kind(), "catalog entry not updated; the next merge of the table or the maintenance run repairs it");
                self.mark(&key, true);
                let msg = e.to_string();
                report.error = Some(match report.error.take() {
                    Some(prev) => format!("{prev}; {msg}"),
                    None => msg,
                });
                unreachable
            }
        }
    }

    /// An entry not tried because Glue looked unreachable: owed to the next sync.
    fn skip(&self, c: &CatalogConfig, name: &str, report: &mut CatalogReport) {
        let key = format!("{}.{name}", c.database);
        self.mark(&key, true);
        let msg = format!("{key} not tried (Glue unreachable)");
        report.error = Some(match report.error.take() {
            Some(prev) => format!("{prev}; {msg}"),
            None => msg,
        });
    }
}

/// What one entry needs after a commit.
enum Plan {
    Full,
    Changes {
        entry: bool,
        added: Vec<GluePartition>,
        removed: Vec<GluePartition>,
    },
    Failed(Error),
}

/// The table's Delta tables: (of the history, location), the current table first.
fn tables_of(cfg: &TableConfig) -> Vec<(bool, &url::Url)> {
    let mut targets: Vec<(bool, &url::Url)> = cfg.target.iter().map(|t| (false, t)).collect();
    targets.extend(cfg.history.iter().map(|h| (true, &h.target)));
    targets
}

/// The table's entries of the main table or of its history.
fn entries(cfg: &TableConfig, c: &CatalogConfig, history: bool) -> Vec<(String, EntryKind)> {
    c.entries(cfg.target.is_some(), cfg.history.is_some())
        .into_iter()
        .filter(|(_, k)| {
            matches!(k, EntryKind::Delta { history: h } | EntryKind::Manifest { history: h } if *h == history)
        })
        .collect()
}

/// Partitions a commit added and removed.
fn partition_diff(
    after: &DeltaTable,
    files_before: &[LiveFile],
) -> Result<(Vec<GluePartition>, Vec<GluePartition>)> {
    let now = entry::partitions(after)?;
    let before: BTreeSet<GluePartition> = if delta::partition_columns(after)?.is_empty() {
        BTreeSet::new()
    } else {
        files_before
            .iter()
            .map(|f| entry::partition(after, &f.partition))
            .collect()
    };
    Ok((
        now.difference(&before).cloned().collect(),
        before.difference(&now).cloned().collect(),
    ))
}

/// Of the partitions a run of commits touched, those the table has files in now (to
/// register; Glue keeps the ones it has) and those it has none in (to remove).
fn gap_partitions(
    table: &DeltaTable,
    g: &crate::delta::manifest::Gap,
) -> Result<(Vec<GluePartition>, Vec<GluePartition>)> {
    if delta::partition_columns(table)?.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let now = entry::partitions(table)?;
    let (mut added, mut removed) = (Vec::new(), Vec::new());
    for p in &g.partitions {
        let gp = entry::partition(table, p);
        match now.contains(&gp) {
            true => added.push(gp),
            false => removed.push(gp),
        }
    }
    Ok((added, removed))
}

/// The table at its latest version.
async fn refreshed(table: &DeltaTable, key: &str) -> Result<DeltaTable> {
    let mut latest = table.clone();
    latest
        .update_incremental(None)
        .await
        .map_err(|e| Error::delta(key, e))?;
    Ok(latest)
}

/// One entry being synced: the Glue client, the table's catalog settings, what the entry
/// should say.
struct EntrySync<'a> {
    glue: &'a Glue,
    c: &'a CatalogConfig,
    d: &'a Desired,
}

impl<'a> EntrySync<'a> {
    fn new(glue: &'a Glue, c: &'a CatalogConfig, d: &'a Desired) -> Self {
        EntrySync { glue, c, d }
    }

    /// Carry out what [`Catalog::after_commit`] planned for the entry.
    async fn apply(
        &self,
        plan: Plan,
        kind: EntryKind,
        after: &DeltaTable,
        report: &mut CatalogReport,
    ) -> Result<()> {
        match plan {
            Plan::Failed(e) => Err(e),
            Plan::Full => self.full(kind, after, report).await,
            Plan::Changes {
                entry: changed,
                added,
                removed,
            } => {
                if changed {
                    let updated = report.entries_updated;
                    self.ensure(report).await?;
                    if report.entries_updated > updated {
                        self.update_partitions(kind, report).await?;
                    }
                }
                self.add(added, report).await?;
                self.remove(after, removed, report).await
            }
        }
    }

    /// `database.name`, for messages.
    fn key(&self) -> String {
        format!("{}.{}", self.c.database, self.d.name)
    }

    /// Make the entry say what `d` says: create it (and the database when allowed), or
    /// update it if it differs, unless a newer version was already written there.
    async fn ensure(&self, report: &mut CatalogReport) -> Result<()> {
        let (glue, c, d) = (self.glue, self.c, self.d);
        let db = &c.database;
        let key = self.key();
        for _ in 0..ENTRY_ATTEMPTS {
            match glue.get_table(db, &d.name).await {
                Err(Failure::NotFound) => match glue.create_table(db, d, d.parameters_over(None)).await {
                    Ok(()) => {
                        report.entries_created += 1;
                        return Ok(());
                    }
                    Err(Failure::NotFound) if c.create_database => {
                        glue.create_database(db)
                            .await
                            .map_err(|f| f.into_error(&key, "CreateDatabase"))?;
                    }
                    Err(Failure::NotFound) => {
                        return Err(Error::catalog(
                            &key,
                            format!("the Glue database `{db}` does not exist: create it (the SAM template does, parameter GlueDatabase) or set `create_database = true` in [table.catalog]"),
                            false,
                        ))
                    }
                    // Created meanwhile by a concurrent sync: read it and compare.
                    Err(Failure::AlreadyExists) => {}
                    Err(f) => return Err(f.into_error(&key, "CreateTable")),
                },
                Err(f) => return Err(f.into_error(&key, "GetTable")),
                Ok(existing) => match existing.verdict(d, c.adopt) {
                    Verdict::UpToDate | Verdict::Newer => return Ok(()),
                    Verdict::NotOurs => {
                        return Err(Error::catalog(
                            &key,
                            "the entry exists and was not created by tributary (it has no `tributary.managed` parameter): choose another `name` in [table.catalog], delete the entry, or set `adopt = true` to let tributary take it over",
                            false,
                        ))
                    }
                    Verdict::Update => match glue
                        .update_table(db, d, d.parameters_over(Some(&existing)), &existing)
                        .await
                    {
                        Ok(()) => {
                            report.entries_updated += 1;
                            return Ok(());
                        }
                        // Changed or deleted meanwhile: read it again.
                        Err(Failure::Concurrent | Failure::NotFound) => {}
                        Err(f) => return Err(f.into_error(&key, "UpdateTable")),
                    },
                },
            }
        }
        Err(Error::catalog(
            &key,
            format!("the entry kept changing while it was synced ({ENTRY_ATTEMPTS} attempts)"),
            true,
        ))
    }

    /// Ensure the entry and, for a manifest entry, make its partitions exactly the table's.
    ///
    /// Glue is read before the table: a partition a concurrent merge registered was committed
    /// before, so the table read after has it, and it is not taken for a stale one.
    async fn full(
        &self,
        kind: EntryKind,
        table: &DeltaTable,
        report: &mut CatalogReport,
    ) -> Result<()> {
        let (glue, c, d) = (self.glue, self.c, self.d);
        let updated = report.entries_updated;
        self.ensure(report).await?;
        if !matches!(kind, EntryKind::Manifest { .. }) {
            return Ok(());
        }
        if report.entries_updated > updated {
            self.update_partitions(kind, report).await?;
        }
        let key = self.key();
        let have: BTreeMap<Vec<String>, String> = glue
            .get_partitions(&c.database, &d.name)
            .await
            .map_err(|f| f.into_error(&key, "GetPartitions"))?
            .into_iter()
            .map(|p| (p.values, p.location))
            .collect();
        let latest = refreshed(table, &key).await?;
        let want: BTreeMap<Vec<String>, String> = entry::partitions(&latest)?
            .into_iter()
            .map(|p| (p.values, p.location))
            .collect();
        // Partitions whose location is wrong are deleted and created again.
        let relocated: Vec<Vec<String>> = have
            .iter()
            .filter(|(v, loc)| want.get(*v).is_some_and(|w| w != *loc))
            .map(|(v, _)| v.clone())
            .collect();
        if !relocated.is_empty() {
            glue.delete_partitions(&c.database, &d.name, &relocated)
                .await
                .map_err(|f| f.into_error(&key, "BatchDeletePartition"))?;
        }
        let missing: Vec<GluePartition> = want
            .iter()
            .filter(|(v, loc)| have.get(*v) != Some(*loc))
            .map(|(v, loc)| GluePartition {
                values: v.clone(),
                location: loc.clone(),
            })
            .collect();
        self.add(missing, report).await?;
        let extra: Vec<Vec<String>> = have
            .keys()
            .filter(|v| !want.contains_key(*v))
            .cloned()
            .collect();
        self.delete_rechecked(&latest, extra, report).await
    }

    /// After the entry was updated (its columns changed: a widened type, a new column): the
    /// registered partitions of a manifest entry get the entry's columns too — a partition
    /// keeps the columns it was registered with, and engines read its files by them.
    async fn update_partitions(&self, kind: EntryKind, report: &mut CatalogReport) -> Result<()> {
        if !matches!(kind, EntryKind::Manifest { .. }) {
            return Ok(());
        }
        let (glue, c, d) = (self.glue, self.c, self.d);
        let key = self.key();
        let have = glue
            .get_partitions(&c.database, &d.name)
            .await
            .map_err(|f| f.into_error(&key, "GetPartitions"))?;
        if have.is_empty() {
            return Ok(());
        }
        glue.update_partitions(&c.database, d, &have)
            .await
            .map_err(|f| f.into_error(&key, "BatchUpdatePartition"))?;
        report.partitions_updated += have.len();
        Ok(())
    }

    /// Delete partitions the table no longer has, then read the table again and register
    /// again any that a concurrent commit filled meanwhile (its own registration may have run
    /// before the delete).
    async fn delete_rechecked(
        &self,
        table: &DeltaTable,
        values: Vec<Vec<String>>,
        report: &mut CatalogReport,
    ) -> Result<()> {
        if values.is_empty() {
            return Ok(());
        }
        let (glue, c, d) = (self.glue, self.c, self.d);
        let key = self.key();
        match glue.delete_partitions(&c.database, &d.name, &values).await {
            // The entry itself is gone: nothing to delete (the next full sync re-creates it).
            Ok(()) | Err(Failure::NotFound) => {}
            Err(f) => return Err(f.into_error(&key, "BatchDeletePartition")),
        }
        report.partitions_removed += values.len();
        let now = entry::partitions(&refreshed(table, &key).await?)?;
        let back: Vec<GluePartition> = now
            .into_iter()
            .filter(|p| values.contains(&p.values))
            .collect();
        self.add(back, report).await
    }

    async fn add(&self, parts: Vec<GluePartition>, report: &mut CatalogReport) -> Result<()> {
        if parts.is_empty() {
            return Ok(());
        }
        let (glue, c, d) = (self.glue, self.c, self.d);
        let key = self.key();
        match glue.create_partitions(&c.database, d, &parts).await {
            Ok(()) => {}
            // The entry is gone (deleted by hand): re-create it, then its partitions.
            Err(Failure::NotFound) => {
                self.ensure(report).await?;
                glue.create_partitions(&c.database, d, &parts)
                    .await
                    .map_err(|f| f.into_error(&key, "BatchCreatePartition"))?;
            }
            Err(f) => return Err(f.into_error(&key, "BatchCreatePartition")),
        }
        report.partitions_added += parts.len();
        Ok(())
    }

    /// Remove partitions a commit emptied — unless a later commit (a concurrent merge whose
    /// catalog call may already have run) put files there again.
    async fn remove(
        &self,
        after: &DeltaTable,
        parts: Vec<GluePartition>,
        report: &mut CatalogReport,
    ) -> Result<()> {
        if parts.is_empty() {
            return Ok(());
        }
        let latest = refreshed(after, &self.key()).await?;
        let live = entry::partitions(&latest)?;
        let gone: Vec<Vec<String>> = parts
            .into_iter()
            .filter(|p| !live.contains(p))
            .map(|p| p.values)
            .collect();
        self.delete_rechecked(&latest, gone, report).await
    }
}
