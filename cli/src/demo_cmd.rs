//! `tributary demo`: the AWS walkthrough's travel_details scenario on a local folder, merged
//! through the same code path as the Lambda, step by step.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use tributary::deltalake::arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray,
};
use tributary::deltalake::arrow::compute::cast;
use tributary::deltalake::arrow::datatypes::{DataType, Int32Type, Int64Type};
use tributary::deltalake::arrow::util::pretty::pretty_format_batches;
use tributary::deltalake::DeltaTable;
use tributary::{delta, demo, Config, Engine, FileStatus, TableConfig};
use url::Url;

use crate::print_maintenance;

/// One run of the demo: its folder, the engine, the scenario and where its files landed.
struct Demo {
    dir: PathBuf,
    engine: Engine,
    scenario: demo::SeedScenario,
    urls: Vec<Url>,
}

pub(crate) async fn run(dir: &Path, rows: i32, new_rows: i32) -> Result<()> {
    if rows < 1 || new_rows < 0 {
        bail!("--rows must be at least 1 and --new-rows at least 0");
    }
    let mut d = Demo::prepare(dir, rows, new_rows)?;
    d.land().await?;
    d.merge_one_by_one().await?;
    d.redeliver_all().await;
    d.query().await?;
    d.compare_with_source().await?;
    d.history().await?;
    d.scd2().await?;
    d.maintain().await?;
    out!(
        "\nInspect: {0}/curated/travel_details (Delta table), {0}/raw (DMS files).",
        d.dir.display()
    );
    Ok(())
}

impl Demo {
    /// Clear earlier output, write the configuration, generate the scenario.
    fn prepare(dir: &Path, rows: i32, new_rows: i32) -> Result<Demo> {
        let tuning = tributary::tuning::Tuning::from_env()?;
        tuning.apply();
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let dir = std::fs::canonicalize(dir)?;
        for sub in ["raw", "curated"] {
            let p = dir.join(sub);
            if p.exists() {
                std::fs::remove_dir_all(&p)
                    .with_context(|| format!("cannot clear {}", p.display()))?;
            }
        }
        let config_path = dir.join("tributary.toml");
        std::fs::write(&config_path, demo::CONFIG)?;
        let engine = Engine::builder(Config::from_path(&config_path)?)
            .tuning(tuning)
            .build();
        out!("tributary demo in {}", dir.display());
        out!("  config: {}", config_path.display());
        Ok(Demo {
            dir,
            engine,
            scenario: demo::seed_scenario(2022, rows, new_rows, 2)?,
            urls: Vec::new(),
        })
    }

    fn table(&self) -> &TableConfig {
        &self.engine.config().tables[0]
    }

    async fn open(&self, version: Option<u64>) -> Result<DeltaTable> {
        let mut t = delta::open(self.table().state_table()?, self.engine.storage_options()).await?;
        if let Some(v) = version {
            t.load_version(v).await?;
        }
        Ok(t)
    }

    /// 1. DMS lands the files.
    async fn land(&mut self) -> Result<()> {
        let raw_root = self.dir.join("raw").join(demo::SOURCE_PREFIX);
        out!(
            "\n1. DMS lands {} files under {}:",
            self.scenario.files.len(),
            raw_root.display()
        );
        for f in &self.scenario.files {
            let url = self.table().source.join(&f.path)?;
            self.engine
                .storage()
                .put(&url, demo::to_parquet(&f.batch)?)
                .await?;
            out!("   {:<42} {}", f.path, f.description);
            self.urls.push(url);
        }
        Ok(())
    }

    /// 2. One invocation per file, as the S3 events would come.
    async fn merge_one_by_one(&self) -> Result<()> {
        out!("\n2. Each file is merged as its S3 event would be (one invocation per file):");
        for (f, url) in self.scenario.files.iter().zip(&self.urls) {
            let t0 = Instant::now();
            let report = self.engine.process(std::slice::from_ref(url)).await;
            let ms = t0.elapsed().as_millis();
            if let Some(FileStatus::Failed { error, .. }) =
                report.failures().next().map(|f| &f.status)
            {
                bail!("merging {} failed: {error}", f.path);
            }
            for t in &report.tables {
                out!(
                    "   {:<42} v{:<2} +{} ~{} -{} ({} ms)",
                    f.path,
                    t.version.unwrap_or_default(),
                    t.inserted,
                    t.updated,
                    t.deleted,
                    ms
                );
            }
        }
        Ok(())
    }

    /// 3. At-least-once delivery: everything again, in one call.
    async fn redeliver_all(&self) {
        out!("\n3. Every event delivered again, all at once (at-least-once delivery):");
        let t0 = Instant::now();
        let report = self.engine.process(&self.urls).await;
        for t in &report.tables {
            out!(
                "   {} files in one call: inserted={} updated={} deleted={} skipped_stale={}; table still at v{} ({} ms)",
                t.files,
                t.inserted,
                t.updated,
                t.deleted,
                t.skipped_stale,
                t.version.unwrap_or_default(),
                t0.elapsed().as_millis()
            );
        }
    }

    /// 4. The walkthrough's query (computed from the table's rows, read by tributary's scan).
    async fn query(&self) -> Result<()> {
        let table = self.open(None).await?;
        out!("\n4. SELECT destination, count(*) FROM travel_details GROUP BY destination:");
        let rows = scan(&table, &["destination", "trip_id"]).await?;
        let mut by_destination: BTreeMap<String, i64> = BTreeMap::new();
        let mut trips = std::collections::BTreeSet::new();
        for b in &rows {
            let dest = cast(b.column(0), &DataType::Utf8)?;
            let id = cast(b.column(1), &DataType::Int64)?;
            let (dest, id) = (dest.as_string::<i32>(), id.as_primitive::<Int64Type>());
            for i in 0..b.num_rows() {
                *by_destination.entry(dest.value(i).to_string()).or_default() += 1;
                trips.insert(id.value(i));
            }
        }
        out!("{}", indent(&counts_table(&by_destination)?));
        let total: i64 = by_destination.values().sum();
        let max = trips.iter().next_back().copied().unwrap_or_default();
        let summary = batch(vec![
            ("rows", Arc::new(Int64Array::from(vec![total])) as ArrayRef),
            (
                "trips",
                Arc::new(Int64Array::from(vec![trips.len() as i64])),
            ),
            ("max_trip_id", Arc::new(Int64Array::from(vec![max]))),
        ])?;
        out!(
            "{}",
            indent(&pretty_format_batches(&[summary])?.to_string())
        );
        Ok(())
    }

    /// The source database's true state against the table, row by row.
    async fn compare_with_source(&self) -> Result<()> {
        let table = self.open(None).await?;
        let batches = scan(
            &table,
            &["trip_id", "destination", "source_location", "route_id"],
        )
        .await?;
        let mut table_rows = Vec::new();
        for b in &batches {
            table_rows.extend(trip_rows(b)?);
        }
        table_rows.sort();
        let source_rows: Vec<_> = self
            .scenario
            .source
            .iter()
            .map(|(id, t)| {
                let t = t.clone();
                (*id, t.destination, t.source_location, t.route_id)
            })
            .collect();
        if table_rows != source_rows {
            bail!(
                "the Delta table ({} rows) differs from the source ({} rows)",
                table_rows.len(),
                source_rows.len()
            );
        }
        out!(
            "   The Delta table equals the source table: {} rows, no Miami, no Los Angeles.",
            source_rows.len()
        );
        Ok(())
    }

    /// 5. DESCRIBE HISTORY and time travel.
    async fn history(&self) -> Result<()> {
        out!("\n5. Table history (DESCRIBE HISTORY):");
        let table = self.open(None).await?;
        let latest = table.version().unwrap_or(0);
        for (i, (op, files, ts)) in table_history(&table).await?.iter().enumerate() {
            out!(
                "   v{:<3} {:<24} {:<10} {}",
                latest.saturating_sub(i as u64),
                ts,
                op,
                files
            );
        }
        let count_at = |v| async move {
            let t = self.open(Some(v)).await?;
            anyhow::Ok(rows_of(&t).await?)
        };
        out!(
            "\n   Time travel: version 0 (table creation) has {} rows; version 2 (full load) has {} rows.",
            count_at(0).await?,
            count_at(2).await?
        );
        Ok(())
    }

    /// 6. The history table: one trip's versions, and the table as of before the update.
    async fn scd2(&self) -> Result<()> {
        let Some(h) = &self.table().history else {
            return Ok(());
        };
        let t = delta::open(&h.target, self.engine.storage_options()).await?;
        let columns = [
            "trip_id",
            "destination",
            "valid_from",
            "valid_to",
            "iscurrent",
        ];
        let versions = scan(&t, &columns).await?;
        let all = tributary::deltalake::arrow::compute::concat_batches(
            &versions
                .first()
                .map(|b| b.schema())
                .context("the history table has no rows")?,
            &versions,
        )?;
        let dest = cast(all.column(1), &DataType::Utf8)?;
        let dest = dest.as_string::<i32>();
        let ids = cast(all.column(0), &DataType::Int64)?;
        let ids = ids.as_primitive::<Int64Type>();
        let id = (0..all.num_rows())
            .filter(|i| dest.value(*i) == "Miami")
            .map(|i| ids.value(i))
            .min()
            .unwrap_or_default();
        out!(
            "\n6. History table (SCD type 2, {}): trip {id} went Miami → Tucson:",
            self.dir.join("curated/travel_details_history").display()
        );
        // The trip's versions, by valid_from.
        let from = cast(all.column(2), &DataType::Int64)?;
        let from = from.as_primitive::<Int64Type>();
        let mut mine: Vec<usize> = (0..all.num_rows())
            .filter(|i| ids.value(*i) == id)
            .collect();
        mine.sort_by_key(|i| from.value(*i));
        let idx = tributary::deltalake::arrow::array::UInt32Array::from(
            mine.iter().map(|i| *i as u32).collect::<Vec<_>>(),
        );
        let trip = tributary::deltalake::arrow::compute::take_record_batch(&all, &idx)?;
        out!("{}", indent(&pretty_format_batches(&[trip])?.to_string()));
        let before = "2022-10-25T21:09:00Z";
        out!("   As of {before} (before the update):");
        let at = chrono::DateTime::parse_from_rfc3339(before)?.timestamp_micros();
        let to = cast(all.column(3), &DataType::Int64)?;
        let to = to.as_primitive::<Int64Type>();
        let mut as_of: BTreeMap<String, i64> = BTreeMap::new();
        for i in 0..all.num_rows() {
            let open = from.is_valid(i) && from.value(i) <= at;
            let not_closed = to.is_null(i) || to.value(i) > at;
            if open && not_closed {
                *as_of.entry(dest.value(i).to_string()).or_default() += 1;
            }
        }
        out!("{}", indent(&counts_table(&as_of)?));
        Ok(())
    }

    /// 7. What the scheduled maintenance function does.
    async fn maintain(&self) -> Result<()> {
        out!("\n7. Maintenance (what the scheduled function does): compaction, checkpoint, vacuum, manifests");
        let summary = tributary::maintenance::handle(&self.engine, &Default::default()).await?;
        if let Some((t, e)) = summary.failed.first() {
            bail!("maintenance of {t} failed: {e}");
        }
        for m in &summary.maintained {
            print_maintenance(m, "   ");
        }
        let table = self.open(None).await?;
        let manifests = tributary::manifest::read_manifests(self.engine.storage(), &table).await?;
        let exact = manifests == tributary::manifest::expected_manifests(&table)?;
        out!(
            "   {} partition manifests under _symlink_format_manifest/ ({}), e.g. route_id=A/manifest:",
            manifests.len(),
            if exact { "exactly the live files" } else { "OUT OF DATE" }
        );
        if !exact {
            err!("the manifests do not list the live files");
        }
        if let Some(first) = manifests.get("route_id=A").and_then(|m| m.first()) {
            out!("     {first}");
        }
        out!(
            "   Rows after maintenance: {} (unchanged)",
            rows_of(&table).await?
        );
        Ok(())
    }
}

/// (trip_id, destination, source_location, route_id) of a query's batch.
fn trip_rows(b: &RecordBatch) -> Result<Vec<(i32, String, String, String)>> {
    let id = cast(b.column(0), &DataType::Int32)?;
    let id = id.as_primitive::<Int32Type>();
    let text: Vec<_> = (1..4)
        .map(|i| cast(b.column(i), &DataType::Utf8))
        .collect::<std::result::Result<_, _>>()?;
    let (dest, src, route) = (
        text[0].as_string::<i32>(),
        text[1].as_string::<i32>(),
        text[2].as_string::<i32>(),
    );
    Ok((0..b.num_rows())
        .map(|i| {
            (
                id.value(i),
                dest.value(i).to_string(),
                src.value(i).to_string(),
                route.value(i).to_string(),
            )
        })
        .collect())
}

/// (operation, files merged, time) per version, newest first.
async fn table_history(table: &DeltaTable) -> Result<Vec<(String, String, String)>> {
    use futures::TryStreamExt;
    let commits: Vec<_> = table.history(None).try_collect().await?;
    Ok(commits
        .into_iter()
        .map(|c| {
            let files = c
                .info
                .get("tributary.files")
                .and_then(|v| v.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str())
                        .map(|s| s.rsplit('/').next().unwrap_or(s).to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            let ts = c
                .timestamp
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_default();
            (c.operation.unwrap_or_default(), files, ts)
        })
        .collect())
}

/// The table's rows, these columns (tributary's scan: deletion vectors applied).
async fn scan(table: &DeltaTable, columns: &[&str]) -> Result<Vec<RecordBatch>> {
    Ok(tributary::scan::Scan::columns(columns).rows(table).await?)
}

/// How many rows the table has.
async fn rows_of(table: &DeltaTable) -> Result<i64> {
    let key = ["trip_id"];
    Ok(scan(table, &key)
        .await?
        .iter()
        .map(|b| b.num_rows() as i64)
        .sum())
}

fn batch(columns: Vec<(&str, ArrayRef)>) -> Result<RecordBatch> {
    Ok(RecordBatch::try_from_iter(columns)?)
}

/// A (destination, count) table, by destination.
fn counts_table(counts: &BTreeMap<String, i64>) -> Result<String> {
    let b = batch(vec![
        (
            "destination",
            Arc::new(StringArray::from(
                counts.keys().cloned().collect::<Vec<_>>(),
            )) as ArrayRef,
        ),
        (
            "count",
            Arc::new(Int64Array::from(
                counts.values().copied().collect::<Vec<_>>(),
            )),
        ),
    ])?;
    Ok(pretty_format_batches(&[b])?.to_string())
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("   {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
