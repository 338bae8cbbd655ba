//! What tributary records in a Delta table's properties (`metaData.configuration`, read with
//! the snapshot at no extra cost): the kind of each sequence column, and the full-load
//! generations (DMS table reloads) with the time each one started.
//!
//! | property | meaning |
//! |---|---|
//! | `tributary.sequenceKinds` | `timestamp`, `integer` or `text` per `sequence_by` column |
//! | `tributary.loadTracking` | `true`: every full-load file applied is recorded (see `reload`) |
//! | `tributary.generation` | the newest full-load generation (absent: 1) |
//! | `tributary.generation.<g>.start` | RFC 3339: files written from then on belong to `g` |
//! | `tributary.tombstoneHorizon` | RFC 3339: tombstones recorded up to then may have expired |
//! | `tributary.fileRecordsSince` | RFC 3339: every CDC file applied since then is recorded (see `applied`) |
//! | `tributary.adopted` | RFC 3339: when tributary adopted a table another writer created (added its order-key column) |

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use crate::model::SeqKind;

pub(crate) const SEQUENCE_KINDS: &str = "tributary.sequenceKinds";
pub(crate) const LOAD_TRACKING: &str = "tributary.loadTracking";
pub(crate) const GENERATION: &str = "tributary.generation";
pub(crate) const TOMBSTONE_HORIZON: &str = "tributary.tombstoneHorizon";
pub(crate) const FILE_RECORDS_SINCE: &str = "tributary.fileRecordsSince";
pub(crate) const ADOPTED: &str = "tributary.adopted";
/// Delta's own property that turns the change data feed on.
pub(crate) const CHANGE_DATA_FEED: &str = "delta.enableChangeDataFeed";
/// Delta's table property that lets writers mark rows deleted in deletion vectors.
pub(crate) const DELETION_VECTORS: &str = "delta.enableDeletionVectors";

fn generation_start_key(g: u32) -> String {
    format!("tributary.generation.{g}.start")
}

/// tributary's properties of one table version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableProps {
    /// `None` for tables created before the kinds were recorded (or by other writers).
    pub sequence_kinds: Option<Vec<SeqKind>>,
    /// Whether full-load files are recorded (tables created by this version on).
    pub load_tracking: bool,
    /// Generations after the first: (g, start), ascending.
    pub generations: Vec<(u32, DateTime<Utc>)>,
    /// Tombstones recorded up to this time may have been expired by maintenance: a file
    /// written before it could revive a deleted row and is refused.
    pub tombstone_horizon: Option<DateTime<Utc>>,
    /// `delta.enableChangeDataFeed` is on.
    pub change_data_feed: bool,
    /// `delta.enableDeletionVectors` is on.
    pub deletion_vectors: bool,
    /// Since when every CDC file the table applied is recorded (`None`: tables from before
    /// the records, or another writer's).
    pub file_records_since: Option<DateTime<Utc>>,
    /// When tributary adopted the table (another writer created it; tributary added its
    /// order-key column, and the rows then in it rank below every change).
    pub adopted: Option<DateTime<Utc>>,
}

impl TableProps {
    /// Read from a table's configuration map.
    pub fn from_configuration(conf: &HashMap<String, String>) -> TableProps {
        let sequence_kinds = conf.get(SEQUENCE_KINDS).and_then(|v| {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(SeqKind::parse)
                .collect::<Option<Vec<_>>>()
        });
        let current: u32 = conf
            .get(GENERATION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let generations = (2..=current)
            .filter_map(|g| Some((g, rfc3339(conf.get(&generation_start_key(g))?)?)))
            .collect();
        TableProps {
            sequence_kinds,
            load_tracking: conf.get(LOAD_TRACKING).is_some_and(|v| v == "true"),
            generations,
            tombstone_horizon: conf.get(TOMBSTONE_HORIZON).and_then(|v| rfc3339(v)),
            change_data_feed: conf
                .get(CHANGE_DATA_FEED)
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
            deletion_vectors: conf
                .get(DELETION_VECTORS)
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
            file_records_since: conf.get(FILE_RECORDS_SINCE).and_then(|v| rfc3339(v)),
            adopted: conf.get(ADOPTED).and_then(|v| rfc3339(v)),
        }
    }

    /// The newest generation.
    pub fn generation(&self) -> u32 {
        self.generations.last().map_or(1, |(g, _)| *g)
    }

    /// The generation a file written at `t` belongs to.
    pub fn generation_at(&self, t: DateTime<Utc>) -> u32 {
        self.generations
            .iter()
            .rev()
            .find(|(_, start)| *start <= t)
            .map_or(1, |(g, _)| *g)
    }

    /// Properties of a new table: the sequence kinds seen in its first files, load tracking.
    pub fn for_new_table(kinds: &[Option<SeqKind>]) -> HashMap<String, String> {
        let mut m = HashMap::new();
        m.insert(LOAD_TRACKING.to_string(), "true".to_string());
        if !kinds.is_empty() && kinds.iter().all(Option::is_some) {
            let s: Vec<&str> = kinds.iter().flatten().map(|k| k.as_str()).collect();
            m.insert(SEQUENCE_KINDS.to_string(), s.join(","));
        }
        m
    }

    /// The properties that register generation `g` starting at `start`.
    pub fn for_generation(g: u32, start: DateTime<Utc>) -> HashMap<String, String> {
        HashMap::from([
            (GENERATION.to_string(), g.to_string()),
            (generation_start_key(g), format_time(start)),
        ])
    }

    /// The property that moves the tombstone horizon to `t`.
    pub fn for_horizon(t: DateTime<Utc>) -> HashMap<String, String> {
        HashMap::from([(TOMBSTONE_HORIZON.to_string(), format_time(t))])
    }

    /// The property that says every CDC file applied from `t` on is recorded.
    pub fn for_file_records(t: DateTime<Utc>) -> HashMap<String, String> {
        HashMap::from([(FILE_RECORDS_SINCE.to_string(), format_time(t))])
    }

    /// The property that records tributary's adoption of a table at `t`.
    pub fn for_adoption(t: DateTime<Utc>) -> HashMap<String, String> {
        HashMap::from([(ADOPTED.to_string(), format_time(t))])
    }

    /// The property that turns the change data feed on.
    pub fn for_change_data_feed() -> HashMap<String, String> {
        HashMap::from([(CHANGE_DATA_FEED.to_string(), "true".to_string())])
    }

    /// The property that lets merges write deletion vectors.
    pub fn for_deletion_vectors() -> HashMap<String, String> {
        HashMap::from([(DELETION_VECTORS.to_string(), "true".to_string())])
    }

    /// The properties that record sequence kinds on a table that has none yet.
    pub fn for_kinds(kinds: &[SeqKind]) -> HashMap<String, String> {
        let s: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
        HashMap::from([(SEQUENCE_KINDS.to_string(), s.join(","))])
    }
}

fn rfc3339(v: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(v)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn format_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_round_trip_and_classify_times() {
        let t2 = DateTime::parse_from_rfc3339("2024-02-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let t3 = DateTime::parse_from_rfc3339("2024-03-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let mut conf = TableProps::for_generation(2, t2);
        conf.extend(TableProps::for_generation(3, t3));
        conf.extend(TableProps::for_new_table(&[Some(SeqKind::Timestamp)]));
        let p = TableProps::from_configuration(&conf);
        assert_eq!(p.generation(), 3);
        assert!(p.load_tracking);
        assert_eq!(p.sequence_kinds, Some(vec![SeqKind::Timestamp]));
        let before = t2 - chrono::Duration::seconds(1);
        assert_eq!(p.generation_at(before), 1);
        assert_eq!(p.generation_at(t2), 2);
        assert_eq!(p.generation_at(t3 + chrono::Duration::days(1)), 3);
        assert_eq!(TableProps::default().generation(), 1);
    }
}
