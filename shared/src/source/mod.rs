//! CDC readers: turn one change file into a [`ChangeSet`]: the rows with only the curated
//! columns, each row's operation, and each row's order key. In two parts: a decoder turns
//! the file's bytes into batches (`parquet`; `csv`, gzip-compressed or not), and the table's
//! CDC convention (`convention`; AWS DMS's is `dms`) says what a row means; the steps after
//! are the same for every convention ([`to_change_set`]).
//!
//! Every problem names the file and, where it applies, the row and column.

mod convention;
mod csv;
#[cfg(test)]
mod debezium;
mod dms;
pub(crate) mod order;
mod parquet;

use convention::{Changes, Convention, Curated};

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float32Array, Float64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use chrono::{DateTime, Utc};
use url::Url;

use crate::coerce;
use crate::config::{Convention as Kind, Format, TableConfig};
use crate::error::{Error, Location, Result};
use crate::props::TableProps;
use crate::storage;

pub use order::SeqKind;

pub(crate) use crate::model::{FileKind, RESERVED_PREFIX};
pub(crate) use crate::storage::{Body, Digest, RawFile};

/// What reading a table's files needs of its configuration — its source settings (format,
/// CDC convention; the operation, sequence, dropped, renamed and before-image columns), its
/// key and partition columns, the name of tributary's order-key column, whether a history
/// needs each change's start — taken once from the table's configuration ([`Spec::of`]):
/// the decoders and conventions see this, not the table's whole configuration.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// The table's name (for messages).
    pub(crate) table: String,
    pub(crate) format: Format,
    pub(crate) convention: Kind,
    pub(crate) op_column: String,
    pub(crate) sequence_by: Vec<String>,
    pub(crate) drop_columns: Vec<String>,
    pub(crate) rename_columns: std::collections::BTreeMap<String, String>,
    pub(crate) before_image_prefix: Option<String>,
    pub(crate) primary_key: Vec<String>,
    pub(crate) partition_by: Vec<String>,
    /// tributary's order-key column (`sequence_column`): no file may have it.
    pub(crate) sequence_column: String,
    /// Each change's start (its first sequence value) is kept: the table has a history.
    pub(crate) starts: bool,
}

impl Spec {
    pub(crate) fn of(cfg: &TableConfig) -> Spec {
        Spec {
            table: cfg.name.clone(),
            format: cfg.format.clone(),
            convention: cfg.convention,
            op_column: cfg.op_column.clone(),
            sequence_by: cfg.sequence_by.clone(),
            drop_columns: cfg.drop_columns.clone(),
            rename_columns: cfg.rename_columns.clone(),
            before_image_prefix: cfg.before_image_prefix.clone(),
            primary_key: cfg.primary_key.clone(),
            partition_by: cfg.partition_by.clone(),
            sequence_column: cfg.writing.sequence_column.clone(),
            starts: cfg.history.is_some(),
        }
    }

    /// The file columns read only for their first value: a full load's sequence columns
    /// that are dropped, in a table without a history. Their values do not order a full
    /// load; the first one tells their kind (recorded when the load creates the table), and
    /// decoding a whole column of timestamps for it was a twentieth of a load's work.
    pub(crate) fn sampled_sequence_columns(&self, kind: FileKind) -> Vec<String> {
        if kind != FileKind::FullLoad || self.starts || !matches!(self.format, Format::Parquet) {
            return Vec::new();
        }
        // A column `rename_columns` names either way is decoded as before (the file must
        // not carry both names: `dms::renamed_columns` checks the decoded columns).
        let renamed = |s: &String| {
            self.rename_columns.contains_key(s) || self.rename_columns.values().any(|t| t == s)
        };
        self.sequence_by
            .iter()
            .filter(|s| self.drop_columns.contains(s) && !renamed(s))
            .cloned()
            .collect()
    }

    /// Whether a file's column is never looked at, so need not be decoded: a dropped column
    /// (by its name after `rename_columns`, as settings name columns) that is not the
    /// operation, a sequence column or a before-image.
    pub(crate) fn unread_column(&self, column: &str) -> bool {
        let column = self
            .rename_columns
            .get(column)
            .map_or(column, String::as_str);
        self.drop_columns.iter().any(|c| c == column)
            && column != self.op_column
            && !self.sequence_by.iter().any(|c| c == column)
            && !self
                .before_image_prefix
                .as_deref()
                .is_some_and(|p| column.starts_with(p))
    }

    /// Whether a file's column is written to the table: not the operation, not a dropped
    /// column, not a before-image.
    pub(crate) fn keeps_column(&self, column: &str) -> bool {
        column != self.op_column
            && !self.drop_columns.iter().any(|c| c == column)
            && !self
                .before_image_prefix
                .as_deref()
                .is_some_and(|p| column.starts_with(p))
    }
}

/// The column a reader adds (CSV with `csv.no_sup_value`): per row, the names of the columns
/// whose value the file does not carry, joined by [`ABSENT_SEPARATOR`] (null: none). Taken
/// out into [`ChangeSet::absent`] before any rule looks at the file's columns.
pub(crate) const ABSENT_COLUMN: &str = "_tributary_absent";
/// Between two names in [`ABSENT_COLUMN`] (the ASCII unit separator).
pub(crate) const ABSENT_SEPARATOR: &str = "\u{1f}";

/// What a row does to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeOp {
    Insert,
    Update,
    Delete,
}

/// Counts of one file's rows by operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FileCounts {
    pub rows: usize,
    pub inserts: usize,
    pub updates: usize,
    pub deletes: usize,
}

impl FileCounts {
    pub(crate) fn add(&mut self, o: &FileCounts) {
        self.rows += o.rows;
        self.inserts += o.inserts;
        self.updates += o.updates;
        self.deletes += o.deletes;
    }
}

/// CSV rows decoded at a time (at most; fewer with a smaller slice); slices are made of
/// whole decode batches. A Parquet file is decoded a slice at a time ([`parquet::Decode`]).
const CSV_DECODE_ROWS: usize = 64 * 1024;

/// A file's decoded record batches (raw columns, before curation).
pub(crate) type Batches = Box<dyn Iterator<Item = Result<RecordBatch>> + Send>;

/// `batches`, or one empty batch of `schema` when there are none (an empty file is a
/// change set of no rows, not nothing). Lazy: opening a file decodes nothing.
fn at_least_one(schema: SchemaRef, batches: Batches) -> Batches {
    struct AtLeastOne {
        batches: Batches,
        empty: Option<RecordBatch>,
    }
    impl Iterator for AtLeastOne {
        type Item = Result<RecordBatch>;
        fn next(&mut self) -> Option<Self::Item> {
            match self.batches.next() {
                Some(b) => {
                    self.empty = None;
                    Some(b)
                }
                None => self.empty.take().map(Ok),
            }
        }
    }
    Box::new(AtLeastOne {
        batches,
        empty: Some(RecordBatch::new_empty(schema)),
    })
}

/// What reading a file gave.
pub(crate) enum Read {
    /// The file in one change set (at most `slice_rows` rows).
    Whole(Box<ChangeSet>),
    /// A file of more rows: merged alone, slice by slice ([`Slices`]).
    Large,
}

/// One file's changes, ready for merge planning.
#[derive(Debug, Clone)]
pub(crate) struct ChangeSet {
    pub file: Url,
    pub kind: FileKind,
    /// Curated columns only (op and dropped columns removed), in the table's types where the
    /// table has the column, else in their Delta types.
    pub data: RecordBatch,
    pub ops: Vec<ChangeOp>,
    /// Order key per row: larger means later. See [`order`].
    pub order: arrow::array::StringArray,
    /// Kind of each `sequence_by` column (`None` when the file does not tell).
    pub seq_kinds: Vec<Option<SeqKind>>,
    /// Each row's normalised value of the first `sequence_by` column (when the change
    /// happened: a history version's start).
    pub starts: Vec<Option<String>>,
    /// The full-load generation the file belongs to (1 unless the table was reloaded).
    pub generation: u32,
    /// When the file was written: the time in a DMS CDC file name, else the object's
    /// last-modified time.
    pub written: Option<DateTime<Utc>>,
    /// The object's last-modified time (identifies a full-load file's version).
    pub last_modified: Option<DateTime<Utc>>,
    /// SHA-256 of the object (identifies the contents a CDC file was applied with).
    pub digest: Option<Digest>,
    pub counts: FileCounts,
    /// Per column, the rows whose value the file does not carry (DMS wrote its
    /// `CsvNoSupValue`: the source did not log the column for that change): null in `data`,
    /// and the change leaves the column as it was, as if the row's file lacked the column
    /// (`plan` makes it a sparse column, the history an absent one). Only columns with such
    /// rows; updates and deletes only (an insert carries every column).
    pub absent: Vec<(String, Vec<bool>)>,
    /// A slice of a large file other than its last (see [`Slices`]): the file is not
    /// applied until its last slice is (a full-load file is recorded with that one).
    pub partial: bool,
    /// The file's rows before this change set's first (a slice's offset): rows named in
    /// errors about `data` are shifted by it, so they are the file's rows.
    pub first_row: usize,
}

impl ChangeSet {
    /// Canonical processing order of a batch: full loads first, then by file name (DMS
    /// names files in write order), then by location.
    pub(crate) fn canonical_key(&self) -> (u32, FileKind, String, String) {
        (
            self.generation,
            self.kind,
            storage::file_name(&self.file),
            self.file.to_string(),
        )
    }
}

/// The order in which a table's files are applied, whatever order they were announced or
/// listed in: full-load files in name order, then CDC files in name order (DMS names both in
/// write order), the location breaking ties. A file larger than a slice is applied at its
/// place in this order, so every version written is a state the source had.
pub fn apply_order(url: &Url) -> (bool, String, String) {
    let name = storage::file_name(url);
    (FileKind::of(&name) == FileKind::Cdc, name, url.to_string())
}

/// [`apply_order`] by the table's convention (which files are full loads).
pub(crate) fn apply_order_of(cfg: &TableConfig, url: &Url) -> (bool, String, String) {
    let name = storage::file_name(url);
    (
        file_kind(cfg, &name) == FileKind::Cdc,
        name,
        url.to_string(),
    )
}

/// A file's kind (a full load or changes), by the table's convention, from its name.
pub(crate) fn file_kind(cfg: &TableConfig, file_name: &str) -> FileKind {
    convention::of_kind(cfg.convention).kind(file_name)
}

/// When a CDC file's changes were written, when its name says (the table's convention).
pub(crate) fn name_time(cfg: &TableConfig, file_name: &str) -> Option<DateTime<Utc>> {
    convention::of_kind(cfg.convention).name_time(file_name)
}

/// What to do with an object found under a table's source prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FileClass {
    /// A data file to merge.
    Data,
    /// Not data (a folder marker); ignoring it loses nothing.
    NotData(&'static str),
}

/// Classify an object under a table's source. Anything that is neither a data file of the
/// table's format nor a folder marker is an error: a file tributary cannot read must fail
/// (and reach the dead-letter queue), never be skipped.
pub(crate) fn classify(url: &Url, format: &Format) -> std::result::Result<FileClass, String> {
    let path = url.path();
    let name = storage::file_name(url);
    if path.ends_with('/') || name.is_empty() || name.ends_with("_$folder$") {
        return Ok(FileClass::NotData("folder marker"));
    }
    let lower = name.to_ascii_lowercase();
    let is_parquet = lower.ends_with(".parquet");
    let is_csv = lower.ends_with(".csv") || lower.ends_with(".csv.gz");
    match (format, is_parquet, is_csv) {
        (Format::Parquet, true, _) | (Format::Csv(_), _, true) => Ok(FileClass::Data),
        (Format::Parquet, false, true) => Err(
            "a CSV file under a table configured with format = \"parquet\"; set the table's `format` (and [table.csv]) to match the DMS endpoint's DataFormat".into(),
        ),
        (Format::Csv(_), true, false) => Err(
            "a Parquet file under a table configured with format = \"csv\"; set `format = \"parquet\"` to match the DMS endpoint's DataFormat".into(),
        ),
        _ => Err(format!(
            "not a DMS data file: tributary reads {} under a table's source; move other files out of the DMS folder",
            match format {
                Format::Parquet => "`.parquet` files",
                Format::Csv(_) => "`.csv` and `.csv.gz` files",
            }
        )),
    }
}

impl Slices {
    /// The whole file when it has at most one slice of rows and of decoded bytes, else
    /// [`Read::Large`].
    pub(crate) fn whole_or_large(mut self) -> Result<Read> {
        if self.total_rows.is_some_and(|n| n > self.slice_rows) {
            return Ok(Read::Large);
        }
        let first = self
            .next_slice()?
            .ok_or_else(|| Error::internal("a file reader yielded no batch"))?;
        if first.partial {
            return Ok(Read::Large);
        }
        Ok(Read::Whole(Box::new(first)))
    }
}

/// A file read in slices of about `slice_rows` rows (whole decode batches): each slice is a
/// [`ChangeSet`] numbered as the file's rows (errors and order keys are the same as if the
/// file were read whole), `partial` on all but the last. Memory holds one slice at a time.
pub(crate) struct Slices {
    file: Url,
    name: String,
    file_name: String,
    kind: FileKind,
    generation: u32,
    written: Option<DateTime<Utc>>,
    last_modified: Option<DateTime<Utc>>,
    digest: Option<Digest>,
    cfg: Spec,
    convention: &'static dyn Convention,
    slice_rows: usize,
    slice_bytes: usize,
    /// Each decode batch is a slice (Parquet: decoded a slice at a time).
    one_batch: bool,
    batches: std::iter::Peekable<Batches>,
    next_row: usize,
    /// Rows in the file, when the format says (Parquet).
    pub(crate) total_rows: Option<usize>,
    /// The first value of each column read only for it ([`Spec::sampled_sequence_columns`]).
    sampled: Vec<(String, ArrayRef)>,
}

impl Slices {
    /// Open a file for reading in slices of `slice_rows` rows / `slice_bytes` decoded bytes.
    /// `table_schema` is what the Delta table says, when it exists: CSV columns without a
    /// declared type take its types (Parquet columns keep theirs until admission).
    pub(crate) fn open(
        file: &Url,
        raw: &RawFile,
        cfg: Spec,
        table_schema: Option<&Schema>,
        props: &TableProps,
        slice_rows: usize,
        slice_bytes: usize,
    ) -> Result<Slices> {
        let name = storage::display(file);
        let file_name = storage::file_name(file);
        let convention = convention::of(&cfg);
        let kind = convention.kind(&file_name);
        let one_batch = matches!(cfg.format, Format::Parquet);
        let sample = cfg.sampled_sequence_columns(kind);
        let (batches, total_rows, first) = match &cfg.format {
            // A slice decoded as one batch when the rows are as wide as measured.
            Format::Parquet => parquet::batches(
                &name,
                &raw.body,
                &parquet::Decode {
                    rows: slice_rows.max(1),
                    bytes: slice_bytes.max(1),
                    skip: &|c| cfg.unread_column(c),
                    sample: &sample,
                },
            )?,
            Format::Csv(opts) => (
                csv::batches(
                    csv::Input {
                        name: &name,
                        file_name: &file_name,
                        body: &raw.body,
                    },
                    opts,
                    kind,
                    &cfg,
                    table_schema,
                    // Batches of at most a quarter of a slice; CSV rows are assumed to
                    // decode to at most 4 KB.
                    CSV_DECODE_ROWS
                        .min(slice_rows.max(1))
                        .min((slice_bytes / 4 / 4096).max(1024)),
                )?,
                None,
                Vec::new(),
            ),
        };

        convention.check_orderable(&name, &file_name, kind, &cfg)?;
        let written = match kind {
            FileKind::Cdc => convention.name_time(&file_name).or(raw.last_modified),
            FileKind::FullLoad => raw.last_modified,
        };
        Ok(Slices {
            file: file.clone(),
            generation: written.map_or(1, |t| props.generation_at(t)),
            name,
            file_name,
            kind,
            written,
            last_modified: raw.last_modified,
            digest: raw.digest,
            cfg,
            convention,
            slice_rows: slice_rows.max(1),
            slice_bytes: slice_bytes.max(1),
            one_batch,
            batches: batches.peekable(),
            next_row: 0,
            total_rows,
            sampled: first,
        })
    }

    /// The next slice, `None` after the last.
    pub(crate) fn next_slice(&mut self) -> Result<Option<ChangeSet>> {
        let mut parts = Vec::new();
        let (mut rows, mut bytes) = (0, 0);
        // A Parquet decode batch is a slice already; CSV batches are gathered.
        while parts.is_empty()
            || (!self.one_batch && rows < self.slice_rows && bytes < self.slice_bytes)
        {
            match self.batches.next() {
                Some(b) => {
                    let b = b?;
                    rows += b.num_rows();
                    bytes += b.get_array_memory_size();
                    parts.push(b);
                }
                None => break,
            }
        }
        // Trailing empty batches do not make a slice partial.
        while self
            .batches
            .peek()
            .is_some_and(|b| b.as_ref().is_ok_and(|b| b.num_rows() == 0))
        {
            self.batches.next();
        }
        let Some(first) = parts.first() else {
            return Ok(None);
        };
        let batch = if parts.len() == 1 {
            first.clone()
        } else {
            arrow::compute::concat_batches(&first.schema(), &parts).map_err(|e| {
                Error::bad_input(
                    &self.name,
                    Location::File,
                    format!("cannot combine the file's batches: {e}"),
                )
            })?
        };
        drop(parts);
        let first_row = self.next_row;
        self.next_row += batch.num_rows();
        let info = FileInfo {
            url: &self.file,
            name: &self.name,
            file_name: &self.file_name,
            kind: self.kind,
            generation: self.generation,
            sampled: &self.sampled,
        };
        let mut cs = to_change_set(self.convention, &info, batch, &self.cfg, first_row)
            .map_err(|e| e.shift_rows(first_row))?;
        cs.written = self.written;
        cs.last_modified = self.last_modified;
        cs.digest = self.digest;
        cs.partial = self.batches.peek().is_some();
        cs.first_row = first_row;
        Ok(Some(cs))
    }
}

/// What the change-set builder needs to know about the file.
struct FileInfo<'a> {
    url: &'a Url,
    /// For messages.
    name: &'a str,
    /// The last path segment (part of the order key).
    file_name: &'a str,
    kind: FileKind,
    generation: u32,
    /// The file's first value of each column not decoded in its batches.
    sampled: &'a [(String, ArrayRef)],
}

/// One batch of a file (its rows from `first_row` on) as a change set: the convention's
/// changes, then what every convention shares — keys checked, order keys, the table's
/// columns converted exactly, the changes the rows imply, counts. Row numbers in errors are
/// the batch's; the caller shifts them.
fn to_change_set(
    convention: &dyn Convention,
    f: &FileInfo<'_>,
    raw: RecordBatch,
    cfg: &Spec,
    first_row: usize,
) -> Result<ChangeSet> {
    let Changes {
        rows: raw,
        ops,
        mut absent,
        sequence,
        own,
    } = convention.changes(f, raw, cfg)?;
    check_keys(f.name, &raw, cfg)?;
    let ordering = order_keys(f, &raw, cfg, &sequence, first_row)?;
    let data = curated_columns(f.name, &raw, cfg, &own)?;
    let Curated {
        data,
        ops,
        ordering,
    } = convention.implied(
        f.name,
        &raw,
        cfg,
        Curated {
            data,
            ops,
            ordering,
        },
    )?;
    // The changes the rows imply (appended after the file's rows) lack no column.
    for (_, rows) in &mut absent {
        rows.resize(data.num_rows(), false);
    }
    let mut counts = FileCounts {
        rows: raw.num_rows(),
        ..Default::default()
    };
    for op in ops.iter().take(raw.num_rows()) {
        match op {
            ChangeOp::Insert => counts.inserts += 1,
            ChangeOp::Update => counts.updates += 1,
            ChangeOp::Delete => counts.deletes += 1,
        }
    }
    Ok(ChangeSet {
        file: f.url.clone(),
        kind: f.kind,
        data,
        ops,
        order: ordering.keys,
        seq_kinds: ordering.kinds,
        starts: ordering.starts,
        generation: f.generation,
        written: None,
        last_modified: None,
        digest: None,
        counts,
        absent,
        partial: false,
        first_row: 0,
    })
}

/// The file's columns decoded: dictionary and run-end encoded columns as their value type,
/// view types as their plain types ([`coerce::decode`]). The Parquet reader hands over a
/// column in the layout the file's Arrow schema asks for; without this, a rule that looks
/// at a column's type (a NaN key is a float key's) would not see a dictionary of floats.
fn plain_columns(file: &str, raw: RecordBatch) -> Result<RecordBatch> {
    let schema = raw.schema();
    if !schema
        .fields()
        .iter()
        .any(|f| coerce::plain_type(f.data_type()).is_some())
    {
        return Ok(raw);
    }
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (f, c) in schema.fields().iter().zip(raw.columns()) {
        let c = coerce::decode(c).map_err(|e| {
            Error::bad_input(
                file,
                Location::Column(f.name().clone()),
                format!("cannot decode the column ({}): {e}", f.data_type()),
            )
        })?;
        fields.push(Field::new(f.name(), c.data_type().clone(), true));
        columns.push(c);
    }
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(raw.num_rows())),
    )
    .map_err(|e| {
        Error::bad_input(
            file,
            Location::File,
            format!("cannot assemble the decoded columns: {e}"),
        )
    })
}

/// Column names must be unique (also ignoring case: Delta and its readers match names
/// case-insensitively) and must not collide with tributary's own columns.
fn check_column_names(file: &str, schema: &SchemaRef, cfg: &Spec) -> Result<()> {
    let mut seen = HashSet::new();
    for f in schema.fields() {
        let n = f.name();
        if !seen.insert(n.to_lowercase()) {
            return Err(Error::bad_input(
                file,
                Location::Column(n.clone()),
                "the file has two columns with this name (names are compared ignoring case); a file must have one column per name",
            ));
        }
        // Ignoring case too: the Delta table could not hold both.
        let lower = n.to_lowercase();
        if lower == cfg.sequence_column.to_lowercase() {
            return Err(Error::bad_input(
                file,
                Location::Column(n.clone()),
                "the file has a column with the name of tributary's internal sequence column; set `sequence_column` in the table config to another name",
            ));
        }
        if lower.starts_with(RESERVED_PREFIX) && cfg.keeps_column(n) {
            return Err(Error::bad_input(
                file,
                Location::Column(n.clone()),
                format!("column names starting with `{RESERVED_PREFIX}` are reserved for tributary's own columns; rename the column at the source or list it in `drop_columns`"),
            ));
        }
    }
    Ok(())
}

fn column(raw: &RecordBatch, name: &str) -> Option<ArrayRef> {
    raw.schema()
        .index_of(name)
        .ok()
        .map(|i| raw.column(i).clone())
}

fn column_list(schema: &SchemaRef) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Keys must be present and non-null; a floating-point key must not be NaN (NaN equals
/// nothing, so the row could never be updated or deleted).
fn check_keys(file: &str, raw: &RecordBatch, cfg: &Spec) -> Result<()> {
    for k in &cfg.primary_key {
        let a = column(raw, k).ok_or_else(|| {
            Error::bad_input(
                file,
                Location::Column(k.clone()),
                format!(
                    "primary key column is missing (columns: {})",
                    column_list(&raw.schema())
                ),
            )
        })?;
        check_key_values(file, k, &a)?;
    }
    Ok(())
}

/// Why a key column's values cannot be keys: the first row (0-based) that is null or NaN
/// (NaN equals nothing, so the row could never be updated or deleted). Judged on the
/// decoded values, whatever the array's layout.
pub(crate) fn key_problem(a: &ArrayRef) -> Option<(usize, &'static str)> {
    if let Some(nulls) = a.logical_nulls() {
        if let Some(r) = (0..a.len()).find(|&i| nulls.is_null(i)) {
            return Some((r, "primary key is null"));
        }
    }
    let nan = match coerce::decode(a) {
        Ok(plain) => first_nan(&plain),
        // A layout that cannot be decoded holds no float of a known type.
        Err(_) => None,
    };
    nan.map(|r| {
        (
            r,
            "primary key is NaN; NaN equals no value, so the row could never be matched again",
        )
    })
}

/// A key column as the table keeps it: a null or NaN key fails the file (naming the row),
/// `-0.0` becomes `0.0` (one key, as SQL compares them).
pub(crate) fn key_column(file: &str, column: &str, a: ArrayRef) -> Result<ArrayRef> {
    check_key_values(file, column, &a)?;
    Ok(normalize_zero(a))
}

/// A null or NaN key fails the file, naming the row and column.
fn check_key_values(file: &str, column: &str, a: &ArrayRef) -> Result<()> {
    match key_problem(a) {
        Some((r, why)) => Err(Error::bad_input(
            file,
            Location::Row {
                row: r + 1,
                column: Some(column.to_string()),
            },
            why,
        )),
        None => Ok(()),
    }
}

fn first_nan(a: &ArrayRef) -> Option<usize> {
    use arrow::datatypes::{Float16Type, Float32Type, Float64Type};
    match a.data_type() {
        DataType::Float16 => a
            .as_primitive::<Float16Type>()
            .values()
            .iter()
            .position(|v| v.is_nan()),
        DataType::Float32 => a
            .as_primitive::<Float32Type>()
            .values()
            .iter()
            .position(|v| v.is_nan()),
        DataType::Float64 => a
            .as_primitive::<Float64Type>()
            .values()
            .iter()
            .position(|v| v.is_nan()),
        _ => None,
    }
}

/// `-0.0` and `0.0` are the same key (SQL equality); store one of them.
pub(crate) fn normalize_zero(a: ArrayRef) -> ArrayRef {
    match a.data_type() {
        DataType::Float32 => {
            let v: Float32Array = a
                .as_primitive::<arrow::datatypes::Float32Type>()
                .unary(|x| if x == 0.0 { 0.0 } else { x });
            Arc::new(v)
        }
        DataType::Float64 => {
            let v: Float64Array = a
                .as_primitive::<arrow::datatypes::Float64Type>()
                .unary(|x| if x == 0.0 { 0.0 } else { x });
            Arc::new(v)
        }
        _ => a,
    }
}

/// Order keys, sequence kinds and the first sequence column's normalised values.
struct Ordering {
    keys: arrow::array::StringArray,
    kinds: Vec<Option<SeqKind>>,
    starts: Vec<Option<String>>,
}

impl Ordering {
    /// With the rows `rows` repeated at the end (their order keys and starts).
    fn with_repeated(self, rows: &[u32]) -> Result<Self> {
        let idx = arrow::array::UInt32Array::from(rows.to_vec());
        let more = arrow::compute::take(&self.keys, &idx, None).map_err(Error::arrow)?;
        let keys = arrow::compute::concat(&[&self.keys, more.as_ref()]).map_err(Error::arrow)?;
        let mut starts = self.starts;
        if !starts.is_empty() {
            let extra: Vec<_> = rows.iter().map(|&i| starts[i as usize].clone()).collect();
            starts.extend(extra);
        }
        Ok(Ordering {
            keys: keys.as_string::<i32>().clone(),
            kinds: self.kinds,
            starts,
        })
    }
}

/// The sequence columns (`sequence_by`) of a CDC file, normalised; a missing column or a
/// value that cannot be ordered fails the file, naming the row and column.
fn cdc_sequences(
    f: &FileInfo<'_>,
    raw: &RecordBatch,
    sequence: &[String],
) -> Result<Vec<order::SeqColumn>> {
    sequence
        .iter()
        .map(|s| {
            let a = column(raw, s).ok_or_else(|| {
                Error::bad_input(
                    f.name,
                    Location::Column(s.clone()),
                    format!(
                        "sequence column (from `sequence_by`) is missing (columns: {})",
                        column_list(&raw.schema())
                    ),
                )
            })?;
            order::sequence_column(&a).map_err(|e| {
                let location = match e.row {
                    Some(r) => Location::Row {
                        row: r + 1,
                        column: Some(s.clone()),
                    },
                    None => Location::Column(s.clone()),
                };
                Error::bad_input(f.name, location, e.message)
            })
        })
        .collect()
}

fn order_keys(
    f: &FileInfo<'_>,
    raw: &RecordBatch,
    cfg: &Spec,
    sequence: &[String],
    first_row: usize,
) -> Result<Ordering> {
    let sequences = match f.kind {
        FileKind::Cdc => cdc_sequences(f, raw, sequence)?,
        FileKind::FullLoad => Vec::new(),
    };
    let rows = raw.num_rows();
    // Each row's start (the first sequence value) serves only a history table.
    let history = cfg.starts;
    let (kinds, starts) = match f.kind {
        FileKind::Cdc => (
            sequences.iter().map(|s| s.kind).collect(),
            match sequences.first() {
                _ if !history => Vec::new(),
                Some(s) => s.values.iter().cloned().map(Some).collect(),
                None => vec![None; rows],
            },
        ),
        // Full-load rows are not ordered by the sequence columns, but when DMS writes them
        // (TimestampColumnName: the transfer time) their kind is the CDC files' kind (it is
        // recorded when the full load creates the table) and their value is when the row
        // was read (the start of its first version in a history table).
        FileKind::FullLoad => {
            // Without a history table only the kind matters: one value tells it.
            let sample = |a: ArrayRef| match (0..a.len()).find(|&i| !a.is_null(i)) {
                Some(i) if !history => a.slice(i, 1),
                _ => a,
            };
            let loaded: Vec<Option<order::SeqColumn>> = sequence
                .iter()
                .map(|s| {
                    column(raw, s)
                        .or_else(|| {
                            f.sampled
                                .iter()
                                .find(|(c, _)| c == s)
                                .map(|(_, v)| v.clone())
                        })
                        .and_then(|a| order::sequence_column(&sample(a)).ok())
                })
                .collect();
            let starts = match loaded.first() {
                _ if !history => Vec::new(),
                Some(Some(s)) => s.values.iter().cloned().map(Some).collect(),
                _ => vec![None; rows],
            };
            (
                loaded
                    .iter()
                    .map(|s| s.as_ref().and_then(|s| s.kind))
                    .collect(),
                starts,
            )
        }
    };
    let keys = order::order_keys(
        f.generation,
        f.kind,
        f.file_name,
        &sequences,
        first_row,
        rows,
    );
    Ok(Ordering {
        keys,
        kinds,
        starts,
    })
}

/// Curated columns, converted exactly to their Delta types. The conversion to the table's
/// types (or the batch's, or a widening of them) is admission's (`plan::admit`), made in
/// the files' order against the type each column has at that file: so a value reaches the
/// table the same way whether the table had the column when the file was read, a file of
/// the same batch created it, or an earlier file of the batch widened it — however the files
/// are grouped into calls (converted to the table's type here, a `Boolean` would have become
/// the `int` 1 and then the widened `decimal` 1; read after the widening, it is refused).
fn curated_columns(
    file: &str,
    raw: &RecordBatch,
    cfg: &Spec,
    own: &[String],
) -> Result<RecordBatch> {
    let schema = raw.schema();
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (i, f) in schema.fields().iter().enumerate() {
        if !cfg.keeps_column(f.name()) || own.contains(f.name()) {
            continue;
        }
        let delta = coerce::delta_type(f.data_type()).ok_or_else(|| {
            Error::bad_input(
                file,
                Location::Column(f.name().clone()),
                format!(
                    "type {} has no Delta Lake equivalent; drop the column with `drop_columns`",
                    f.data_type()
                ),
            )
        })?;
        let mut c = convert(file, f.name(), raw.column(i), &delta)?;
        if cfg.primary_key.contains(f.name()) {
            c = key_column(file, f.name(), c)?;
        }
        fields.push(Field::new(f.name(), delta, true));
        columns.push(c);
    }
    for p in &cfg.partition_by {
        if !fields.iter().any(|f| f.name() == p) {
            return Err(Error::bad_input(
                file,
                Location::Column(p.clone()),
                format!(
                    "partition column is missing (columns: {})",
                    column_list(&schema)
                ),
            ));
        }
    }
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(raw.num_rows())),
    )
    .map_err(|e| {
        Error::bad_input(
            file,
            Location::File,
            format!("cannot assemble columns: {e}"),
        )
    })
}

/// Convert a file's column exactly; the error names the file, row, column and value.
pub(crate) fn convert(file: &str, column: &str, a: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
    coerce::exact_cast(a, to).map_err(|e| {
        let location = match e.row {
            Some(r) => Location::Row {
                row: r + 1,
                column: Some(column.to_string()),
            },
            None => Location::Column(column.to_string()),
        };
        Error::bad_input(file, location, e.describe(a.data_type(), to))
    })
}

/// A value that does not convert to the table's type, in a file whose column has another
/// (non-text) type than the table's: a type change that is not a widening
/// ([`Error::TypeChange`]). Text (CSV) that does not convert is a bad value, as before.
pub(crate) fn type_change(e: Error, file_type: &DataType, table_type: &DataType) -> Error {
    let text = matches!(
        file_type,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    );
    match e {
        Error::BadInput {
            file,
            location,
            message,
        } if !text && file_type != table_type => {
            let (column, row) = match &location {
                Location::Row {
                    row,
                    column: Some(c),
                } => (c.clone(), Some(*row)),
                Location::Column(c) => (c.clone(), None),
                _ => {
                    return Error::BadInput {
                        file,
                        location,
                        message,
                    }
                }
            };
            Error::TypeChange {
                file,
                column,
                row,
                change: Box::new(crate::error::TypeChange {
                    table_type: table_type.to_string(),
                    file_type: file_type.to_string(),
                    reason: message,
                }),
            }
        }
        e => e,
    }
}

/// Build a Utf8 array from strings (helper for planning).
pub(crate) fn string_array<'a>(values: impl Iterator<Item = &'a str>) -> ArrayRef {
    Arc::new(arrow::array::StringArray::from_iter_values(values))
}

#[cfg(test)]
mod tests {
    use arrow::array::{
        DictionaryArray, Int32Array, Int64Array, RunArray, StringArray, StringViewArray,
    };
    use arrow::datatypes::{Float64Type, Int32Type};
    use bytes::Bytes;

    use super::*;
    use crate::config::{Config, CsvOptions};

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    fn table(extra: &str) -> TableConfig {
        let text = format!("[[table]]\nname = \"t\"\nsource = \"s3://r/t/\"\ntarget = \"s3://c/t\"\nprimary_key = [\"id\"]\n{extra}");
        Config::from_toml(&text, "test", None)
            .unwrap()
            .tables
            .remove(0)
    }

    fn batch(cols: Vec<(&str, ArrayRef)>) -> RecordBatch {
        let fields: Vec<Field> = cols
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect();
        RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            cols.into_iter().map(|(_, a)| a).collect(),
        )
        .unwrap()
    }

    /// `b` as a Parquet file in row groups of `rows` rows.
    fn in_row_groups(b: &RecordBatch, rows: usize) -> Vec<u8> {
        let props = ::parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(rows))
            .build();
        let mut buf = Vec::new();
        let mut w =
            ::parquet::arrow::ArrowWriter::try_new(&mut buf, b.schema(), Some(props)).unwrap();
        w.write(b).unwrap();
        w.close().unwrap();
        buf
    }

    /// Open a file of `body` in slices of `rows` rows and `bytes` decoded bytes.
    fn open_slices(
        name: &str,
        body: Bytes,
        cfg: &TableConfig,
        table: Option<&Schema>,
        (rows, bytes): (usize, usize),
    ) -> Result<Slices> {
        let raw = RawFile {
            body: Body::Memory(body),
            last_modified: None,
            digest: None,
        };
        let file = url(&format!("s3://r/t/{name}"));
        let props = TableProps::default();
        Slices::open(&file, &raw, Spec::of(cfg), table, &props, rows, bytes)
    }

    /// Read a file of `body` as the engine does (whole, one slice).
    fn read(
        name: &str,
        body: Bytes,
        cfg: &TableConfig,
        table: Option<&Schema>,
    ) -> Result<ChangeSet> {
        open_slices(name, body, cfg, table, (1_000, 1 << 20))?
            .next_slice()?
            .ok_or_else(|| Error::internal("no slice"))
    }

    /// A slice is bounded by its rows' decoded size, measured: a column of long repeated
    /// strings is a few bytes per row in the file (a dictionary), a kilobyte once decoded.
    /// (Sized from the file's own figures, the whole file was one slice.)
    #[test]
    fn slices_follow_the_decoded_size_of_the_rows() {
        let cfg = table("drop_columns = [\"unread\", \"b\"]\nrename_columns = { a = \"b\" }");
        let n = 20_000;
        let b = batch(vec![
            ("id", Arc::new(Int64Array::from_iter_values(0..n))),
            (
                "v",
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| format!("{:>1000}", i % 3)),
                )),
            ),
            ("unread", Arc::new(Int64Array::from_iter_values(0..n))),
        ]);
        let spec = Spec::of(&cfg);
        assert!(spec.unread_column("unread") && !spec.unread_column("v"));
        // Settings name the table's columns: `a` is read as `b`, which is dropped.
        assert!(spec.unread_column("a") && spec.unread_column("b"));
        let body = crate::demo::to_parquet(&b).unwrap();
        let mut slices = open_slices(
            "LOAD00000001.parquet",
            body,
            &cfg,
            None,
            (1_000_000, 4 << 20),
        )
        .unwrap();
        let mut sizes = Vec::new();
        while let Some(cs) = slices.next_slice().unwrap() {
            sizes.push(cs.data.num_rows());
        }
        // About 4 MB of 1 KB rows per slice.
        assert!(
            sizes.len() >= 4 && sizes.iter().all(|&s| s <= 5_000),
            "{sizes:?}"
        );
        assert_eq!(sizes.iter().sum::<usize>(), 20_000);
    }

    /// Rows that widen later in the file: the first rows are short, a later row group holds
    /// kilobyte values. The slices follow the widest row group, not the file's average.
    #[test]
    fn slices_follow_the_widest_row_group() {
        let cfg = table("");
        let n = 20_000;
        let b = batch(vec![
            ("id", Arc::new(Int64Array::from_iter_values(0..n))),
            (
                "v",
                Arc::new(StringArray::from_iter_values((0..n).map(|i| {
                    match i < 10_000 {
                        true => String::new(),
                        false => format!("{i:>1000}"),
                    }
                }))),
            ),
        ]);
        let buf = in_row_groups(&b, 10_000);
        let mut slices = open_slices(
            "LOAD00000001.parquet",
            Bytes::from(buf),
            &cfg,
            None,
            (1_000_000, 4 << 20),
        )
        .unwrap();
        let mut rows = 0;
        while let Some(cs) = slices.next_slice().unwrap() {
            rows += cs.data.num_rows();
            // About 4 MB of values per slice (the file's average row would make 8 MB ones).
            let v = cs.data.column_by_name("v").unwrap().as_string::<i32>();
            assert!(v.value_data().len() < 5_000_000, "{}", cs.data.num_rows());
        }
        assert_eq!(rows, 20_000);
    }

    /// A file of at least four slices starts with smaller ones (about a quarter, then half
    /// of one, each whole row groups) and goes on with full ones; every row is read once,
    /// in order. A smaller file is not ramped.
    #[test]
    fn a_large_file_starts_with_smaller_slices() {
        let cfg = table("");
        let n = 2_000;
        let b = batch(vec![("id", Arc::new(Int64Array::from_iter_values(0..n)))]);
        let buf = in_row_groups(&b, 10);
        let body = Bytes::from(buf);
        for (slice, expected) in [
            (200, [vec![50, 100], vec![200; 9], vec![50]].concat()),
            (600, vec![600, 600, 600, 200]),
        ] {
            let mut slices = open_slices(
                "LOAD00000001.parquet",
                body.clone(),
                &cfg,
                None,
                (slice, 1 << 30),
            )
            .unwrap();
            let (mut sizes, mut ids) = (Vec::new(), Vec::new());
            while let Some(cs) = slices.next_slice().unwrap() {
                sizes.push(cs.data.num_rows());
                let id = cs.data.column_by_name("id").unwrap();
                ids.extend(
                    id.as_primitive::<arrow::datatypes::Int64Type>()
                        .values()
                        .iter()
                        .copied(),
                );
            }
            assert_eq!(sizes, expected, "slices of {slice} rows");
            assert_eq!(ids, (0..n).collect::<Vec<_>>());
        }
    }

    /// A full load's dropped sequence column is not decoded with its rows (it orders
    /// nothing in a full load) but its first value still tells every slice its kind — even a
    /// slice whose own values are all null; the same file with the column kept, or with a
    /// history table (which keeps each row's start), reads it in full as before.
    #[test]
    fn a_full_loads_dropped_sequence_column_is_sampled_not_decoded() {
        let n = 4_000;
        let ts = StringArray::from_iter((0..n).map(|i| match i < 2_500 {
            true => None,
            false => Some("2024-01-01 00:00:00.000000"),
        }));
        let b = batch(vec![
            ("id", Arc::new(Int64Array::from_iter_values(0..n))),
            ("ts", Arc::new(ts)),
        ]);
        let buf = in_row_groups(&b, 1_000);
        let body = Bytes::from(buf);
        let sampled = "sequence_by = [\"ts\"]\ndrop_columns = [\"ts\"]";
        let history = "sequence_by = [\"ts\"]\ndrop_columns = [\"ts\"]\n[table.history]\ntarget = \"s3://c/t_history\"";
        let kept = "sequence_by = [\"ts\"]";
        for (extra, columns, first_kind) in [
            (sampled, vec!["ts".to_string()], Some(SeqKind::Timestamp)),
            (kept, Vec::new(), None),
        ] {
            let cfg = table(extra);
            let spec = Spec::of(&cfg);
            assert_eq!(spec.sampled_sequence_columns(FileKind::FullLoad), columns);
            assert!(spec.sampled_sequence_columns(FileKind::Cdc).is_empty());
            let mut slices = open_slices(
                "LOAD00000001.parquet",
                body.clone(),
                &cfg,
                None,
                (1_000, 1 << 30),
            )
            .unwrap();
            let mut kinds = Vec::new();
            while let Some(cs) = slices.next_slice().unwrap() {
                kinds.push(cs.seq_kinds[0]);
            }
            // Slices of 1,000 rows, the first two (and half of the third) without a value.
            assert_eq!(kinds[0], first_kind, "{extra}");
            assert_eq!(kinds[3], Some(SeqKind::Timestamp), "{extra}");
        }
        let spec = Spec::of(&table(history));
        assert!(spec.sampled_sequence_columns(FileKind::FullLoad).is_empty());
        let renamed = table(
            "sequence_by = [\"ts\"]\ndrop_columns = [\"ts\"]\nrename_columns = { t = \"ts\" }",
        );
        assert!(Spec::of(&renamed)
            .sampled_sequence_columns(FileKind::FullLoad)
            .is_empty());
    }

    fn floats_dict(keys: Vec<i32>, values: Vec<f64>) -> ArrayRef {
        Arc::new(
            DictionaryArray::<Int32Type>::try_new(
                Int32Array::from(keys),
                Arc::new(Float64Array::from(values)),
            )
            .unwrap(),
        )
    }

    /// Issue #23: a `dictionary<int32, float64>` key column holding NaN merged (NaN keys
    /// that never match again); a plain float64 NaN key was refused. The rule is about the
    /// values, whatever the layout the Parquet file asks for.
    #[test]
    fn a_dictionary_encoded_nan_key_fails_the_file() {
        let cfg = table("");
        let b = batch(vec![
            ("id", floats_dict(vec![1, 0, 1], vec![f64::NAN, 1.0])),
            ("v", Arc::new(StringArray::from(vec!["one", "a", "b"]))),
        ]);
        let parquet = crate::demo::to_parquet(&b).unwrap();
        // The reader hands the column over as the dictionary it was written as.
        let read_back = ::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            parquet.clone(),
        )
        .unwrap();
        assert!(matches!(
            read_back.schema().field_with_name("id").unwrap().data_type(),
            DataType::Dictionary(_, v) if **v == DataType::Float64
        ));
        let e = read("LOAD00000001.parquet", parquet, &cfg, None)
            .expect_err("a NaN key must fail the file")
            .to_string();
        assert!(
            e.contains("LOAD00000001.parquet")
                && e.contains("row 2, column `id`")
                && e.contains("NaN"),
            "{e}"
        );

        // Without NaN the file reads, as plain values: -0.0 and 0.0 are one key.
        let b = batch(vec![("id", floats_dict(vec![0, 1], vec![-0.0, 2.5]))]);
        let cs = read(
            "LOAD00000002.parquet",
            crate::demo::to_parquet(&b).unwrap(),
            &cfg,
            None,
        )
        .unwrap();
        let id = cs.data.column_by_name("id").unwrap();
        assert_eq!(id.data_type(), &DataType::Float64);
        let zero = id.as_primitive::<Float64Type>().value(0);
        assert!(zero == 0.0 && zero.is_sign_positive(), "{zero}");
    }

    /// A dictionary entry that is null is a null key, though the dictionary's keys are all
    /// valid; a run-end encoded or view key column is judged by its values too.
    #[test]
    fn key_rules_judge_decoded_values_in_every_layout() {
        let cfg = table("");
        let file = url("s3://r/t/LOAD00000001.parquet");
        let info = FileInfo {
            url: &file,
            name: "s3://r/t/LOAD00000001.parquet",
            file_name: "LOAD00000001.parquet",
            kind: FileKind::FullLoad,
            generation: 1,
            sampled: &[],
        };
        let change_set = |id: ArrayRef| {
            to_change_set(
                &dms::Dms,
                &info,
                batch(vec![("id", id)]),
                &Spec::of(&cfg),
                0,
            )
        };
        let null_entry: ArrayRef = Arc::new(
            DictionaryArray::<Int32Type>::try_new(
                Int32Array::from(vec![0, 1]),
                Arc::new(Float64Array::from(vec![Some(1.0), None])),
            )
            .unwrap(),
        );
        let e = change_set(null_entry).unwrap_err().to_string();
        assert!(
            e.contains("row 2, column `id`") && e.contains("null"),
            "{e}"
        );

        let ree: ArrayRef = Arc::new(
            RunArray::<Int32Type>::try_new(
                &Int32Array::from(vec![2, 3]),
                &Float64Array::from(vec![1.0, f64::NAN]),
            )
            .unwrap(),
        );
        let e = change_set(ree).unwrap_err().to_string();
        assert!(e.contains("row 3, column `id`") && e.contains("NaN"), "{e}");

        let ree: ArrayRef = Arc::new(
            RunArray::<Int32Type>::try_new(
                &Int32Array::from(vec![2, 3]),
                &Int64Array::from(vec![Some(7), None]),
            )
            .unwrap(),
        );
        let e = change_set(ree).unwrap_err().to_string();
        assert!(
            e.contains("row 3, column `id`") && e.contains("null"),
            "{e}"
        );

        let view: ArrayRef = Arc::new(StringViewArray::from(vec!["a", "b"]));
        let cs = change_set(view).unwrap();
        assert_eq!(
            cs.data.column_by_name("id").unwrap().data_type(),
            &DataType::Utf8
        );
    }

    /// Issue #23, CSV: every CSV value is text parsed into the column's type, so a
    /// zero-padded integer fails the file like any other text would.
    #[test]
    fn a_zero_padded_csv_integer_fails_the_file() {
        let cfg = table(
            "format = \"csv\"\n[table.csv]\nheader = true\ncolumns = [{ name = \"id\", type = \"int64\" }, { name = \"zip\", type = \"int64\" }]\n",
        );
        let e = read(
            "LOAD00000001.csv",
            Bytes::from_static(b"id,zip\n1,2134\n2,007\n"),
            &cfg,
            None,
        )
        .expect_err("007 is not an integer as it is written back")
        .to_string();
        assert!(
            e.contains("row 2, column `zip`") && e.contains("\"007\""),
            "{e}"
        );
        let cs = read(
            "LOAD00000002.csv",
            Bytes::from_static(b"id,zip\n1,2134\n2,-5\n"),
            &cfg,
            None,
        )
        .unwrap();
        let zip = cs.data.column_by_name("zip").unwrap();
        assert_eq!(
            zip.as_primitive::<arrow::datatypes::Int64Type>().values()[..],
            [2134, -5]
        );
    }

    fn csv_table(csv: &str) -> TableConfig {
        table(&format!(
            "sequence_by = [\"ts\"]\nformat = \"csv\"\n[table.csv]\n{csv}columns = [{{ name = \"ts\", type = \"timestamp\" }}, {{ name = \"id\", type = \"int64\" }}, {{ name = \"v\", type = \"string\" }}]\n"
        ))
    }

    /// Issue #23: with DMS `UseCsvNoSupValue`, the `CsvNoSupValue` text of a column the
    /// source did not log was stored as the column's value. It is no value: in a value
    /// column of an update or delete it is null and the row is marked as not carrying the
    /// column; in a key, a sequence column or an insert it fails the file, naming the row,
    /// the column and the text.
    #[test]
    fn a_no_sup_placeholder_is_no_value() {
        let cfg = csv_table("header = false\nno_sup_value = \"__NOSUP__\"\n");
        let cdc = |body: &'static [u8]| {
            read(
                "20240101-0000000001.csv",
                Bytes::from_static(body),
                &cfg,
                None,
            )
        };
        let cs = cdc(b"U,2024-01-01 00:00:01,1,a\nU,2024-01-01 00:00:02,2,__NOSUP__\nD,2024-01-01 00:00:03,3,__NOSUP__\n").unwrap();
        let v = cs.data.column_by_name("v").unwrap().as_string::<i32>();
        assert_eq!(v.iter().collect::<Vec<_>>(), vec![Some("a"), None, None]);
        assert_eq!(cs.absent, vec![("v".to_string(), vec![false, true, true])]);
        assert!(cs.data.column_by_name(ABSENT_COLUMN).is_none());

        let e = cdc(b"U,2024-01-01 00:00:01,__NOSUP__,a\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("20240101-0000000001.csv")
                && e.contains("row 1, column `id`")
                && e.contains("\"__NOSUP__\"")
                && e.contains("primary key"),
            "{e}"
        );
        let parted = TableConfig {
            partition_by: vec!["v".into()],
            ..csv_table("header = false\nno_sup_value = \"__NOSUP__\"\n")
        };
        let e = read(
            "20240101-0000000001.csv",
            Bytes::from_static(b"U,2024-01-01 00:00:01,1,__NOSUP__\n"),
            &parted,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("row 1, column `v`") && e.contains("partition"),
            "{e}"
        );
        let e = cdc(b"U,__NOSUP__,1,a\n").unwrap_err().to_string();
        assert!(
            e.contains("row 1, column `ts`") && e.contains("sequence_by"),
            "{e}"
        );
        let e = cdc(b"U,2024-01-01 00:00:01,1,a\nI,2024-01-01 00:00:01,2,__NOSUP__\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("row 2, column `v`") && e.contains("an insert"),
            "{e}"
        );
        // The text is a value when the table does not say DMS writes it.
        let plain = csv_table("header = false\n");
        let cs = read(
            "20240101-0000000002.csv",
            Bytes::from_static(b"U,2024-01-01 00:00:01,1,__NOSUP__\n"),
            &plain,
            None,
        )
        .unwrap();
        assert_eq!(
            cs.data
                .column_by_name("v")
                .unwrap()
                .as_string::<i32>()
                .value(0),
            "__NOSUP__"
        );
        assert!(cs.absent.is_empty());
    }

    /// Issue #23: a zero-byte CSV file failed with "no `Op` column"; it is called empty.
    #[test]
    fn an_empty_csv_file_fails_as_empty() {
        use std::io::Write;
        for (csv, body) in [
            ("header = true\n", &b""[..]),
            ("header = false\n", &b" \n\r\n"[..]),
        ] {
            let e = read(
                "20240101-0000000001.csv",
                Bytes::copy_from_slice(body),
                &csv_table(csv),
                None,
            )
            .expect_err("an empty file is not a DMS file")
            .to_string();
            assert!(e.contains("the file is empty"), "{e}");
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"").unwrap();
        let e = read(
            "20240101-0000000001.csv.gz",
            Bytes::from(gz.finish().unwrap()),
            &csv_table("header = true\n"),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("empty") && e.contains("decompressed"), "{e}");
        let e = read(
            "20240101-0000000001.csv.gz",
            Bytes::new(),
            &csv_table("header = true\n"),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("the file is empty (zero bytes"), "{e}");
    }

    /// Issue #23: a header row in a file read without one failed as a type error on row 1
    /// (or merged, in text columns); a file without a header read with one said "no `Op`
    /// column". Both say which setting to change.
    #[test]
    fn a_header_row_where_none_is_configured_names_the_setting() {
        let cfg = csv_table("header = false\n");
        let e = read(
            "20240101-0000000001.csv",
            Bytes::from_static(b"Op,ts,id,v\nU,2024-01-01 00:00:01,1,a\n"),
            &cfg,
            None,
        )
        .expect_err("a header is not a change")
        .to_string();
        assert!(
            e.contains("row 1 looks like a header (`Op,ts,id,v`)")
                && e.contains("csv.cdc_header = true"),
            "{e}"
        );
        let load = table(
            "format = \"csv\"\n[table.csv]\nheader = false\ncolumns = [{ name = \"id\", type = \"string\" }, { name = \"v\", type = \"string\" }]\n",
        );
        let e = read(
            "LOAD00000001.csv",
            Bytes::from_static(b"ID, v\n1,a\n"),
            &load,
            None,
        )
        .expect_err("even in text columns")
        .to_string();
        assert!(e.contains("csv.full_load_header = true"), "{e}");

        let cfg = csv_table("header = true\n");
        let e = read(
            "20240101-0000000001.csv",
            Bytes::from_static(b"U,2024-01-01 00:00:01,1,a\n"),
            &cfg,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("reads as a change, not a header") && e.contains("csv.cdc_header = false"),
            "{e}"
        );
    }

    /// A Parquet file of `id int64` and `t int96` (as Spark writes timestamps): a null, then
    /// the INT96 values given as (Julian day, nanoseconds into the day).
    fn int96_file(values: &[(u32, u64)]) -> Bytes {
        use ::parquet::data_type::{Int64Type, Int96, Int96Type};
        use ::parquet::file::writer::SerializedFileWriter;
        let schema = Arc::new(
            ::parquet::schema::parser::parse_message_type(
                "message m { required int64 id; optional int96 t; }",
            )
            .unwrap(),
        );
        let mut out = Vec::new();
        let mut w = SerializedFileWriter::new(&mut out, schema, Default::default()).unwrap();
        let mut rg = w.next_row_group().unwrap();
        // A null first: the rows of values are counted with their definition levels.
        let ids: Vec<i64> = (1..=values.len() as i64 + 1).collect();
        let mut c = rg.next_column().unwrap().unwrap();
        c.typed::<Int64Type>()
            .write_batch(&ids, None, None)
            .unwrap();
        c.close().unwrap();
        let ts: Vec<Int96> = values
            .iter()
            .map(|&(day, nanos)| {
                let mut v = Int96::new();
                v.set_data(nanos as u32, (nanos >> 32) as u32, day);
                v
            })
            .collect();
        let defs: Vec<i16> = std::iter::once(0).chain(ts.iter().map(|_| 1)).collect();
        let mut c = rg.next_column().unwrap().unwrap();
        c.typed::<Int96Type>()
            .write_batch(&ts, Some(&defs), None)
            .unwrap();
        c.close().unwrap();
        rg.close().unwrap();
        w.close().unwrap();
        Bytes::from(out)
    }

    /// Issue #23: INT96 timestamps (Spark, Hive, Impala) outside 1677..2262 were refused
    /// with an instant the file does not hold (`9999-12-31 23:59:59` as `1816-03-30…`, a
    /// wrap in the nanosecond read). They are read as microseconds, exactly; digits below
    /// the microsecond still fail the file, naming the row, the column and the instant.
    #[test]
    fn int96_timestamps_read_exactly_and_sub_microsecond_digits_fail() {
        use arrow::datatypes::TimestampMicrosecondType;
        let cfg = table("");
        // 9999-12-31 23:59:59 and 2024-01-01 00:00:00.000001.
        let end_of_time = (2_440_588 + 2_932_896, 86_399 * 1_000_000_000);
        let micro = (2_440_588 + 19_723, 1_000);
        let cs = read(
            "LOAD00000001.parquet",
            int96_file(&[end_of_time, micro]),
            &cfg,
            None,
        )
        .unwrap();
        let t = cs.data.column_by_name("t").unwrap();
        let t = t.as_primitive::<TimestampMicrosecondType>();
        assert!(t.is_null(0));
        assert_eq!(t.value(1), 253_402_300_799_000_000);
        assert_eq!(t.value(2), 1_704_067_200_000_001);

        let nano = (2_440_588 + 19_723, 1);
        let e = read(
            "LOAD00000002.parquet",
            int96_file(&[micro, nano]),
            &cfg,
            None,
        )
        .expect_err("a nanosecond is not truncated")
        .to_string();
        assert!(
            e.contains("LOAD00000002.parquet")
                && e.contains("row 3, column `t`")
                && e.contains("2024-01-01 00:00:00.000000001")
                && e.contains("below the microsecond"),
            "{e}"
        );
    }

    /// Issue #23: a zero-byte Parquet file says it is empty.
    #[test]
    fn an_empty_parquet_file_fails_as_empty() {
        let e = read("LOAD00000001.parquet", Bytes::new(), &table(""), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("the file is empty (zero bytes)"), "{e}");
    }

    #[test]
    fn classification_fails_unknown_files_and_ignores_only_folder_markers() {
        let p = Format::Parquet;
        let csv = Format::Csv(CsvOptions {
            full_load_header: true,
            cdc_header: true,
            delimiter: b',',
            quote: b'"',
            null_value: "NULL".into(),
            no_sup_value: None,
            include_op_for_full_load: false,
            columns: vec![],
        });
        assert_eq!(
            classify(&url("s3://b/t/x.parquet"), &p),
            Ok(FileClass::Data)
        );
        assert_eq!(
            classify(&url("s3://b/t/20240101-1.csv.gz"), &csv),
            Ok(FileClass::Data)
        );
        assert_eq!(
            classify(&url("s3://b/t/LOAD00000001.CSV"), &csv),
            Ok(FileClass::Data)
        );
        assert!(matches!(
            classify(&url("s3://b/t/2024/"), &p),
            Ok(FileClass::NotData(_))
        ));
        assert!(matches!(
            classify(&url("s3://b/t/x_$folder$"), &p),
            Ok(FileClass::NotData(_))
        ));
        assert!(classify(&url("s3://b/t/x.csv.gz"), &p)
            .unwrap_err()
            .contains("format"));
        assert!(classify(&url("s3://b/t/x.parquet"), &csv).is_err());
        assert!(classify(&url("s3://b/t/notes.txt"), &p).is_err());
        assert!(classify(&url("s3://b/t/x.json.gz"), &csv).is_err());
    }
}
