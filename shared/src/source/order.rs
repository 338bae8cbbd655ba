//! Order keys: one string per change whose byte order is the change order (docs/design.md,
//! "Ordering").
//!
//! ```text
//! generation 1 (the first full load and the CDC after it):
//!   full load   0 <file name>
//!   CDC         1 <sequence value>… <file name> <row>
//! generation g ≥ 2 (after the g-th full load, a DMS table reload):
//!   full load   2 <g, 8 digits> 0 <file name>
//!   CDC         2 <g, 8 digits> 1 <sequence value>… <file name> <row>
//! ```
//!
//! Every key of a later generation is greater than every key of an earlier one, and within a
//! generation the full load ranks below every CDC change. The rows of one full-load file
//! share their key: a full load is a snapshot with each key once, so nothing within the file
//! needs ordering, and a key per row (its row number) was a sixth of a full load's time — a
//! key twice in one full-load file keeps its first row (an equal key is a change already
//! seen). Keys written before this layout (`0 <file name> <row>`) rank just above the same
//! file's keys now, below every later file's.
//!
//! Sequence values are normalised so that string order is value order and so that the same
//! instant is written the same way whatever type carried it: timestamps, dates and strings
//! that read as timestamps all become `YYYY-MM-DD HH:MM:SS.ffffff` (UTC); integers become a
//! zero-padded offset form (negative values first); other strings are kept as they are. The
//! [`SeqKind`] of each column is recorded in the table so that files whose values would not
//! compare (an integer sequence in one file, free text in another) are refused.

use arrow::array::{Array, ArrayRef, AsArray, StringArray, StringBuilder};
use arrow::datatypes::{DataType, Date32Type, Date64Type, Int64Type, TimeUnit, UInt64Type};
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};

use crate::model::FileKind;
use std::fmt::Write as _;

pub use crate::model::SeqKind;

/// Why a sequence column cannot be ordered; the row is 0-based.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeqError {
    pub row: Option<usize>,
    pub message: String,
}

/// The normalised values of one sequence column of one file, and their kind (`None` when the
/// file has no rows to tell a text column's kind by).
#[derive(Debug, Clone)]
pub(crate) struct SeqColumn {
    pub kind: Option<SeqKind>,
    pub values: Vec<String>,
}

/// Normalise a sequence column. Nulls are refused: every CDC row needs its position.
pub(crate) fn sequence_column(a: &ArrayRef) -> Result<SeqColumn, SeqError> {
    if let Some(r) = (0..a.len()).find(|&i| a.is_null(i)) {
        return Err(SeqError {
            row: Some(r),
            message: "sequence value is null; every CDC row needs it to be ordered".into(),
        });
    }
    let as_i64 = || {
        arrow::compute::cast(a, &DataType::Int64).map_err(|e| SeqError {
            row: None,
            message: e.to_string(),
        })
    };
    match a.data_type() {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32 => ints(
            as_i64()?
                .as_primitive::<Int64Type>()
                .values()
                .iter()
                .map(|v| i128::from(*v)),
        ),
        DataType::UInt64 => ints(
            a.as_primitive::<UInt64Type>()
                .values()
                .iter()
                .map(|v| i128::from(*v)),
        ),
        DataType::Timestamp(unit, _) => timestamps(a, *unit),
        DataType::Date32 => instants(
            a.as_primitive::<Date32Type>()
                .values()
                .iter()
                .map(|d| i128::from(*d) * 86_400_000_000),
        ),
        DataType::Date64 => instants(
            a.as_primitive::<Date64Type>()
                .values()
                .iter()
                .map(|ms| i128::from(*ms) * 1_000),
        ),
        DataType::Utf8 => texts((0..a.len()).map(|i| a.as_string::<i32>().value(i))),
        DataType::LargeUtf8 => texts((0..a.len()).map(|i| a.as_string::<i64>().value(i))),
        DataType::Utf8View => texts((0..a.len()).map(|i| a.as_string_view().value(i))),
        DataType::Dictionary(_, v) => {
            let plain = arrow::compute::cast(a, v).map_err(|e| SeqError {
                row: None,
                message: e.to_string(),
            })?;
            sequence_column(&plain)
        }
        other => Err(SeqError {
            row: None,
            message: format!(
                "sequence column has type {other}; use a string, integer, date or timestamp column"
            ),
        }),
    }
}

fn ints(values: impl Iterator<Item = i128>) -> Result<SeqColumn, SeqError> {
    Ok(SeqColumn {
        kind: Some(SeqKind::Integer),
        values: values
            .map(|v| format!("{:020}", v + (1i128 << 63)))
            .collect(),
    })
}

fn timestamps(a: &ArrayRef, unit: TimeUnit) -> Result<SeqColumn, SeqError> {
    // The raw values are UTC instants (timezone-aware) or wall-clock times read as UTC
    // (naive); a cast to Int64 hands them over unchanged.
    let raw = arrow::compute::cast(a, &DataType::Int64).map_err(|e| SeqError {
        row: None,
        message: e.to_string(),
    })?;
    let values = raw.as_primitive::<Int64Type>().values().to_vec();
    let mut micros = Vec::with_capacity(values.len());
    for (i, v) in values.into_iter().enumerate() {
        let v = i128::from(v);
        let us = match unit {
            TimeUnit::Second => v * 1_000_000,
            TimeUnit::Millisecond => v * 1_000,
            TimeUnit::Microsecond => v,
            TimeUnit::Nanosecond => {
                if v % 1_000 != 0 {
                    return Err(SeqError {
                        row: Some(i),
                        message: "sequence timestamp has sub-microsecond digits; tributary orders by microseconds (cast the column to microseconds at the source)".into(),
                    });
                }
                v / 1_000
            }
        };
        micros.push(us);
    }
    instants(micros.into_iter())
}

fn instants(micros: impl Iterator<Item = i128>) -> Result<SeqColumn, SeqError> {
    let mut values = Vec::new();
    for (i, us) in micros.enumerate() {
        values.push(render_micros(us).ok_or_else(|| SeqError {
            row: Some(i),
            message: "sequence timestamp is outside the years 0000-9999".into(),
        })?);
    }
    Ok(SeqColumn {
        kind: Some(SeqKind::Timestamp),
        values,
    })
}

pub(crate) fn render_micros(us: i128) -> Option<String> {
    let t = DateTime::<Utc>::from_timestamp_micros(i64::try_from(us).ok()?)?;
    (0..=9999)
        .contains(&chrono::Datelike::year(&t))
        .then(|| render(&t.naive_utc()))
}

fn render(t: &NaiveDateTime) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.6f").to_string()
}

/// Strings: timestamp-like values are normalised; any other text is kept. A column whose
/// values are partly timestamps and partly not cannot be ordered consistently.
fn texts<'a>(values: impl Iterator<Item = &'a str>) -> Result<SeqColumn, SeqError> {
    let mut out = Vec::new();
    let mut kind = None;
    for (i, v) in values.enumerate() {
        let (k, s) = match parse_instant(v) {
            Some(Ok(s)) => (SeqKind::Timestamp, s),
            Some(Err(m)) => {
                return Err(SeqError {
                    row: Some(i),
                    message: m,
                })
            }
            None => (SeqKind::Text, v.to_string()),
        };
        if kind.is_some_and(|prev| prev != k) {
            return Err(SeqError {
                row: Some(i),
                message: format!(
                    "sequence value {v:?} is {k} while earlier rows of the file are {}; the column cannot be ordered consistently",
                    kind.map(SeqKind::as_str).unwrap_or_default()
                ),
            });
        }
        kind = Some(k);
        out.push(s);
    }
    Ok(SeqColumn { kind, values: out })
}

/// `Some(Ok(canonical))` when the text is a timestamp or date, `Some(Err)` when it looks like
/// one but has more precision than microseconds, `None` for other text.
fn parse_instant(v: &str) -> Option<Result<String, String>> {
    if is_canonical(v) {
        return Some(Ok(v.to_string()));
    }
    let t = v.trim();
    if t.len() < 10 || !t.as_bytes()[..4].iter().all(u8::is_ascii_digit) || t.as_bytes()[4] != b'-'
    {
        return None;
    }
    let parsed = DateTime::parse_from_rfc3339(t)
        .map(|d| d.naive_utc())
        .ok()
        .or_else(|| NaiveDateTime::parse_from_str(t, "%Y-%m-%d %H:%M:%S%.f").ok())
        .or_else(|| NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S%.f").ok())
        .or_else(|| {
            NaiveDate::parse_from_str(t, "%Y-%m-%d")
                .ok()
                .and_then(|d| d.and_hms_opt(0, 0, 0))
        })?;
    if chrono::Timelike::nanosecond(&parsed) % 1_000 != 0 {
        return Some(Err(format!(
            "sequence value {v:?} has sub-microsecond digits; tributary orders by microseconds"
        )));
    }
    Some(Ok(render(&parsed)))
}

/// `YYYY-MM-DD HH:MM:SS.ffffff`, what DMS writes for `TimestampColumnName`.
fn is_canonical(v: &str) -> bool {
    let b = v.as_bytes();
    b.len() == 26
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b' ',
            13 | 16 => *c == b':',
            19 => *c == b'.',
            _ => c.is_ascii_digit(),
        })
}

/// The order-key prefix of a generation: empty for the first, `2 <g> ` after reloads.
fn generation_prefix(generation: u32) -> String {
    if generation <= 1 {
        String::new()
    } else {
        format!("2 {generation:08} ")
    }
}

/// The smallest order key of generation `g` (rows below it predate the g-th full load).
pub(crate) fn generation_floor(generation: u32) -> String {
    if generation <= 1 {
        "0".into()
    } else {
        format!("2 {generation:08} ")
    }
}

/// Order keys of a file's rows.
pub(crate) fn order_keys(
    generation: u32,
    kind: FileKind,
    file_name: &str,
    sequences: &[SeqColumn],
    first_row: usize,
    rows: usize,
) -> StringArray {
    let prefix = generation_prefix(generation);
    match kind {
        // One key for every row of the file (see the module documentation).
        FileKind::FullLoad => StringArray::new_repeated(format!("{prefix}0 {file_name}"), rows),
        FileKind::Cdc => {
            let mut out =
                StringBuilder::with_capacity(rows, rows * (prefix.len() + file_name.len() + 40));
            let head = format!("{prefix}1");
            let tail = format!(" {file_name} ");
            let mut number = Numbered::new(String::new(), first_row + 1);
            // Each value written into the builder's buffer in parts, then ended.
            let part = |out: &mut StringBuilder, s: &str| {
                // Appending to the builder's buffer cannot fail.
                let _ = out.write_str(s);
            };
            for i in 0..rows {
                part(&mut out, &head);
                for s in sequences {
                    part(&mut out, " ");
                    part(&mut out, &s.values[i]);
                }
                part(&mut out, &tail);
                part(&mut out, number.as_str());
                out.append_value("");
                number.advance();
            }
            out.finish()
        }
    }
}

/// Text ending in a row number in decimal with at least ten digits (`format!("{n:010}")`),
/// counted up one at a time: one per row of every file, formatting each (ten divisions, then
/// checking the digits are text) was a tenth of a full load's reading time.
struct Numbered {
    text: String,
    /// Where the number starts.
    at: usize,
}

impl Numbered {
    fn new(prefix: String, n: usize) -> Numbered {
        let at = prefix.len();
        let mut text = prefix;
        // Writing to a String cannot fail.
        let _ = write!(text, "{n:010}");
        Numbered { text, at }
    }

    fn as_str(&self) -> &str {
        &self.text
    }

    /// The next number: a last digit below nine goes up one; a nine becomes a zero after the
    /// digits before it go up (a new leading one when every digit was a nine). In place.
    fn advance(&mut self) {
        if self.text.len() == self.at {
            self.text.push('1');
            return;
        }
        match self.text.pop() {
            Some(d @ '0'..='8') => self.text.push(char::from(d as u8 + 1)),
            _ => {
                self.advance();
                self.text.push('0');
            }
        }
    }
}

/// When DMS wrote a CDC file, from its name (`20221025-2105000000.parquet`: date, time,
/// then fractions of a second). `None` for other names.
pub(crate) fn dms_file_time(file_name: &str) -> Option<DateTime<Utc>> {
    let stem = file_name.split('.').next()?;
    let (date, time) = stem.split_once('-')?;
    if date.len() != 8 || time.len() < 6 || !time.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let day = NaiveDate::parse_from_str(date, "%Y%m%d").ok()?;
    let (hms, fraction) = time.split_at(6);
    let t = chrono::NaiveTime::parse_from_str(hms, "%H%M%S").ok()?;
    let mut micros: i64 = 0;
    for (i, d) in fraction.bytes().take(6).enumerate() {
        micros += i64::from(d - b'0') * 10i64.pow(5 - i as u32);
    }
    Some(day.and_time(t).and_utc() + chrono::Duration::microseconds(micros))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        Date32Array, Int32Array, Int64Array, StringArray, TimestampMicrosecondArray,
        TimestampNanosecondArray, UInt64Array,
    };

    use super::*;

    fn values(a: ArrayRef) -> (Option<SeqKind>, Vec<String>) {
        let s = sequence_column(&a).unwrap();
        (s.kind, s.values)
    }

    /// The stored order keys, spelled out: a table's existing `_tributary_seq` values are
    /// compared with new ones as text, so their layout must never change.
    #[test]
    fn order_keys_keep_their_stored_layout() {
        let seq = [
            SeqColumn {
                kind: Some(SeqKind::Timestamp),
                values: vec!["t1".into(), "t2".into()],
            },
            SeqColumn {
                kind: Some(SeqKind::Integer),
                values: vec!["n1".into(), "n2".into()],
            },
        ];
        let keys = |g, kind, name, seq: &[SeqColumn]| -> Vec<String> {
            let a = order_keys(g, kind, name, seq, 41, 2);
            a.iter()
                .map(|v| v.unwrap_or_default().to_string())
                .collect()
        };
        assert_eq!(
            keys(1, FileKind::Cdc, "20240101-1.parquet", &seq),
            [
                "1 t1 n1 20240101-1.parquet 0000000042",
                "1 t2 n2 20240101-1.parquet 0000000043"
            ]
        );
        assert_eq!(
            keys(3, FileKind::FullLoad, "LOAD00000001.parquet", &[]),
            [
                "2 00000003 0 LOAD00000001.parquet",
                "2 00000003 0 LOAD00000001.parquet"
            ]
        );
        assert_eq!(
            keys(1, FileKind::Cdc, "20240101-1.parquet", &[]),
            [
                "1 20240101-1.parquet 0000000042",
                "1 20240101-1.parquet 0000000043"
            ]
        );
    }

    #[test]
    fn row_numbers_are_written_as_the_formatter_pads_them() {
        // Counted up from each start across carries, as `format!` pads them, after the text
        // before the number (which a carry out of every digit leaves alone).
        for prefix in ["", "0 LOAD00000001.parquet "] {
            for start in [
                0,
                1,
                8,
                98,
                999,
                1_234_567_889,
                9_999_999_990,
                99_999_999_990,
            ] {
                let mut n = Numbered::new(prefix.to_string(), start);
                for k in start..start + 25 {
                    assert_eq!(n.as_str(), format!("{prefix}{k:010}"));
                    n.advance();
                }
            }
        }
        assert_eq!(
            Numbered::new(String::new(), usize::MAX).as_str(),
            format!("{}", usize::MAX)
        );
    }

    #[test]
    fn integers_order_numerically_across_widths_and_signs() {
        let (k, v) = values(Arc::new(Int64Array::from(vec![-5, -1, 0, 3, i64::MAX])));
        assert_eq!(k, Some(SeqKind::Integer));
        let mut sorted = v.clone();
        sorted.sort();
        assert_eq!(sorted, v, "string order is numeric order");
        let (_, narrow) = values(Arc::new(Int32Array::from(vec![-5, 3])));
        assert_eq!(
            narrow,
            vec![v[0].clone(), v[3].clone()],
            "same rendering for any width"
        );
        let (_, wide) = values(Arc::new(UInt64Array::from(vec![3, u64::MAX])));
        assert_eq!(wide[0], v[3]);
        assert!(wide[1] > v[4]);
    }

    #[test]
    fn instants_render_alike_whatever_type_carries_them() {
        let us = 1_700_000_000_123_456i64;
        let (k, a) = values(Arc::new(TimestampMicrosecondArray::from(vec![us])));
        assert_eq!(k, Some(SeqKind::Timestamp));
        let (_, b) = values(Arc::new(
            TimestampMicrosecondArray::from(vec![us]).with_timezone("+02:00"),
        ));
        let (_, c) = values(Arc::new(TimestampNanosecondArray::from(vec![us * 1000])));
        let (_, d) = values(Arc::new(StringArray::from(vec![
            "2023-11-14 22:13:20.123456",
        ])));
        let (_, e) = values(Arc::new(StringArray::from(vec![
            "2023-11-14T22:13:20.123456Z",
        ])));
        let (_, f) = values(Arc::new(StringArray::from(vec![
            "2023-11-15T00:13:20.123456+02:00",
        ])));
        assert_eq!(a, vec!["2023-11-14 22:13:20.123456".to_string()]);
        for other in [b, c, d, e, f] {
            assert_eq!(other, a);
        }
        let (_, day) = values(Arc::new(Date32Array::from(vec![19_675])));
        let (_, day_text) = values(Arc::new(StringArray::from(vec!["2023-11-14"])));
        assert_eq!(day, vec!["2023-11-14 00:00:00.000000".to_string()]);
        assert_eq!(day_text, day);
    }

    #[test]
    fn text_sequences_stay_as_they_are_and_mixtures_are_refused() {
        let (k, v) = values(Arc::new(StringArray::from(vec![
            "20221025210500000000000000000000001",
        ])));
        assert_eq!(k, Some(SeqKind::Text));
        assert_eq!(v[0], "20221025210500000000000000000000001");
        let e = sequence_column(
            &(Arc::new(StringArray::from(vec!["2024-01-01 00:00:00.000000", "abc"])) as ArrayRef),
        )
        .unwrap_err();
        assert_eq!(e.row, Some(1));
        let ns =
            sequence_column(&(Arc::new(TimestampNanosecondArray::from(vec![1_500])) as ArrayRef))
                .unwrap_err();
        assert!(ns.message.contains("sub-microsecond"), "{}", ns.message);
        let null = sequence_column(&(Arc::new(Int64Array::from(vec![Some(1), None])) as ArrayRef))
            .unwrap_err();
        assert_eq!(null.row, Some(1));
    }

    #[test]
    fn generations_rank_above_each_other_and_loads_below_cdc() {
        let seq = [SeqColumn {
            kind: Some(SeqKind::Timestamp),
            values: vec!["2099-01-01 00:00:00.000000".into()],
        }];
        let old_cdc = order_keys(1, FileKind::Cdc, "20990101-0000000000.parquet", &seq, 0, 1)
            .value(0)
            .to_string();
        let load2 = order_keys(2, FileKind::FullLoad, "LOAD00000001.parquet", &[], 0, 1)
            .value(0)
            .to_string();
        let cdc2 = order_keys(2, FileKind::Cdc, "20240101-0000000000.parquet", &seq, 0, 1)
            .value(0)
            .to_string();
        let load3 = order_keys(3, FileKind::FullLoad, "LOAD00000001.parquet", &[], 0, 1)
            .value(0)
            .to_string();
        assert!(old_cdc < load2 && load2 < cdc2 && cdc2 < load3);
        assert!(generation_floor(2).as_str() <= load2.as_str());
        assert!(generation_floor(2).as_str() > old_cdc.as_str());
        assert_eq!(
            order_keys(1, FileKind::FullLoad, "LOAD00000001.parquet", &[], 0, 1)
                .value(0)
                .to_string(),
            "0 LOAD00000001.parquet"
        );
    }

    #[test]
    fn a_full_load_file_is_one_key_between_earlier_and_later_files() {
        let key = |g, name: &str, first, rows| -> Vec<String> {
            order_keys(g, FileKind::FullLoad, name, &[], first, rows)
                .iter()
                .map(|v| v.unwrap_or_default().to_string())
                .collect()
        };
        // Every row of a file, whatever slice it is read in.
        let first = key(1, "LOAD00000002.parquet", 0, 3);
        assert_eq!(first, ["0 LOAD00000002.parquet"; 3]);
        assert_eq!(key(1, "LOAD00000002.parquet", 500_000, 2), first[..2]);
        // A later file's rows rank above an earlier file's, in both layouts (the row-numbered
        // keys of tables loaded before), and a file's keys in the old layout rank above its
        // keys now: re-delivered, its rows are not newer than what the table holds.
        let earlier_old = "0 LOAD00000001.parquet 0000000007";
        let same_old = "0 LOAD00000002.parquet 0000000001";
        let later = key(1, "LOAD00000003.parquet", 0, 1).remove(0);
        assert!(earlier_old < first[0].as_str());
        assert!(first[0].as_str() < same_old && same_old < later.as_str());
        // Below every CDC change of the generation.
        assert!(later.as_str() < "1");
    }

    #[test]
    fn dms_file_names_give_the_write_time() {
        let t = dms_file_time("20221025-2105001234.parquet").unwrap();
        assert_eq!(t.to_rfc3339(), "2022-10-25T21:05:00.123400+00:00");
        assert!(dms_file_time("LOAD00000001.parquet").is_none());
        assert!(dms_file_time("changes.csv").is_none());
    }
}
