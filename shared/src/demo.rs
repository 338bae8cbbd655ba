//! The seed scenario users know from the AWS walkthrough (`travel_details`), generated as
//! the files DMS would write, plus the source table's true final state to compare against.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{Error, Result};

pub const CITIES: [&str; 10] = [
    "Seattle",
    "New York",
    "New Jersey",
    "Los Angeles",
    "Las Vegas",
    "Tucson",
    "Washington DC",
    "Philadelphia",
    "Miami",
    "San Francisco",
];

/// Folder (under the raw root) where DMS lands the table: `<schema>/<table>/`.
pub const SOURCE_PREFIX: &str = "delta_emr_source/travel_details/";

/// The local Lambda loop's configuration: the S3 layout of the sample events in `events/`
/// (served from a local folder with `TRIBUTARY_LOCAL_S3_ROOT`, or from an emulator).
pub const S3_CONFIG: &str = r#"# tributary table configuration for the sample events (see docs/configuration.md)
[[table]]
name = "travel_details"
source = "s3://tributary-raw/dms/delta_emr_source/travel_details/"
target = "s3://tributary-curated/delta/travel_details"
primary_key = ["trip_id"]
partition_by = ["route_id"]
sequence_by = ["update_ts_dms"]
drop_columns = ["schema_name", "table_name", "update_ts_dms"]
"#;

/// Where the sample events' raw files live: bucket and key prefix of the table.
pub const S3_RAW_BUCKET: &str = "tributary-raw";
pub const S3_RAW_PREFIX: &str = "dms/delta_emr_source/travel_details/";

/// The demo's table configuration (paths relative to the demo folder).
pub const CONFIG: &str = r#"# tributary table configuration for the seed scenario (see docs/configuration.md)
[[table]]
name = "travel_details"
# where DMS lands the files: <raw>/<schema>/<table>/ (CDC files in date folders below)
source = "raw/delta_emr_source/travel_details/"
# the curated Delta table
target = "curated/travel_details"
primary_key = ["trip_id"]
partition_by = ["route_id"]
# DMS TimestampColumnName: the source commit time of each change
sequence_by = ["update_ts_dms"]
# DMS metadata added by transformation rules; Op is always dropped
drop_columns = ["schema_name", "table_name", "update_ts_dms"]
format = "parquet"

# every version of every trip (SCD type 2), fed from the same files
[table.history]
target = "curated/travel_details_history"
start_column = "valid_from"
end_column = "valid_to"
current_column = "iscurrent"
"#;

/// One row of the source table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trip {
    pub tstamp_micros: i64,
    pub route_id: String,
    pub destination: String,
    pub source_location: String,
}

/// A file DMS would write.
#[derive(Debug, Clone)]
pub struct DemoFile {
    /// Path relative to the table's source prefix, e.g. `2022/10/25/20221025-2105000000.parquet`.
    pub path: String,
    pub description: String,
    pub batch: RecordBatch,
}

/// The generated files, in the order DMS wrote them, and the source's final state.
#[derive(Debug, Clone)]
pub struct SeedScenario {
    pub files: Vec<DemoFile>,
    pub source: BTreeMap<i32, Trip>,
}

fn schema(with_op: bool) -> Arc<Schema> {
    let mut f = Vec::new();
    if with_op {
        f.push(Field::new("Op", DataType::Utf8, true));
    }
    f.extend([
        Field::new("update_ts_dms", DataType::Utf8, true),
        Field::new("schema_name", DataType::Utf8, true),
        Field::new("table_name", DataType::Utf8, true),
        Field::new("trip_id", DataType::Int32, true),
        Field::new(
            "tstamp",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            true,
        ),
        Field::new("route_id", DataType::Utf8, true),
        Field::new("destination", DataType::Utf8, true),
        Field::new("source_location", DataType::Utf8, true),
    ]);
    Arc::new(Schema::new(f))
}

/// Build a DMS-shaped batch from (op, commit time, id, row).
/// One row as DMS writes it: operation (none in full-load files), `update_ts_dms`, trip id,
/// the trip.
pub type DmsRow = (Option<&'static str>, String, i32, Trip);

pub fn dms_batch(rows: &[DmsRow]) -> Result<RecordBatch> {
    let with_op = rows.first().is_some_and(|r| r.0.is_some());
    let mut cols: Vec<ArrayRef> = Vec::new();
    if with_op {
        cols.push(Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.0.unwrap_or("I")),
        )));
    }
    cols.push(Arc::new(StringArray::from_iter_values(
        rows.iter().map(|r| r.1.as_str()),
    )));
    cols.push(Arc::new(StringArray::from_iter_values(
        rows.iter().map(|_| "delta_emr_source"),
    )));
    cols.push(Arc::new(StringArray::from_iter_values(
        rows.iter().map(|_| "travel_details"),
    )));
    cols.push(Arc::new(Int32Array::from_iter_values(
        rows.iter().map(|r| r.2),
    )));
    cols.push(Arc::new(TimestampMicrosecondArray::from_iter_values(
        rows.iter().map(|r| r.3.tstamp_micros),
    )));
    cols.push(Arc::new(StringArray::from_iter_values(
        rows.iter().map(|r| r.3.route_id.as_str()),
    )));
    cols.push(Arc::new(StringArray::from_iter_values(
        rows.iter().map(|r| r.3.destination.as_str()),
    )));
    cols.push(Arc::new(StringArray::from_iter_values(
        rows.iter().map(|r| r.3.source_location.as_str()),
    )));
    RecordBatch::try_new(schema(with_op), cols).map_err(Error::arrow)
}

/// Encode a batch as a Parquet file (as DMS would, snappy-compressed).
pub fn to_parquet(batch: &RecordBatch) -> Result<Bytes> {
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::SNAPPY)
        .build();
    let mut buf = Vec::new();
    let pq = |e: parquet::errors::ParquetError| Error::arrow(e.into());
    let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(props)).map_err(pq)?;
    w.write(batch).map_err(pq)?;
    w.close().map_err(pq)?;
    Ok(Bytes::from(buf))
}

fn ts(s: &str) -> i64 {
    chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f")
        .map(|t| t.and_utc().timestamp_micros())
        .unwrap_or(0)
}

/// The walkthrough: `insert_records(full_load_rows)` (full load, `load_files` LOAD files), then
/// `insert_records(new_rows)`, Miami→Tucson and deleting Los Angeles (three CDC files).
/// The inserts run before the update so that, as the walkthrough's check expects, no
/// Miami trip is left (new trips draw their destination at random, Miami included).
pub fn seed_scenario(
    seed: u64,
    full_load_rows: i32,
    new_rows: i32,
    load_files: usize,
) -> Result<SeedScenario> {
    let mut w = Walkthrough {
        rng: StdRng::seed_from_u64(seed),
        source: BTreeMap::new(),
        files: Vec::new(),
    };
    w.full_load(full_load_rows, load_files)?;
    w.insert_records(new_rows)?;
    w.miami_to_tucson()?;
    w.delete_los_angeles()?;
    Ok(SeedScenario {
        files: w.files,
        source: w.source,
    })
}

/// The source table as the walkthrough's statements change it, and the files DMS writes.
struct Walkthrough {
    rng: StdRng,
    source: BTreeMap<i32, Trip>,
    files: Vec<DemoFile>,
}

impl Walkthrough {
    /// `n` new trips (ids after the largest), created at `now`.
    fn insert(&mut self, n: i32, now: &str) -> Vec<i32> {
        let start = self.source.keys().next_back().copied().unwrap_or(0);
        let ids: Vec<i32> = (start + 1..=start + n).collect();
        for &id in &ids {
            let t = Trip {
                tstamp_micros: ts(now),
                route_id: ((b'A' + (id % 10) as u8) as char).to_string(),
                destination: CITIES[self.rng.random_range(0..CITIES.len())].to_string(),
                source_location: CITIES[self.rng.random_range(0..CITIES.len())].to_string(),
            };
            self.source.insert(id, t);
        }
        ids
    }

    fn file(&mut self, path: &str, description: String, rows: &[DmsRow]) -> Result<()> {
        self.files.push(DemoFile {
            path: path.to_string(),
            description,
            batch: dms_batch(rows)?,
        });
        Ok(())
    }

    /// 1. The full load, in `load_files` files. DMS stamps full-load rows with the transfer
    ///    time.
    fn full_load(&mut self, rows: i32, load_files: usize) -> Result<()> {
        let ids = self.insert(rows, "2022-10-25 20:55:01.000000");
        let transfer = "2022-10-25 21:00:03.112233".to_string();
        let per_file = ids.len().div_ceil(load_files.max(1)).max(1);
        for (n, chunk) in ids.chunks(per_file).enumerate() {
            let rows: Vec<DmsRow> = chunk
                .iter()
                .map(|id| (None, transfer.clone(), *id, self.source[id].clone()))
                .collect();
            let description = format!("full load part {} ({} rows)", n + 1, rows.len());
            self.file(&format!("LOAD{:08X}.parquet", n + 1), description, &rows)?;
        }
        Ok(())
    }

    /// 2a. `call insert_records(n);`
    fn insert_records(&mut self, n: i32) -> Result<()> {
        let now = "2022-10-25 21:05:00.000001";
        let rows: Vec<DmsRow> = self
            .insert(n, now)
            .iter()
            .map(|id| (Some("I"), now.to_string(), *id, self.source[id].clone()))
            .collect();
        let description = format!("CDC: insert_records({n}) ({} inserts)", rows.len());
        self.file("2022/10/25/20221025-2105000000.parquet", description, &rows)
    }

    /// 2b. `update travel_details set destination='Tucson' where destination='Miami';`
    fn miami_to_tucson(&mut self) -> Result<()> {
        let commit = "2022-10-25 21:10:00.000001".to_string();
        let mut rows = Vec::new();
        for (id, t) in self.source.iter_mut() {
            if t.destination == "Miami" {
                t.destination = "Tucson".into();
                rows.push((Some("U"), commit.clone(), *id, t.clone()));
            }
        }
        let description = format!("CDC: Miami → Tucson ({} updates)", rows.len());
        self.file("2022/10/25/20221025-2110000000.parquet", description, &rows)
    }

    /// 2c. `delete from travel_details where destination='Los Angeles';`
    fn delete_los_angeles(&mut self) -> Result<()> {
        let commit = "2022-10-25 21:15:00.000001".to_string();
        let doomed: Vec<i32> = self
            .source
            .iter()
            .filter(|(_, t)| t.destination == "Los Angeles")
            .map(|(id, _)| *id)
            .collect();
        let rows: Vec<DmsRow> = doomed
            .into_iter()
            .filter_map(|id| Some((Some("D"), commit.clone(), id, self.source.remove(&id)?)))
            .collect();
        let description = format!("CDC: delete Los Angeles ({} deletes)", rows.len());
        self.file("2022/10/25/20221025-2115000000.parquet", description, &rows)
    }
}

/// `destination → count` of a source state.
pub fn counts_by_destination(source: &BTreeMap<i32, Trip>) -> BTreeMap<String, i64> {
    let mut m = BTreeMap::new();
    for t in source.values() {
        *m.entry(t.destination.clone()).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_matches_walkthrough() {
        let s = seed_scenario(7, 2000, 200, 2).unwrap();
        assert_eq!(s.files.len(), 5);
        assert_eq!(s.files[0].path, "LOAD00000001.parquet");
        assert!(s
            .source
            .values()
            .all(|t| t.destination != "Miami" && t.destination != "Los Angeles"));
        assert_eq!(*s.source.keys().next_back().unwrap(), 2200);
        let deleted = s.files[4].batch.num_rows();
        assert_eq!(s.source.len(), 2200 - deleted);
        // route_id = chr(65 + trip_id % 10)
        for (id, t) in &s.source {
            assert_eq!(t.route_id, ((b'A' + (id % 10) as u8) as char).to_string());
        }
    }
}
