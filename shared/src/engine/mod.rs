//! The merge pipeline: route files to tables, read them, screen and admit them, plan, and
//! commit — one commit per table per call, retried on conflicts, with bad files isolated —
//! through a table format's `Sink` only: the engine is built with its sink (Delta Lake's
//! is `crate::delta::Engine`; the tests build one on the in-memory sink).
//!
//! ```text
//! files ──route──▶ per table ──read──▶ ChangeSets ──screen (horizon, reloads)──▶
//!   ──admit (types, sequence kinds)──▶ plan ──record tombstones──▶ MERGE (retry on conflict)
//!   ──re-check tombstones──▶ manifests ──▶ report
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::stream::{self, StreamExt};
use url::Url;

use crate::config::{Config, TableConfig};
use crate::error::{Error, Result};
use crate::plan;
use crate::props::TableProps;
use crate::sink::{Sink, View, Whole};
use crate::source::{self, ChangeSet, FileClass, FileKind};
use crate::storage::{self, Storage};
use crate::tuning::Tuning;

pub use crate::report::{FileOutcome, FileStatus, Phases, ProcessReport, TableReport, WritePath};
pub(crate) use crate::sink::Batch;

/// The merge engine of one table format: configuration, storage and the format's sink,
/// built once.
#[derive(Debug, Clone)]
pub struct Engine<S> {
    config: Arc<Config>,
    storage: Arc<Storage>,
    pub(crate) sink: S,
    local_s3_root: Option<Arc<std::path::PathBuf>>,
    /// Why files no table owns fail instead of being ignored (a newer configuration is
    /// refused: they may belong to a table it adds).
    unowned: Option<Arc<str>>,
}

/// Files read for a call.
#[derive(Default)]
pub(crate) struct ReadFiles {
    pub(crate) sets: Vec<ChangeSet>,
    /// Files to merge in slices, with their fetched bodies.
    pub(crate) large: Vec<(Url, source::RawFile)>,
    pub(crate) failed: Vec<(Url, Error)>,
}

/// The configuration at `location` (a local path, or an `s3://` / `file://` URI read with
/// `tuning`'s storage).
pub async fn load_config(location: &str, tuning: &Tuning) -> Result<Config> {
    if location.starts_with("s3://") || location.starts_with("file://") {
        let url = Url::parse(location)
            .map_err(|e| Error::config(location, format!("not a valid URI: {e}")))?;
        let storage = Storage::with_tuning(tuning);
        let bytes = storage
            .get(&url)
            .await
            .map_err(|e| Error::config(location, format!("cannot read the configuration: {e}")))?;
        let text = String::from_utf8(bytes.to_vec())
            .map_err(|_| Error::config(location, "the file is not UTF-8 text"))?;
        Config::from_toml(&text, location, None)
    } else {
        Config::from_path(std::path::Path::new(location))
    }
}

impl<S> Engine<S> {
    /// The engine of `config` on the sink `sink` makes of the engine's storage (built with
    /// `tuning`).
    pub(crate) fn on(
        config: Config,
        tuning: &Tuning,
        sink: impl FnOnce(Arc<Storage>) -> S,
    ) -> Self {
        let storage = Arc::new(Storage::with_tuning(tuning));
        Engine {
            config: Arc::new(config),
            sink: sink(storage.clone()),
            storage,
            local_s3_root: None,
            unowned: None,
        }
    }

    /// This engine, failing (retryably) the files no table owns instead of ignoring them,
    /// with `why` (the Lambda adapter, `tributary_lambda::live`: a newer configuration does
    /// not load).
    pub fn failing_unowned(mut self, why: impl Into<Arc<str>>) -> Self {
        self.unowned = Some(why.into());
        self
    }

    /// Serve `s3://bucket/key` from `<root>/bucket/key` on the local disk — the announced
    /// files and the configured tables alike: for running the Lambda locally
    /// (`cargo lambda watch`) against the sample events without AWS.
    pub fn with_local_s3_root(mut self, root: impl Into<std::path::PathBuf>) -> Self {
        let root: std::path::PathBuf = root.into();
        let root = std::fs::canonicalize(&root).unwrap_or(root);
        self.local_s3_root = Some(Arc::new(root));
        let mut config = (*self.config).clone();
        for t in &mut config.tables {
            t.source = self.resolve(&t.source);
            t.target = t.target.as_ref().map(|u| self.resolve(u));
            t.tombstones = t.tombstones.as_ref().map(|u| self.resolve(u));
            if let Some(h) = &mut t.history {
                h.target = self.resolve(&h.target);
                h.changes = self.resolve(&h.changes);
            }
        }
        self.config = Arc::new(config);
        self
    }

    /// The URL a file is actually read from (see [`Engine::with_local_s3_root`]).
    pub fn resolve(&self, url: &Url) -> Url {
        match (&self.local_s3_root, url.scheme()) {
            (Some(root), "s3") => {
                let mut u =
                    Url::from_directory_path(root.as_path()).unwrap_or_else(|_| url.clone());
                let keep_slash = url.path().ends_with('/');
                if let Ok(mut segments) = u.path_segments_mut() {
                    segments.pop_if_empty().push(url.host_str().unwrap_or(""));
                    for s in url.path().trim_start_matches('/').split('/') {
                        segments.push(&storage::percent_decode(s));
                    }
                    if !keep_slash {
                        segments.pop_if_empty();
                    }
                }
                u
            }
            _ => url.clone(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }
}

impl<S> Engine<S> {
    /// Merge these files into the tables of `sink` (the engine's own, `self.sink`, for a
    /// format's `process`). Files of one table go into one commit; tables are independent;
    /// a bad file fails alone. Never panics on input; every file gets an outcome.
    pub(crate) async fn process_into<T: Sink>(&self, sink: &T, files: &[Url]) -> ProcessReport {
        let (by_table, routed) = self.route(files);
        let mut report = ProcessReport {
            files: routed,
            ..Default::default()
        };
        let results = stream::iter(by_table)
            .map(|(name, files)| async move {
                match self.config.table(&name) {
                    Some(table) => self.process_table(sink, table, files).await,
                    None => (vec![], vec![]),
                }
            })
            .buffer_unordered(4)
            .collect::<Vec<_>>()
            .await;
        for (outcomes, tables) in results {
            report.files.extend(outcomes);
            report.tables.extend(tables);
        }
        report
    }

    /// Files per table. Files outside every source and folder markers are ignored; any
    /// other file under a source that is not a data file of the table's format fails.
    /// The files per table, and the outcomes of the files routing settled.
    fn route(&self, files: &[Url]) -> (BTreeMap<String, Vec<Url>>, Vec<FileOutcome>) {
        let mut by_table: BTreeMap<String, Vec<Url>> = BTreeMap::new();
        let mut outcomes = Vec::new();
        for f in files.iter().map(|f| self.resolve(f)) {
            let Some(t) = self.config.table_for(&f) else {
                if let Some(why) = &self.unowned {
                    let e = Error::Unowned {
                        file: storage::display(&f),
                        why: why.to_string(),
                    };
                    log_failure(UNOWNED, &f, &e);
                    outcomes.push(FileOutcome::failed(f, UNOWNED, Arc::new(e)));
                    continue;
                }
                tracing::warn!(file = %storage::display(&f), "ignored: no configured table has this prefix (check the tables' `source`)");
                outcomes.push(FileOutcome {
                    file: f,
                    status: FileStatus::Ignored {
                        reason: "no configured table has this prefix".into(),
                    },
                });
                continue;
            };
            match source::classify(&f, &t.format) {
                Ok(FileClass::Data) => {
                    let list = by_table.entry(t.name.clone()).or_default();
                    if !list.contains(&f) {
                        list.push(f);
                    }
                }
                Ok(FileClass::NotData(what)) => {
                    tracing::info!(table = %t.name, file = %storage::display(&f), "ignored: {what}");
                    outcomes.push(FileOutcome {
                        file: f,
                        status: FileStatus::Ignored {
                            reason: what.to_string(),
                        },
                    });
                }
                Err(message) => {
                    let e = Error::bad_input(
                        &storage::display(&f),
                        crate::error::Location::File,
                        message,
                    );
                    log_failure(&t.name, &f, &e);
                    outcomes.push(FileOutcome::failed(f, &t.name, Arc::new(e)));
                }
            }
        }
        (by_table, outcomes)
    }

    async fn process_table<T: Sink>(
        &self,
        sink: &T,
        table: &TableConfig,
        files: Vec<Url>,
    ) -> (Vec<FileOutcome>, Vec<TableReport>) {
        let mut outcomes = Vec::new();
        let view = match sink.view(table).await {
            Ok(v) => v,
            Err(e) => {
                let e = Arc::new(e);
                let failed = files
                    .into_iter()
                    .map(|f| FileOutcome::failed(f, &table.name, e.clone()))
                    .collect();
                return (failed, vec![]);
            }
        };
        // Files are applied in their order (`source::apply_order_of`: full load, then CDC, each
        // by name), read eight at a time and merged in groups of at most one slice of rows
        // and decoded bytes: memory follows the slice, not the number of files a batch
        // announces (a FIFO batch can announce a thousand). A file is never split across
        // groups; each group is one commit. A file larger than a slice is merged at its place
        // in the order, after the group before it and before the files after it: every
        // version written is then a state the source had.
        let mut files = files;
        files.sort_by_key(|f| source::apply_order_of(table, f));
        let (schema, props) = (view.schema.clone(), view.props.clone());
        let mut reads = stream::iter(files.iter().cloned())
            .map(|f| {
                let (schema, props) = (schema.as_deref(), &props);
                async move {
                    let r = self.read_file(table, &f, schema, props, true).await;
                    (f, r)
                }
            })
            .buffered(8);
        let mut view = Some(view);
        let mut reports = Vec::new();
        let mut group: Vec<ChangeSet> = Vec::new();
        let (mut rows, mut bytes) = (0usize, 0usize);
        loop {
            let next = reads.next().await;
            let end = next.is_none();
            let (mut set, mut large) = (None, None);
            match next {
                Some((_, Ok((source::Read::Whole(cs), _)))) => set = Some(*cs),
                Some((f, Ok((source::Read::Large, raw)))) => large = Some((f, raw)),
                Some((f, Err(e))) => {
                    log_failure(&table.name, &f, &e);
                    outcomes.push(FileOutcome::failed(f, &table.name, Arc::new(e)));
                }
                None => {}
            }
            let (n, b) = set.as_ref().map_or((0, 0), |cs| {
                (cs.data.num_rows(), cs.data.get_array_memory_size())
            });
            let full = rows + n > table.limits.slice_rows || bytes + b > table.limits.slice_bytes;
            if !group.is_empty() && (end || large.is_some() || (set.is_some() && full)) {
                let sets = std::mem::take(&mut group);
                (rows, bytes) = (0, 0);
                let (r, o) = self.merge_on(sink, table, view.take(), sets).await;
                reports.extend(r);
                outcomes.extend(o);
            }
            if let Some((file, raw)) = large {
                // Slice by slice (or appended whole), on the table as it is now.
                view = None;
                match self.merge_large(sink, table, &file, &raw).await {
                    Ok((r, o)) => {
                        reports.extend(r);
                        outcomes.extend(o);
                    }
                    Err(e) => {
                        log_failure(&table.name, &file, &e);
                        outcomes.push(FileOutcome::failed(file, &table.name, Arc::new(e)));
                    }
                }
            }
            if let Some(cs) = set {
                rows += n;
                bytes += b;
                group.push(cs);
            }
            if end {
                break;
            }
        }
        (outcomes, reports)
    }

    /// [`Engine::merge_group`] on `view`, the table read before the first group; later
    /// groups read it again (the group before changed it). A table that cannot be read
    /// fails the group's files.
    async fn merge_on<T: Sink>(
        &self,
        sink: &T,
        table: &TableConfig,
        view: Option<View<T::Table>>,
        sets: Vec<ChangeSet>,
    ) -> (Vec<TableReport>, Vec<FileOutcome>) {
        let v = match view {
            Some(v) => Ok(v),
            None => sink.view(table).await,
        };
        match v {
            Ok(v) => Box::pin(self.merge_group(sink, table, v, sets)).await,
            Err(e) => {
                let e = Arc::new(e);
                let failed = sets.into_iter().map(|cs| {
                    log_failure(&table.name, &cs.file, &e);
                    FileOutcome::failed(cs.file, &table.name, e.clone())
                });
                (vec![], failed.collect())
            }
        }
    }

    /// Screen, admit and merge one group of a table's small files (one commit, or one per
    /// file when a bad one must be isolated) on `view`.
    async fn merge_group<T: Sink>(
        &self,
        sink: &T,
        table: &TableConfig,
        view: View<T::Table>,
        sets: Vec<ChangeSet>,
    ) -> (Vec<TableReport>, Vec<FileOutcome>) {
        let (sets, mut outcomes) = crate::sink::screen(sink, table, &view, sets).await;
        let admission = plan::admit(
            sets,
            &table.primary_key,
            view.schema.as_deref(),
            view.props.sequence_kinds.as_deref(),
        );
        for (f, e) in admission.rejected {
            log_failure(&table.name, &f, &e);
            outcomes.push(FileOutcome::failed(f, &table.name, Arc::new(e)));
        }
        if admission.admitted.is_empty() {
            return (vec![], outcomes);
        }
        let batch = Batch {
            changes: &admission.admitted,
            kinds: admission.kinds.clone(),
            delete_unmatched_below: None,
        };
        let (reports, merged) = self
            .merge_or_isolate(sink, table, batch, view.loaded())
            .await;
        outcomes.extend(merged);
        (reports, outcomes)
    }

    /// Merge a file of more than `slice_rows` rows: first read all of it, checking every
    /// slice as a merge would (a bad row anywhere fails the file before any of it is
    /// applied), then merge it slice by slice, one commit each, in the file's order. A
    /// slice's rows are a prefix of the file's changes, so every state a reader sees between
    /// two slices is one the source had; re-merging the file (after a crash between slices)
    /// applies nothing twice (order keys). A full-load file is recorded as applied with its
    /// last slice. The report (`None` when screening settled the file) and the file's
    /// outcome.
    async fn merge_large<T: Sink>(
        &self,
        sink: &T,
        table: &TableConfig,
        file: &Url,
        raw: &source::RawFile,
    ) -> Result<(Option<TableReport>, Vec<FileOutcome>)> {
        match sink.append_whole(table, file, raw).await? {
            Whole::Done(r, outcomes) => return Ok((r.map(|r| *r), outcomes)),
            Whole::Fallback(why) => {
                tracing::info!(table = %table.name, file = %storage::display(file), why, "not appendable as a whole")
            }
        }
        tracing::info!(table = %table.name, file = %storage::display(file), slice_rows = table.limits.slice_rows, "more rows than a slice: checking the whole file, then merging it slice by slice");
        let mut view = sink.view(table).await?;
        let counts = match self.check_large(sink, table, &view, file, raw).await? {
            Checked::Counts(c) => c,
            Checked::Settled(outcomes) => return Ok((None, outcomes)),
        };
        let mut total: Option<TableReport> = None;
        let mut commits = 0;
        let mut slices = crate::sink::slices_of(table, &view, file, raw)?;
        while let Some(cs) = slices.next_slice()? {
            let admission = plan::admit(
                vec![cs],
                &table.primary_key,
                view.schema.as_deref(),
                view.props.sequence_kinds.as_deref(),
            );
            if let Some((_, e)) = admission.rejected.into_iter().next() {
                return Err(e);
            }
            let batch = Batch {
                changes: &admission.admitted,
                kinds: admission.kinds.clone(),
                delete_unmatched_below: None,
            };
            let r = sink.commit(table, &batch, view.loaded()).await?;
            commits += 1;
            match &mut total {
                Some(t) => t.absorb(&r),
                None => total = Some(r),
            }
            view = sink.view(table).await?;
        }
        let outcome = FileOutcome {
            file: file.clone(),
            status: FileStatus::Merged {
                table: table.name.clone(),
                counts,
            },
        };
        let report = total.map(|mut t| {
            t.files = 1;
            t.slices = commits;
            t
        });
        Ok((report, vec![outcome]))
    }

    /// The checking pass of [`Self::merge_large`]: every slice screened (the first) and
    /// admitted as a merge would: the file's counts, or what screening settled it as.
    async fn check_large<T: Sink>(
        &self,
        sink: &T,
        table: &TableConfig,
        view: &View<T::Table>,
        file: &Url,
        raw: &source::RawFile,
    ) -> Result<Checked> {
        let checking = std::time::Instant::now();
        let mut slices = crate::sink::slices_of(table, view, file, raw)?;
        let mut counts = source::FileCounts::default();
        let mut first = true;
        while let Some(mut cs) = slices.next_slice()? {
            if first {
                first = false;
                match crate::sink::screen(sink, table, view, vec![cs]).await {
                    (mut kept, _) if kept.len() == 1 => cs = kept.remove(0),
                    (_, settled) => return Ok(Checked::Settled(settled)),
                }
            }
            counts.add(&cs.counts);
            let mut check = plan::admit(
                vec![cs],
                &table.primary_key,
                view.schema.as_deref(),
                view.props.sequence_kinds.as_deref(),
            );
            if let Some((_, e)) = check.rejected.pop() {
                return Err(e);
            }
        }
        tracing::info!(table = %table.name, file = %storage::display(file), rows = counts.rows, ms = checking.elapsed().as_millis() as u64, "checked; merging slice by slice");
        Ok(Checked::Counts(counts))
    }

    /// Fetch and open one file: whole when it has at most one slice of rows and bytes
    /// (`sliced`; otherwise always whole), else [`source::Read::Large`] with its body.
    async fn read_file(
        &self,
        table: &TableConfig,
        f: &Url,
        schema: Option<&arrow::datatypes::Schema>,
        props: &TableProps,
        sliced: bool,
    ) -> Result<(source::Read, source::RawFile)> {
        let (rows, bytes) = match sliced {
            true => (table.limits.slice_rows, table.limits.slice_bytes),
            false => (usize::MAX, usize::MAX),
        };
        let raw = self.storage.get_file(f).await?;
        // Only a CDC file's contents are recorded as applied (`delta::applied`); a full
        // load is told by its last-modified time, and hashing it would only delay it.
        let raw = match source::file_kind(table, &storage::file_name(f)) {
            FileKind::Cdc => raw.with_digest(&storage::display(f)).await?,
            FileKind::FullLoad => raw,
        };
        let read =
            source::Slices::open(f, &raw, source::Spec::of(table), schema, props, rows, bytes)?
                .whole_or_large()?;
        Ok((read, raw))
    }

    /// Read and parse files (8 at a time): the change sets, the files larger than a slice
    /// (to merge in slices; with `sliced` false every file is read whole), and the files
    /// that failed.
    pub(crate) async fn read_files<T>(
        &self,
        table: &TableConfig,
        files: &[Url],
        view: &View<T>,
        sliced: bool,
    ) -> ReadFiles {
        let read = stream::iter(files.iter().cloned())
            .map(|f| async move {
                let r = self
                    .read_file(table, &f, view.schema.as_deref(), &view.props, sliced)
                    .await;
                (f, r)
            })
            .buffered(8)
            .collect::<Vec<_>>()
            .await;
        let mut out = ReadFiles::default();
        for (f, r) in read {
            match r {
                Ok((source::Read::Whole(cs), _)) => out.sets.push(*cs),
                Ok((source::Read::Large, raw)) => out.large.push((f, raw)),
                Err(e) => {
                    log_failure(&table.name, &f, &e);
                    out.failed.push((f, e));
                }
            }
        }
        out
    }

    /// Merge the batch; if that fails for a reason a single file can cause, merge the
    /// files one by one (canonical order) so only the culprit fails.
    async fn merge_or_isolate<T: Sink>(
        &self,
        sink: &T,
        table: &TableConfig,
        batch: Batch<'_>,
        loaded: Option<T::Table>,
    ) -> (Vec<TableReport>, Vec<FileOutcome>) {
        let mut outcomes = Vec::new();
        match sink.commit(table, &batch, loaded).await {
            Ok(r) => {
                outcomes.extend(merged(table, batch.changes));
                (vec![r], outcomes)
            }
            Err(e) if !e.is_retryable() && batch.changes.len() > 1 => {
                tracing::warn!(table = %table.name, error = %e, "batch merge failed; merging file by file to isolate the bad file");
                let mut reports = Vec::new();
                for cs in batch.changes {
                    let one = Batch {
                        changes: std::slice::from_ref(cs),
                        ..batch.clone()
                    };
                    match sink.commit(table, &one, None).await {
                        Ok(r) => {
                            reports.push(r);
                            outcomes.extend(merged(table, one.changes));
                        }
                        Err(e) => {
                            log_failure(&table.name, &cs.file, &e);
                            outcomes.push(FileOutcome::failed(
                                cs.file.clone(),
                                &table.name,
                                Arc::new(e),
                            ));
                        }
                    }
                }
                (reports, outcomes)
            }
            Err(e) => {
                let e = Arc::new(e);
                for cs in batch.changes {
                    log_failure(&table.name, &cs.file, &e);
                    outcomes.push(FileOutcome::failed(cs.file.clone(), &table.name, e.clone()));
                }
                (vec![], outcomes)
            }
        }
    }
}

/// How the checking pass of a large file ended ([`Engine::check_large`]).
enum Checked {
    /// Every slice is fine: the file's counts.
    Counts(source::FileCounts),
    /// Screening settled the file (refused it, or found it reflected by a reload).
    Settled(Vec<FileOutcome>),
}

/// The table named for files no table owns (logs, metrics).
const UNOWNED: &str = "(unowned)";

fn log_failure(table: &str, file: &Url, e: &Error) {
    FileOutcome::log_failure(table, file, e)
}

fn merged(table: &TableConfig, sets: &[ChangeSet]) -> Vec<FileOutcome> {
    FileOutcome::merged(table, sets)
}

#[cfg(test)]
mod tests;
