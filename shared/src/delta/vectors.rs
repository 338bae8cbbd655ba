//! Deletion vectors written (merge-on-read, `deletion_vectors = true`): the rows a merge
//! replaces or deletes in a data file marked in the file's vector instead of rewriting it.
//!
//! The protocol's format exactly, by the Delta kernel's writer (the RoaringBitmapArray
//! "portable" serialisation of a `roaring` treemap behind its magic number; in a file: a
//! version byte, then per vector its size, the bitmap and a CRC-32 of it). A vector of at
//! most [`INLINE_BYTES`] goes inline in the log (`storageType = "i"`: the bytes Base85 / Z85
//! encoded, padded to a multiple of four as Delta's `Base85Codec` pads them, `sizeInBytes`
//! unpadded); the others of one merge share one `deletion_vector_<uuid>.bin` at the table's
//! root (`storageType = "u"`, the UUID Z85 encoded), one PUT per merge. A file's new vector
//! holds its old one's rows too, and replaces it by a `remove` of the file with the old
//! descriptor and an `add` of the same path with the new one; the file's statistics are
//! kept with `tightBounds = false` (its minimum and maximum may be deleted rows' now).

use std::sync::Arc;

use deltalake::kernel::{Action, DeletionVectorDescriptor, LogicalFileView, StorageType};
use object_store::ObjectStoreExt;

use crate::error::{Error, Result};

/// Vectors up to this many bytes (magic number and bitmap) are written inline in the log:
/// no object to PUT, and none for a reader to GET per data file. A vector grows with the
/// merges that mark the file (about two bytes a row while its rows are sparse), so an
/// often-changed file's moves to a file; every checkpoint carries the inline ones.
const INLINE_BYTES: usize = 1024;

/// The share of a file's rows its deletion vector may delete before maintenance rewrites
/// the file without them: Delta's OPTIMIZE default (`maxDeletedRowsRatio`, 0.05). Below it a
/// file that is not small keeps its vector (rewriting 100 MB to drop a few rows is the cost
/// merge-on-read avoids); small files are compacted, and so materialised, anyway.
pub(crate) const MATERIALISE_SHARE: f64 = 0.05;

/// Whether a file of `rows` rows (unknown: yes) whose vector deletes `deleted` of them is
/// rewritten without them by maintenance.
pub(crate) fn materialise(deleted: u64, rows: Option<u64>) -> bool {
    deleted > 0 && rows.is_none_or(|n| deleted as f64 > MATERIALISE_SHARE * n as f64)
}

/// The RoaringBitmapArray format's magic number (little-endian before the bitmap).
const MAGIC: u32 = 1_681_511_377;

/// Write the vectors of `files` (each with every row its new vector deletes) and return the
/// actions that commit them: per file a `remove` with its old descriptor and an `add` of the
/// same path with the new one.
pub(crate) async fn write(
    store: &Arc<dyn deltalake::ObjectStore>,
    label: &str,
    files: Vec<(LogicalFileView, roaring::RoaringTreemap)>,
) -> Result<Vec<Action>> {
    use delta_kernel::actions::deletion_vector_writer::{
        KernelDeletionVector, StreamingDeletionVectorWriter,
    };
    if files.is_empty() {
        return Ok(Vec::new());
    }
    let err = |m: String| Error::internal(format!("table {label}: deletion vector: {m}"));
    let uuid = uuid::Uuid::new_v4();
    let mut bytes: Vec<u8> = Vec::new();
    let mut writer = StreamingDeletionVectorWriter::new(&mut bytes);
    let mut actions = Vec::with_capacity(files.len() * 2);
    let mut in_file = 0usize;
    for (f, deleted) in files {
        let cardinality = deleted.len() as i64;
        let size = 4 + deleted.serialized_size();
        let descriptor = if size <= INLINE_BYTES {
            let mut data = Vec::with_capacity(size + 3);
            data.extend_from_slice(&MAGIC.to_le_bytes());
            deleted
                .serialize_into(&mut data)
                .map_err(|e| err(e.to_string()))?;
            let size_in_bytes = data.len() as i32;
            data.resize(data.len().div_ceil(4) * 4, 0);
            DeletionVectorDescriptor {
                storage_type: StorageType::Inline,
                path_or_inline_dv: z85::encode(&data),
                offset: None,
                size_in_bytes,
                cardinality,
            }
        } else {
            let mut dv = KernelDeletionVector::new();
            dv.add_deleted_row_indexes(deleted.iter());
            let w = writer
                .write_deletion_vector(dv)
                .map_err(|e| err(e.to_string()))?;
            in_file += 1;
            DeletionVectorDescriptor {
                storage_type: StorageType::UuidRelativePath,
                path_or_inline_dv: z85::encode(uuid.as_bytes()),
                offset: Some(w.offset),
                size_in_bytes: w.size_in_bytes,
                cardinality: w.cardinality,
            }
        };
        actions.push(Action::Remove(f.remove_action(true)));
        #[allow(
            deprecated,
            reason = "the file's add as logged, to re-add it with a vector"
        )]
        let mut add = f.add_action();
        add.deletion_vector = Some(descriptor);
        add.data_change = true;
        add.stats = add.stats.as_deref().map(loose).transpose()?;
        actions.push(Action::Add(add));
    }
    writer.finalize().map_err(|e| err(e.to_string()))?;
    if in_file > 0 {
        let path = object_store::path::Path::from(file_name(&uuid));
        store
            .put(&path, bytes.into())
            .await
            .map_err(|e| Error::delta(label, e.into()))?;
    }
    Ok(actions)
}

/// The name of a vector file at the table's root, as readers derive it from the UUID.
fn file_name(uuid: &uuid::Uuid) -> String {
    format!("deletion_vector_{uuid}.bin")
}

/// A file's statistics once a vector deletes some of its rows: `numRecords` still counts the
/// file's rows (as the protocol asks), the bounds and null counts are no longer tight.
fn loose(stats: &str) -> Result<String> {
    let mut v: serde_json::Value = serde_json::from_str(stats)
        .map_err(|e| Error::internal(format!("a data file's statistics: {e}")))?;
    if let Some(m) = v.as_object_mut() {
        m.insert("tightBounds".into(), serde_json::Value::Bool(false));
    }
    Ok(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An inline vector decodes (as the kernel and Spark decode one: Z85, then the magic
    /// number and the bitmap) to the rows written; a large one goes to a file.
    #[test]
    fn an_inline_vector_is_the_magic_number_and_the_bitmap() {
        let deleted: roaring::RoaringTreemap =
            [1u64, 5, 9, 70_000, 5_000_000_000].into_iter().collect();
        let mut data = MAGIC.to_le_bytes().to_vec();
        deleted.serialize_into(&mut data).unwrap();
        let n = data.len();
        data.resize(n.div_ceil(4) * 4, 0);
        let encoded = z85::encode(&data);
        let decoded = z85::decode(&encoded).unwrap();
        assert_eq!(u32::from_le_bytes(decoded[..4].try_into().unwrap()), MAGIC);
        let back = roaring::RoaringTreemap::deserialize_from(&decoded[4..]).unwrap();
        assert_eq!(back, deleted);
        assert!(4 + deleted.serialized_size() <= INLINE_BYTES);
    }

    #[test]
    fn loose_statistics_keep_the_counts_and_say_the_bounds_are_wide() {
        let s = loose(
            r#"{"numRecords":10,"minValues":{"id":1},"maxValues":{"id":9},"nullCount":{"id":0}}"#,
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["numRecords"], 10);
        assert_eq!(v["tightBounds"], false);
        assert_eq!(v["minValues"]["id"], 1);
    }
}
