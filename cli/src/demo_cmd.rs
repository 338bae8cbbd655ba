//! `tributary demo`: the AWS walkthrough's travel_details scenario on a local folder, merged
//! through the same code path as the Lambda, step by step.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use tributary::deltalake::arrow::array::{AsArray, RecordBatch};
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
        tributary::tuning::Tuning::from_env()?;
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
        let engine = Engine::new(Config::from_path(&config_path)?);
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

    /// 4. The walkthrough's query.
    async fn query(&self) -> Result<()> {
        let table = self.open(None).await?;
        out!("\n4. SELECT destination, count(*) FROM travel_details GROUP BY destination:");
        let batches = delta::query(
            &table,
            "SELECT destination, count(*) AS count FROM t GROUP BY destination ORDER BY destination",
        )
        .await?;
        out!("{}", indent(&pretty_format_batches(&batches)?.to_string()));
        let total = delta::query(
            &table,
            "SELECT count(*) AS rows, count(DISTINCT trip_id) AS trips, max(trip_id) AS max_trip_id FROM t",
        )
        .await?;
        out!("{}", indent(&pretty_format_batches(&total)?.to_string()));
        Ok(())
    }

    /// The source database's true state against the table, row by row.
    async fn compare_with_source(&self) -> Result<()> {
        let table = self.open(None).await?;
        let batches = delta::query(
            &table,
            "SELECT CAST(trip_id AS INT) AS trip_id, CAST(destination AS VARCHAR) AS d, CAST(source_location AS VARCHAR) AS s, CAST(route_id AS VARCHAR) AS r FROM t ORDER BY trip_id",
        )
        .await?;
        let mut table_rows = Vec::new();
        for b in &batches {
            table_rows.extend(trip_rows(b)?);
        }
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
            anyhow::Ok(count(
                &delta::query(&t, "SELECT count(*) AS rows FROM t").await?,
            ))
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
        let miami = delta::query(
            &t,
            "SELECT CAST(min(trip_id) AS BIGINT) FROM t WHERE destination = 'Miami'",
        )
        .await?;
        let id = count(&miami);
        out!(
            "\n6. History table (SCD type 2, {}): trip {id} went Miami → Tucson:",
            self.dir.join("curated/travel_details_history").display()
        );
        let versions = delta::query(
            &t,
            &format!("SELECT trip_id, destination, valid_from, valid_to, iscurrent FROM t WHERE trip_id = {id} ORDER BY valid_from"),
        )
        .await?;
        out!("{}", indent(&pretty_format_batches(&versions)?.to_string()));
        let before = "2022-10-25T21:09:00Z";
        out!("   As of {before} (before the update):");
        let as_of = delta::query(
            &t,
            &format!(
                "SELECT destination, count(*) AS count FROM t WHERE valid_from <= TIMESTAMP '{before}' AND (valid_to > TIMESTAMP '{before}' OR valid_to IS NULL) GROUP BY destination ORDER BY destination"
            ),
        )
        .await?;
        out!("{}", indent(&pretty_format_batches(&as_of)?.to_string()));
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
        let c = delta::query(&table, "SELECT count(*) FROM t").await?;
        out!("   Rows after maintenance: {} (unchanged)", count(&c));
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

fn count(b: &[RecordBatch]) -> i64 {
    b.iter()
        .filter(|b| b.num_rows() > 0)
        .map(|b| b.column(0).as_primitive::<Int64Type>().value(0))
        .sum()
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("   {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
