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
pub fn dms_batch(rows: &[(Option<&str>, String, i32, Trip)]) -> Result<RecordBatch> {
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
    RecordBatch::try_new(schema(with_op), cols).map_err(|e| Error::Internal(e.to_string()))
}

/// Encode a batch as a Parquet file (as DMS would, snappy-compressed).
pub fn to_parquet(batch: &RecordBatch) -> Result<Bytes> {
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::SNAPPY)
        .build();
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(props))
        .map_err(|e| Error::Internal(e.to_string()))?;
    w.write(batch).map_err(|e| Error::Internal(e.to_string()))?;
    w.close().map_err(|e| Error::Internal(e.to_string()))?;
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
    let mut rng = StdRng::seed_from_u64(seed);
    let mut source: BTreeMap<i32, Trip> = BTreeMap::new();
    let insert = |rng: &mut StdRng, source: &mut BTreeMap<i32, Trip>, n: i32, now: &str| {
        let start = source.keys().next_back().copied().unwrap_or(0);
        let mut ids = Vec::new();
        for id in start + 1..=start + n {
            let t = Trip {
                tstamp_micros: ts(now),
                route_id: ((b'A' + (id % 10) as u8) as char).to_string(),
                destination: CITIES[rng.random_range(0..CITIES.len())].to_string(),
                source_location: CITIES[rng.random_range(0..CITIES.len())].to_string(),
            };
            source.insert(id, t);
            ids.push(id);
        }
        ids
    };
    let mut files = Vec::new();

    // 1. Full load. DMS stamps full-load rows with the transfer time.
    let ids = insert(
        &mut rng,
        &mut source,
        full_load_rows,
        "2022-10-25 20:55:01.000000",
    );
    let transfer = "2022-10-25 21:00:03.112233".to_string();
    let per_file = ids.len().div_ceil(load_files.max(1));
    for (n, chunk) in ids.chunks(per_file.max(1)).enumerate() {
        let rows: Vec<_> = chunk
            .iter()
            .map(|id| (None, transfer.clone(), *id, source[id].clone()))
            .collect();
        files.push(DemoFile {
            path: format!("LOAD{:08X}.parquet", n + 1),
            description: format!("full load part {} ({} rows)", n + 1, rows.len()),
            batch: dms_batch(&rows)?,
        });
    }

    // 2a. call insert_records(200);
    let now = "2022-10-25 21:05:00.000001";
    let ids = insert(&mut rng, &mut source, new_rows, now);
    let rows: Vec<_> = ids
        .iter()
        .map(|id| (Some("I"), now.to_string(), *id, source[id].clone()))
        .collect();
    files.push(DemoFile {
        path: "2022/10/25/20221025-2105000000.parquet".into(),
        description: format!("CDC: insert_records({new_rows}) ({} inserts)", rows.len()),
        batch: dms_batch(&rows)?,
    });

    // 2b. update travel_details set destination='Tucson' where destination='Miami';
    let commit = "2022-10-25 21:10:00.000001".to_string();
    let mut rows = Vec::new();
    for (id, t) in source.iter_mut() {
        if t.destination == "Miami" {
            t.destination = "Tucson".into();
            rows.push((Some("U"), commit.clone(), *id, t.clone()));
        }
    }
    files.push(DemoFile {
        path: "2022/10/25/20221025-2110000000.parquet".into(),
        description: format!("CDC: Miami → Tucson ({} updates)", rows.len()),
        batch: dms_batch(&rows)?,
    });

    // 2c. delete from travel_details where destination='Los Angeles';
    let commit = "2022-10-25 21:15:00.000001".to_string();
    let doomed: Vec<i32> = source
        .iter()
        .filter(|(_, t)| t.destination == "Los Angeles")
        .map(|(id, _)| *id)
        .collect();
    let mut rows = Vec::new();
    for id in doomed {
        if let Some(t) = source.remove(&id) {
            rows.push((Some("D"), commit.clone(), id, t));
        }
    }
    files.push(DemoFile {
        path: "2022/10/25/20221025-2115000000.parquet".into(),
        description: format!("CDC: delete Los Angeles ({} deletes)", rows.len()),
        batch: dms_batch(&rows)?,
    });
    Ok(SeedScenario { files, source })
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
