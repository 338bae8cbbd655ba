//! Interval values: typed as the sequence column (a timestamp for DMS `update_ts_dms`, an
//! integer, or text), converted from and to the normalised strings order keys are made of.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Int64Type, TimeUnit};
use chrono::NaiveDateTime;

use crate::error::{Error, Result};
use crate::source::order::{render_micros, SeqKind};

const OFFSET: i128 = 1 << 63;

/// The Arrow type of the interval columns for a sequence kind.
pub(crate) fn interval_type(kind: SeqKind) -> DataType {
    match kind {
        SeqKind::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        SeqKind::Integer => DataType::Int64,
        SeqKind::Text => DataType::Utf8,
    }
}

/// The start of a version whose first change has no sequence value (a full-load row
/// without one, such as DMS's `AR_H_CHANGE_SEQ` during the full load), as a normalised
/// value: at or below every value of the kind, so that "as of T" returns the loaded row
/// for every T after the load. Timestamps: 1970-01-01 00:00:00 UTC (not year 1: engines
/// that rebase ancient Parquet timestamps, such as Spark, read it as it is); integers: the
/// smallest `bigint`; text: the empty string.
pub(crate) fn floor(kind: SeqKind) -> String {
    match kind {
        SeqKind::Timestamp => "1970-01-01 00:00:00.000000".into(),
        SeqKind::Integer => format!("{:020}", 0),
        SeqKind::Text => String::new(),
    }
}

/// The sequence kind an interval column of this type was created for.
pub(crate) fn kind_of_type(t: &DataType) -> Option<SeqKind> {
    match t {
        DataType::Timestamp(_, _) => Some(SeqKind::Timestamp),
        DataType::Int64 => Some(SeqKind::Integer),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Some(SeqKind::Text),
        _ => None,
    }
}

fn bad(value: &str, kind: SeqKind) -> Error {
    Error::internal(format!(
        "sequence value {value:?} is not a normalised {kind}"
    ))
}

/// Normalised values → a typed column.
pub(crate) fn to_typed(kind: SeqKind, values: &[Option<String>]) -> Result<ArrayRef> {
    Ok(match kind {
        SeqKind::Timestamp => {
            let micros = values
                .iter()
                .map(|v| match v {
                    None => Ok(None),
                    Some(s) => NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.6f")
                        .map(|t| Some(t.and_utc().timestamp_micros()))
                        .map_err(|_| bad(s, kind)),
                })
                .collect::<Result<Vec<_>>>()?;
            Arc::new(TimestampMicrosecondArray::from(micros).with_timezone("UTC"))
        }
        SeqKind::Integer => {
            let ints = values
                .iter()
                .map(|v| match v {
                    None => Ok(None),
                    Some(s) => s
                        .parse::<i128>()
                        .ok()
                        .and_then(|n| i64::try_from(n - OFFSET).ok())
                        .map(Some)
                        .ok_or_else(|| bad(s, kind)),
                })
                .collect::<Result<Vec<_>>>()?;
            Arc::new(Int64Array::from(ints))
        }
        SeqKind::Text => Arc::new(StringArray::from(values.to_vec())),
    })
}

/// A typed column → normalised values.
pub(crate) fn from_typed(kind: SeqKind, a: &ArrayRef) -> Result<Vec<Option<String>>> {
    let raw = |a: &ArrayRef| arrow::compute::cast(a, &DataType::Int64).map_err(Error::arrow);
    Ok(match kind {
        SeqKind::Timestamp => {
            let micros =
                raw(&arrow::compute::cast(a, &interval_type(kind)).map_err(Error::arrow)?)?;
            let micros = micros.as_primitive::<Int64Type>();
            (0..a.len())
                .map(|i| {
                    a.is_valid(i)
                        .then(|| render_micros(i128::from(micros.value(i))))
                        .flatten()
                })
                .collect()
        }
        SeqKind::Integer => {
            let ints = raw(a)?;
            let ints = ints.as_primitive::<Int64Type>();
            (0..a.len())
                .map(|i| {
                    a.is_valid(i)
                        .then(|| format!("{:020}", i128::from(ints.value(i)) + OFFSET))
                })
                .collect()
        }
        SeqKind::Text => {
            let s = arrow::compute::cast(a, &DataType::Utf8).map_err(Error::arrow)?;
            s.as_string::<i32>()
                .iter()
                .map(|v| v.map(str::to_string))
                .collect()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalised_values_round_trip_through_their_types() {
        for (kind, v) in [
            (SeqKind::Timestamp, "2022-10-25 21:10:00.000001"),
            (SeqKind::Integer, "09223372036854775803"),
            (SeqKind::Text, "20221025210500000000000000000000001"),
        ] {
            let values = vec![Some(v.to_string()), None];
            let typed = to_typed(kind, &values).unwrap();
            assert_eq!(typed.data_type(), &interval_type(kind));
            assert_eq!(from_typed(kind, &typed).unwrap(), values);
        }
        let typed = to_typed(SeqKind::Integer, &[Some("09223372036854775803".into())]).unwrap();
        assert_eq!(typed.as_primitive::<Int64Type>().value(0), -5);
    }

    #[test]
    fn the_floor_of_each_kind_is_its_smallest_value_and_has_a_type() {
        let typed = to_typed(SeqKind::Integer, &[Some(floor(SeqKind::Integer))]).unwrap();
        assert_eq!(typed.as_primitive::<Int64Type>().value(0), i64::MIN);
        let typed = to_typed(SeqKind::Timestamp, &[Some(floor(SeqKind::Timestamp))]).unwrap();
        assert_eq!(
            typed
                .as_primitive::<arrow::datatypes::TimestampMicrosecondType>()
                .value(0),
            0
        );
        assert_eq!(floor(SeqKind::Text), "");
        for kind in [SeqKind::Timestamp, SeqKind::Integer, SeqKind::Text] {
            assert_eq!(kind_of_type(&interval_type(kind)), Some(kind));
        }
    }
}
