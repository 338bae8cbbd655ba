//! Exact file statistics in the Delta log, whoever wrote the commit.
//!
//! delta-rs's writer (deltalake 1.1, and Python deltalake 1.6) computes a decimal column's
//! `minValues`/`maxValues` through `f64`: `1234567890123456789` (decimal(38,0)) is logged as
//! `1234567890123456768`, and a decimal(38,18) amount's bounds miss its own digits. Every
//! engine that skips files by statistics (Athena, Trino, Spark, DuckDB's `delta` extension,
//! delta-rs's own MERGE and scans) then skips the file that holds the value: a filter on it
//! returns no row, a MERGE on such a key inserts a second row. `f64` holds every decimal of
//! at most 15 digits exactly; wider decimals ([`MAX_EXACT_DIGITS`]) are the ones at risk.
//!
//! The fix sits where every commit passes, whichever delta-rs operation wrote it (MERGE,
//! write, tributary's own appends, rewrites and compaction, history, tombstones, change
//! logs): the PUT of a commit file (`logcache::LogCache::put_opts`). Each `add` of a table
//! with such columns gets its decimal bounds from the data file's own footer — the Parquet
//! statistics, exact integers — written as exact decimal numbers (as Spark writes them), or
//! no min/max for the column when the footer cannot bound it exactly (a row group without
//! statistics, a truncated statistic). Checkpoints are made from the commits as stored, so
//! they carry the same exact numbers.
//!
//! The JSON is edited as text: a value is replaced in place and nothing else is parsed and
//! printed again (re-printing other columns' float bounds could move them by one ulp).

use std::collections::BTreeMap;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::basic::{ConvertedType, LogicalType};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::statistics::Statistics;

/// Decimal digits an `f64` always holds exactly.
pub(crate) const MAX_EXACT_DIGITS: u32 = 15;

/// Bytes read from the end of a data file for its footer in one request.
const FOOTER_HINT: usize = 64 * 1024;

/// Whether a Delta schema (its `schemaString`) has a decimal column wider than
/// [`MAX_EXACT_DIGITS`], at any depth.
pub(crate) fn schema_string_has_wide_decimal(schema: &str) -> bool {
    let mut rest = schema;
    while let Some(i) = rest.find("decimal(") {
        rest = &rest[i + "decimal(".len()..];
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        if digits.parse::<u32>().is_ok_and(|p| p > MAX_EXACT_DIGITS) {
            return true;
        }
    }
    false
}

/// Whether an Arrow schema has a decimal column wider than [`MAX_EXACT_DIGITS`].
pub(crate) fn arrow_has_wide_decimal(schema: &arrow::datatypes::Schema) -> bool {
    fn wide(t: &arrow::datatypes::DataType) -> bool {
        use arrow::datatypes::DataType as D;
        match t {
            D::Decimal128(p, _) | D::Decimal256(p, _) => u32::from(*p) > MAX_EXACT_DIGITS,
            D::Struct(fields) => fields.iter().any(|f| wide(f.data_type())),
            D::List(f) | D::LargeList(f) | D::FixedSizeList(f, _) | D::Map(f, _) => {
                wide(f.data_type())
            }
            _ => false,
        }
    }
    schema.fields().iter().any(|f| wide(f.data_type()))
}

/// What a table's schema says about its decimal bounds, as far as this process knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Known {
    /// No decimal column wider than f64 holds: the writer's bounds are exact.
    Exact,
    /// A wide decimal column: bounds come from the footers.
    Wide,
    /// Never seen: read the footer of every `add` with numeric bounds.
    Unknown,
}

/// The table root (in the store's path space) of a commit file's path.
pub(crate) fn table_root(commit: &Path) -> Option<&str> {
    let s = commit.as_ref();
    let i = s.rfind("_delta_log/")?;
    Some(s[..i].trim_end_matches('/'))
}

/// A commit file's contents with exact decimal bounds in every `add`; `None` when nothing
/// changes. `known` says what the table's schema is, when a `metaData` action of the commit
/// does not say it itself. Storage errors reading a footer fail the commit (it is retried);
/// a footer that cannot bound a column exactly drops the column's bounds.
pub(crate) async fn exact_commit(
    store: &dyn ObjectStore,
    commit: &Path,
    data: &[u8],
    known: Known,
) -> object_store::Result<(Option<Bytes>, Option<Known>)> {
    let Ok(text) = std::str::from_utf8(data) else {
        return Ok((None, None));
    };
    let mut learned = None;
    for line in text.lines() {
        if line.starts_with("{\"metaData\"") {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
                if let Some(s) = v["metaData"]["schemaString"].as_str() {
                    learned = Some(if schema_string_has_wide_decimal(s) {
                        Known::Wide
                    } else {
                        Known::Exact
                    });
                }
            }
        }
    }
    let known = learned.unwrap_or(known);
    if known == Known::Exact || !text.contains("\"add\"") {
        return Ok((None, learned));
    }
    let Some(root) = table_root(commit) else {
        return Ok((None, learned));
    };
    let mut out = String::with_capacity(text.len() + 64);
    let mut changed = false;
    for line in text.split_inclusive('\n') {
        let (body, end) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        match exact_add(store, root, body, known).await? {
            Some(fixed) => {
                out.push_str(&fixed);
                changed = true;
            }
            None => out.push_str(body),
        }
        out.push_str(end);
    }
    Ok((changed.then(|| Bytes::from(out)), learned))
}

/// One action line: the `add` with exact bounds, or `None` when it is no `add` or keeps its
/// statistics as they are.
async fn exact_add(
    store: &dyn ObjectStore,
    root: &str,
    line: &str,
    known: Known,
) -> object_store::Result<Option<String>> {
    if !line.starts_with("{\"add\"") {
        return Ok(None);
    }
    let Ok(mut action) = serde_json::from_str::<serde_json::Value>(line) else {
        return Ok(None);
    };
    let add = &action["add"];
    let (Some(path), Some(size), Some(stats)) = (
        add["path"].as_str(),
        add["size"].as_u64(),
        add["stats"].as_str(),
    ) else {
        return Ok(None);
    };
    if known == Known::Unknown && !has_numeric_bound(stats) {
        return Ok(None);
    }
    let Some(location) = data_file(root, path) else {
        return Ok(None);
    };
    let footer = read_footer(store, &location, size).await?;
    let bounds = match &footer {
        Some(m) => wide_decimal_bounds(m),
        None => return Ok(None),
    };
    if bounds.is_empty() {
        return Ok(None);
    }
    let Some(fixed) = set_bounds(stats, &bounds) else {
        return Ok(None);
    };
    if fixed == stats {
        return Ok(None);
    }
    action["add"]["stats"] = serde_json::Value::String(fixed);
    Ok(Some(action.to_string()))
}

/// Whether statistics JSON has a number among its bounds (what a decimal's look like).
fn has_numeric_bound(stats: &str) -> bool {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(stats) else {
        return false;
    };
    fn any_number(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Number(_) => true,
            serde_json::Value::Object(m) => m.values().any(any_number),
            _ => false,
        }
    }
    any_number(&v["minValues"]) || any_number(&v["maxValues"])
}

/// The object of an `add` path (relative, percent-encoded as delta-rs decodes it).
fn data_file(root: &str, path: &str) -> Option<Path> {
    if path.contains("://") {
        return None; // an absolute URL (shallow clone): another store
    }
    let decoded = percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .ok()?;
    let full = if root.is_empty() {
        decoded.to_string()
    } else {
        format!("{root}/{decoded}")
    };
    Some(Path::parse(&full).unwrap_or_else(|_| Path::from(full.as_str())))
}

/// A data file's footer (one ranged GET for small footers). `None` when it is no Parquet.
pub(crate) async fn read_footer(
    store: &dyn ObjectStore,
    location: &Path,
    size: u64,
) -> object_store::Result<Option<ParquetMetaData>> {
    if size < 12 {
        return Ok(None);
    }
    let mut tail = store
        .get_range(location, size.saturating_sub(FOOTER_HINT as u64)..size)
        .await?;
    let len = tail.len();
    if len < 8 || &tail[len - 4..] != b"PAR1" {
        return Ok(None);
    }
    let meta_len =
        u32::from_le_bytes([tail[len - 8], tail[len - 7], tail[len - 6], tail[len - 5]]) as u64;
    if meta_len + 8 > size {
        return Ok(None);
    }
    if meta_len + 8 > len as u64 {
        tail = store.get_range(location, size - meta_len - 8..size).await?;
    }
    let len = tail.len();
    let meta = &tail[len - 8 - meta_len as usize..len - 8];
    Ok(parquet::file::metadata::ParquetMetaDataReader::decode_metadata(meta).ok())
}

/// Exact bounds of a file's wide decimal columns, by column path: `Some((min, max))` as
/// decimal text, `None` when the footer cannot bound the column exactly.
type Bounds = BTreeMap<Vec<String>, Option<(String, String)>>;

fn wide_decimal_bounds(meta: &ParquetMetaData) -> Bounds {
    let schema = meta.file_metadata().schema_descr();
    let mut out = Bounds::new();
    for (i, col) in schema.columns().iter().enumerate() {
        if col.max_rep_level() > 0 {
            continue; // inside a list or map: Delta keeps no bounds there
        }
        let (precision, scale) = match col.logical_type_ref() {
            Some(LogicalType::Decimal(d)) => (d.precision, d.scale),
            _ if col.converted_type() == ConvertedType::DECIMAL => {
                (col.type_precision(), col.type_scale())
            }
            _ => continue,
        };
        if precision <= MAX_EXACT_DIGITS as i32 || scale < 0 {
            continue;
        }
        let path = col.path().parts().to_vec();
        let mut lo: Option<i128> = None;
        let mut hi: Option<i128> = None;
        let mut exact = true;
        for rg in meta.row_groups() {
            let chunk = rg.column(i);
            let Some(stats) = chunk.statistics() else {
                exact = false;
                break;
            };
            let (min, max) = (unscaled(stats, true), unscaled(stats, false));
            match (min, max) {
                (Some(a), Some(b)) if stats.min_is_exact() && stats.max_is_exact() => {
                    lo = Some(lo.map_or(a, |l| l.min(a)));
                    hi = Some(hi.map_or(b, |h| h.max(b)));
                }
                // A row group of nulls only bounds nothing.
                (None, None) if stats.null_count_opt() == Some(chunk.num_values() as u64) => {}
                _ => {
                    exact = false;
                    break;
                }
            }
        }
        let bounds = match (exact, lo, hi) {
            (true, Some(l), Some(h)) => Some((decimal_text(l, scale), decimal_text(h, scale))),
            (true, None, None) => continue, // all null: no bounds to set
            _ => None,
        };
        out.insert(path, bounds);
    }
    out
}

/// A decimal statistic's unscaled value.
fn unscaled(stats: &Statistics, min: bool) -> Option<i128> {
    match stats {
        Statistics::Int32(s) => (if min { s.min_opt() } else { s.max_opt() }).map(|v| *v as i128),
        Statistics::Int64(s) => (if min { s.min_opt() } else { s.max_opt() }).map(|v| *v as i128),
        Statistics::FixedLenByteArray(_) | Statistics::ByteArray(_) => {
            let b = if min {
                stats.min_bytes_opt()
            } else {
                stats.max_bytes_opt()
            }?;
            if b.is_empty() || b.len() > 16 {
                return None;
            }
            let fill = if b[0] & 0x80 != 0 { 0xff } else { 0 };
            let mut buf = [fill; 16];
            buf[16 - b.len()..].copy_from_slice(b);
            Some(i128::from_be_bytes(buf))
        }
        _ => None,
    }
}

/// An unscaled decimal as exact decimal text (`-12.3400` for -123400 at scale 4).
pub(crate) fn decimal_text(unscaled: i128, scale: i32) -> String {
    let digits = unscaled.unsigned_abs().to_string();
    let sign = if unscaled < 0 { "-" } else { "" };
    let scale = scale.max(0) as usize;
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

/// Statistics JSON with `bounds` set in `minValues`/`maxValues` (removed where `None`), edited
/// as text. `None` when the JSON is not what delta-rs writes.
fn set_bounds(stats: &str, bounds: &Bounds) -> Option<String> {
    let mut s = stats.to_string();
    for (path, b) in bounds {
        for (which, value) in [
            ("minValues", b.as_ref().map(|b| b.0.as_str())),
            ("maxValues", b.as_ref().map(|b| b.1.as_str())),
        ] {
            let mut keys = vec![which.to_string()];
            keys.extend(path.iter().cloned());
            s = edit(&s, &keys, value)?;
        }
    }
    Some(s)
}

/// Replace (or with `None`, remove) the value at `keys` in a JSON object's text. A missing
/// key is left missing (a column the writer gave no bounds keeps none).
fn edit(json: &str, keys: &[String], value: Option<&str>) -> Option<String> {
    let members = object_members(json, 0)?;
    let (key, rest) = keys.split_first()?;
    let Some(m) = members.iter().find(|m| m.key == *key) else {
        return Some(json.to_string());
    };
    let inner = &json[m.value.clone()];
    let replacement = if rest.is_empty() {
        match value {
            Some(v) => v.to_string(),
            None => {
                // Remove the member and one adjacent comma.
                let mut start = m.start;
                let mut end = m.value.end;
                let after = json[end..].trim_start();
                if after.starts_with(',') {
                    end = json.len() - after.len() + 1;
                } else if let Some(p) = json[..start].trim_end().strip_suffix(',') {
                    start = p.len();
                }
                return Some(format!("{}{}", &json[..start], &json[end..]));
            }
        }
    } else {
        if !inner.trim_start().starts_with('{') {
            return Some(json.to_string());
        }
        edit(inner, rest, value)?
    };
    Some(format!(
        "{}{}{}",
        &json[..m.value.start],
        replacement,
        &json[m.value.end..]
    ))
}

/// A member of a JSON object: its key (unescaped), where it starts and its value's span.
struct Member {
    key: String,
    start: usize,
    value: std::ops::Range<usize>,
}

/// The members of the object starting at `at` (after whitespace).
fn object_members(json: &str, at: usize) -> Option<Vec<Member>> {
    let b = json.as_bytes();
    let mut i = skip_ws(b, at);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    let mut out = Vec::new();
    loop {
        i = skip_ws(b, i);
        match b.get(i)? {
            b'}' => return Some(out),
            b',' => {
                i += 1;
                continue;
            }
            b'"' => {}
            _ => return None,
        }
        let start = i;
        let key_end = skip_string(b, i)?;
        let key: String = serde_json::from_str(&json[i..key_end]).ok()?;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let v_end = skip_value(b, i)?;
        out.push(Member {
            key,
            start,
            value: i..v_end,
        });
        i = v_end;
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| c.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

/// The end of the string starting at `i` (a quote).
fn skip_string(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        match b.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// The end of the JSON value starting at `i`.
fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => skip_string(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match b.get(j)? {
                    b'"' => {
                        j = skip_string(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let mut j = i;
            while b
                .get(j)
                .is_some_and(|c| !matches!(c, b',' | b'}' | b']') && !c.is_ascii_whitespace())
            {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_text_is_exact() {
        assert_eq!(decimal_text(1234567890123456789, 0), "1234567890123456789");
        assert_eq!(decimal_text(-123400, 4), "-12.3400");
        assert_eq!(decimal_text(5, 3), "0.005");
        assert_eq!(decimal_text(-5, 3), "-0.005");
        assert_eq!(decimal_text(i128::MAX, 18).len(), 40);
        let max38 = 10i128.pow(38) - 1;
        assert_eq!(
            decimal_text(max38, 18),
            "99999999999999999999.999999999999999999"
        );
    }

    #[test]
    fn wide_decimals_are_found_in_delta_schema_strings() {
        let s = r#"{"type":"struct","fields":[{"name":"a","type":"decimal(38,0)"}]}"#;
        assert!(schema_string_has_wide_decimal(s));
        let s = r#"{"type":"struct","fields":[{"name":"a","type":"decimal(15,2)"},{"name":"b","type":"long"}]}"#;
        assert!(!schema_string_has_wide_decimal(s));
    }

    #[test]
    fn bounds_are_replaced_as_text_and_nothing_else_moves() {
        let stats = r#"{"numRecords":2,"minValues":{"f":0.30000000000000004,"amt":5,"s":{"d":1.5}},"maxValues":{"f":1e300,"amt":1234567890123456768,"s":{"d":2.5}},"nullCount":{"f":0,"amt":0}}"#;
        let mut b = Bounds::new();
        b.insert(
            vec!["amt".into()],
            Some(("5".into(), "1234567890123456789".into())),
        );
        b.insert(vec!["s".into(), "d".into()], None);
        let out = set_bounds(stats, &b).unwrap();
        assert_eq!(
            out,
            r#"{"numRecords":2,"minValues":{"f":0.30000000000000004,"amt":5,"s":{}},"maxValues":{"f":1e300,"amt":1234567890123456789,"s":{}},"nullCount":{"f":0,"amt":0}}"#
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["maxValues"]["amt"].to_string(), "1234567890123456789");
    }

    #[test]
    fn removing_the_first_or_last_member_keeps_valid_json() {
        for (json, key, want) in [
            (r#"{"a":1,"b":2}"#, "a", r#"{"b":2}"#),
            (r#"{"a":1,"b":2}"#, "b", r#"{"a":1}"#),
            (r#"{"a":1}"#, "a", r#"{}"#),
            (
                r#"{"a":"x,}","b":[1,{"c":2}]}"#,
                "a",
                r#"{"b":[1,{"c":2}]}"#,
            ),
        ] {
            let out = edit(json, &[key.to_string()], None).unwrap();
            assert_eq!(out, want);
            serde_json::from_str::<serde_json::Value>(&out).unwrap();
        }
    }

    #[test]
    fn commit_roots_are_the_folder_above_the_log() {
        let p = Path::from("bucket_prefix/t/_delta_log/00000000000000000001.json");
        assert_eq!(table_root(&p), Some("bucket_prefix/t"));
        let p = Path::from("_delta_log/00000000000000000001.json");
        assert_eq!(table_root(&p), Some(""));
    }
}
