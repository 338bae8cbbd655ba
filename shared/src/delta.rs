//! Delta writes: open/create tables, read tributary's table properties, and MERGE a plan
//! (tombstones live in `tombstones`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{Field, Schema, SchemaRef};
use deltalake::datafusion::common::Column;
use deltalake::datafusion::logical_expr::utils::conjunction;
use deltalake::datafusion::logical_expr::when;
use deltalake::datafusion::prelude::{lit, Expr, SessionContext};
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::{StructType, Transaction};
use deltalake::logstore::LogStore;
use deltalake::operations::merge::MergeMetrics;
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::{DeltaTable, DeltaTableBuilder};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;
use url::Url;

use crate::config::TableConfig;
use crate::error::{Error, Result};
use crate::logcache::LogCache;
use crate::plan::{is_internal, MergePlan, PlanOp, OP_COLUMN};
use crate::props::TableProps;
use crate::scan::{KeyBound, KeyRange};

/// Every DataFusion read of a table's data files decodes Parquet INT96 timestamps (Spark's
/// legacy type) as microseconds, the table's `timestamp` unit: DataFusion's default
/// nanoseconds wrap outside 1677–2262, so a row of a Spark table holding 9999-12-30 that a
/// MERGE rewrote came out as 1816-03-28 (#43). Sub-microsecond digits are not kept, as by
/// tributary's own readers (`source/parquet.rs`, `datafile.rs`).
fn read_int96_exactly(options: &mut deltalake::datafusion::config::ConfigOptions) {
    options.execution.parquet.coerce_int96 = Some("us".into());
    options.execution.parquet.coerce_int96_tz = Some("UTC".into());
}

/// The session of a query or scan of a table (DataFusion's defaults, INT96 read exactly).
pub(crate) fn session() -> SessionContext {
    let mut config = deltalake::datafusion::prelude::SessionConfig::new();
    read_int96_exactly(config.options_mut());
    SessionContext::new_with_config(config)
}

/// The session of a delta-rs MERGE (delta-rs's own, INT96 read exactly).
pub(crate) fn merge_session() -> Arc<dyn deltalake::datafusion::catalog::Session> {
    let ctx = deltalake::delta_datafusion::DeltaSessionContext::new().into_inner();
    let mut state = ctx.state();
    read_int96_exactly(state.config_mut().options_mut());
    Arc::new(state)
}

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
    let (mut table, store) = unloaded(url, options)?;
    match table.load().await {
        Ok(()) => {
            note_schema(&store, url, &table);
            Ok(table)
        }
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

/// Tell the bucket's store what the loaded table's schema says of its decimal bounds, so
/// that its commits' statistics are made exact only where they need it (`stats`).
fn note_schema(store: &Arc<LogCache>, url: &Url, table: &DeltaTable) {
    if let (Some(schema), Ok(root)) = (
        arrow_schema(table),
        object_store::path::Path::from_url_path(url.path()),
    ) {
        store.note_schema(root.as_ref(), crate::stats::arrow_has_wide_decimal(&schema));
    }
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
    let total = crate::tuning::Tuning::from_env()?.log_cache_bytes;
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
        .with_commit_properties(tributary_commit(&[]))
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

/// Set table properties (a metadata commit: concurrent writers retry once).
pub(crate) async fn set_properties(
    table: DeltaTable,
    properties: HashMap<String, String>,
) -> Result<DeltaTable> {
    let label = table.table_url().to_string();
    table
        .set_tbl_properties()
        .with_properties(properties)
        .with_raise_if_not_exists(false)
        .with_commit_properties(tributary_commit(&[]))
        .await
        .map_err(|e| Error::delta(&label, e))
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
    mut table: DeltaTable,
    txns: Vec<Transaction>,
    info: Option<(&str, serde_json::Value)>,
) -> Result<DeltaTable> {
    let label = table.table_url().to_string();
    let snapshot = table.snapshot().map_err(|e| Error::delta(&label, e))?;
    CommitBuilder::from(tributary_commit_with(&[], info).with_application_transactions(txns))
        .build(
            Some(snapshot),
            table.log_store(),
            DeltaOperation::Write {
                mode: SaveMode::Append,
                partition_by: None,
                predicate: None,
            },
        )
        .await
        .map_err(|e| Error::delta(&label, e))?;
    table
        .update_incremental(None)
        .await
        .map_err(|e| Error::delta(&label, e))?;
    Ok(table)
}

/// Commit properties of every tributary commit: engine and source files in the commit info,
/// and no log cleanup after the commit. delta-rs's post-commit cleanup (on by default) lists
/// the whole `_delta_log` at every commit: with a commit every few seconds and 30 days of log
/// retention that is hundreds of thousands of entries, hundreds of LIST pages, on every
/// merge. The maintenance run cleans the log once per run instead (`cleanup_metadata`, with
/// the table's `delta.logRetentionDuration`).
pub(crate) fn tributary_commit(files: &[String]) -> CommitProperties {
    tributary_commit_with(files, None)
}

/// [`tributary_commit`] with one more entry in the commit info.
pub(crate) fn tributary_commit_with(
    files: &[String],
    info: Option<(&str, serde_json::Value)>,
) -> CommitProperties {
    let mut meta = vec![(
        "engineInfo".to_string(),
        serde_json::Value::String(format!("tributary/{}", env!("CARGO_PKG_VERSION"))),
    )];
    if !files.is_empty() {
        meta.push(("tributary.files".to_string(), serde_json::json!(files)));
    }
    if let Some((k, v)) = info {
        meta.push((k.to_string(), v));
    }
    CommitProperties::default()
        .with_metadata(meta)
        .with_cleanup_expired_logs(Some(false))
}

/// How delta-rs's writer lays out data files of the table at `snapshot` (its schema,
/// partitioning and statistics columns), with these Parquet settings and target file size.
pub(crate) fn writer_config(
    snapshot: &deltalake::table::state::DeltaTableState,
    properties: Option<WriterProperties>,
    target_file_size: Option<std::num::NonZeroU64>,
) -> deltalake::datafile::writer::WriterConfig {
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
) -> deltalake::datafile::writer::WriterConfig {
    use deltalake::table::config::TablePropertiesExt;
    let props = snapshot.table_config();
    deltalake::datafile::writer::WriterConfig::new(
        schema,
        snapshot.metadata().partition_columns().to_vec(),
        properties,
        target_file_size,
        None,
        props.num_indexed_cols(),
        props
            .data_skipping_stats_columns
            .as_ref()
            .map(|v| v.iter().map(|c| c.to_string()).collect()),
    )
}

/// Parquet settings of the data files tributary writes (MERGE, appends, compaction, the
/// history MERGE): the table's codec (`parquet_compression`; zstd at level 1) and dictionary
/// encoding, except that columns unique per row — the order keys, and a single-column
/// primary key — skip the dictionary attempt, which never pays off there and costs hashing
/// every value of every rewritten file; with `order_key_encoding = "delta"` the order keys
/// are DELTA_BYTE_ARRAY.
pub fn writer_properties(table_cfg: &TableConfig) -> WriterProperties {
    use crate::config::ParquetCompression as C;
    let compression = match table_cfg.compression {
        C::Snappy => Compression::SNAPPY,
        C::Zstd => Compression::ZSTD(Default::default()), // level 1, as measured
        C::Gzip => Compression::GZIP(Default::default()),
    };
    let mut b = WriterProperties::builder()
        .set_created_by(format!("tributary {}", env!("CARGO_PKG_VERSION")))
        .set_compression(compression)
        .set_column_dictionary_enabled(ColumnPath::from(table_cfg.sequence_column.as_str()), false);
    if let [key] = table_cfg.primary_key.as_slice() {
        b = b.set_column_dictionary_enabled(ColumnPath::from(key.as_str()), false);
    }
    if table_cfg.delta_order_keys {
        let history = [crate::model::LAST_SEQ_COLUMN, crate::model::END_SEQ_COLUMN];
        for c in std::iter::once(table_cfg.sequence_column.as_str()).chain(history) {
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

fn qcol(alias: &str, name: &str) -> Expr {
    Expr::Column(Column::new(Some(alias), name))
}

fn ucol(name: &str) -> Column {
    Column::new_unqualified(name)
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
    table
        .add_columns()
        .with_fields(kernel.fields().cloned().collect::<Vec<_>>())
        .with_commit_properties(tributary_commit(&[]))
        .await
        .map_err(|e| Error::delta(label, e))
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

/// The expressions of tributary's MERGE (docs/design.md, "One MERGE per call").
struct MergeSql {
    on: Expr,
    /// Target column → value when a newer upsert matches.
    updates: Vec<(String, Expr)>,
    /// Columns inserted from the source.
    inserts: Vec<String>,
    upsert_when: Expr,
    delete_when: Expr,
    /// Whether the plan brings columns the table lacks (schema evolution only then: it
    /// costs extra planning in every MERGE otherwise).
    new_columns: bool,
}

impl MergeSql {
    fn new(table_cfg: &TableConfig, plan: &MergePlan, table: &DeltaTable) -> Result<Self> {
        let on = conjunction(
            table_cfg
                .primary_key
                .iter()
                .map(|k| qcol("t", k).eq(qcol("s", k))),
        )
        .ok_or_else(|| Error::internal("empty primary key"))?;
        let seq = table_cfg.sequence_column.as_str();
        let newer = |s: Expr| qcol("t", seq).is_null().or(s.gt(qcol("t", seq)));
        let is_op = |op: PlanOp| qcol("s", OP_COLUMN).eq(lit(op.marker()));
        let inserts: Vec<String> = plan
            .batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| !is_internal(n))
            .collect();
        let new_columns = match arrow_schema(table) {
            Some(ts) => inserts.iter().any(|c| ts.field_with_name(c).is_err()),
            None => true,
        };
        // A sparse column takes the plan's value only when the change that set it is newer
        // than the row (plan.rs explains why).
        let update_value = |c: &str| -> Result<Expr> {
            match plan.sparse.iter().find(|s| s.column == c) {
                None => Ok(qcol("s", c)),
                Some(s) => when(
                    qcol("s", &s.seq_column)
                        .is_not_null()
                        .and(newer(qcol("s", &s.seq_column))),
                    qcol("s", c),
                )
                .otherwise(qcol("t", c))
                .map_err(|e| {
                    Error::datafusion(format!("table {}: MERGE update", table_cfg.name), e)
                }),
            }
        };
        Ok(MergeSql {
            on,
            updates: inserts
                .iter()
                .map(|c| Ok((c.clone(), update_value(c)?)))
                .collect::<Result<_>>()?,
            upsert_when: is_op(PlanOp::Upsert).and(newer(qcol("s", seq))),
            delete_when: is_op(PlanOp::Delete).and(newer(qcol("s", seq))),
            inserts,
            new_columns,
        })
    }
}

/// MERGE the plan into the table. Applies a change only when its order key is greater than
/// the row's (or the row has none). Returns the new table state and the metrics.
pub(crate) async fn merge(
    table_cfg: &TableConfig,
    table: DeltaTable,
    plan: &MergePlan,
    files: &[String],
    extras: &MergeExtras,
) -> Result<(DeltaTable, MergeMetrics)> {
    let label = table_cfg.name.as_str();
    let delta_err = |e| Error::delta(label, e);
    let source = SessionContext::new()
        .read_batch(plan.batch.clone())
        .map_err(|e| Error::datafusion(format!("table {label}: MERGE source"), e))?;
    let sql = MergeSql::new(table_cfg, plan, &table)?;
    let checks = checks(&table);
    let mut commit = tributary_commit(files);
    if !extras.txns.is_empty() {
        commit = commit.with_application_transactions(extras.txns.clone());
    }
    let mut builder = table
        .merge(source, sql.on)
        .with_source_alias("s")
        .with_target_alias("t")
        .with_merge_schema(sql.new_columns)
        .with_session_state(merge_session())
        .with_writer_properties(writer_properties(table_cfg))
        .with_commit_properties(commit)
        .when_matched_update(|u| {
            sql.updates
                .iter()
                .fold(u.predicate(sql.upsert_when), |u, (c, e)| {
                    u.update(ucol(c), e.clone())
                })
        })
        .map_err(delta_err)?
        .when_matched_delete(|d| d.predicate(sql.delete_when))
        .map_err(delta_err)?
        .when_not_matched_insert(|i| {
            sql.inserts.iter().fold(
                i.predicate(qcol("s", OP_COLUMN).eq(lit(PlanOp::Upsert.marker()))),
                |i, c| i.set(ucol(c), qcol("s", c)),
            )
        })
        .map_err(delta_err)?;
    if let Some(floor) = &extras.delete_unmatched_below {
        let seq = table_cfg.sequence_column.as_str();
        let below = qcol("t", seq)
            .is_null()
            .or(qcol("t", seq).lt(lit(floor.clone())));
        builder = builder
            .when_not_matched_by_source_delete(|d| d.predicate(below))
            .map_err(delta_err)?;
    }
    let (table, metrics) = builder
        .await
        .map_err(|e| refused_rows(label, &checks, files, e))?;
    Ok((settle(table).await?, metrics))
}

/// The table's CHECK constraints and NOT NULL columns, for messages.
fn checks(table: &DeltaTable) -> String {
    let Ok(state) = table.snapshot() else {
        return String::new();
    };
    let mut out: Vec<String> = state
        .metadata()
        .configuration()
        .iter()
        .filter_map(|(k, v)| {
            Some(format!(
                "CHECK {}: {v}",
                k.strip_prefix("delta.constraints.")?
            ))
        })
        .collect();
    out.sort();
    for f in state.schema().fields() {
        if !f.is_nullable() {
            out.push(format!("`{}` NOT NULL", f.name()));
        }
        if let Some(v) = f.metadata().get("delta.invariants") {
            out.push(format!("`{}` invariant {v:?}", f.name()));
        }
    }
    out.join("; ")
}

/// A MERGE that delta-rs's writer refused because rows break the table's CHECK constraints
/// or NOT NULL invariants: the files' fault, not retryable, named with the constraints and
/// the rows (delta-rs's preview). Any other error as it is.
fn refused_rows(
    label: &str,
    checks: &str,
    files: &[String],
    e: deltalake::DeltaTableError,
) -> Error {
    let text = e.to_string();
    if !text.contains("failed validation check") && !text.contains("validation check failed") {
        return Error::delta(label, e);
    }
    Error::bad_input(
        &files.join(", "),
        crate::error::Location::File,
        format!("rows break a constraint of table `{label}` ({checks}), checked on every write; nothing was applied. Fix the rows at the source and replay the file, or drop the constraint if it no longer holds (ALTER TABLE … DROP CONSTRAINT). {text}"),
    )
}

/// The table after a commit, as readers see it. delta-rs keeps the committed actions in
/// memory as its writer made them; the stored commit has exact decimal bounds (`stats`),
/// the in-memory one the writer's `f64` ones, which a MERGE or scan of this handle would
/// prune by. A table with such columns is read back from the log (its commits are in the
/// log cache); any other is kept as it is.
pub(crate) async fn settle(mut table: DeltaTable) -> Result<DeltaTable> {
    let wide = arrow_schema(&table).is_some_and(|s| crate::stats::arrow_has_wide_decimal(&s));
    let Some(version) = table.version().filter(|_| wide) else {
        return Ok(table);
    };
    let label = table.table_url().to_string();
    table.state = None;
    table
        .load_version(version)
        .await
        .map_err(|e| Error::delta(&label, e))?;
    Ok(table)
}

pub(crate) fn is_conflict(e: &Error) -> bool {
    matches!(e, Error::Delta { source, .. } if crate::error::is_commit_conflict(source))
}

/// Run SQL against a table registered as `t` (used by the demo, CLI and tests).
pub async fn query(table: &DeltaTable, sql: &str) -> Result<Vec<RecordBatch>> {
    let label = table.table_url().to_string();
    let ctx = session();
    table
        .update_datafusion_session(&ctx.state())
        .map_err(|e| Error::delta(&label, e))?;
    let provider = table
        .table_provider()
        .await
        .map_err(|e| Error::datafusion(format!("{label}: table provider"), e))?;
    ctx.register_table("t", provider)
        .map_err(|e| Error::datafusion(format!("{label}: register"), e))?;
    ctx.sql(sql)
        .await
        .map_err(|e| Error::datafusion(format!("{label}: query"), e))?
        .collect()
        .await
        .map_err(|e| Error::datafusion(format!("{label}: query"), e))
}

/// When a plan can be appended instead of merged: every row an upsert, no new column, one
/// key column of an integer or string type, and no row of the table with a key in the
/// plan's key range — then MERGE would insert every row, and an append writes the same rows
/// without reading or rewriting anything. Returns the range predicate (SQL), which the
/// append's commit declares as what it read: a concurrent commit that adds files whose key
/// statistics overlap the range makes the append conflict, and the retry merges.
pub(crate) async fn append_predicate(
    cfg: &TableConfig,
    table: &DeltaTable,
    plan: &MergePlan,
) -> Result<Option<String>> {
    Ok(append_range(cfg, table, plan)
        .await?
        .map(|r| r.predicate(&cfg.primary_key[0])))
}

/// The plan's key range when it can be appended (see [`append_predicate`]).
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
    if writes_only_through_merge(table).is_some()
        || !plan.sparse.is_empty()
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
    Ok((!crate::scan::rows_in_range(table, key, &range).await?).then_some(range))
}

/// A table tributary cannot write exactly, refused by name before anything is written
/// (the adoption's metadata commit included), not retryable: column mapping (the data files
/// name columns by physical names tributary does not write) and identity columns (values
/// the writer must generate).
pub(crate) fn refuse_unwritable(table: &DeltaTable, label: &str) -> Result<()> {
    let Ok(state) = table.snapshot() else {
        return Ok(());
    };
    let refuse = |feature: String, way_forward: &str| Error::Unsupported {
        table: label.to_string(),
        feature,
        way_forward: format!("nothing was written; {way_forward}"),
    };
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
    let identity: Vec<String> = state
        .schema()
        .fields()
        .filter(|f| f.metadata().keys().any(|k| k.starts_with("delta.identity")))
        .map(|f| format!("`{}`", f.name()))
        .collect();
    if !identity.is_empty() {
        return Err(refuse(
            format!("identity columns ({}), whose values the writer must generate; tributary writes the source's values", identity.join(", ")),
            "merge into a new table without identity columns (the source database already assigns the key), then replay the files",
        ));
    }
    Ok(())
}

/// Why the table's rows can be written only through delta-rs's MERGE (it computes
/// generated columns and writes column mapping's physical names), or `None` when
/// tributary's own writers (the append, the whole-file append, the rewrite) write the
/// table exactly — CHECK constraints, invariants and NOT NULL columns included, which
/// they check on every row (`constraints`).
pub(crate) fn writes_only_through_merge(table: &DeltaTable) -> Option<&'static str> {
    let state = table.snapshot().ok()?;
    // Deletion vectors are honoured by tributary's readers (`datafile::TableFiles`); column
    // mapping's physical names are not.
    if state
        .metadata()
        .configuration()
        .get("delta.columnMapping.mode")
        .is_some_and(|m| m != "none")
    {
        return Some("column mapping");
    }
    state.schema().fields().find_map(|f| {
        f.metadata().keys().find_map(|k| {
            if k.starts_with("delta.generationExpression") {
                Some("generated columns")
            } else if k.starts_with("delta.identity") {
                Some("identity columns")
            } else {
                None
            }
        })
    })
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
    predicate: String,
    files: &[String],
    extras: &MergeExtras,
) -> Result<(DeltaTable, usize)> {
    let adds = write_rows(cfg, &table, plan, &files.join(", ")).await?;
    let written = adds.len();
    let table = commit_append(cfg, table, adds, predicate, files, &extras.txns).await?;
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
    use deltalake::datafile::writer::DeltaWriter;
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
    crate::constraints::Checks::of(table, label)?.verify(label, files, &cfg.primary_key, &batch)?;
    let batch =
        RecordBatch::try_new(schema.clone(), batch.columns().to_vec()).map_err(Error::arrow)?;
    let config = writer_config(snapshot, Some(writer_properties(cfg)), None);
    let mut writer = DeltaWriter::new(table.log_store().object_store(None), config);
    writer.write(&batch).await.map_err(delta_err)?;
    Ok(writer
        .close()
        .await
        .map_err(delta_err)?
        .into_iter()
        .map(Action::Add)
        .collect())
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
    use deltalake::datafile::writer::DeltaWriter;
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
    let mut writer = DeltaWriter::new(table.log_store().object_store(None), config);
    writer.write(&batch).await.map_err(delta_err)?;
    let adds: Vec<Action> = writer
        .close()
        .await
        .map_err(delta_err)?
        .into_iter()
        .map(Action::Add)
        .collect();
    let partition_columns = partition_columns(&table)?;
    let operation = DeltaOperation::Write {
        mode: SaveMode::Append,
        partition_by: (!partition_columns.is_empty()).then_some(partition_columns),
        predicate: None,
    };
    commit_actions_as(label, table, adds, operation, files, &[]).await
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
    use deltalake::datafile::writer::DeltaWriter;
    use deltalake::kernel::Action;
    use futures::StreamExt;
    let delta_err = |e| Error::delta(label, e);
    let snapshot = table.snapshot().map_err(delta_err)?;
    let schema = snapshot.snapshot().arrow_schema();
    let partition_columns = snapshot.metadata().partition_columns().to_vec();
    let files = crate::datafile::TableFiles::of(&table);
    let config = writer_config(snapshot, properties, None);
    let mut writer: Option<DeltaWriter> = None;
    let mut actions = Vec::new();
    let mut changed = 0usize;
    for f in snapshot.log_data().iter() {
        let partition = crate::manifest::Partition::of(&f, &partition_columns);
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
        let w = writer.get_or_insert_with(|| DeltaWriter::new(files.store.clone(), config.clone()));
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
    let table = commit_actions_as(label, table, actions, operation, &[], txns).await?;
    Ok((table, changed))
}

/// Commit written files as an append on the table's snapshot, declaring `predicate` (the
/// key range) as what it read, with the application transactions `txns`.
pub(crate) async fn commit_append(
    cfg: &TableConfig,
    table: DeltaTable,
    adds: Vec<deltalake::kernel::Action>,
    predicate: String,
    files: &[String],
    txns: &[Transaction],
) -> Result<DeltaTable> {
    let partition_columns = partition_columns(&table)?;
    let operation = DeltaOperation::Write {
        mode: SaveMode::Append,
        partition_by: (!partition_columns.is_empty()).then_some(partition_columns),
        predicate: Some(predicate),
    };
    commit_actions(cfg, table, adds, operation, files, txns).await
}

/// Commit actions on the table's loaded snapshot as `operation` (whose read predicate the
/// conflict checker uses), with the merged `files` in the commit info and the application
/// transactions `txns`; returns the table at the new version.
pub(crate) async fn commit_actions(
    cfg: &TableConfig,
    table: DeltaTable,
    actions: Vec<deltalake::kernel::Action>,
    operation: DeltaOperation,
    files: &[String],
    txns: &[Transaction],
) -> Result<DeltaTable> {
    commit_actions_as(&cfg.name, table, actions, operation, files, txns).await
}

/// [`commit_actions`] on any table, `label` naming it in errors.
pub(crate) async fn commit_actions_as(
    label: &str,
    mut table: DeltaTable,
    actions: Vec<deltalake::kernel::Action>,
    operation: DeltaOperation,
    files: &[String],
    txns: &[Transaction],
) -> Result<DeltaTable> {
    let snapshot = table.snapshot().map_err(|e| Error::delta(label, e))?;
    let commit = |txns: Vec<Transaction>, actions: Vec<deltalake::kernel::Action>| {
        let mut commit = tributary_commit(files);
        if !txns.is_empty() {
            commit = commit.with_application_transactions(txns);
        }
        CommitBuilder::from(commit).with_actions(actions).build(
            Some(snapshot),
            table.log_store(),
            operation.clone(),
        )
    };
    let watermark = |t: &Transaction| t.app_id == crate::model::WATERMARK_APP_ID;
    let done = match commit(txns.to_vec(), actions.clone()).await {
        // The watermark a merge carries lost to another writer's: the merge commits without
        // it (its own conflicts checked again), and the watermark is committed after.
        Err(e) if crate::error::is_commit_conflict(&e) && txns.iter().any(watermark) => {
            let without = txns.iter().filter(|t| !watermark(t)).cloned().collect();
            commit(without, actions).await
        }
        done => done,
    }
    .map_err(|e| Error::delta(label, e))?;
    // The commit's own snapshot (delta-rs brought it to the new version): loading it again
    // would list and read the log once more (except where its statistics are not exact).
    table.state = Some(done.snapshot());
    settle(table).await
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let (_, table) = crate::testing::merged_table(dir.path(), &batch).await;
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
