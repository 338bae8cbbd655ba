//! Delta writes: open/create tables and MERGE a plan (tombstones live in `tombstones`).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{Field, Schema, SchemaRef};
use deltalake::datafusion::common::Column;
use deltalake::datafusion::prelude::{lit, Expr, SessionContext};
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::StructType;
use deltalake::operations::merge::MergeMetrics;
use deltalake::{DeltaTable, DeltaTableBuilder};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;
use url::Url;

use crate::config::TableConfig;
use crate::error::{Error, Result};
use crate::plan::{MergePlan, OP_COLUMN};

/// Open a table, or return an unloaded handle when nothing is there yet.
pub async fn open(url: &Url, options: &HashMap<String, String>) -> Result<DeltaTable> {
    let label = crate::storage::display(url);
    if url.scheme() == "file" {
        // delta-rs wants a local table's folder to exist before it creates the table.
        if let Ok(path) = url.to_file_path() {
            std::fs::create_dir_all(&path)
                .map_err(|e| Error::Internal(format!("cannot create {}: {e}", path.display())))?;
        }
    }
    let mut table = DeltaTableBuilder::from_url(url.clone())
        .map_err(|e| Error::delta(&label, e))?
        .with_storage_options(options.clone())
        .build()
        .map_err(|e| Error::delta(&label, e))?;
    match table.load().await {
        Ok(()) => Ok(table),
        Err(deltalake::DeltaTableError::NotATable(_)) => Ok(table),
        Err(e) => Err(Error::delta(&label, e)),
    }
}

/// Whether the handle points at an existing table.
pub fn exists(table: &DeltaTable) -> bool {
    table.version().is_some()
}

/// The table's Arrow schema, when it exists.
pub fn arrow_schema(table: &DeltaTable) -> Option<SchemaRef> {
    table.snapshot().ok().map(|s| s.snapshot().arrow_schema())
}

/// Create the table with this schema and partitioning, unless it exists. A concurrent
/// creator winning the race is not an error: the caller's retry reloads the table.
pub async fn create(
    table: DeltaTable,
    name: &str,
    schema: &Schema,
    partition_by: &[String],
) -> Result<DeltaTable> {
    let label = table.table_url().to_string();
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
        .with_commit_properties(tributary_commit(&[]))
        .await
        .map_err(|e| Error::delta(&label, e))
}

/// Create the table unless it exists; if a concurrent writer created it first (whatever
/// error delta-rs reports for that), use theirs.
pub async fn create_or_open(
    url: &Url,
    options: &HashMap<String, String>,
    name: &str,
    schema: &Schema,
    partition_by: &[String],
) -> Result<DeltaTable> {
    let t = open(url, options).await?;
    if exists(&t) {
        return Ok(t);
    }
    match create(t, name, schema, partition_by).await {
        Ok(t) => Ok(t),
        Err(e) => {
            let t = open(url, options).await?;
            if exists(&t) {
                Ok(t)
            } else {
                Err(e)
            }
        }
    }
}

pub(crate) fn tributary_commit(files: &[String]) -> CommitProperties {
    let mut meta = vec![(
        "engineInfo".to_string(),
        serde_json::Value::String(format!("tributary/{}", env!("CARGO_PKG_VERSION"))),
    )];
    if !files.is_empty() {
        meta.push(("tributary.files".to_string(), serde_json::json!(files)));
    }
    CommitProperties::default().with_metadata(meta)
}

/// Parquet settings of the files a MERGE writes: delta-rs's defaults (Snappy, dictionary
/// encoding) except that columns unique per row — the order key, and a single-column primary
/// key — skip the dictionary attempt, which never pays off there and costs hashing every
/// value of every rewritten file.
pub(crate) fn writer_properties(table_cfg: &TableConfig) -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_created_by(format!("tributary {}", env!("CARGO_PKG_VERSION")))
        .set_compression(Compression::SNAPPY)
        .set_column_dictionary_enabled(ColumnPath::from(table_cfg.sequence_column.as_str()), false);
    if let [key] = table_cfg.primary_key.as_slice() {
        b = b.set_column_dictionary_enabled(ColumnPath::from(key.as_str()), false);
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
/// fine (added by the MERGE); a column whose type differs is cast when lossless.
pub fn align_to_table(
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
    if let Ok(s) = table.snapshot() {
        let parts: Vec<String> = s
            .metadata()
            .partition_columns()
            .iter()
            .map(|c| c.to_string())
            .collect();
        if parts != table_cfg.partition_by {
            return Err(serr(format!(
                "the Delta table is partitioned by {:?} but the config says partition_by = {:?}; change the config or write to a new table",
                parts, table_cfg.partition_by
            )));
        }
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
        if f.name() == OP_COLUMN {
            continue;
        }
        if let Ok(tf) = tschema.field_with_name(f.name()) {
            if tf.data_type() != f.data_type() {
                let c = cast(&cols[i], tf.data_type()).map_err(|e| {
                    serr(format!(
                        "column `{}` is {} in the table but {} in the files, and cannot be converted: {e}",
                        f.name(),
                        tf.data_type(),
                        f.data_type()
                    ))
                })?;
                if c.null_count() != cols[i].null_count() {
                    return Err(serr(format!(
                        "column `{}` is {} in the table but {} in the files; converting would lose values (type changes are not applied automatically)",
                        f.name(),
                        tf.data_type(),
                        f.data_type()
                    )));
                }
                cols[i] = c;
                fields[i] = Field::new(f.name(), tf.data_type().clone(), true);
                changed = true;
            }
        }
    }
    if changed {
        plan.batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)
            .map_err(|e| Error::Internal(e.to_string()))?;
    }
    Ok(())
}

/// MERGE the plan into the table. Applies a change only when its order key is greater than
/// the row's (or the row has none). Returns the new table state and the metrics.
pub async fn merge(
    table_cfg: &TableConfig,
    table: DeltaTable,
    plan: &MergePlan,
    files: &[String],
) -> Result<(DeltaTable, MergeMetrics)> {
    let label = table_cfg.name.as_str();
    let ctx = SessionContext::new();
    let source = ctx
        .read_batch(plan.batch.clone())
        .map_err(|e| Error::Internal(format!("merge source: {e}")))?;
    let mut on: Option<Expr> = None;
    for k in &table_cfg.primary_key {
        let e = qcol("t", k).eq(qcol("s", k));
        on = Some(match on {
            None => e,
            Some(p) => p.and(e),
        });
    }
    let on = on.ok_or_else(|| Error::Internal("empty primary key".into()))?;
    let seq = table_cfg.sequence_column.as_str();
    let newer = qcol("t", seq)
        .is_null()
        .or(qcol("s", seq).gt(qcol("t", seq)));
    let is_upsert = qcol("s", OP_COLUMN).eq(lit("U"));
    let is_delete = qcol("s", OP_COLUMN).eq(lit("D"));
    let data_cols: Vec<String> = plan
        .batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| n != OP_COLUMN)
        .collect();
    // Schema evolution only when the plan brings columns the table lacks (it costs extra
    // planning in every MERGE otherwise).
    let new_columns = match arrow_schema(&table) {
        Some(ts) => data_cols.iter().any(|c| ts.field_with_name(c).is_err()),
        None => true,
    };
    let upd_cols = data_cols.clone();
    let ins_cols = data_cols;
    let (table, metrics) = table
        .merge(source, on)
        .with_source_alias("s")
        .with_target_alias("t")
        .with_merge_schema(new_columns)
        .with_writer_properties(writer_properties(table_cfg))
        .with_commit_properties(tributary_commit(files))
        .when_matched_update(|u| {
            let mut u = u.predicate(is_upsert.clone().and(newer.clone()));
            for c in &upd_cols {
                u = u.update(ucol(c), qcol("s", c));
            }
            u
        })
        .map_err(|e| Error::delta(label, e))?
        .when_matched_delete(|d| d.predicate(is_delete.and(newer)))
        .map_err(|e| Error::delta(label, e))?
        .when_not_matched_insert(|i| {
            let mut i = i.predicate(is_upsert);
            for c in &ins_cols {
                i = i.set(ucol(c), qcol("s", c));
            }
            i
        })
        .map_err(|e| Error::delta(label, e))?
        .await
        .map_err(|e| Error::delta(label, e))?;
    Ok((table, metrics))
}

pub(crate) fn is_conflict(e: &Error) -> bool {
    matches!(e, Error::Delta { source, .. } if crate::error::is_commit_conflict(source))
}

/// Jittered exponential backoff: ~50 ms doubling up to ~3 s.
pub(crate) async fn backoff(attempt: u32) {
    use rand::Rng;
    let base = 50u64 << attempt.min(6);
    let ms = rand::rng().random_range(base / 2..=base + base / 2);
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}

/// Run SQL against a table registered as `t` (used by the demo, CLI and tests).
pub async fn query(table: &DeltaTable, sql: &str) -> Result<Vec<RecordBatch>> {
    let label = table.table_url().to_string();
    let ctx = SessionContext::new();
    table
        .update_datafusion_session(&ctx.state())
        .map_err(|e| Error::delta(&label, e))?;
    let provider = table
        .table_provider()
        .await
        .map_err(|e| Error::Internal(format!("{label}: {e}")))?;
    ctx.register_table("t", provider)
        .map_err(|e| Error::Internal(format!("{label}: {e}")))?;
    ctx.sql(sql)
        .await
        .map_err(|e| Error::Internal(format!("query failed: {e}")))?
        .collect()
        .await
        .map_err(|e| Error::Internal(format!("query failed: {e}")))
}
