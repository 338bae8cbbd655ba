//! Delta writes: open/create tables, read tributary's table properties, and MERGE a plan
//! (tombstones live in `tombstones`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{Field, Schema, SchemaRef};
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::{Action, MetadataExt, StructType, Transaction};
use deltalake::logstore::LogStore;
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::{DeltaTable, DeltaTableBuilder};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;
use url::Url;

use crate::config::TableConfig;
use crate::delta::logcache::LogCache;
use crate::delta::scan::{KeyBound, KeyRange};
use crate::error::{Error, Result};
use crate::plan::{is_internal, MergePlan, PlanOp};
use crate::props::TableProps;

pub(crate) mod applied;
pub mod catalog;
mod commit;
pub(crate) mod constraints;
pub mod cut;
pub(crate) mod datafile;
mod engine;
mod errors;
pub mod history;
pub mod logcache;
pub mod maintenance;
pub mod manifest;
pub(crate) mod pipeline;
pub mod reload;
pub(crate) mod retry;
pub(crate) mod rewrite;
pub mod scan;
pub mod sink;
pub(crate) mod stats;
pub mod status;
#[cfg(test)]
pub(crate) mod testing;
pub(crate) mod tombstones;
pub(crate) mod vectors;
pub mod watermark;
pub(crate) mod widen;
pub(crate) mod writer;
use commit::Commit;
pub(crate) use commit::Read;
pub use engine::{Engine, EngineBuilder};

/// Open a table, or return an unloaded handle when nothing is there yet.
pub async fn open(url: &Url, options: &HashMap<String, String>) -> Result<DeltaTable> {
    let label = crate::storage::display(url);
    if url.scheme() == "file" {
        // delta-rs wants a local table's folder to exist before it creates the table.
        if let Ok(path) = url.to_file_path() {
            std::fs::create_dir_all(&path).map_err(|e| Error::Io {
                path: path.display().to_string(),
                source: e,
            })?;
        }
    }
    let (mut table, _) = unloaded(url, options)?;
    match table.load().await {
        Ok(()) => Ok(table),
        Err(deltalake::DeltaTableError::NotATable(_)) => Ok(table),
        Err(e) => Err(Error::delta(&label, e)),
    }
}

/// The table as it was at `version` (time travel: its first schema, say). An error when the
/// version is no longer in the log.
pub(crate) async fn open_version(
    url: &Url,
    options: &HashMap<String, String>,
    version: u64,
) -> Result<DeltaTable> {
    let label = crate::storage::display(url);
    let (mut table, _) = unloaded(url, options)?;
    table
        .load_version(version)
        .await
        .map_err(|e| Error::delta(&label, e))?;
    Ok(table)
}

/// A handle on the table at `url` (through the bucket's caching store), not loaded yet.
fn unloaded(url: &Url, options: &HashMap<String, String>) -> Result<(DeltaTable, Arc<LogCache>)> {
    let label = crate::storage::display(url);
    let mut builder = DeltaTableBuilder::from_url(url.clone())
        .map_err(|e| Error::delta(&label, e))?
        .with_storage_options(options.clone());
    let store = root_store(url, options, &builder)?;
    builder = builder.with_storage_backend(
        store.clone() as Arc<dyn deltalake::ObjectStore>,
        url.clone(),
    );
    let table = builder.build().map_err(|e| Error::delta(&label, e))?;
    Ok((table, store))
}

/// Keep the data files of the table at `url` in its bucket's cache once read or written
/// (`LogCache::keep_data_files_of`): for small append-only tables every merge reads whole.
pub(crate) fn keep_data_files(url: &Url, options: &HashMap<String, String>) -> Result<()> {
    let (_, store) = unloaded(url, options)?;
    if let Ok(root) = object_store::path::Path::from_url_path(url.path()) {
        store.keep_data_files_of(root.as_ref());
    }
    Ok(())
}

/// The store every table of `url`'s bucket (or of the local disk) is read through: delta-rs's
/// own, behind one [`LogCache`] per bucket and process, so that a warm instance does not
/// fetch the same commit files and checkpoints again (`TRIBUTARY_LOG_CACHE_MB=0`: a cache
/// that keeps nothing), and so that every commit's statistics are exact (`stats`).
fn root_store(
    url: &Url,
    options: &HashMap<String, String>,
    builder: &DeltaTableBuilder,
) -> Result<Arc<LogCache>> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<LogCache>>>> = OnceLock::new();
    let total = crate::tuning::log_cache_bytes();
    let mut opts: Vec<_> = options.iter().collect();
    opts.sort();
    let key = format!(
        "{}://{} {opts:?}",
        url.scheme(),
        url.host_str().unwrap_or("")
    );
    let stores = STORES.get_or_init(Default::default);
    if let Some(s) = stores.lock().ok().and_then(|m| m.get(&key).cloned()) {
        return Ok(s);
    }
    let root = builder
        .build_storage()
        .map_err(|e| Error::delta(&crate::storage::display(url), e))?
        .root_object_store(None);
    let store = Arc::new(LogCache::new(root, total));
    if let Ok(mut m) = stores.lock() {
        return Ok(m.entry(key).or_insert(store).clone());
    }
    Ok(store)
}

/// Bring a loaded table to its newest version (after a lost commit race).
pub(crate) async fn refresh(table: &mut DeltaTable, label: &str) -> Result<()> {
    table
        .update_incremental(None)
        .await
        .map_err(|e| Error::delta(label, e))
}

/// Whether the handle points at an existing table.
pub fn exists(table: &DeltaTable) -> bool {
    table.version().is_some()
}

/// The table's Arrow schema, when it exists.
pub(crate) fn arrow_schema(table: &DeltaTable) -> Option<SchemaRef> {
    table.snapshot().ok().map(|s| s.snapshot().arrow_schema())
}

/// tributary's properties of the loaded version (defaults when the table does not exist).
pub fn props(table: &DeltaTable) -> TableProps {
    table
        .snapshot()
        .ok()
        .map(|s| TableProps::from_configuration(s.metadata().configuration()))
        .unwrap_or_default()
}

/// Whether merges may write deletion vectors into the table: `delta.enableDeletionVectors`
/// is on and its protocol has the `deletionVectors` feature (reader and writer).
pub(crate) fn writes_deletion_vectors(table: &DeltaTable) -> bool {
    let Ok(state) = table.snapshot() else {
        return false;
    };
    let (readers, writers) = feature_names(state.protocol());
    let has = |f: &[String]| f.iter().any(|f| f == "deletionVectors");
    props(table).deletion_vectors && has(&readers) && has(&writers)
}

/// A protocol's reader and writer features, by name (none for a legacy protocol).
pub(crate) fn feature_names(protocol: &deltalake::kernel::Protocol) -> (Vec<String>, Vec<String>) {
    fn names<T: std::fmt::Display>(f: Option<&[T]>) -> Vec<String> {
        f.unwrap_or_default()
            .iter()
            .map(|f| f.to_string())
            .collect()
    }
    (
        names(protocol.reader_features()),
        names(protocol.writer_features()),
    )
}

/// The partition columns of the loaded version.
pub(crate) fn partition_columns(table: &DeltaTable) -> Result<Vec<String>> {
    let label = table.table_url().to_string();
    Ok(table
        .snapshot()
        .map_err(|e| Error::delta(&label, e))?
        .metadata()
        .partition_columns()
        .to_vec())
}

/// Create the table with this schema, partitioning and properties, unless it exists. A
/// concurrent creator winning the race is not an error: the caller's retry reloads the table.
pub(crate) async fn create(
    table: DeltaTable,
    name: &str,
    schema: &Schema,
    partition_by: &[String],
    mut properties: HashMap<String, String>,
) -> Result<DeltaTable> {
    let label = table.table_url().to_string();
    properties
        .entry(CHECKPOINT_INTERVAL.to_string())
        .or_insert_with(|| CHECKPOINT_EVERY.to_string());
    let nullable = Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    );
    let kernel: StructType = (&nullable).try_into_kernel().map_err(|e| Error::Schema {
        table: name.to_string(),
        message: format!("cannot map the columns to Delta types: {e}"),
    })?;
    table
        .create()
        .with_table_name(name)
        .with_columns(kernel.fields().cloned())
        .with_partition_columns(partition_by.to_vec())
        .with_configuration(properties.into_iter().map(|(k, v)| (k, Some(v))))
        // tributary's own `tributary.*` keys are not Delta properties.
        .with_raise_if_key_not_exists(false)
        .with_commit_properties(create_commit())
        .await
        .map_err(|e| Error::delta(&label, e))
}

/// Create the table unless it exists; if a concurrent writer created it first (whatever
/// error delta-rs reports for that), use theirs. Also tells whether this call created it.
pub(crate) async fn open_or_create(
    url: &Url,
    options: &HashMap<String, String>,
    name: &str,
    schema: &Schema,
    partition_by: &[String],
    properties: HashMap<String, String>,
) -> Result<(DeltaTable, bool)> {
    let t = open(url, options).await?;
    if exists(&t) {
        return Ok((t, false));
    }
    match create(t, name, schema, partition_by, properties).await {
        Ok(t) => Ok((t, true)),
        Err(e) => {
            let t = open(url, options).await?;
            if exists(&t) {
                Ok((t, false))
            } else {
                Err(e)
            }
        }
    }
}

/// The Delta property for how often a commit writes a checkpoint.
pub(crate) const CHECKPOINT_INTERVAL: &str = "delta.checkpointInterval";
/// tributary's tables write a checkpoint every 10 commits (Delta Lake's default; delta-rs's
/// is 100). Every load of a table — each merge loads it more than once — reads every commit
/// since the last checkpoint, one GET each: at 100 that was up to ~190 GETs per merge on S3
/// (docs/benchmarks.md, "S3 requests").
pub(crate) const CHECKPOINT_EVERY: u32 = 10;

/// Whether the loaded table carries its own checkpoint interval.
pub(crate) fn has_checkpoint_interval(table: &DeltaTable) -> bool {
    table.snapshot().is_ok_and(|s| {
        s.metadata()
            .configuration()
            .contains_key(CHECKPOINT_INTERVAL)
    })
}

/// Whether tributary writes the table's checkpoints: not for tables with the `v2Checkpoint`
/// feature (delta-rs writes classic checkpoints only; their writer keeps theirs).
pub(crate) fn classic_checkpoints(table: &DeltaTable) -> bool {
    table.snapshot().is_ok_and(|s| {
        !s.protocol()
            .reader_features()
            .is_some_and(|f| f.iter().any(|f| f.to_string() == "v2Checkpoint"))
    })
}

/// A table without recorded sequence kinds (created before they were recorded, or by
/// another writer) gets the batch's, once, so that later files are checked against them.
pub(crate) async fn record_kinds(
    target: DeltaTable,
    kinds: Option<&[crate::model::SeqKind]>,
) -> Result<DeltaTable> {
    let Some(kinds) = kinds else {
        return Ok(target);
    };
    if kinds.is_empty() || props(&target).sequence_kinds.is_some() {
        return Ok(target);
    }
    set_properties(target, TableProps::for_kinds(kinds)).await
}

/// Set table properties: a metadata commit (with the protocol the properties need: the
/// change data feed's writer version or feature). A concurrent writer's metadata commit
/// makes it conflict; the caller's attempt retries it.
pub(crate) async fn set_properties(
    table: DeltaTable,
    properties: HashMap<String, String>,
) -> Result<DeltaTable> {
    let label = table.table_url().to_string();
    let delta_err = |e| Error::delta(&label, e);
    let state = table.snapshot().map_err(delta_err)?;
    let mut metadata = state.metadata().clone();
    for (k, v) in &properties {
        metadata = metadata
            .add_config_key(k.clone(), v.clone())
            .map_err(|e| delta_err(e.into()))?;
    }
    let mut actions = vec![Action::Metadata(metadata)];
    let feed = properties
        .get("delta.enableChangeDataFeed")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if feed {
        actions.extend(upgraded(
            state.protocol(),
            None,
            "changeDataFeed",
            4,
            &label,
        )?);
    }
    let vectors = properties
        .get(crate::props::DELETION_VECTORS)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if vectors {
        // A reader-writer feature: reader version 3 / writer version 7 with the features the
        // table's legacy versions implied listed (`upgraded`).
        actions.extend(upgraded(
            state.protocol(),
            Some("deletionVectors"),
            "deletionVectors",
            7,
            &label,
        )?);
    }
    let operation = DeltaOperation::SetTableProperties { properties };
    let commit = Commit::of(&label, actions, operation, Read::Nothing);
    commit::commit(table, commit).await
}

/// The table's protocol with a feature more, when it lacks it: `writer` (a writer feature,
/// or a reader-writer one with `reader`); a legacy protocol (writer version below 7) that
/// has it from `legacy_writer` on, upgraded to that version, else to table features (the
/// features its versions implied listed, as Spark upgrades them).
fn upgraded(
    protocol: &deltalake::kernel::Protocol,
    reader: Option<&str>,
    writer: &str,
    legacy_writer: i32,
    label: &str,
) -> Result<Option<Action>> {
    let (r, w) = (protocol.min_reader_version(), protocol.min_writer_version());
    let (mut readers, mut writers) = feature_names(protocol);
    if writers.iter().any(|f| f == writer) && reader.is_none_or(|f| readers.iter().any(|x| x == f))
    {
        return Ok(None);
    }
    let value = if w < 7 && reader.is_none() {
        if w >= legacy_writer {
            return Ok(None);
        }
        serde_json::json!({"minReaderVersion": r, "minWriterVersion": legacy_writer})
    } else {
        if w < 7 {
            let implied: &[(i32, &[&str])] = &[
                (2, &["appendOnly", "invariants"]),
                (3, &["checkConstraints"]),
                (4, &["changeDataFeed", "generatedColumns"]),
                (5, &["columnMapping"]),
                (6, &["identityColumns"]),
            ];
            for (v, features) in implied {
                if w >= *v {
                    writers.extend(features.iter().map(|f| f.to_string()));
                }
            }
            if r == 2 {
                readers.push("columnMapping".into());
            }
        }
        writers.push(writer.to_string());
        readers.extend(reader.map(str::to_string));
        let mut value = serde_json::json!({
            "minReaderVersion": if reader.is_some() || r >= 3 { 3 } else { r },
            "minWriterVersion": 7,
            "writerFeatures": writers,
        });
        if reader.is_some() || r >= 3 {
            value["readerFeatures"] = serde_json::json!(readers);
        }
        value
    };
    serde_json::from_value(value)
        .map(|p| Some(Action::Protocol(p)))
        .map_err(|e| Error::internal(format!("{label}: protocol upgrade: {e}")))
}

/// The version an application transaction id was last committed with, if any.
pub(crate) async fn txn_version(table: &DeltaTable, app_id: &str) -> Result<Option<i64>> {
    let label = table.table_url().to_string();
    let snapshot = table.snapshot().map_err(|e| Error::delta(&label, e))?;
    snapshot
        .transaction_version(table.log_store().as_ref(), app_id)
        .await
        .map_err(|e| Error::delta(&label, e))
}

/// Commit only application transaction ids (no data change), e.g. to record that files were
/// applied when their rows changed nothing.
pub(crate) async fn commit_txns(table: DeltaTable, txns: Vec<Transaction>) -> Result<DeltaTable> {
    commit_txns_with(table, txns, None).await
}

/// [`commit_txns`], with one more entry in the commit info.
pub(crate) async fn commit_txns_with(
    table: DeltaTable,
    txns: Vec<Transaction>,
    info: Option<(&str, serde_json::Value)>,
) -> Result<DeltaTable> {
    let label = table.table_url().to_string();
    let mut commit = Commit::of(
        &label,
        vec![],
        append_operation(&table, None)?,
        Read::Nothing,
    );
    commit.txns = txns;
    commit.info.extend(info.map(|(k, v)| (k.to_string(), v)));
    commit::commit(table, commit).await
}

/// A commit of no action (VACUUM's START and END), `metrics` as its operation metrics.
pub(crate) async fn commit_marker(
    label: &str,
    table: DeltaTable,
    operation: DeltaOperation,
    metrics: serde_json::Value,
) -> Result<DeltaTable> {
    let mut commit = Commit::of(label, vec![], operation, Read::Nothing);
    commit.info.push(("operationMetrics".to_string(), metrics));
    commit::commit(table, commit).await
}

/// The commit properties of a table tributary creates (delta-rs's create commits version 0
/// itself): tributary as the engine, and no log cleanup (the maintenance run cleans the log
/// once per run, `cleanup_metadata`, with the table's `delta.logRetentionDuration`).
pub(crate) fn create_commit() -> CommitProperties {
    CommitProperties::default()
        .with_metadata([(
            "engineInfo".to_string(),
            serde_json::Value::String(format!("tributary/{}", env!("CARGO_PKG_VERSION"))),
        )])
        .with_cleanup_expired_logs(Some(false))
}

/// A `WRITE` (append) operation on the table, declaring `predicate` as what it read.
fn append_operation(table: &DeltaTable, predicate: Option<String>) -> Result<DeltaOperation> {
    let partition_columns = partition_columns(table)?;
    Ok(DeltaOperation::Write {
        mode: SaveMode::Append,
        partition_by: (!partition_columns.is_empty()).then_some(partition_columns),
        predicate,
    })
}

/// How delta-rs's writer lays out data files of the table at `snapshot` (its schema,
/// partitioning and statistics columns), with these Parquet settings and target file size.
pub(crate) fn writer_config(
    snapshot: &deltalake::table::state::DeltaTableState,
    properties: Option<WriterProperties>,
    target_file_size: Option<std::num::NonZeroU64>,
) -> writer::FileLayout {
    writer_config_for(
        snapshot,
        snapshot.snapshot().arrow_schema(),
        properties,
        target_file_size,
    )
}

/// [`writer_config`] for data files in `schema` (the table's schema about to change: a
/// widening's rewrite).
pub(crate) fn writer_config_for(
    snapshot: &deltalake::table::state::DeltaTableState,
    schema: SchemaRef,
    properties: Option<WriterProperties>,
    target_file_size: Option<std::num::NonZeroU64>,
) -> writer::FileLayout {
    use deltalake::table::config::TablePropertiesExt;
    let props = snapshot.table_config();
    let partition_columns = snapshot.metadata().partition_columns().to_vec();
    let config = deltalake::datafile::writer::WriterConfig::new(
        schema,
        partition_columns.clone(),
        properties,
        target_file_size,
        None,
        props.num_indexed_cols(),
        props
            .data_skipping_stats_columns
            .as_ref()
            .map(|v| v.iter().map(|c| c.to_string()).collect()),
    );
    writer::FileLayout {
        config,
        partition_columns: partition_columns.into(),
    }
}

/// Parquet settings of the data files tributary writes (MERGE, appends, compaction, the
/// history MERGE): the table's codec (`parquet_compression`; zstd at level 1) and dictionary
/// encoding, except that columns unique per row — the order keys, and a single-column
/// primary key — skip the dictionary attempt, which never pays off there and costs hashing
/// every value of every rewritten file; with `order_key_encoding = "delta"` the order keys
/// are DELTA_BYTE_ARRAY.
pub fn writer_properties(table_cfg: &TableConfig) -> WriterProperties {
    use crate::config::ParquetCompression as C;
    let compression = match table_cfg.writing.compression {
        C::Snappy => Compression::SNAPPY,
        C::Zstd => Compression::ZSTD(Default::default()), // level 1, as measured
        C::Gzip => Compression::GZIP(Default::default()),
    };
    let mut b = WriterProperties::builder()
        .set_created_by(format!("tributary {}", env!("CARGO_PKG_VERSION")))
        .set_compression(compression)
        .set_column_dictionary_enabled(
            ColumnPath::from(table_cfg.writing.sequence_column.as_str()),
            false,
        );
    if let [key] = table_cfg.primary_key.as_slice() {
        b = b.set_column_dictionary_enabled(ColumnPath::from(key.as_str()), false);
    }
    if table_cfg.writing.order_key_encoding == crate::config::OrderKeyEncoding::Delta {
        let history = [crate::model::LAST_SEQ_COLUMN, crate::model::END_SEQ_COLUMN];
        for c in std::iter::once(table_cfg.writing.sequence_column.as_str()).chain(history) {
            b = b
                .set_column_dictionary_enabled(ColumnPath::from(c), false)
                .set_column_encoding(
                    ColumnPath::from(c),
                    parquet::basic::Encoding::DELTA_BYTE_ARRAY,
                );
        }
    }
    b.build()
}

/// Check the plan against an existing table: keys, partitioning, types. New columns are
/// fine (added by the MERGE); a column whose type differs is converted when every value
/// fits exactly, else the plan is refused.
pub(crate) fn align_to_table(
    table_cfg: &TableConfig,
    plan: &mut MergePlan,
    table: &DeltaTable,
) -> Result<()> {
    let Some(tschema) = arrow_schema(table) else {
        return Ok(());
    };
    let serr = |m: String| Error::Schema {
        table: table_cfg.name.clone(),
        message: m,
    };
    let parts = partition_columns(table)?;
    if parts != table_cfg.partition_by {
        return Err(serr(format!(
            "the Delta table is partitioned by {:?} but the config says partition_by = {:?}; change the config or write to a new table",
            parts, table_cfg.partition_by
        )));
    }
    for k in &table_cfg.primary_key {
        if tschema.field_with_name(k).is_err() {
            return Err(serr(format!(
                "primary key column `{k}` is not a column of the existing Delta table"
            )));
        }
    }
    let schema = plan.batch.schema();
    let mut cols: Vec<ArrayRef> = plan.batch.columns().to_vec();
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut changed = false;
    for (i, f) in schema.fields().iter().enumerate() {
        let Ok(tf) = tschema.field_with_name(f.name()) else {
            continue;
        };
        if is_internal(f.name()) || tf.data_type() == f.data_type() {
            continue;
        }
        cols[i] = crate::coerce::exact_cast(&cols[i], tf.data_type()).map_err(|e| {
            serr(format!(
                "column `{}` is {} in the table but {} in the files: {}; {}",
                f.name(),
                tf.data_type(),
                f.data_type(),
                e.describe(f.data_type(), tf.data_type()),
                crate::error::TYPE_CHANGE_HELP
            ))
        })?;
        if table_cfg.primary_key.contains(f.name()) {
            // The keys in their new type: text `NaN` is no key, text `-0` is the key `0`.
            if let Some((r, why)) = crate::source::key_problem(&cols[i]) {
                return Err(serr(format!(
                    "key column `{}` is {} in the table but {} in the files: row {} of the plan: {why}",
                    f.name(),
                    tf.data_type(),
                    f.data_type(),
                    r + 1
                )));
            }
            cols[i] = crate::source::normalize_zero(cols[i].clone());
        }
        fields[i] = Field::new(f.name(), tf.data_type().clone(), true);
        changed = true;
    }
    if changed {
        plan.batch =
            RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(Error::arrow)?;
    }
    Ok(())
}

/// Add the columns of `schema` (the plan's) the table lacks, nullable, by a metadata commit
/// before the merge writes them — what Spark's `ALTER TABLE ADD COLUMNS` commits; the rows
/// already in the table have nulls there. A conflict (another writer's metadata commit) is
/// retried by the caller's attempt like the merge's own.
pub(crate) async fn add_new_columns(
    table_cfg: &TableConfig,
    table: DeltaTable,
    schema: &Schema,
) -> Result<DeltaTable> {
    add_new_columns_as(&table_cfg.name, table, schema).await
}

/// [`add_new_columns`] of any table, `label` naming it.
pub(crate) async fn add_new_columns_as(
    label: &str,
    table: DeltaTable,
    schema: &Schema,
) -> Result<DeltaTable> {
    let Some(tschema) = arrow_schema(&table) else {
        return Ok(table);
    };
    let new: Vec<Field> = schema
        .fields()
        .iter()
        .filter(|f| tschema.field_with_name(f.name()).is_err())
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    if new.is_empty() {
        return Ok(table);
    }
    let names: Vec<String> = new.iter().map(|f| f.name().clone()).collect();
    tracing::info!(table = %label, columns = ?names, "adding the files' new columns to the table");
    let kernel: StructType = (&Schema::new(new))
        .try_into_kernel()
        .map_err(|e| Error::Schema {
            table: label.to_string(),
            message: format!("cannot map the new columns {names:?} to Delta types: {e}"),
        })?;
    add_columns(label, table, kernel.fields().cloned().collect()).await
}

/// Add `fields` to the table's schema, as Spark's `ALTER TABLE ADD COLUMNS` commits: the
/// table's metadata with the wider schema, and the `timestampNtz` feature when a new column
/// needs it.
pub(crate) async fn add_columns(
    label: &str,
    table: DeltaTable,
    fields: Vec<deltalake::kernel::StructField>,
) -> Result<DeltaTable> {
    let delta_err = |e| Error::delta(label, e);
    let state = table.snapshot().map_err(delta_err)?;
    let schema = state.schema();
    let all: Vec<_> = schema
        .fields()
        .cloned()
        .chain(fields.iter().cloned())
        .collect();
    let wider = StructType::try_new(all).map_err(|e| Error::Schema {
        table: label.to_string(),
        message: format!("cannot add the columns: {e}"),
    })?;
    let metadata = state
        .metadata()
        .clone()
        .with_schema(&wider)
        .map_err(|e| delta_err(e.into()))?;
    let mut actions = vec![Action::Metadata(metadata)];
    let ntz = fields
        .iter()
        .any(|f| serde_json::to_string(f).is_ok_and(|s| s.contains("\"timestamp_ntz\"")));
    if ntz {
        actions.extend(upgraded(
            state.protocol(),
            Some("timestampNtz"),
            "timestampNtz",
            7,
            label,
        )?);
    }
    let operation = DeltaOperation::AddColumn { fields };
    commit::commit(table, Commit::of(label, actions, operation, Read::Nothing)).await
}

/// What a MERGE commits besides the plan.
#[derive(Debug, Clone, Default)]
pub(crate) struct MergeExtras {
    /// Application transaction ids to record in the same commit (full-load files applied).
    pub(crate) txns: Vec<Transaction>,
    /// A reload: delete the table's rows that no change of the plan matches and whose order
    /// key is below this (rows absent from the new full load).
    pub(crate) delete_unmatched_below: Option<String>,
}

/// A commit race: reading the table again and retrying resolves it.
pub(crate) fn is_conflict(e: &Error) -> bool {
    matches!(
        e,
        Error::Table {
            outcome: crate::error::TableFailure::Conflict,
            ..
        }
    )
}

/// When a plan can be appended instead of merged: every row an upsert, no new column, one
/// key column of an integer or string type, and no row of the table with a key in the
/// plan's key range — then MERGE would insert every row, and an append writes the same rows
/// without reading or rewriting anything. Returns the key range, which the append's
/// commit declares as what it read: a concurrent commit that adds files whose key
/// statistics overlap the range makes the append conflict, and the retry merges.
pub(crate) async fn append_range(
    cfg: &TableConfig,
    table: &DeltaTable,
    plan: &MergePlan,
) -> Result<Option<KeyRange>> {
    let [key] = cfg.primary_key.as_slice() else {
        return Ok(None);
    };
    let Some(tschema) = arrow_schema(table) else {
        return Ok(None);
    };
    if !plan.sparse.is_empty()
        || plan.batch.num_rows() == 0
        || plan.ops()?.iter().any(|o| *o != PlanOp::Upsert)
        || plan
            .table_schema()
            .fields()
            .iter()
            .any(|f| tschema.field_with_name(f.name()).is_err())
    {
        return Ok(None);
    }
    let Some(keys) = plan.batch.column_by_name(key) else {
        return Ok(None);
    };
    let Some(range) = KeyRange::of(keys)? else {
        return Ok(None);
    };
    if holds_a_row_in_range(table, key, &range) {
        return Ok(None);
    }
    Ok((!crate::delta::scan::rows_in_range(table, key, &range).await?).then_some(range))
}

/// Reader features tributary reads exactly (deletion vectors with the kernel, the rest as
/// delta-rs does); column mapping only while its mode is `none` (checked below).
const READER_FEATURES: &[&str] = &[
    "deletionVectors",
    "timestampNtz",
    "v2Checkpoint",
    "vacuumProtocolCheck",
    "columnMapping",
];

/// Writer features tributary writes exactly: CHECK constraints, invariants and NOT NULL
/// checked on every row (`constraints`), the change data feed written (`rewrite`), append-
/// only refused for any remove (`commit`), deletion vectors honoured, VACUUM committing
/// START/END through this check; generated, identity and mapped columns only while the
/// table has none (checked below).
const WRITER_FEATURES: &[&str] = &[
    "appendOnly",
    "invariants",
    "checkConstraints",
    "changeDataFeed",
    "timestampNtz",
    "deletionVectors",
    "v2Checkpoint",
    "vacuumProtocolCheck",
    "generatedColumns",
    "identityColumns",
    "columnMapping",
];

/// A table tributary cannot write exactly, refused by name before anything is written
/// (the adoption's metadata commit included), not retryable: a protocol feature it does
/// not know (row tracking, clustering, type widening, in-commit timestamps, …), column
/// mapping (the data files name columns by physical names tributary does not write),
/// identity columns (values the writer must generate) and generated columns (values the
/// writer must compute).
pub(crate) fn refuse_unwritable(table: &DeltaTable, label: &str) -> Result<()> {
    let Ok(state) = table.snapshot() else {
        return Ok(());
    };
    let refuse = |feature: String, way_forward: &str| Error::Unsupported {
        table: label.to_string(),
        feature,
        way_forward: format!("nothing was written; {way_forward}"),
    };
    let protocol = state.protocol();
    let (readers, writers) = feature_names(protocol);
    let unknown: Vec<String> = readers
        .into_iter()
        .filter(|f| !READER_FEATURES.contains(&f.as_str()))
        .chain(
            writers
                .into_iter()
                .filter(|f| !WRITER_FEATURES.contains(&f.as_str())),
        )
        .collect();
    if !unknown.is_empty() || protocol.min_reader_version() > 3 || protocol.min_writer_version() > 7
    {
        return Err(refuse(
            format!(
                "the table's protocol (reader version {}, writer version {}) has features tributary does not write: {}",
                protocol.min_reader_version(),
                protocol.min_writer_version(),
                if unknown.is_empty() { "a newer protocol version".to_string() } else { unknown.join(", ") }
            ),
            "merge into a new table (point `target` at a new folder: tributary creates it, and the DMS full load fills it), or drop the features with the engine that added them, then replay the files",
        ));
    }
    if let Some(mode) = state
        .metadata()
        .configuration()
        .get("delta.columnMapping.mode")
        .filter(|m| m.as_str() != "none")
    {
        return Err(refuse(
            format!("the table uses column mapping (delta.columnMapping.mode = {mode}), whose physical column names tributary does not write"),
            "merge into a new table (point `target` at a new folder: tributary creates it, and the DMS full load fills it), or rewrite this one without column mapping (e.g. Spark's CREATE TABLE … AS SELECT), then replay the files",
        ));
    }
    let with = |prefix: &str| -> Vec<String> {
        state
            .schema()
            .fields()
            .filter(|f| f.metadata().keys().any(|k| k.starts_with(prefix)))
            .map(|f| format!("`{}`", f.name()))
            .collect()
    };
    let identity = with("delta.identity");
    if !identity.is_empty() {
        return Err(refuse(
            format!("identity columns ({}), whose values the writer must generate; tributary writes the source's values", identity.join(", ")),
            "merge into a new table without identity columns (the source database already assigns the key), then replay the files",
        ));
    }
    let generated = with("delta.generationExpression");
    if !generated.is_empty() {
        return Err(refuse(
            format!("generated columns ({}), whose values the writer must compute from their expressions; tributary writes the source's columns only", generated.join(", ")),
            "merge into a new table without generated columns (compute them in the readers' views, or in the source), then replay the files",
        ));
    }
    Ok(())
}

/// Whether a data file's statistics show that the table has a row with an integer `key`
/// in `range`: its minimum or maximum key is in it (an exact value of one of its rows; a
/// file with a deletion vector may have lost that row, so it says nothing). Answers the
/// append check without a scan whenever a plan updates a key of the table: the scan
/// (`rows_in_range`) opens every file whose range overlaps the plan's, four GETs each, and
/// a plan of scattered updates overlaps nearly all of them (one such merge made 241 GETs,
/// docs/benchmarks.md "Freshness").
fn holds_a_row_in_range(table: &DeltaTable, key: &str, range: &KeyRange) -> bool {
    let (KeyBound::Int(lo), KeyBound::Int(hi)) = (&range.lo, &range.hi) else {
        return false;
    };
    let Ok(snapshot) = table.snapshot() else {
        return false;
    };
    snapshot.log_data().iter().any(|f| {
        if f.deletion_vector_descriptor().is_some() {
            return false;
        }
        let Some(stats) = f.stats() else {
            return false;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&stats) else {
            return false;
        };
        ["minValues", "maxValues"].iter().any(|which| {
            v.get(which)
                .and_then(|m| m.get(key))
                .and_then(serde_json::Value::as_i64)
                .is_some_and(|k| (*lo..=*hi).contains(&k))
        })
    })
}

/// Append the plan's rows (see [`append_predicate`]) in one commit that also records
/// `extras.txns`. Returns the table after it and the files written.
pub(crate) async fn append(
    cfg: &TableConfig,
    table: DeltaTable,
    plan: &MergePlan,
    range: KeyRange,
    files: &[String],
    extras: &MergeExtras,
) -> Result<(DeltaTable, usize)> {
    let adds = write_rows(cfg, &table, plan, &files.join(", ")).await?;
    let written = adds.len();
    let table = commit_append(cfg, table, adds, range, files, &extras.txns).await?;
    Ok((table, written))
}

/// Write the plan's rows as data files of the table (in its schema; columns the plan lacks
/// are null), without committing them: the `add` actions that would. The rows are checked
/// against the table's constraints first (a row that breaks one refuses `files`).
pub(crate) async fn write_rows(
    cfg: &TableConfig,
    table: &DeltaTable,
    plan: &MergePlan,
    files: &str,
) -> Result<Vec<deltalake::kernel::Action>> {
    use deltalake::kernel::Action;
    let label = cfg.name.as_str();
    let delta_err = |e| Error::delta(label, e);
    let snapshot = table.snapshot().map_err(delta_err)?;
    let schema = snapshot.snapshot().arrow_schema();
    let rows = plan.batch.num_rows();
    let columns = schema
        .fields()
        .iter()
        .map(|f| match plan.batch.column_by_name(f.name()) {
            Some(c) if c.data_type() == f.data_type() => Ok(c.clone()),
            Some(c) => arrow::compute::cast(c, f.data_type()).map_err(Error::arrow),
            None => Ok(arrow::array::new_null_array(f.data_type(), rows)),
        })
        .collect::<Result<Vec<_>>>()?;
    let batch = RecordBatch::try_new_with_options(
        Arc::new(Schema::new(
            schema
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true))
                .collect::<Vec<_>>(),
        )),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(rows)),
    )
    .map_err(Error::arrow)?;
    crate::delta::constraints::Checks::of(table, label)?.verify(
        label,
        files,
        &cfg.primary_key,
        &batch,
    )?;
    let batch =
        RecordBatch::try_new(schema.clone(), batch.columns().to_vec()).map_err(Error::arrow)?;
    let config = writer_config(snapshot, Some(writer_properties(cfg)), None);
    let store = table.log_store().object_store(None);
    let parts = writer::Partitioned::of(&batch, &config.partition_columns).map_err(delta_err)?;
    // One share is written here; more each in its own task (all of them: a task spawned
    // from a runtime thread waits in that thread's own slot, which the other threads do not
    // take from, until the spawning task yields), each awaited whatever the others'
    // outcome, so that none is still writing once this returns.
    let mut shares = parts.shares(WRITERS_PER_BATCH);
    let adds = match shares.len() {
        0 => Ok(Vec::new()),
        1 => write_share(store, config, shares.remove(0)).await,
        _ => {
            let tasks: Vec<_> = shares
                .into_iter()
                .map(|share| tokio::spawn(write_share(store.clone(), config.clone(), share)))
                .collect();
            let mut adds = Ok(Vec::new());
            for task in tasks {
                let written = task
                    .await
                    .map_err(|e| Error::internal(format!("data-file writer: {e}")))?;
                match (&mut adds, written) {
                    (Ok(all), Ok(more)) => all.extend(more),
                    (Ok(_), Err(e)) => adds = Err(e),
                    (Err(_), _) => {}
                }
            }
            adds
        }
    };
    Ok(adds
        .map_err(delta_err)?
        .into_iter()
        .map(Action::Add)
        .collect())
}

/// Writers that write the partitions of one batch at once ([`write_rows`]): the encoding of
/// a large slice (most of a full load's CPU) is spread over both cores of a 2-vCPU function,
/// and the last slice of a file is not written by one core while the other waits.
const WRITERS_PER_BATCH: usize = 2;

/// Write one share of a batch's partitions as data files: their `add` actions.
async fn write_share(
    store: deltalake::logstore::ObjectStoreRef,
    config: writer::FileLayout,
    share: writer::Partitioned,
) -> deltalake::DeltaResult<Vec<deltalake::kernel::Add>> {
    let mut writer = writer::Writer::new(store, config);
    writer.write_partitioned(&share).await?;
    writer.close().await
}

/// Append `rows` as a blind append (no read predicate: concurrent appends do not conflict)
/// with `files` in the commit info: the columns the table lacks added first by a metadata
/// commit, the rows in the table's schema (columns they lack null), written with the
/// table's Parquet settings (`properties`) by delta-rs's writer. For tributary's own
/// tables (tombstones, the history's change log), whose rows it builds itself.
pub(crate) async fn append_rows(
    label: &str,
    table: DeltaTable,
    rows: &RecordBatch,
    properties: Option<WriterProperties>,
    files: &[String],
) -> Result<DeltaTable> {
    use deltalake::kernel::Action;
    let delta_err = |e| Error::delta(label, e);
    let table = add_new_columns_as(label, table, &rows.schema()).await?;
    let snapshot = table.snapshot().map_err(delta_err)?;
    let schema = snapshot.snapshot().arrow_schema();
    let n = rows.num_rows();
    let columns = schema
        .fields()
        .iter()
        .map(|f| match rows.column_by_name(f.name()) {
            Some(c) if c.data_type() == f.data_type() => Ok(c.clone()),
            Some(c) => crate::coerce::exact_cast(c, f.data_type()).map_err(|e| Error::Schema {
                table: label.to_string(),
                message: format!(
                    "column `{}`: {}",
                    f.name(),
                    e.describe(c.data_type(), f.data_type())
                ),
            }),
            None => Ok(arrow::array::new_null_array(f.data_type(), n)),
        })
        .collect::<Result<Vec<_>>>()?;
    let batch = RecordBatch::try_new(schema.clone(), columns).map_err(Error::arrow)?;
    let config = writer_config(snapshot, properties, None);
    let mut writer = writer::Writer::new(table.log_store().object_store(None), config);
    writer.write(&batch).await.map_err(delta_err)?;
    let adds: Vec<Action> = writer
        .close()
        .await
        .map_err(delta_err)?
        .into_iter()
        .map(Action::Add)
        .collect();
    let operation = append_operation(&table, None)?;
    commit_actions(label, table, adds, operation, Read::Nothing, files, &[]).await
}

/// Append `rows` to the table, creating it (their schema, partitioned by `partition_by`)
/// when it does not exist yet: the benchmarks' base tables, written as a load would be.
pub async fn write_batch(
    table: DeltaTable,
    name: &str,
    rows: &RecordBatch,
    partition_by: &[String],
    properties: WriterProperties,
) -> Result<DeltaTable> {
    let table = match exists(&table) {
        true => table,
        false => create(table, name, &rows.schema(), partition_by, HashMap::new()).await?,
    };
    append_rows(name, table, rows, Some(properties), &[]).await
}

/// Rewrite the table's rows through `change` (each batch of each live file, its deletion
/// vector applied: the batch to write instead, and how many of its rows changed), file by
/// file; the files with a change are written again (the table's Parquet settings,
/// `properties`) and replaced in one commit as `operation`, with the application
/// transactions `txns`. Returns the table and the rows changed (no commit when none).
/// For updates and deletes over a whole table of tributary's own (tombstone expiry, a
/// history's interval floor) that no merge plan describes.
pub(crate) async fn rewrite_rows(
    label: &str,
    table: DeltaTable,
    properties: Option<WriterProperties>,
    mut change: impl FnMut(RecordBatch) -> Result<(RecordBatch, usize)>,
    operation: DeltaOperation,
    txns: &[Transaction],
) -> Result<(DeltaTable, usize)> {
    use deltalake::kernel::Action;
    use futures::StreamExt;
    let delta_err = |e| Error::delta(label, e);
    let snapshot = table.snapshot().map_err(delta_err)?;
    let schema = snapshot.snapshot().arrow_schema();
    let partition_columns = snapshot.metadata().partition_columns().to_vec();
    let files = crate::delta::datafile::TableFiles::of(&table);
    let config = writer_config(snapshot, properties, None);
    let mut writer: Option<writer::Writer> = None;
    let mut actions = Vec::new();
    let mut changed = 0usize;
    for f in snapshot.log_data().iter() {
        let partition = crate::delta::manifest::Partition::of(&f, &partition_columns);
        let mut out = Vec::new();
        let mut n = 0usize;
        let mut batches = files
            .stream(&f, &schema, &partition)
            .await
            .map_err(|e| e.into_error(label))?;
        while let Some(b) = batches.next().await {
            let (b, c) = change(b.map_err(|e| e.into_error(label))?)?;
            n += c;
            out.push(b);
        }
        if n == 0 {
            continue;
        }
        changed += n;
        let w =
            writer.get_or_insert_with(|| writer::Writer::new(files.store.clone(), config.clone()));
        for b in out.iter().filter(|b| b.num_rows() > 0) {
            w.write(b).await.map_err(delta_err)?;
        }
        actions.push(Action::Remove(f.remove_action(true)));
    }
    if actions.is_empty() {
        return Ok((table, 0));
    }
    if let Some(w) = writer {
        actions.extend(
            w.close()
                .await
                .map_err(delta_err)?
                .into_iter()
                .map(Action::Add),
        );
    }
    // What it read are the files it removes: a concurrent commit that adds rows adds newer
    // ones, which this does not touch.
    let table = commit_actions(label, table, actions, operation, Read::Nothing, &[], txns).await?;
    Ok((table, changed))
}

/// Commit written files as an append on the table's snapshot that read the keys in
/// `range` of the table's first key column, with the application transactions `txns`.
pub(crate) async fn commit_append(
    cfg: &TableConfig,
    table: DeltaTable,
    adds: Vec<deltalake::kernel::Action>,
    range: KeyRange,
    files: &[String],
    txns: &[Transaction],
) -> Result<DeltaTable> {
    let key = cfg.primary_key[0].clone();
    let operation = append_operation(&table, Some(range.predicate(&key)))?;
    let read = Read::Keys { column: key, range };
    commit_actions(&cfg.name, table, adds, operation, read, files, txns).await
}

/// Commit actions on the table's loaded snapshot as `operation` having read `read`
/// (`commit`), with the merged CDC `files` in the commit info and the application
/// transactions `txns`; returns the table at the new version. `label` names the table in
/// errors.
pub(crate) async fn commit_actions(
    label: &str,
    table: DeltaTable,
    actions: Vec<deltalake::kernel::Action>,
    operation: DeltaOperation,
    read: Read,
    files: &[String],
    txns: &[Transaction],
) -> Result<DeltaTable> {
    let mut commit = Commit::of(label, actions, operation, read);
    commit.txns = txns.to_vec();
    if !files.is_empty() {
        commit
            .info
            .push(("tributary.files".to_string(), serde_json::json!(files)));
    }
    commit::commit(table, commit).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The protocol a property or a new column needs: a legacy protocol moves to the writer
    /// version that has the feature, or to table features listing what its versions
    /// implied; a table-features protocol gets the feature added; one that has it, nothing.
    #[test]
    fn a_protocol_is_upgraded_as_little_as_the_feature_needs() {
        let protocol = |v: serde_json::Value| -> deltalake::kernel::Protocol {
            serde_json::from_value(v).unwrap()
        };
        let json = |a: Option<Action>| match a {
            Some(Action::Protocol(p)) => serde_json::to_value(p).unwrap(),
            other => panic!("{other:?}"),
        };
        let legacy = protocol(serde_json::json!({"minReaderVersion": 1, "minWriterVersion": 2}));
        let feed = upgraded(&legacy, None, "changeDataFeed", 4, "t").unwrap();
        assert_eq!(
            json(feed),
            serde_json::json!({"minReaderVersion": 1, "minWriterVersion": 4})
        );
        let ntz = upgraded(&legacy, Some("timestampNtz"), "timestampNtz", 7, "t").unwrap();
        assert_eq!(
            json(ntz),
            serde_json::json!({"minReaderVersion": 3, "minWriterVersion": 7,
                "readerFeatures": ["timestampNtz"],
                "writerFeatures": ["appendOnly", "invariants", "timestampNtz"]})
        );
        let features = protocol(
            serde_json::json!({"minReaderVersion": 3, "minWriterVersion": 7,
            "readerFeatures": ["deletionVectors"], "writerFeatures": ["deletionVectors"]}),
        );
        let feed = upgraded(&features, None, "changeDataFeed", 4, "t").unwrap();
        assert_eq!(
            json(feed),
            serde_json::json!({"minReaderVersion": 3, "minWriterVersion": 7,
                "readerFeatures": ["deletionVectors"],
                "writerFeatures": ["deletionVectors", "changeDataFeed"]})
        );
        let four = protocol(serde_json::json!({"minReaderVersion": 1, "minWriterVersion": 4}));
        assert!(upgraded(&four, None, "changeDataFeed", 4, "t")
            .unwrap()
            .is_none());
    }

    use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    /// The append check's shortcut: a file's minimum or maximum key inside the range is a
    /// row there; a range inside a file's, or outside every file's, is left to the scan.
    #[tokio::test]
    async fn a_key_range_holding_a_files_bound_has_a_row_without_a_scan() {
        let dir = tempfile::tempdir().unwrap();
        let n = 11;
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("Op", DataType::Utf8, true),
                Field::new("ts", DataType::Utf8, true),
                Field::new("id", DataType::Int64, true),
            ])),
            vec![
                Arc::new(StringArray::from(vec!["I"; n])) as ArrayRef,
                Arc::new(StringArray::from(vec!["2024-01-01 00:00:00"; n])),
                Arc::new(Int64Array::from_iter_values(10..10 + n as i64)),
            ],
        )
        .unwrap();
        let (_, table) = crate::delta::testing::merged_table(dir.path(), &batch).await;
        let range = |lo, hi| KeyRange {
            lo: KeyBound::Int(lo),
            hi: KeyBound::Int(hi),
        };
        // The file holds ids 10..=20.
        for (lo, hi, known) in [
            (15, 100, true),
            (0, 10, true),
            (20, 20, true),
            (21, 30, false),
            (0, 9, false),
            (12, 18, false),
        ] {
            assert_eq!(
                holds_a_row_in_range(&table, "id", &range(lo, hi)),
                known,
                "{lo}..={hi}"
            );
        }
        let text = KeyRange {
            lo: KeyBound::Text("a".into()),
            hi: KeyBound::Text("z".into()),
        };
        assert!(!holds_a_row_in_range(&table, "id", &text));
    }
}
