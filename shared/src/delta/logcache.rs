//! A cache of Delta log files, in front of the object store delta-rs reads tables through.
//!
//! delta-rs reads every commit file since the last checkpoint, and the checkpoint, each time
//! it loads or brings a table forward — and in deltalake 1.1 a load reads the commits twice
//! and the checkpoint's footer and columns in several requests (one merge made 6 commit GETs
//! twice and 11 checkpoint GETs to load a table). Commit files (`<version>.json`) and
//! checkpoints (`<version>.checkpoint[.<part>.<parts>].parquet`) never change once written,
//! so a warm function instance keeps them in memory (up to `TRIBUTARY_LOG_CACHE_MB`,
//! default 64): a load then fetches only the commits it has not seen, and a commit this
//! instance wrote (kept when its PUT succeeds) is not fetched back at all.
//!
//! Safety against a table deleted and created again at the same place (a new `0.json`
//! under an old name): a cached file is served only when the newest listing of its
//! `_delta_log` — delta-rs lists the log before it reads any commit or checkpoint — shows
//! the same size and ETag as the cached copy. A file not listed since, or listed
//! differently, is fetched again. `_last_checkpoint` and every other object pass through.
//!
//! It also keeps the data files of the tables it is told to ([`LogCache::keep_data_files_of`]:
//! the tombstone tables, small and append-only, which every merge reads whole). A data file
//! is named by its writer with a fresh UUID and never written again, so a copy is served
//! without a listing; one written through the cache is kept from its PUT. Without this,
//! every merge read every tombstone file written since the last maintenance run, five GETs
//! each, one more file per merge with deletes (docs/benchmarks.md, "Freshness").

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

/// Largest file kept (larger checkpoints are read as delta-rs reads them). A table's
/// records of applied files make its checkpoint a few MB (~78 bytes a record; docs/design.md,
/// "Re-uploaded CDC files"): over the limit, every load fetches it again (+14 GETs).
const MAX_ENTRY_BYTES: u64 = 24 * 1024 * 1024;
/// Listed sizes and ETags kept at most (forgotten all at once beyond: only hits are lost).
const MAX_LISTED: usize = 200_000;

/// Whether `path` is an immutable Delta log file: a commit or a classic checkpoint (part).
pub(crate) fn immutable_log_file(path: &Path) -> bool {
    let s = path.as_ref();
    let Some((dir, name)) = s.rsplit_once('/') else {
        return false;
    };
    if !(dir == "_delta_log" || dir.ends_with("/_delta_log")) {
        return false;
    }
    let (version, rest) = name.split_at(name.len().min(20));
    if version.len() != 20 || !version.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    if rest == ".json" || rest == ".checkpoint.parquet" {
        return true;
    }
    // Multi-part checkpoint: `.checkpoint.<part>.<parts>.parquet`, both numbers digits.
    rest.strip_prefix(".checkpoint.")
        .and_then(|r| r.strip_suffix(".parquet"))
        .and_then(|r| r.split_once('.'))
        .is_some_and(|(a, b)| {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        })
}

/// An ETag without quotes or weak marker (S3 and emulators differ between requests).
fn tag(meta: &ObjectMeta) -> Option<(u64, String)> {
    let e = meta.e_tag.as_deref()?;
    let e = e.trim_start_matches("W/").trim_matches('"');
    Some((meta.size, e.to_string()))
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<Path, (Bytes, ObjectMeta)>,
    order: VecDeque<Path>,
    bytes: u64,
    /// Size and ETag of each log file in the newest listing that showed it.
    listed: HashMap<Path, (u64, String)>,
    hits: u64,
    misses: u64,
    /// Roots (`<path>/`) of the tables whose data files are kept.
    data_roots: Vec<String>,
}

impl State {
    fn remove(&mut self, path: &Path) {
        if let Some((data, _)) = self.entries.remove(path) {
            self.bytes -= data.len() as u64;
        }
        self.listed.remove(path);
    }

    /// Whether `path` is a data file of a table whose data files are kept: a Parquet file
    /// below its root, outside `_delta_log`, named as delta-rs names the files it writes.
    fn kept_data_file(&self, path: &Path) -> bool {
        let s = path.as_ref();
        self.data_roots.iter().any(|root| {
            s.strip_prefix(root.as_str()).is_some_and(|rest| {
                let name = rest.rsplit('/').next().unwrap_or(rest);
                !rest.starts_with("_delta_log/")
                    && name.starts_with("part-")
                    && name.ends_with(".parquet")
            })
        })
    }

    fn valid(&self, path: &Path) -> Option<(Bytes, ObjectMeta)> {
        let (data, meta) = self.entries.get(path)?;
        if self.kept_data_file(path) {
            return Some((data.clone(), meta.clone()));
        }
        let listed = self.listed.get(path)?;
        (tag(meta).as_ref() == Some(listed)).then(|| (data.clone(), meta.clone()))
    }

    fn insert(&mut self, path: &Path, data: Bytes, meta: ObjectMeta, total: u64) {
        if tag(&meta).is_none() || data.len() as u64 > MAX_ENTRY_BYTES.min(total) {
            return;
        }
        if let Some((old, _)) = self.entries.remove(path) {
            self.bytes -= old.len() as u64;
        }
        while self.bytes + data.len() as u64 > total {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some((old, _)) = self.entries.remove(&oldest) {
                self.bytes -= old.len() as u64;
            }
        }
        self.bytes += data.len() as u64;
        self.order.push_back(path.clone());
        self.entries.insert(path.clone(), (data, meta));
    }

    fn saw(&mut self, meta: &ObjectMeta) {
        if !immutable_log_file(&meta.location) {
            return;
        }
        if self.listed.len() >= MAX_LISTED {
            self.listed.clear();
        }
        match tag(meta) {
            Some(t) => self.listed.insert(meta.location.clone(), t),
            None => self.listed.remove(&meta.location),
        };
    }
}

/// Counters of a [`LogCache`]: files served from memory and fetched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogCacheStats {
    pub hits: u64,
    pub misses: u64,
    pub bytes: u64,
}

/// An object store that keeps immutable Delta log files in memory (see the module).
#[derive(Clone)]
pub struct LogCache {
    inner: Arc<dyn ObjectStore>,
    state: Arc<Mutex<State>>,
    total: u64,
}

impl fmt::Debug for LogCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LogCache({:?})", self.inner)
    }
}

impl fmt::Display for LogCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LogCache({})", self.inner)
    }
}

/// No precondition or version: a plain read the cache may answer.
fn plain(o: &GetOptions) -> bool {
    o.if_match.is_none()
        && o.if_none_match.is_none()
        && o.if_modified_since.is_none()
        && o.if_unmodified_since.is_none()
        && o.version.is_none()
}

fn generic(e: impl std::error::Error + Send + Sync + 'static) -> object_store::Error {
    object_store::Error::Generic {
        store: "LogCache",
        source: Box::new(e),
    }
}

impl LogCache {
    /// A cache of at most `total` bytes in front of `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>, total: u64) -> Self {
        LogCache {
            inner,
            state: Arc::default(),
            total,
        }
    }

    /// Keep the data files of the table at `root` (a path of this store) once read or
    /// written: a small append-only table read whole by every merge (see the module).
    pub(crate) fn keep_data_files_of(&self, root: &str) {
        let root = format!("{}/", root.trim_end_matches('/'));
        self.with(|s| {
            if !s.data_roots.contains(&root) {
                if s.data_roots.len() >= MAX_LISTED {
                    s.data_roots.clear();
                }
                s.data_roots.push(root);
            }
        });
    }

    /// Whether the cache may answer reads of `path`.
    fn cacheable(&self, path: &Path) -> bool {
        self.total > 0
            && (immutable_log_file(path) || self.with(|s| s.kept_data_file(path)).unwrap_or(false))
    }

    pub fn stats(&self) -> LogCacheStats {
        self.state
            .lock()
            .map(|s| LogCacheStats {
                hits: s.hits,
                misses: s.misses,
                bytes: s.bytes,
            })
            .unwrap_or_default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> Option<T> {
        self.state.lock().ok().map(|mut s| f(&mut s))
    }

    /// The whole file, from memory when the cached copy is the listed one, else fetched
    /// (and kept). `None` when the file is too large to keep.
    async fn whole(&self, location: &Path) -> object_store::Result<Option<(Bytes, ObjectMeta)>> {
        if let Some(Some(hit)) = self.with(|s| {
            let hit = s.valid(location);
            if hit.is_some() {
                s.hits += 1;
            }
            hit
        }) {
            return Ok(Some(hit));
        }
        // Listed too large to keep: read as asked, without a whole-file fetch first.
        let limit = MAX_ENTRY_BYTES.min(self.total);
        if self
            .with(|s| s.listed.get(location).is_some_and(|(n, _)| *n > limit))
            .unwrap_or(false)
        {
            return Ok(None);
        }
        let got = self.inner.get_opts(location, GetOptions::default()).await?;
        if got.meta.size > limit {
            return Ok(None);
        }
        let meta = got.meta.clone();
        let data = got.bytes().await?;
        self.with(|s| {
            s.misses += 1;
            s.insert(location, data.clone(), meta.clone(), self.total)
        });
        Ok(Some((data, meta)))
    }

    fn record<'a>(
        &self,
        listing: BoxStream<'a, object_store::Result<ObjectMeta>>,
    ) -> BoxStream<'a, object_store::Result<ObjectMeta>> {
        let state = self.state.clone();
        listing
            .map(move |m| {
                if let (Ok(meta), Ok(mut s)) = (&m, state.lock()) {
                    s.saw(meta);
                }
                m
            })
            .boxed()
    }

    fn forget(&self, path: &Path) {
        self.with(|s| s.remove(path));
    }
}

#[async_trait::async_trait]
impl ObjectStore for LogCache {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let log_file = immutable_log_file(location);
        // Anything but a log file or a kept table's data file passes through.
        if !log_file && !self.cacheable(location) {
            return self.inner.put_opts(location, payload, opts).await;
        }
        self.forget(location);
        if payload.content_length() as u64 > MAX_ENTRY_BYTES.min(self.total) {
            return self.inner.put_opts(location, payload, opts).await;
        }
        let data: Bytes = payload.clone().into();
        let put = self.inner.put_opts(location, payload, opts).await?;
        let meta = ObjectMeta {
            location: location.clone(),
            last_modified: chrono::Utc::now(),
            size: data.len() as u64,
            e_tag: put.e_tag.clone(),
            version: put.version.clone(),
        };
        self.with(|s| s.insert(location, data, meta, self.total));
        Ok(put)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.forget(location);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if !plain(&options) || !self.cacheable(location) {
            return self.inner.get_opts(location, options).await;
        }
        let Some((data, meta)) = self.whole(location).await? else {
            return self.inner.get_opts(location, options).await;
        };
        let range = match &options.range {
            Some(r) => r.as_range(meta.size).map_err(generic)?,
            None => 0..meta.size,
        };
        let body = match options.head {
            true => Bytes::new(),
            false => data.slice(range.start as usize..range.end as usize),
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(
                futures::stream::once(async move { Ok(body) }).boxed(),
            ),
            meta,
            range,
            attributes: Default::default(),
        })
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        if !self.cacheable(location) {
            return self.inner.get_ranges(location, ranges).await;
        }
        let Some((data, meta)) = self.whole(location).await? else {
            return self.inner.get_ranges(location, ranges).await;
        };
        ranges
            .iter()
            .map(|r| {
                let r = object_store::GetRange::Bounded(r.clone())
                    .as_range(meta.size)
                    .map_err(generic)?;
                Ok(data.slice(r.start as usize..r.end as usize))
            })
            .collect()
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let state = self.state.clone();
        let locations = locations
            .map(move |p| {
                if let (Ok(p), Ok(mut s)) = (&p, state.lock()) {
                    s.remove(p);
                }
                p
            })
            .boxed();
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.record(self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.record(self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let listed = self.inner.list_with_delimiter(prefix).await?;
        self.with(|s| listed.objects.iter().for_each(|m| s.saw(m)));
        Ok(listed)
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.forget(to);
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.forget(from);
        self.forget(to);
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::testing::Counting;
    use futures::TryStreamExt;
    use object_store::local::LocalFileSystem;
    use object_store::ObjectStoreExt;

    #[test]
    fn only_commits_and_classic_checkpoints_are_immutable() {
        let yes = [
            "t/_delta_log/00000000000000000007.json",
            "_delta_log/00000000000000000010.checkpoint.parquet",
            "a/b/_delta_log/00000000000000000010.checkpoint.0000000001.0000000002.parquet",
        ];
        let no = [
            "t/_delta_log/_last_checkpoint",
            "t/_delta_log/00000000000000000007.crc",
            "t/_delta_log/0000000000000000007.json",
            "t/_delta_log/_commit_00000000000000000007.json.tmp",
            "t/_delta_log/00000000000000000010.checkpoint.80a083e8-8c31-4bbc-a3a4-2a54c4b2d6e7.parquet",
            "t/part-00000.parquet",
            "t/x_delta_log/00000000000000000007.json",
        ];
        for p in yes {
            assert!(immutable_log_file(&Path::from(p)), "{p}");
        }
        for p in no {
            assert!(!immutable_log_file(&Path::from(p)), "{p}");
        }
    }

    /// A kept table's data files are fetched at most once (none when written through the
    /// cache); other tables' data files and the kept table's other objects pass through.
    #[tokio::test]
    async fn a_kept_tables_data_files_are_fetched_once_and_others_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let below = Arc::new(Counting::new(Arc::new(
            LocalFileSystem::new_with_prefix(dir.path()).unwrap(),
        )));
        let cache = LogCache::new(below.clone(), 1024 * 1024);
        let name = "part-00000-0b0e2c7a-2f7e-4c55-9a39-1d3a3b8d3f00-c000.snappy.parquet";
        let old = Path::from(format!("t/_tributary_tombstones/{name}"));
        let new = Path::from(format!(
            "t/_tributary_tombstones/{}",
            name.replace("0b0e", "1c1f")
        ));
        let main = Path::from(format!("t/{name}"));
        let other = Path::from("t/_tributary_tombstones/_delta_log/_last_checkpoint");
        for p in [&old, &main, &other] {
            below.put(p, "rows".into()).await.unwrap();
        }
        cache.keep_data_files_of("t/_tributary_tombstones");
        cache.put(&new, "written here".into()).await.unwrap();
        for _ in 0..3 {
            assert_eq!(
                cache.get(&old).await.unwrap().bytes().await.unwrap(),
                "rows"
            );
            assert_eq!(cache.get_range(&old, 1..3).await.unwrap(), "ow");
            assert_eq!(
                cache.get_ranges(&new, &[0..7, 8..12]).await.unwrap(),
                vec![Bytes::from("written"), Bytes::from("here")]
            );
            cache.get(&main).await.unwrap();
            cache.get(&other).await.unwrap();
        }
        assert_eq!(
            below.gets(),
            1 + 3 + 3,
            "the kept file once, the others each time"
        );
        cache.delete(&old).await.unwrap();
        assert!(
            cache.get(&old).await.is_err(),
            "deleted through the cache: gone"
        );
    }

    #[tokio::test]
    async fn a_listed_log_file_is_read_once_and_a_recreated_one_again() {
        let dir = tempfile::tempdir().unwrap();
        let below = Arc::new(Counting::new(Arc::new(
            LocalFileSystem::new_with_prefix(dir.path()).unwrap(),
        )));
        let cache = LogCache::new(below.clone(), 1024 * 1024);
        let gets = || below.gets();
        let commit = Path::from("t/_delta_log/00000000000000000000.json");
        let other = Path::from("t/_delta_log/_last_checkpoint");
        let log = Path::from("t/_delta_log");
        let list = |c: &LogCache| {
            let c = c.clone();
            let log = log.clone();
            async move { c.list(Some(&log)).try_collect::<Vec<_>>().await.unwrap() }
        };
        cache.put(&commit, "first".into()).await.unwrap();
        cache.put(&other, "{}".into()).await.unwrap();
        // Written here but not listed since: fetched.
        assert_eq!(
            cache.get(&commit).await.unwrap().bytes().await.unwrap(),
            "first"
        );
        assert_eq!(gets(), 1);
        list(&cache).await;
        for _ in 0..3 {
            assert_eq!(
                cache.get(&commit).await.unwrap().bytes().await.unwrap(),
                "first"
            );
            assert_eq!(cache.get_range(&commit, 1..3).await.unwrap(), "ir");
            assert_eq!(
                cache.get_ranges(&commit, &[0..1, 4..5]).await.unwrap(),
                vec![Bytes::from("f"), Bytes::from("t")]
            );
            cache.get(&other).await.unwrap();
        }
        assert_eq!(
            gets(),
            4,
            "the commit from memory, _last_checkpoint each time"
        );
        // The table deleted and created again by another writer (below the cache).
        below.delete(&commit).await.unwrap();
        below.put(&commit, "second!".into()).await.unwrap();
        list(&cache).await;
        assert_eq!(
            cache.get(&commit).await.unwrap().bytes().await.unwrap(),
            "second!"
        );
        assert_eq!(gets(), 5, "a file listed differently is fetched again");
        assert_eq!(
            cache.get(&commit).await.unwrap().bytes().await.unwrap(),
            "second!"
        );
        assert_eq!(gets(), 5);
        // Deleted through the cache: gone.
        cache.delete(&commit).await.unwrap();
        list(&cache).await;
        assert!(cache.get(&commit).await.is_err());
        assert_eq!(cache.stats().bytes, 0);
    }
}
