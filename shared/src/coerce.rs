//! Type coercion: the Delta type a new source column gets, and exact conversion of values to
//! a column's type.
//!
//! Every conversion tributary makes (a CSV text into a typed column, a file's column into the
//! table's type, one file's column into the type another file of the same batch set) goes
//! through [`exact_cast`]: a value that the target type cannot represent exactly is an error
//! naming the row and the value. Nothing is truncated, rounded, wrapped or nulled.
//!
//! "Exactly" means the value survives the round trip: converted back to the type it came in,
//! it is equal to what it was (`1.75` into an integer column fails, `5` into a string column
//! is `"5"` and back `5`). Text (CSV) is checked against what it says: `3.333` does not fit
//! `decimal(10,2)`, `…:00.1234567` does not fit microseconds, and a number read from text
//! must not lose what the text had: `02134` into an integer column would come back as
//! `2134`, so an integer column takes text only in its canonical form (`2134`, `-5`), and a
//! float or decimal column refuses zero-padded or space-padded text (`007.5`, ` 7`).
//!
//! Values are judged decoded: dictionary and run-end encoded arrays are unpacked and view
//! types read as their plain types ([`decode`]) before any rule looks at them.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::kernels::cmp::not_distinct;
use arrow::compute::{cast_with_options, CastOptions};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::util::display::{array_value_to_string, FormatOptions};
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::basic::Type as PhysicalType;

/// The type a new column gets in the Delta table (Delta has no unsigned, time-of-day or
/// nanosecond types; timestamps become `timestamp` (UTC), as Spark writes them). `None` when
/// Delta has no equivalent.
pub(crate) fn delta_type(dt: &DataType) -> Option<DataType> {
    Some(match dt {
        DataType::Null | DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        DataType::Time32(_) | DataType::Time64(_) => DataType::Utf8,
        DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_) => {
            DataType::Binary
        }
        DataType::UInt8 => DataType::Int16,
        DataType::UInt16 => DataType::Int32,
        DataType::UInt32 => DataType::Int64,
        DataType::UInt64 => DataType::Decimal128(20, 0),
        DataType::Float16 => DataType::Float32,
        DataType::Date64 => DataType::Date32,
        DataType::Timestamp(_, _) => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        DataType::Dictionary(_, v) => return delta_type(v),
        DataType::RunEndEncoded(_, v) => return delta_type(v.data_type()),
        DataType::Boolean
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::Float32
        | DataType::Float64
        | DataType::Utf8
        | DataType::Binary
        | DataType::Date32
        | DataType::Decimal128(_, _) => dt.clone(),
        _ => return None,
    })
}

/// Decimal digits every value of an integer type fits in (`None`: not an integer type).
fn integer_digits(dt: &DataType) -> Option<u8> {
    Some(match dt {
        DataType::Int8 => 3,
        DataType::Int16 => 5,
        DataType::Int32 => 10,
        DataType::Int64 => 19,
        _ => return None,
    })
}

/// Whether a column of type `from` can take type `to` with every value it can hold kept
/// exactly (a lossless widening, applied to a table automatically; docs/configuration.md,
/// "Types in the Delta table"): a larger integer; `float` to `double`; an integer to a
/// decimal with at least its digits before the point; `decimal(p,s)` to `decimal(p',s')`
/// with `p'-s' >= p-s` and `s' >= s`; `date` to `timestamp`, each date becoming its midnight
/// in UTC. Equal types are not a widening. Both are Delta types ([`delta_type`]).
///
/// `date` → `timestamp`: a source timestamp is stored as a `timestamp` read as UTC
/// ([`delta_type`]), so a `DATE` column altered to `DATETIME` / `TIMESTAMP` at the source
/// holds each old date as its midnight there, and arrives as such; the old rows take exactly
/// that value, the one a reload of the table would write. Delta's `timestamp_ntz` is never
/// a source column's type here, so its table feature is not needed.
pub(crate) fn is_widening(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    match (from, to) {
        (Float32, Float64) => true,
        (Date32, Timestamp(TimeUnit::Microsecond, Some(_))) => true,
        (Decimal128(p, s), Decimal128(q, t)) => {
            (q, t) != (p, s) && t >= s && (*q as i16 - *t as i16) >= (*p as i16 - *s as i16)
        }
        (f, Decimal128(q, t)) => {
            integer_digits(f).is_some_and(|d| *t >= 0 && (*q as i16 - *t as i16) >= d as i16)
        }
        (f, t) => match (integer_digits(f), integer_digits(t)) {
            (Some(a), Some(b)) => a < b,
            _ => false,
        },
    }
}

/// Why a column could not be converted: the first row (0-based) that does not fit, its value
/// as text, and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inexact {
    pub row: Option<usize>,
    pub value: Option<String>,
    pub reason: String,
}

impl Inexact {
    fn at(array: &dyn Array, row: usize, reason: impl Into<String>) -> Self {
        Inexact {
            row: Some(row),
            value: array_value_to_string(array, row).ok(),
            reason: reason.into(),
        }
    }

    /// `value "1.75" cannot be represented exactly as Int64 (from Float64): …`
    pub(crate) fn describe(&self, from: &DataType, to: &DataType) -> String {
        let value = self
            .value
            .as_ref()
            .map(|v| format!("value {v:?} "))
            .unwrap_or_default();
        format!(
            "{value}cannot be represented exactly as {to} (from {from}): {}",
            self.reason
        )
    }
}

const STRICT: CastOptions<'static> = CastOptions {
    safe: false,
    format_options: FormatOptions::new(),
};

/// The plain type of an encoded layout: a dictionary's or a run-end encoded array's value
/// type (itself decoded), a view type's plain type. `None` when `dt` is plain already.
pub(crate) fn plain_type(dt: &DataType) -> Option<DataType> {
    let values = match dt {
        DataType::Dictionary(_, v) => v.as_ref(),
        DataType::RunEndEncoded(_, v) => v.data_type(),
        DataType::Utf8View => return Some(DataType::Utf8),
        DataType::BinaryView => return Some(DataType::Binary),
        _ => return None,
    };
    Some(plain_type(values).unwrap_or_else(|| values.clone()))
}

/// `array` with its values decoded ([`plain_type`]); the same array when it is plain.
/// Decoding changes no value, so every rule about values can look at the result.
pub(crate) fn decode(array: &ArrayRef) -> Result<ArrayRef, arrow::error::ArrowError> {
    let mut a = array.clone();
    // One layer at a time (a dictionary of views: the dictionary, then the view).
    while let Some(t) = plain_type(a.data_type()) {
        let next = match a.data_type() {
            DataType::Dictionary(_, v) => v.as_ref().clone(),
            DataType::RunEndEncoded(_, v) => v.data_type().clone(),
            _ => t,
        };
        a = cast_with_options(&a, &next, &STRICT)?;
    }
    Ok(a)
}

/// Convert `array` to `to`, refusing any value that would change.
pub(crate) fn exact_cast(array: &ArrayRef, to: &DataType) -> Result<ArrayRef, Inexact> {
    let from = array.data_type();
    within_precision(array)?;
    if from == to {
        return Ok(array.clone());
    }
    if plain_type(from).is_some() {
        // Unpacking a dictionary or run-end encoding, or a view, changes no value.
        let plain = decode(array).map_err(|e| Inexact {
            row: None,
            value: None,
            reason: e.to_string(),
        })?;
        return exact_cast(&plain, to);
    }
    if let Some(same) = same_instants(array, to) {
        return same;
    }
    if !same_kind(from, to) {
        let row = (0..array.len()).find(|&i| array.is_valid(i));
        return Err(match row {
            Some(r) => Inexact::at(array.as_ref(), r, "a value of another kind (numbers, text, dates and times, booleans and bytes do not turn into each other, except into text)"),
            None => return cast_with_options(array, to, &STRICT).map_err(|e| first_failure(array, to, e)),
        });
    }
    let out = cast_with_options(array, to, &STRICT).map_err(|e| first_failure(array, to, e))?;
    if let Some(row) = (0..array.len()).find(|&i| array.is_valid(i) && out.is_null(i)) {
        return Err(Inexact::at(
            array.as_ref(),
            row,
            "the value has no equivalent",
        ));
    }
    let mismatch = if is_text(from) {
        text_mismatch(array, &out, to)
    } else {
        roundtrip_mismatch(array, &out)?
    };
    match mismatch {
        Some((row, reason)) => Err(Inexact::at(array.as_ref(), row, reason)),
        None => Ok(out),
    }
}

/// A timestamp without a zone into the same unit in UTC (how Delta stores every timestamp),
/// or from one zone into another: the same numbers, the zone only names them. Arrow's cast
/// gets there too, but computes each value through the zone's rules (a tenth of a full
/// load's time, measured); this only relabels the array. `None` for every other cast.
fn same_instants(array: &ArrayRef, to: &DataType) -> Option<Result<ArrayRef, Inexact>> {
    let (DataType::Timestamp(unit, zone), DataType::Timestamp(to_unit, Some(to_zone))) =
        (array.data_type(), to)
    else {
        return None;
    };
    let utc = matches!(to_zone.as_ref(), "UTC" | "+00:00" | "Z" | "Etc/UTC");
    if unit != to_unit || (zone.is_none() && !utc) {
        return None;
    }
    Some(
        array
            .to_data()
            .into_builder()
            .data_type(to.clone())
            .build()
            .map(arrow::array::make_array)
            .map_err(|e| Inexact {
                row: None,
                value: None,
                reason: e.to_string(),
            }),
    )
}

/// A decimal array's values all have at most its precision's digits. Arrow and Parquet do
/// not check it (a writer may declare `decimal(3,3)` and store `1.234`): such a value kept
/// as it is would be read differently, or not at all, by other engines; a cast to another
/// decimal type checks it already.
fn within_precision(array: &ArrayRef) -> Result<(), Inexact> {
    let DataType::Decimal128(p, s) = array.data_type() else {
        return Ok(());
    };
    let max = 10i128.checked_pow(u32::from(*p)).map(|m| m - 1);
    let values = array.as_primitive::<arrow::datatypes::Decimal128Type>();
    let row = (0..array.len()).find(|&i| {
        array.is_valid(i) && max.is_some_and(|m| values.value(i).unsigned_abs() > m as u128)
    });
    match row {
        Some(r) => Err(Inexact {
            row: Some(r),
            value: Some(format!("unscaled {}", values.value(r))),
            reason: format!(
                "the value has more digits than its column's type, decimal({p},{s}), allows (at most {p}): the file is not valid"
            ),
        }),
        None => Ok(()),
    }
}

/// What a value means, as far as conversions go.
#[derive(PartialEq, Eq)]
enum Kind {
    Number,
    Text,
    Time,
    Bool,
    Bytes,
    Other,
}

fn kind(dt: &DataType) -> Kind {
    use DataType::*;
    match dt {
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Float16 | Float32
        | Float64 | Decimal32(..) | Decimal64(..) | Decimal128(..) | Decimal256(..) => Kind::Number,
        Utf8 | LargeUtf8 | Utf8View => Kind::Text,
        Date32 | Date64 | Timestamp(..) | Time32(_) | Time64(_) => Kind::Time,
        Boolean => Kind::Bool,
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => Kind::Bytes,
        Dictionary(_, v) => kind(v),
        RunEndEncoded(_, v) => kind(v.data_type()),
        _ => Kind::Other,
    }
}

/// Conversions that keep a value's meaning: within a kind, anything to text and text to
/// anything (parsing), text and bytes both ways. An integer never becomes a date.
fn same_kind(from: &DataType, to: &DataType) -> bool {
    let (f, t) = (kind(from), kind(to));
    f == t
        || t == Kind::Text
        || f == Kind::Text
        || matches!(
            (&f, &t),
            (Kind::Bytes, Kind::Text) | (Kind::Text, Kind::Bytes)
        )
        || (f == Kind::Other && t == Kind::Other)
}

fn is_text(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

/// The strict cast failed: find the first row a lenient cast turns into null (the value that
/// does not convert) so the error can name it.
fn first_failure(array: &ArrayRef, to: &DataType, e: arrow::error::ArrowError) -> Inexact {
    let lenient = cast_with_options(array, to, &CastOptions::default()).ok();
    let row = lenient
        .as_ref()
        .and_then(|l| (0..array.len()).find(|&i| array.is_valid(i) && l.is_null(i)));
    match row {
        Some(r) => Inexact::at(array.as_ref(), r, e.to_string()),
        None => Inexact {
            row: None,
            value: None,
            reason: e.to_string(),
        },
    }
}

/// Typed source: convert back and compare. Returns the first row that changed.
fn roundtrip_mismatch(
    array: &ArrayRef,
    out: &ArrayRef,
) -> Result<Option<(usize, String)>, Inexact> {
    let back = cast_with_options(out, array.data_type(), &CastOptions::default()).map_err(|e| {
        Inexact {
            row: None,
            value: None,
            reason: format!("cannot verify the conversion: {e}"),
        }
    })?;
    let changed = "the value changes in the conversion";
    if let Some(a) = as_f64(array) {
        let b = as_f64(&back).unwrap_or_default();
        let row = (0..array.len()).find(|&i| {
            array.is_valid(i)
                && (back.is_null(i) || !(a[i] == b[i] || (a[i].is_nan() && b[i].is_nan())))
        });
        return Ok(row.map(|r| (r, changed.to_string())));
    }
    let equal = not_distinct(array, &back).map_err(|e| Inexact {
        row: None,
        value: None,
        reason: format!("cannot verify the conversion: {e}"),
    })?;
    let row = (0..array.len()).find(|&i| array.is_valid(i) && !equal.value(i));
    Ok(row.map(|r| (r, changed.to_string())))
}

fn as_f64(a: &ArrayRef) -> Option<Vec<f64>> {
    use arrow::datatypes::{Float16Type, Float32Type, Float64Type};
    Some(match a.data_type() {
        DataType::Float16 => a
            .as_primitive::<Float16Type>()
            .values()
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        DataType::Float32 => a
            .as_primitive::<Float32Type>()
            .values()
            .iter()
            .map(|v| f64::from(*v))
            .collect(),
        DataType::Float64 => a.as_primitive::<Float64Type>().values().to_vec(),
        _ => return None,
    })
}

/// Text source: check what the text says against what the target kept.
fn text_mismatch(array: &ArrayRef, out: &ArrayRef, to: &DataType) -> Option<(usize, String)> {
    let text =
        |i: usize| -> String { array_value_to_string(array.as_ref(), i).unwrap_or_default() };
    let rows = (0..array.len()).filter(|&i| array.is_valid(i));
    if to.is_integer() {
        // The integer, written back, must be the text: `02134`, `+5`, ` 7` would not be.
        return first_text(array, |t| !is_canonical_integer(t)).map(|i| {
            let kept = array_value_to_string(out.as_ref(), i).unwrap_or_default();
            (
                i,
                format!(
                    "the column would keep {kept}, which does not give this text back; an integer column takes text only as it writes it (no leading zeros, `+`, spaces, fraction or exponent) — keep codes such as zip codes in a text column"
                ),
            )
        });
    }
    if matches!(
        to,
        DataType::Float16
            | DataType::Float32
            | DataType::Float64
            | DataType::Decimal32(..)
            | DataType::Decimal64(..)
            | DataType::Decimal128(..)
            | DataType::Decimal256(..)
    ) {
        if let Some(i) = first_text(array, is_padded_number) {
            return Some((
                i,
                "the text is padded (leading zeros or spaces) and the number would not give it back; keep codes such as zip codes in a text column".into(),
            ));
        }
    }
    let rows = rows.collect::<Vec<_>>();
    match to {
        DataType::Decimal32(_, s)
        | DataType::Decimal64(_, s)
        | DataType::Decimal128(_, s)
        | DataType::Decimal256(_, s) => too_many_decimals(&rows, text, *s),
        DataType::Float16 | DataType::Float32 | DataType::Float64 => {
            float_out_of_range(&rows, text, &as_f64(out)?)
        }
        DataType::Timestamp(unit, _) => too_many_second_digits(&rows, text, unit),
        DataType::Date32 | DataType::Date64 => time_of_day_dropped(&rows, array, out),
        _ => None,
    }
}

/// The first row whose text has more decimal places than the column's scale `s`.
fn too_many_decimals(
    rows: &[usize],
    text: impl Fn(usize) -> String,
    s: i8,
) -> Option<(usize, String)> {
    rows.iter().find_map(|&i| {
        let needed = decimal_scale(&text(i))?;
        (needed > i64::from(s)).then(|| {
            (
                i,
                format!("it has {needed} decimal places; the column keeps {s}"),
            )
        })
    })
}

/// The first row whose float `values` lost what the text says: out of range, or too small
/// (0 from a non-zero mantissa).
fn float_out_of_range(
    rows: &[usize],
    text: impl Fn(usize) -> String,
    values: &[f64],
) -> Option<(usize, String)> {
    rows.iter().find_map(|&i| {
        let (t, v) = (text(i), values[i]);
        if v.is_infinite() && !names_infinity(&t) {
            return Some((i, "it is out of the type's range".to_string()));
        }
        (v == 0.0 && has_nonzero_mantissa(&t)).then(|| {
            (
                i,
                "it is too small for the type (would become 0)".to_string(),
            )
        })
    })
}

/// The first row whose text has more fractional second digits than `unit` keeps.
fn too_many_second_digits(
    rows: &[usize],
    text: impl Fn(usize) -> String,
    unit: &TimeUnit,
) -> Option<(usize, String)> {
    let keep = match unit {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 3,
        TimeUnit::Microsecond => 6,
        TimeUnit::Nanosecond => 9,
    };
    rows.iter().find_map(|&i| {
        let digits = fraction_digits(&text(i));
        (digits > keep).then(|| {
            (
                i,
                format!("it has {digits} fractional second digits; the column keeps {keep}"),
            )
        })
    })
}

/// The first row whose date dropped a time of day other than midnight.
fn time_of_day_dropped(
    rows: &[usize],
    array: &ArrayRef,
    out: &ArrayRef,
) -> Option<(usize, String)> {
    let micros = DataType::Timestamp(TimeUnit::Microsecond, None);
    let said = cast_with_options(array, &micros, &CastOptions::default()).ok()?;
    let kept = cast_with_options(out, &micros, &CastOptions::default()).ok()?;
    let equal = not_distinct(&said, &kept).ok()?;
    rows.iter()
        .find(|&&i| said.is_valid(i) && !equal.value(i))
        .map(|&i| {
            (
                i,
                "it has a time of day; the column keeps dates".to_string(),
            )
        })
}

/// The first valid row of a text array whose text is `bad`.
fn first_text(array: &ArrayRef, bad: impl Fn(&str) -> bool) -> Option<usize> {
    let mut rows = (0..array.len()).filter(|&i| array.is_valid(i));
    match array.data_type() {
        DataType::Utf8 => {
            let a = array.as_string::<i32>();
            rows.find(|&i| bad(a.value(i)))
        }
        DataType::LargeUtf8 => {
            let a = array.as_string::<i64>();
            rows.find(|&i| bad(a.value(i)))
        }
        DataType::Utf8View => {
            let a = array.as_string_view();
            rows.find(|&i| bad(a.value(i)))
        }
        _ => None,
    }
}

/// How an integer is written back: `0`, `2134`, `-5` — no `+`, leading zeros, spaces,
/// fraction or exponent, and no `-0`.
fn is_canonical_integer(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
        && text != "-0"
}

/// A number with spaces around it or zeros before its first digit (`007.5`, `-01`, ` 7`):
/// what the padding said is lost in a number column. `0.5`, `0`, `-0.25`, `0e3` are not.
fn is_padded_number(text: &str) -> bool {
    if text.trim() != text {
        return true;
    }
    let t = text.strip_prefix(['-', '+']).unwrap_or(text).as_bytes();
    t.len() > 1 && t[0] == b'0' && t[1].is_ascii_digit()
}

/// The number of decimal places `text` needs (`"3.330"` → 2, `"1.5e-3"` → 4, `"1200"` → 0).
/// `None` when the text is not a plain decimal number (the parser judged it already).
fn decimal_scale(text: &str) -> Option<i64> {
    let t = text.trim();
    let t = t.strip_prefix(['-', '+']).unwrap_or(t);
    let (mantissa, exp) = match t.find(['e', 'E']) {
        Some(p) => (&t[..p], t[p + 1..].parse::<i64>().ok()?),
        None => (t, 0),
    };
    let fraction = match mantissa.split_once('.') {
        Some((_, f)) => f.trim_end_matches('0'),
        None => "",
    };
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((fraction.len() as i64 - exp).max(0))
}

fn names_infinity(text: &str) -> bool {
    let t = text
        .trim()
        .trim_start_matches(['-', '+'])
        .to_ascii_lowercase();
    t == "inf" || t == "infinity"
}

fn has_nonzero_mantissa(text: &str) -> bool {
    let t = text.trim();
    let mantissa = match t.find(['e', 'E']) {
        Some(p) => &t[..p],
        None => t,
    };
    mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b))
}

/// Significant fractional-second digits of a timestamp text (`…:05.120` → 2).
fn fraction_digits(text: &str) -> usize {
    // The fraction follows the seconds: the first '.' after the last ':'.
    let Some(colon) = text.rfind(':') else {
        return 0;
    };
    let rest = &text[colon..];
    let Some(dot) = rest.find('.') else {
        return 0;
    };
    rest[dot + 1..]
        .bytes()
        .take_while(u8::is_ascii_digit)
        .collect::<Vec<_>>()
        .iter()
        .rposition(|b| *b != b'0')
        .map_or(0, |p| p + 1)
}

/// A Parquet file's Arrow schema with its top-level INT96 columns typed as microsecond
/// timestamps (their time zone kept), to read it with
/// (`ArrowReaderOptions::with_schema`); `None` when it has none. The reader's default,
/// nanoseconds, wraps outside 1677-09-21..2262-04-11 (Spark's `9999-12-31` read as
/// `1816-03-30`); microseconds are the unit of Delta's `timestamp`, so every value Spark or
/// any Delta writer stores reads exactly. Nested INT96 values are read
/// as nanoseconds (the source's check, `source::parquet::check_int96`, covers their range).
pub(crate) fn int96_as_micros(metadata: &ArrowReaderMetadata) -> Option<Arc<Schema>> {
    let descr = metadata.metadata().file_metadata().schema_descr();
    let top: Vec<&str> = descr
        .columns()
        .iter()
        .filter(|c| c.physical_type() == PhysicalType::INT96 && c.path().parts().len() == 1)
        .map(|c| c.path().parts()[0].as_str())
        .collect();
    if top.is_empty() {
        return None;
    }
    let schema = metadata.schema();
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Timestamp(_, tz) if top.contains(&f.name().as_str()) => f
                .as_ref()
                .clone()
                .with_data_type(DataType::Timestamp(TimeUnit::Microsecond, tz.clone())),
            _ => f.as_ref().clone(),
        })
        .collect();
    Some(Arc::new(
        Schema::new(fields).with_metadata(schema.metadata().clone()),
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        Decimal128Array, Float64Array, Int32Array, Int64Array, StringArray,
        TimestampNanosecondArray,
    };

    use super::*;

    fn err(a: ArrayRef, to: DataType) -> Inexact {
        exact_cast(&a, &to).expect_err("must refuse")
    }

    /// A decimal array holding a value past its declared precision (Arrow and Parquet let
    /// a writer store `1.234` in a `decimal(3,3)`) is refused, in its own type as in any
    /// other: kept as it is, it landed in the table and failed the next widening's rewrite.
    #[test]
    fn a_decimal_past_its_declared_precision_is_refused() {
        let bad: ArrayRef = Arc::new(
            Decimal128Array::from(vec![Some(123), None, Some(1234)])
                .with_precision_and_scale(3, 3)
                .unwrap(),
        );
        for to in [
            DataType::Decimal128(3, 3),
            DataType::Decimal128(38, 9),
            DataType::Utf8,
        ] {
            let e = err(bad.clone(), to.clone());
            assert_eq!(e.row, Some(2), "{to}: {e:?}");
            assert!(e.reason.contains("decimal(3,3)"), "{}", e.reason);
            assert_eq!(e.value.as_deref(), Some("unscaled 1234"));
        }
        let good: ArrayRef = Arc::new(
            Decimal128Array::from(vec![Some(999), Some(-999), None])
                .with_precision_and_scale(3, 3)
                .unwrap(),
        );
        assert!(exact_cast(&good, &DataType::Decimal128(3, 3)).is_ok());
    }

    /// Relabelling a timestamp's zone gives what arrow's cast computes value by value, nulls
    /// and the extremes included; a naive time into another zone still goes through the
    /// cast (it moves the values).
    #[test]
    fn timestamps_into_utc_are_relabelled_as_arrows_cast_computes_them() {
        use arrow::array::TimestampMicrosecondArray;
        // 0001-01-01, before 1970, null, the epoch, 9999-12-31 23:59:59.999999.
        let values = vec![
            Some(-62_135_596_800_000_000),
            Some(-1),
            None,
            Some(0),
            Some(253_402_300_799_999_999),
        ];
        let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        for from in [
            TimestampMicrosecondArray::from(values.clone()),
            TimestampMicrosecondArray::from(values.clone()).with_timezone("+02:00"),
        ] {
            let a: ArrayRef = Arc::new(from);
            let fast = same_instants(&a, &utc).expect("relabelled").unwrap();
            let cast = cast_with_options(&a, &utc, &CastOptions::default()).unwrap();
            assert_eq!(fast.as_ref(), cast.as_ref(), "{}", a.data_type());
            assert_eq!(exact_cast(&a, &utc).unwrap().as_ref(), cast.as_ref());
        }
        let naive: ArrayRef = Arc::new(TimestampMicrosecondArray::from(values));
        let paris = DataType::Timestamp(TimeUnit::Microsecond, Some("Europe/Paris".into()));
        assert!(same_instants(&naive, &paris).is_none());
        let nanos = DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()));
        assert!(
            same_instants(&naive, &nanos).is_none(),
            "a unit change is a cast"
        );
    }

    #[test]
    fn widenings_keep_every_value_and_nothing_else_is_one() {
        use DataType::*;
        for (from, to) in [
            (Int8, Int16),
            (Int16, Int32),
            (Int32, Int64),
            (Int8, Int64),
            (Float32, Float64),
            (Int32, Decimal128(10, 0)),
            (Int64, Decimal128(19, 0)),
            (Int64, Decimal128(21, 2)),
            (Int16, Decimal128(7, 2)),
            (Decimal128(10, 2), Decimal128(12, 2)),
            (Decimal128(10, 2), Decimal128(11, 3)),
            (Date32, Timestamp(TimeUnit::Microsecond, Some("UTC".into()))),
        ] {
            assert!(is_widening(&from, &to), "{from} -> {to}");
        }
        for (from, to) in [
            (Int64, Int32),
            (Int32, Int32),
            (Float64, Float32),
            (Int32, Float64),
            (Int64, Float64),
            (Float64, Decimal128(38, 10)),
            (Int64, Decimal128(18, 0)),
            (Int32, Decimal128(10, 1)),
            (Decimal128(10, 2), Decimal128(10, 3)),
            (Decimal128(10, 2), Decimal128(12, 1)),
            (Decimal128(10, 2), Int64),
            (Utf8, Int64),
            (Int64, Utf8),
            (Timestamp(TimeUnit::Microsecond, Some("UTC".into())), Date32),
            (Date32, Utf8),
            (Boolean, Int8),
        ] {
            assert!(!is_widening(&from, &to), "{from} -> {to}");
        }
        // Every value of the narrower type survives the widening exactly.
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![i64::MIN, -1, 0, i64::MAX]));
        exact_cast(&ints, &Decimal128(19, 0)).unwrap();
        exact_cast(&ints, &Decimal128(21, 2)).unwrap();
        let small: ArrayRef = Arc::new(Int32Array::from(vec![i32::MIN, i32::MAX]));
        exact_cast(&small, &Int64).unwrap();
        exact_cast(&small, &Decimal128(10, 0)).unwrap();
        let dec: ArrayRef = Arc::new(
            Decimal128Array::from(vec![9_999_999_999_i128, -9_999_999_999])
                .with_precision_and_scale(10, 2)
                .unwrap(),
        );
        exact_cast(&dec, &Decimal128(11, 3)).unwrap();
        // A date becomes its midnight in UTC, and that converts back to the same date.
        let days: ArrayRef = Arc::new(arrow::array::Date32Array::from(vec![-719_162, 0, 19_723]));
        let utc = Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let at = exact_cast(&days, &utc).unwrap();
        let micros = at.as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
        assert_eq!(
            micros.values().to_vec(),
            vec![-719_162 * 86_400_000_000, 0, 19_723 * 86_400_000_000]
        );
    }

    #[test]
    fn lossy_numeric_conversions_are_refused_with_row_and_value() {
        let e = err(
            Arc::new(Float64Array::from(vec![1.0, 1.75])),
            DataType::Int64,
        );
        assert_eq!((e.row, e.value.as_deref()), (Some(1), Some("1.75")));
        let d = Decimal128Array::from(vec![1234])
            .with_precision_and_scale(10, 3)
            .unwrap();
        let e = err(Arc::new(d), DataType::Decimal128(10, 2));
        assert_eq!(e.value.as_deref(), Some("1.234"));
        let e = err(
            Arc::new(Int64Array::from(vec![5, 1 << 40])),
            DataType::Int32,
        );
        assert_eq!(e.row, Some(1));
        let e = err(
            Arc::new(Int64Array::from(vec![(1 << 60) + 1])),
            DataType::Float64,
        );
        assert_eq!(e.row, Some(0));
        let ns = TimestampNanosecondArray::from(vec![1_000, 1_500]);
        let e = err(
            Arc::new(ns),
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        );
        assert_eq!(e.row, Some(1));
    }

    #[test]
    fn exact_conversions_pass() {
        let a: ArrayRef = Arc::new(Int32Array::from(vec![Some(5), None, Some(-7)]));
        let out = exact_cast(&a, &DataType::Int64).unwrap();
        assert_eq!(out.null_count(), 1);
        let s = exact_cast(&a, &DataType::Utf8).unwrap();
        assert_eq!(s.as_string::<i32>().value(2), "-7");
        let f: ArrayRef = Arc::new(Float64Array::from(vec![2.0, -0.0, f64::NAN]));
        assert!(exact_cast(&f, &DataType::Float32).is_ok());
        assert!(exact_cast(&f.slice(0, 2), &DataType::Int64).is_ok());
        assert!(
            exact_cast(&f, &DataType::Int64).is_err(),
            "NaN has no integer"
        );
    }

    #[test]
    fn text_is_checked_against_what_it_says() {
        let t = |v: &[&str]| -> ArrayRef { Arc::new(StringArray::from(v.to_vec())) };
        let e = err(t(&["1.10", "3.333"]), DataType::Decimal128(10, 2));
        assert_eq!((e.row, e.value.as_deref()), (Some(1), Some("3.333")));
        let ok = exact_cast(&t(&["3.330", "-2", "12"]), &DataType::Decimal128(10, 2));
        assert!(ok.is_ok(), "{ok:?}");
        assert!(exact_cast(&t(&["1e-3"]), &DataType::Decimal128(10, 2)).is_err());
        let us = DataType::Timestamp(TimeUnit::Microsecond, None);
        assert!(exact_cast(&t(&["2024-01-01 00:00:00.123456"]), &us).is_ok());
        assert!(exact_cast(&t(&["2024-01-01 00:00:00.1234567"]), &us).is_err());
        assert!(exact_cast(&t(&["2024-01-01 00:00:00.1234560"]), &us).is_ok());
        assert!(exact_cast(&t(&["1e400"]), &DataType::Float64).is_err());
        assert!(exact_cast(&t(&["1e-50"]), &DataType::Float32).is_err());
        assert!(exact_cast(&t(&["0.1", "inf"]), &DataType::Float32).is_ok());
        assert!(exact_cast(&t(&["1.5"]), &DataType::Int64).is_err());
        assert!(exact_cast(&t(&["2024-01-01"]), &DataType::Date32).is_ok());
    }

    /// Issue #23: `zip = '02134'` into an `int64` column merged as 2134. Text goes into an
    /// integer column only as the integer writes it back.
    #[test]
    fn text_into_an_integer_column_must_be_the_integers_canonical_form() {
        let t = |v: &[&str]| -> ArrayRef { Arc::new(StringArray::from(v.to_vec())) };
        for bad in ["02134", "+5", " 7", "7 ", "1e3", "-0", "007", "5.0"] {
            for to in [
                DataType::Int64,
                DataType::Int32,
                DataType::UInt64,
                DataType::Int8,
            ] {
                let e = err(t(&["1", bad]), to.clone());
                assert_eq!(
                    (e.row, e.value.as_deref()),
                    (Some(1), Some(bad)),
                    "{bad:?} into {to}: {e:?}"
                );
            }
        }
        let e = err(t(&["02134"]), DataType::Int64);
        assert!(
            e.describe(&DataType::Utf8, &DataType::Int64)
                .contains("2134"),
            "{e:?}"
        );
        let ok = exact_cast(
            &t(&["2134", "-5", "0", "9223372036854775807"]),
            &DataType::Int64,
        )
        .unwrap();
        assert_eq!(
            ok.as_primitive::<arrow::datatypes::Int64Type>().values()[..],
            [2134, -5, 0, i64::MAX]
        );
        // The same for every layout of text.
        let large: ArrayRef = Arc::new(arrow::array::LargeStringArray::from(vec!["02134"]));
        assert!(exact_cast(&large, &DataType::Int64).is_err());
        let view: ArrayRef = Arc::new(arrow::array::StringViewArray::from(vec!["02134"]));
        assert!(exact_cast(&view, &DataType::Int64).is_err());
        let dict: ArrayRef = Arc::new(
            vec!["2134", "02134"]
                .into_iter()
                .collect::<arrow::array::DictionaryArray<arrow::datatypes::Int32Type>>(),
        );
        assert_eq!(err(dict, DataType::Int64).row, Some(1));
    }

    /// Floats and decimals parse their notations (`1e3`, `1.50`, `+5`), but zero- or
    /// space-padded text would not come back either.
    #[test]
    fn padded_text_into_a_float_or_decimal_column_fails() {
        let t = |v: &[&str]| -> ArrayRef { Arc::new(StringArray::from(v.to_vec())) };
        assert!(exact_cast(&t(&["1e3", ".5", "-0"]), &DataType::Float64).is_ok());
        for to in [
            DataType::Float64,
            DataType::Float32,
            DataType::Decimal128(10, 2),
        ] {
            for bad in ["02134", "007.5", "-01", " 7", "7 "] {
                assert_eq!(
                    err(t(&["1", bad]), to.clone()).row,
                    Some(1),
                    "{bad:?} into {to}"
                );
            }
            let ok = exact_cast(&t(&["0.5", "0", "-0.25", "+5", "1.50"]), &to);
            assert!(ok.is_ok(), "{to}: {ok:?}");
        }
    }

    /// Encoded layouts are decoded before any rule: a dictionary, a run-end encoded array
    /// and a view convert as their plain values do.
    #[test]
    fn encoded_layouts_convert_as_their_values() {
        use arrow::array::{DictionaryArray, RunArray, StringViewArray};
        use arrow::datatypes::Int32Type;
        let values: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 1.75]));
        let dict: ArrayRef = Arc::new(
            DictionaryArray::<Int32Type>::try_new(Int32Array::from(vec![0, 1, 0]), values).unwrap(),
        );
        assert_eq!(err(dict.clone(), DataType::Int64).row, Some(1));
        assert_eq!(
            plain_type(dict.data_type()),
            Some(DataType::Float64),
            "a dictionary's plain type is its value type"
        );
        let ree: ArrayRef = Arc::new(
            RunArray::<Int32Type>::try_new(
                &Int32Array::from(vec![2, 3]),
                &Int64Array::from(vec![5, 1 << 40]),
            )
            .unwrap(),
        );
        assert_eq!(delta_type(ree.data_type()), Some(DataType::Int64));
        let plain = decode(&ree).unwrap();
        assert_eq!(plain.data_type(), &DataType::Int64);
        assert_eq!(plain.len(), 3);
        assert_eq!(err(ree, DataType::Int32).row, Some(2));
        let view: ArrayRef = Arc::new(StringViewArray::from(vec!["a", "b"]));
        assert_eq!(decode(&view).unwrap().data_type(), &DataType::Utf8);
        let nested = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8View));
        assert_eq!(plain_type(&nested), Some(DataType::Utf8));
    }

    #[test]
    fn decimal_scale_reads_plain_and_exponent_forms() {
        assert_eq!(decimal_scale("3.330"), Some(2));
        assert_eq!(decimal_scale("-1200"), Some(0));
        assert_eq!(decimal_scale("1.5e-3"), Some(4));
        assert_eq!(decimal_scale("12.5E2"), Some(0));
        assert_eq!(fraction_digits("2024-01-01T00:00:05.120Z"), 2);
        assert_eq!(fraction_digits("2024-01-01"), 0);
    }
}
