//! The configuration in force, picked up again when it changes: warm function instances
//! live for hours, and an uploaded configuration must not wait for their cold start. At most
//! every `TRIBUTARY_CONFIG_CHECK_SECONDS` (default 60) an invocation asks the store for the
//! object's version tag (a HEAD request, no download); a new tag loads, validates and swaps
//! the engine. A new configuration that does not load is logged as an error and the
//! previous one stays in force (a bad upload does not stop the merges); metric
//! `ConfigRejected` counts such checks, for an alarm.
//!
//! A file that no table of the configuration in force owns would be ignored; it may belong
//! to a table just added, so such an invocation checks at once, whatever the interval
//! ([`LiveEngine::engine_for`]). If the newest configuration does not load, the invocation
//! fails instead of ignoring the file (retried, then dead-lettered: not lost).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use url::Url;

use tributary::storage::Storage;
use tributary::{Engine, Error, Result};

use crate::events::Announces;

/// The engine of the configuration in force.
#[derive(Debug)]
pub struct LiveEngine {
    location: String,
    url: Option<Url>,
    every: Duration,
    storage: Storage,
    state: Mutex<State>,
    /// Serialises reloads (one at a time; the others keep using the current engine).
    reloading: tokio::sync::Mutex<()>,
    build: fn(&str) -> BuildFuture,
}

/// What building an engine returns.
pub type BuildFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Engine>> + Send>>;

#[derive(Debug)]
struct State {
    engine: Arc<Engine>,
    tag: Option<String>,
    checked: Instant,
    /// The newest version seen, when it does not load, and why.
    rejected: Option<(Option<String>, String)>,
}

/// The configuration's URL (`s3://`, `file://`, or a local path).
/// `TRIBUTARY_CONFIG_CHECK_SECONDS`'s value as the check interval (unset or empty: 60 s).
#[allow(clippy::result_large_err)]
fn interval(value: Option<&str>) -> Result<Duration> {
    Ok(tributary::tuning::seconds(
        "TRIBUTARY_CONFIG_CHECK_SECONDS",
        value,
        "at most this often an invocation checks whether the configuration file changed (default 60; 0 checks on every invocation)",
    )?
    .unwrap_or(Duration::from_secs(60)))
}

fn config_url(location: &str) -> Option<Url> {
    if location.contains("://") {
        return Url::parse(location).ok();
    }
    let p = std::path::Path::new(location);
    let abs = std::fs::canonicalize(p).ok()?;
    Url::from_file_path(abs).ok()
}

/// How a check ended.
enum Checked {
    /// The version in force is the newest (or it was just put in force).
    Current,
    /// A newer version exists and does not load: the error.
    Refused(Error),
    /// The store could not be asked: the error.
    Unknown(Error),
}

impl LiveEngine {
    /// Load the configuration at `location` with `build` and keep it in force; its version
    /// tag is read *before* it is loaded, so that an upload in between is loaded at the next
    /// check rather than taken for the version in force.
    pub async fn start(
        location: &str,
        every: Duration,
        build: fn(&str) -> BuildFuture,
    ) -> Result<Self> {
        let url = config_url(location);
        if url.is_none() {
            tracing::warn!(config = %location, "the configuration's location is not a URL or an existing file: it is not checked for changes");
        }
        let storage = Storage::new();
        let tag = match &url {
            Some(u) => storage.version_tag(u).await.ok().flatten(),
            None => None,
        };
        let engine = build(location).await?;
        tracing::info!(config = %location, version = tag.as_deref().unwrap_or("-"), tables = engine.config().tables.len(), "configuration in force");
        Ok(LiveEngine {
            location: location.to_string(),
            url,
            every,
            storage,
            state: Mutex::new(State {
                engine: Arc::new(engine),
                tag,
                checked: Instant::now(),
                rejected: None,
            }),
            reloading: tokio::sync::Mutex::new(()),
            build,
        })
    }

    /// The check interval from `TRIBUTARY_CONFIG_CHECK_SECONDS` (default 60; 0 checks on
    /// every invocation); `Err` (the init fails with it) when it is not a number of seconds.
    #[allow(clippy::result_large_err)]
    pub fn interval_from_env() -> tributary::Result<Duration> {
        interval(
            std::env::var("TRIBUTARY_CONFIG_CHECK_SECONDS")
                .ok()
                .as_deref(),
        )
    }

    fn current_engine(&self) -> Arc<Engine> {
        match self.state.lock() {
            Ok(s) => s.engine.clone(),
            Err(p) => p.into_inner().engine.clone(),
        }
    }

    /// The engine to serve this invocation with, after a check when one is due.
    pub async fn engine(&self) -> Arc<Engine> {
        let due = self
            .state
            .lock()
            .map(|s| s.checked.elapsed() >= self.every)
            .unwrap_or(true);
        if !due {
            return self.current_engine();
        }
        let Ok(_guard) = self.reloading.try_lock() else {
            return self.current_engine();
        };
        self.check_logged().await;
        self.current_engine()
    }

    /// The engine for an invocation with this payload: [`Self::engine`], and when the
    /// payload announces a file that no table of the configuration in force owns, a check
    /// now (the file may belong to a table just added). While such a file remains unowned
    /// and a newer configuration exists that does not load, or the store cannot say whether
    /// there is one, the engine returned fails those files (retryably: `unowned`) instead of
    /// ignoring them — only their messages are retried, then dead-lettered; the other
    /// files of the invocation are merged.
    pub async fn engine_for(&self, payload: &impl Announces) -> Result<Arc<Engine>> {
        let engine = self.engine().await;
        if unowned(&engine, payload).is_none() {
            return Ok(engine);
        }
        let checked = {
            let _guard = self.reloading.lock().await;
            self.check_logged().await
        };
        let engine = self.current_engine();
        if unowned(&engine, payload).is_none() {
            return Ok(engine);
        }
        let why = match checked {
            Checked::Current => return Ok(engine),
            Checked::Refused(e) => format!("the newer configuration does not load ({e})"),
            Checked::Unknown(e) => {
                format!("whether the configuration changed cannot be read ({e})")
            }
        };
        Ok(Arc::new(engine.as_ref().clone().failing_unowned(why)))
    }

    /// Check, log what a failed check means, and say how it ended.
    async fn check_logged(&self) -> Checked {
        let checked = self.check().await;
        match &checked {
            Checked::Current => {}
            Checked::Refused(e) => {
                tracing::error!(config = %self.location, error = %e, kind = e.kind(), "the configuration changed but does not load; the previous one stays in force");
                println!("{}", crate::metrics::config_rejected_emf(crate::now_ms()));
            }
            Checked::Unknown(e) => {
                tracing::warn!(config = %self.location, error = %e, kind = e.kind(), "cannot check the configuration for changes; the one in force stays");
            }
        }
        checked
    }

    async fn check(&self) -> Checked {
        let Some(url) = &self.url else {
            return Checked::Current;
        };
        // Counted as checked whatever the answer: a store that fails is asked again at the
        // next interval, not at every invocation.
        let (known, rejected) = match self.state.lock() {
            Ok(mut s) => {
                s.checked = Instant::now();
                (s.tag.clone(), s.rejected.clone())
            }
            Err(_) => return Checked::Unknown(Error::internal("configuration state poisoned")),
        };
        let tag = match self.storage.version_tag(url).await {
            Ok(t) => t,
            Err(e) => return Checked::Unknown(e),
        };
        if tag == known {
            if let Ok(mut s) = self.state.lock() {
                s.rejected = None;
            }
            return Checked::Current;
        }
        // The version already refused: not downloaded and validated again.
        if let Some((refused, why)) = rejected.filter(|(t, _)| *t == tag) {
            let _ = refused;
            return Checked::Refused(Error::config(&self.location, why));
        }
        let engine = match (self.build)(&self.location).await {
            Ok(e) => e,
            Err(e) => {
                if let Ok(mut s) = self.state.lock() {
                    s.rejected = Some((tag, e.to_string()));
                }
                return Checked::Refused(e);
            }
        };
        tracing::info!(config = %self.location, version = tag.as_deref().unwrap_or("-"), previous = known.as_deref().unwrap_or("-"), tables = engine.config().tables.len(), "configuration changed: now in force");
        match self.state.lock() {
            Ok(mut s) => {
                s.engine = Arc::new(engine);
                s.tag = tag;
                s.rejected = None;
                Checked::Current
            }
            Err(_) => Checked::Unknown(Error::internal("configuration state poisoned")),
        }
    }
}

/// The first file the payload announces that no table of `engine`'s configuration owns.
fn unowned(engine: &Engine, payload: &impl Announces) -> Option<String> {
    payload
        .objects()
        .iter()
        .find(|f| engine.config().table_for(&engine.resolve(f)).is_none())
        .map(tributary::storage::display)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_interval_is_a_number_of_seconds_or_refused() {
        assert_eq!(interval(None).unwrap(), Duration::from_secs(60));
        assert_eq!(interval(Some("")).unwrap(), Duration::from_secs(60));
        assert_eq!(interval(Some("0")).unwrap(), Duration::ZERO);
        assert_eq!(interval(Some("2.5")).unwrap(), Duration::from_millis(2500));
        let e = interval(Some("1m")).unwrap_err().to_string();
        assert!(
            e.contains("TRIBUTARY_CONFIG_CHECK_SECONDS=1m is not a number of seconds"),
            "{e}"
        );
    }
}
