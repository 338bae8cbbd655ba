//! Storage access for raw CDC files and the config file: `file://` and `s3://` URIs through
//! `object_store` (the same client stack delta-rs uses for the tables). `AWS_ENDPOINT_URL`
//! (or `AWS_ENDPOINT_URL_S3`) points everything at an emulator.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use deltalake::{ObjectStore, Path};
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::ObjectStoreExt;
use url::Url;

use crate::error::{Error, Result};

/// Builds and caches one object store per bucket (or one for the local file system).
#[derive(Debug, Default)]
pub struct Storage {
    stores: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
}

/// The endpoint override from the environment, if any.
pub fn endpoint_override() -> Option<String> {
    std::env::var("AWS_ENDPOINT_URL_S3")
        .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
        .ok()
        .filter(|s| !s.is_empty())
}

/// Storage options for delta-rs tables, derived from the environment so that an emulator
/// endpoint and plain-HTTP access work without further setup.
pub fn delta_storage_options() -> HashMap<String, String> {
    let mut opts = HashMap::new();
    if let Some(ep) = endpoint_override() {
        if ep.starts_with("http://") {
            opts.insert("AWS_ALLOW_HTTP".to_string(), "true".to_string());
        }
        opts.insert("AWS_ENDPOINT_URL".to_string(), ep);
        // Emulators serve path-style requests.
        opts.insert(
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST".to_string(),
            "false".to_string(),
        );
    }
    if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() {
        opts.insert("AWS_REGION".to_string(), "us-east-1".to_string());
    }
    opts
}

/// Object path (within its store) of a `file://` or `s3://` URL.
pub fn object_path(url: &Url) -> Result<Path> {
    let p = url.path().trim_start_matches('/');
    let decoded = percent_decode(p);
    Path::parse(decoded).map_err(|e| Error::storage(url.as_str(), e.into()))
}

pub(crate) fn percent_decode(s: &str) -> String {
    // `Url` keeps paths percent-encoded; object paths are the decoded keys.
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Build an `s3://bucket/key` URL from a decoded object key.
pub fn s3_url(bucket: &str, key: &str) -> Result<Url> {
    let mut u = Url::parse(&format!("s3://{bucket}/"))
        .map_err(|e| Error::Internal(format!("invalid bucket name {bucket:?}: {e}")))?;
    u.set_path(key);
    Ok(u)
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

impl Storage {
    pub fn new() -> Self {
        Self::default()
    }

    /// The object store that serves `url`.
    pub fn store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        let key = match url.scheme() {
            "file" => "file://".to_string(),
            "s3" | "s3a" => format!("s3://{}", url.host_str().unwrap_or("")),
            other => {
                return Err(Error::Internal(format!(
                    "unsupported URI scheme `{other}` in {url}; use s3:// or file://"
                )))
            }
        };
        let mut stores = self
            .stores
            .lock()
            .map_err(|_| Error::Internal("storage cache lock poisoned".into()))?;
        if let Some(s) = stores.get(&key) {
            return Ok(s.clone());
        }
        let store: Arc<dyn ObjectStore> = if url.scheme() == "file" {
            Arc::new(LocalFileSystem::new())
        } else {
            let bucket = url.host_str().unwrap_or("");
            let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
            if let Some(ep) = endpoint_override() {
                b = b
                    .with_allow_http(ep.starts_with("http://"))
                    .with_endpoint(ep)
                    .with_virtual_hosted_style_request(false);
            }
            if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err()
            {
                b = b.with_region("us-east-1");
            }
            Arc::new(b.build().map_err(|e| Error::storage(url.as_str(), e))?)
        };
        stores.insert(key, store.clone());
        Ok(store)
    }

    /// Read a whole object.
    pub async fn get(&self, url: &Url) -> Result<Bytes> {
        let store = self.store(url)?;
        let path = object_path(url)?;
        let res = store
            .get(&path)
            .await
            .map_err(|e| Error::storage(display(url), e))?;
        res.bytes()
            .await
            .map_err(|e| Error::storage(display(url), e))
    }

    /// Write a whole object (used by the demo and tests).
    pub async fn put(&self, url: &Url, data: Bytes) -> Result<()> {
        let store = self.store(url)?;
        let path = object_path(url)?;
        store
            .put(&path, data.into())
            .await
            .map_err(|e| Error::storage(display(url), e))?;
        Ok(())
    }

    /// All objects under a prefix (recursively), as URLs, sorted by key.
    pub async fn list(&self, prefix: &Url) -> Result<Vec<Url>> {
        let store = self.store(prefix)?;
        let path = object_path(prefix)?;
        let metas: Vec<_> = store
            .list(Some(&path))
            .try_collect()
            .await
            .map_err(|e| Error::storage(display(prefix), e))?;
        let mut out = Vec::with_capacity(metas.len());
        for m in metas {
            let mut u = prefix.clone();
            u.set_path(&format!("/{}", m.location.as_ref()));
            out.push(u);
        }
        out.sort_by(|a, b| a.path().cmp(b.path()));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_urls_round_trip_keys_with_spaces_and_symbols() {
        let u = s3_url("raw", "dms/sales/my table/2024/01/01/20240101-1+2.parquet").unwrap();
        assert_eq!(
            object_path(&u).unwrap().as_ref(),
            "dms/sales/my table/2024/01/01/20240101-1+2.parquet"
        );
        assert_eq!(file_name(&u), "20240101-1+2.parquet");
        assert_eq!(
            display(&u),
            "s3://raw/dms/sales/my table/2024/01/01/20240101-1+2.parquet"
        );
    }

    #[tokio::test]
    async fn local_put_get_list() {
        let dir = tempfile::tempdir().unwrap();
        let base = Url::from_directory_path(dir.path()).unwrap();
        let s = Storage::new();
        let a = base.join("t/LOAD00000001.csv").unwrap();
        let b = base.join("t/2024/01/02/20240102-0000.csv").unwrap();
        s.put(&b, Bytes::from_static(b"y")).await.unwrap();
        s.put(&a, Bytes::from_static(b"x")).await.unwrap();
        assert_eq!(s.get(&a).await.unwrap(), Bytes::from_static(b"x"));
        let listed = s.list(&base.join("t/").unwrap()).await.unwrap();
        assert_eq!(listed, vec![b.clone(), a.clone()]);
        let missing = s.get(&base.join("t/nope.csv").unwrap()).await.unwrap_err();
        assert!(!missing.is_retryable(), "{missing}");
    }
}
