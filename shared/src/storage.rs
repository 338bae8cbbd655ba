//! Storage access for raw CDC files, manifests and the config file: `file://` and `s3://`
//! URIs through `object_store` (the same client stack delta-rs uses for the tables).
//! `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`) points everything at an emulator.
//!
//! One rule for keys and URLs: a URL's path is the object key percent-encoded once (as
//! [`Url::from_file_path`] and [`s3_url`] build it), and [`object_path`] decodes it once. A
//! key may contain any character, `%` included.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::ObjectStore;
use object_store::{
    GetResultPayload, ObjectMeta, ObjectStoreExt, PutMode, PutOptions, UpdateVersion,
};
use percent_encoding::percent_decode_str;
use tokio::io::AsyncWriteExt;
use url::Url;

use crate::error::{Error, Result};
use crate::tuning::Tuning;

/// Objects larger than this are not held in memory: they are streamed to a temporary file
/// and read from there in slices.
pub(crate) const SPILL_BYTES: u64 = 64 * 1024 * 1024;

/// Local files (the CLI's) up to this size are read into memory whole; larger ones where
/// they are.
pub(crate) const LOCAL_WHOLE_BYTES: u64 = 8 * 1024 * 1024;

/// Builds and caches one object store per bucket (or one for the local file system).
#[derive(Debug, Default)]
pub struct Storage {
    stores: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
    /// Objects larger than this are spilled to local disk (`None`: [`SPILL_BYTES`]).
    spill_bytes: Option<u64>,
    /// The object-store options (endpoint, region: [`crate::tuning::StoreSettings`]),
    /// shared with the Delta tables' stores.
    options: HashMap<String, String>,
}

/// Decode a URL path component once.
pub fn percent_decode(s: &str) -> String {
    percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// Object path (within its store) of a `file://` or `s3://` URL: the key, decoded once.
pub(crate) fn object_path(url: &Url) -> Result<Path> {
    let decoded = percent_decode(url.path().trim_start_matches('/'));
    Path::parse(decoded).map_err(|e| Error::storage(url.as_str(), e.into()))
}

/// Build an `s3://bucket/key` URL from a decoded object key (any characters).
pub fn s3_url(bucket: &str, key: &str) -> Result<Url> {
    let mut u = Url::parse(&format!("s3://{bucket}/"))
        .map_err(|e| Error::config("event", format!("invalid bucket name {bucket:?}: {e}")))?;
    set_key(&mut u, key);
    Ok(u)
}

/// Replace a URL's path with `key`, each segment percent-encoded (so that [`object_path`]
/// gives the key back exactly).
fn set_key(u: &mut Url, key: &str) {
    u.set_path("/");
    if let Ok(mut segments) = u.path_segments_mut() {
        segments.clear().extend(key.split('/'));
    }
}

/// The last path segment (file name) of a URL, decoded.
pub fn file_name(url: &Url) -> String {
    percent_decode(url.path().rsplit('/').next().unwrap_or(""))
}

/// A URL for display: scheme, bucket and decoded key.
pub fn display(url: &Url) -> String {
    match url.scheme() {
        "file" => percent_decode(url.path()),
        _ => format!(
            "{}://{}{}",
            url.scheme(),
            url.host_str().unwrap_or(""),
            percent_decode(url.path())
        ),
    }
}

/// `base` + `/name` for a URL without a trailing slash (`name` is a decoded key segment).
pub(crate) fn join(base: &Url, name: &str) -> Url {
    let mut u = base.clone();
    if let Ok(mut segments) = u.path_segments_mut() {
        segments.pop_if_empty().push(name);
    }
    u
}

/// An object under a listed prefix.
/// A small object read with its version tag, for a conditional write after it
/// ([`Storage::put_if`]).
#[derive(Debug, Clone)]
pub(crate) struct Tagged {
    pub(crate) body: Bytes,
    /// The ETag (`None` when the store gives none).
    pub(crate) tag: Option<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct Listed {
    pub(crate) url: Url,
    pub(crate) last_modified: chrono::DateTime<chrono::Utc>,
}

impl Storage {
    /// The storage of the environment's tuning ([`Tuning::from_env_or_default`]).
    pub fn new() -> Self {
        Self::with_tuning(&Tuning::from_env_or_default())
    }

    /// The storage of `tuning`: objects larger than its `spill_bytes` are spilled to local
    /// disk (default [`SPILL_BYTES`]); S3 is reached as its `store` says.
    pub fn with_tuning(tuning: &Tuning) -> Self {
        Storage {
            spill_bytes: tuning.spill_bytes,
            options: tuning.store.options(),
            ..Self::default()
        }
    }

    /// The object-store options the tables are opened with (delta-rs's storage options).
    pub(crate) fn options(&self) -> &HashMap<String, String> {
        &self.options
    }

    /// The object store that serves `url`.
    pub(crate) fn store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        let key = match url.scheme() {
            "file" => "file://".to_string(),
            "s3" | "s3a" => format!("s3://{}", url.host_str().unwrap_or("")),
            other => {
                return Err(Error::config(
                    url.as_str(),
                    format!("unsupported URI scheme `{other}`; use s3:// or file://"),
                ))
            }
        };
        let mut stores = self
            .stores
            .lock()
            .map_err(|_| Error::internal("storage cache lock poisoned"))?;
        if let Some(s) = stores.get(&key) {
            return Ok(s.clone());
        }
        let store: Arc<dyn ObjectStore> = if url.scheme() == "file" {
            Arc::new(LocalFileSystem::new())
        } else {
            let mut b = AmazonS3Builder::from_env().with_bucket_name(url.host_str().unwrap_or(""));
            for (k, v) in &self.options {
                if let Ok(k) = k.to_ascii_lowercase().parse() {
                    b = b.with_config(k, v);
                }
            }
            Arc::new(b.build().map_err(|e| Error::storage(url.as_str(), e))?)
        };
        stores.insert(key, store.clone());
        Ok(store)
    }

    /// The object's version tag (ETag, or what the local file system derives from the file),
    /// `None` when the store gives none.
    pub async fn version_tag(&self, url: &Url) -> Result<Option<String>> {
        let store = self.store(url)?;
        let path = object_path(url)?;
        let meta = store
            .head(&path)
            .await
            .map_err(|e| Error::storage(display(url), e))?;
        Ok(meta.e_tag.or_else(|| {
            Some(format!(
                "{}-{}",
                meta.last_modified.timestamp_micros(),
                meta.size
            ))
        }))
    }

    /// Read a whole object into memory.
    pub async fn get(&self, url: &Url) -> Result<Bytes> {
        let store = self.store(url)?;
        let path = object_path(url)?;
        store
            .get(&path)
            .await
            .map_err(|e| Error::storage(display(url), e))?
            .bytes()
            .await
            .map_err(|e| Error::storage(display(url), e))
    }

    /// Fetch an object with its last-modified time: a local file (`file://`) read where it
    /// is; a remote object in memory up to [`SPILL_BYTES`], a larger one streamed to a local
    /// temporary file (`TMPDIR`; Lambda's ephemeral storage) — so that memory never holds a
    /// large file whole.
    pub(crate) async fn get_file(&self, url: &Url) -> Result<RawFile> {
        let store = self.store(url)?;
        let path = object_path(url)?;
        let res = store
            .get(&path)
            .await
            .map_err(|e| Error::storage(display(url), e))?;
        let last_modified = Some(res.meta.last_modified);
        let size = res.meta.size;
        // A local file of more than a few megabytes is read where it is: reading it into
        // memory first only delays its first slice (the footer says which byte ranges are
        // needed). A small one is read whole, in one read, as a fetched object is.
        let limit = match res.payload {
            GetResultPayload::File(..) => LOCAL_WHOLE_BYTES,
            GetResultPayload::Stream(_) => SPILL_BYTES,
        };
        let limit = self.spill_bytes.map_or(limit, |spill| spill.min(limit));
        if size <= limit {
            let bytes = res
                .bytes()
                .await
                .map_err(|e| Error::storage(display(url), e))?;
            return Ok(RawFile {
                body: Body::Memory(bytes),
                last_modified,
                digest: None,
            });
        }
        let body = match res.payload {
            GetResultPayload::File(_, local) => Body::Disk {
                path: local,
                _spilled: None,
            },
            GetResultPayload::Stream(mut stream) => {
                let io = |e: std::io::Error| Error::Io {
                    path: format!("temporary copy of {}", display(url)),
                    source: e,
                };
                let temp = tempfile::NamedTempFile::new().map_err(io)?.into_temp_path();
                let mut out = tokio::fs::File::create(&temp).await.map_err(io)?;
                while let Some(chunk) = stream
                    .try_next()
                    .await
                    .map_err(|e| Error::storage(display(url), e))?
                {
                    out.write_all(&chunk).await.map_err(io)?;
                }
                out.flush().await.map_err(io)?;
                tracing::info!(file = %display(url), bytes = size, "spilled to a temporary file (larger than the in-memory limit)");
                Body::Disk {
                    path: temp.to_path_buf(),
                    _spilled: Some(Arc::new(temp)),
                }
            }
        };
        Ok(RawFile {
            body,
            last_modified,
            digest: None,
        })
    }

    /// Write a whole object.
    pub async fn put(&self, url: &Url, data: Bytes) -> Result<()> {
        let store = self.store(url)?;
        let path = object_path(url)?;
        store
            .put(&path, data.into())
            .await
            .map_err(|e| Error::storage(display(url), e))?;
        Ok(())
    }

    /// Read a small object with its version tag (ETag); `None` when it does not exist.
    pub(crate) async fn get_tagged(&self, url: &Url) -> Result<Option<Tagged>> {
        let store = self.store(url)?;
        let path = object_path(url)?;
        let res = match store.get(&path).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(Error::storage(display(url), e)),
        };
        let tag = res.meta.e_tag.clone();
        let body = res
            .bytes()
            .await
            .map_err(|e| Error::storage(display(url), e))?;
        Ok(Some(Tagged { body, tag }))
    }

    /// Write an object only if it is still as `seen` (`None`: only if it does not exist):
    /// `false` when another writer created or changed it first. A store that cannot make
    /// a conditional update (the local file system) writes unconditionally — the caller
    /// has compared what it read just before.
    pub(crate) async fn put_if(
        &self,
        url: &Url,
        data: Bytes,
        seen: Option<&Tagged>,
    ) -> Result<bool> {
        let store = self.store(url)?;
        let path = object_path(url)?;
        let mode = match seen {
            None => PutMode::Create,
            Some(t) => match &t.tag {
                Some(e_tag) => PutMode::Update(UpdateVersion {
                    e_tag: Some(e_tag.clone()),
                    version: None,
                }),
                None => PutMode::Overwrite,
            },
        };
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        match store.put_opts(&path, data.clone().into(), opts).await {
            Ok(_) => Ok(true),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Ok(false),
            Err(object_store::Error::NotImplemented { .. }) => {
                self.put(url, data).await?;
                Ok(true)
            }
            Err(e) => Err(Error::storage(display(url), e)),
        }
    }

    /// Delete an object; `false` when it was not there.
    pub(crate) async fn delete_if_exists(&self, url: &Url) -> Result<bool> {
        let store = self.store(url)?;
        let path = object_path(url)?;
        match store.delete(&path).await {
            Ok(()) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(Error::storage(display(url), e)),
        }
    }

    /// All objects under a prefix (recursively), as URLs, sorted by key.
    pub async fn list(&self, prefix: &Url) -> Result<Vec<Url>> {
        Ok(self
            .list_meta(prefix)
            .await?
            .into_iter()
            .map(|l| l.url)
            .collect())
    }

    /// All objects under a prefix (recursively) with their metadata, sorted by key. A
    /// prefix that does not exist lists nothing.
    pub(crate) async fn list_meta(&self, prefix: &Url) -> Result<Vec<Listed>> {
        self.list_meta_after(prefix, None).await
    }

    /// [`Storage::list_meta`] of the keys after `after` only (S3's `start-after`: the
    /// listing starts there instead of at the prefix's first key).
    pub(crate) async fn list_meta_after(
        &self,
        prefix: &Url,
        after: Option<&Url>,
    ) -> Result<Vec<Listed>> {
        let store = self.store(prefix)?;
        let path = object_path(prefix)?;
        let listed = match after {
            Some(a) => {
                let offset = object_path(a)?;
                store
                    .list_with_offset(Some(&path), &offset)
                    .try_collect()
                    .await
            }
            None => store.list(Some(&path)).try_collect().await,
        };
        let metas: Vec<ObjectMeta> = match listed {
            Ok(m) => m,
            Err(object_store::Error::NotFound { .. }) => vec![],
            Err(e) => return Err(Error::storage(display(prefix), e)),
        };
        Ok(self.listed(prefix, metas))
    }

    /// The objects directly under a prefix (not in its sub-folders), sorted by key.
    pub(crate) async fn list_shallow(&self, prefix: &Url) -> Result<Vec<Listed>> {
        let store = self.store(prefix)?;
        let path = object_path(prefix)?;
        let metas = match store.list_with_delimiter(Some(&path)).await {
            Ok(r) => r.objects,
            Err(object_store::Error::NotFound { .. }) => vec![],
            Err(e) => return Err(Error::storage(display(prefix), e)),
        };
        Ok(self.listed(prefix, metas))
    }

    fn listed(&self, prefix: &Url, metas: Vec<ObjectMeta>) -> Vec<Listed> {
        let mut out: Vec<Listed> = metas
            .into_iter()
            .map(|m| {
                let mut u = prefix.clone();
                set_key(&mut u, m.location.as_ref());
                Listed {
                    url: u,
                    last_modified: m.last_modified,
                }
            })
            .collect();
        out.sort_by(|a, b| a.url.path().cmp(b.url.path()));
        out
    }
}

/// Where a fetched object's bytes are.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    Memory(Bytes),
    /// On local disk: the object itself (`file://`), or a temporary copy of a large object
    /// (deleted when the last clone of the body goes).
    Disk {
        path: std::path::PathBuf,
        _spilled: Option<Arc<tempfile::TempPath>>,
    },
}

impl Body {
    /// A reader over the whole body.
    pub(crate) fn reader(&self, name: &str) -> Result<Box<dyn std::io::Read + Send>> {
        match self {
            Body::Memory(b) => Ok(Box::new(std::io::Cursor::new(b.clone()))),
            Body::Disk { path, .. } => std::fs::File::open(path)
                .map(|f| {
                    Box::new(std::io::BufReader::with_capacity(1 << 20, f))
                        as Box<dyn std::io::Read + Send>
                })
                .map_err(|e| Error::Io {
                    path: name.to_string(),
                    source: e,
                }),
        }
    }
}

/// A raw object as fetched: its body and when it was last written.
#[derive(Debug, Clone)]
pub(crate) struct RawFile {
    pub body: Body,
    pub last_modified: Option<chrono::DateTime<chrono::Utc>>,
    /// SHA-256 of the body, once computed ([`RawFile::with_digest`]): identifies the
    /// contents a file name was applied with (see `applied`).
    pub digest: Option<Digest>,
}

/// SHA-256 of a file's bytes.
pub(crate) type Digest = [u8; 32];

impl RawFile {
    /// The file with the SHA-256 of its body (read again from disk for a spilled body; on a
    /// blocking thread).
    pub(crate) async fn with_digest(mut self, name: &str) -> Result<RawFile> {
        let body = self.body.clone();
        let label = name.to_string();
        let digest = tokio::task::spawn_blocking(move || -> Result<Digest> {
            use sha2::Digest as _;
            use std::io::Read as _;
            let mut h = sha2::Sha256::new();
            match &body {
                Body::Memory(b) => h.update(b),
                Body::Disk { path, .. } => {
                    // Through a buffer on the stack: a zeroed 1 MB one per file (eight read
                    // at once) stayed in the threads' heaps, +9 MB peak on merges of small
                    // local files.
                    let io = |e: std::io::Error| Error::Io {
                        path: label.clone(),
                        source: e,
                    };
                    let mut f = std::fs::File::open(path).map_err(io)?;
                    let mut buf = [0u8; 64 * 1024];
                    loop {
                        match f.read(&mut buf).map_err(io)? {
                            0 => break,
                            n => h.update(&buf[..n]),
                        }
                    }
                }
            }
            Ok(h.finalize().into())
        })
        .await
        .map_err(|e| Error::internal(format!("digest of {name}: {e}")))??;
        self.digest = Some(digest);
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_urls_round_trip_keys_with_any_character() {
        for key in [
            "dms/sales/my table/2024/01/01/20240101-1+2.parquet",
            "dms/x/2024%2001.parquet",
            "dms/100%/a?b#c=d.parquet",
        ] {
            let u = s3_url("raw", key).unwrap();
            assert_eq!(object_path(&u).unwrap().as_ref(), key, "{u}");
            assert_eq!(display(&u), format!("s3://raw/{key}"));
        }
        let u = s3_url("raw", "dms/x/2024%2001.parquet").unwrap();
        assert_eq!(file_name(&u), "2024%2001.parquet");
    }

    #[tokio::test]
    async fn a_large_local_file_is_read_where_it_is_a_remote_one_fetched() {
        let dir = tempfile::tempdir().unwrap();
        let base = Url::from_directory_path(dir.path()).unwrap();
        let s = Storage::with_tuning(&Tuning {
            spill_bytes: Some(8),
            ..Tuning::default()
        });
        // A small local file read whole, a larger one where it is (its own path).
        for (name, body) in [("small.csv", "I,1\n"), ("large.csv", "I,1\nI,2\nI,3\n")] {
            let url = join(&base, name);
            s.put(&url, Bytes::from(body)).await.unwrap();
            let raw = s.get_file(&url).await.unwrap();
            assert!(raw.last_modified.is_some());
            match (&raw.body, body.len() > 8) {
                (Body::Memory(b), false) => assert_eq!(b, body),
                (
                    Body::Disk {
                        path,
                        _spilled: None,
                    },
                    true,
                ) => assert_eq!(path, &dir.path().join(name)),
                (other, _) => panic!("{name}: {other:?}"),
            }
        }
        // A remote object (an in-memory store in S3's place): in memory up to the limit,
        // larger ones copied to a temporary file.
        s.stores.lock().unwrap().insert(
            "s3://raw".to_string(),
            Arc::new(object_store::memory::InMemory::new()),
        );
        for (key, body) in [("small.csv", "I,1\n"), ("large.csv", "I,1\nI,2\nI,3\n")] {
            let url = s3_url("raw", key).unwrap();
            s.put(&url, Bytes::from(body)).await.unwrap();
            let raw = s.get_file(&url).await.unwrap();
            let mut read = String::new();
            std::io::Read::read_to_string(&mut raw.body.reader(key).unwrap(), &mut read).unwrap();
            assert_eq!(read, body);
            match (&raw.body, body.len() > 8) {
                (Body::Memory(_), false) => {}
                (
                    Body::Disk {
                        path,
                        _spilled: Some(_),
                    },
                    true,
                ) => {
                    assert!(!path.starts_with(dir.path()), "{path:?}")
                }
                (other, _) => panic!("{key}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn local_put_get_list_with_percent_in_names() {
        let dir = tempfile::tempdir().unwrap();
        let base = Url::from_directory_path(dir.path()).unwrap();
        let s = Storage::new();
        let a = join(&join(&base, "t%20x"), "LOAD00000001.csv");
        let b = join(&join(&base, "t%20x"), "2024%2001.csv");
        s.put(&b, Bytes::from_static(b"y")).await.unwrap();
        s.put(&a, Bytes::from_static(b"x")).await.unwrap();
        assert!(dir.path().join("t%20x/2024%2001.csv").is_file());
        assert_eq!(s.get(&a).await.unwrap(), Bytes::from_static(b"x"));
        let mut prefix = join(&base, "t%20x");
        prefix.set_path(&format!("{}/", prefix.path()));
        let listed = s.list(&prefix).await.unwrap();
        assert_eq!(listed.len(), 2);
        for u in &listed {
            assert!(s.get(u).await.is_ok(), "listed {u} must be readable");
        }
        let missing = s.get(&join(&base, "nope.csv")).await.unwrap_err();
        assert!(!missing.is_retryable(), "{missing}");
        assert!(s
            .list(&base.join("none/").unwrap())
            .await
            .unwrap()
            .is_empty());
    }
}
