//! The library's tuning from the environment (`TRIBUTARY_LOG_CACHE_MB`,
//! `TRIBUTARY_SPILL_MB`, `TRIBUTARY_LOG_VALUES`, and the S3 endpoint and region an emulator
//! or a region-less machine needs: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, `AWS_REGION`,
//! `AWS_DEFAULT_REGION`), read and checked in one place — the only place in the library that
//! reads the environment. A value that is not what the variable takes is refused with the
//! variable, the value and what it takes — at start-up ([`Tuning::from_env`], from
//! [`crate::Engine::from_config_location`]: the function's init or the CLI command fails with
//! it) — never replaced by the default. From there the tuning is carried down as a value
//! ([`crate::Engine::builder`], [`crate::storage::Storage::with_tuning`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Default size of the Delta log cache, in MB (`TRIBUTARY_LOG_CACHE_MB`).
pub const DEFAULT_LOG_CACHE_MB: u64 = 64;

/// The region when the environment names none (as the AWS CLI's default).
const DEFAULT_REGION: &str = "us-east-1";

/// The environment's tuning of the library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    /// Bytes of Delta log files a process keeps (`TRIBUTARY_LOG_CACHE_MB`; 0: none).
    pub log_cache_bytes: u64,
    /// Objects larger than this are spilled to disk (`TRIBUTARY_SPILL_MB`; `None`: the
    /// default, 64 MB).
    pub spill_bytes: Option<u64>,
    /// Row values in error messages (`TRIBUTARY_LOG_VALUES`, default true; false: `…`
    /// instead, [`crate::redact`]).
    pub log_values: bool,
    /// Where S3 is reached: the tables' and the raw files' object stores.
    pub store: StoreSettings,
}

impl Default for Tuning {
    /// Every variable unset.
    fn default() -> Self {
        Tuning {
            log_cache_bytes: DEFAULT_LOG_CACHE_MB * 1024 * 1024,
            spill_bytes: None,
            log_values: true,
            store: StoreSettings::default(),
        }
    }
}

/// The S3 endpoint override and whether the environment names a region.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreSettings {
    /// `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL` (an emulator; `None`: AWS).
    pub endpoint: Option<String>,
    /// `AWS_REGION` or `AWS_DEFAULT_REGION` is set (the S3 client reads it itself);
    /// otherwise [`DEFAULT_REGION`].
    pub region_set: bool,
}

impl StoreSettings {
    /// The object-store options (delta-rs's and the raw files' stores alike): an emulator
    /// endpoint with plain HTTP and path-style requests, and a region when none is set.
    pub fn options(&self) -> HashMap<String, String> {
        let mut opts = HashMap::new();
        if let Some(ep) = &self.endpoint {
            if ep.starts_with("http://") {
                opts.insert("AWS_ALLOW_HTTP".to_string(), "true".to_string());
            }
            opts.insert("AWS_ENDPOINT_URL".to_string(), ep.clone());
            // Emulators serve path-style requests.
            opts.insert(
                "AWS_VIRTUAL_HOSTED_STYLE_REQUEST".to_string(),
                "false".to_string(),
            );
        }
        if !self.region_set {
            opts.insert("AWS_REGION".to_string(), DEFAULT_REGION.to_string());
        }
        opts
    }
}

/// The Delta log cache's size, set by [`Tuning::apply`] (process-wide, as the cache is).
static LOG_CACHE_BYTES: AtomicU64 = AtomicU64::new(DEFAULT_LOG_CACHE_MB * 1024 * 1024);

/// Bytes of Delta log files this process keeps ([`Tuning::log_cache_bytes`] as applied).
pub(crate) fn log_cache_bytes() -> u64 {
    LOG_CACHE_BYTES.load(Ordering::Relaxed)
}

impl Tuning {
    /// The tuning from this process's environment; `Err` names the variable that is wrong.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`Tuning::from_env`] for conveniences that cannot fail ([`crate::Engine::new`],
    /// [`crate::storage::Storage::new`]): a variable the library does not take is logged as an
    /// error and its default used. Start-up paths use [`Tuning::from_env`], which refuses it.
    pub fn from_env_or_default() -> Self {
        Self::from_env().unwrap_or_else(|e| {
            tracing::error!(error = %e, "using the default tuning");
            Tuning {
                store: Self::store_from(|k| std::env::var(k).ok()),
                ..Tuning::default()
            }
        })
    }

    /// The tuning from `var` (a variable's value, `None` when unset).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let log_cache_mb = whole_megabytes(
            "TRIBUTARY_LOG_CACHE_MB",
            var("TRIBUTARY_LOG_CACHE_MB").as_deref(),
            "megabytes of Delta log files a function instance keeps in memory (default 64; 0 turns the cache off)",
        )?
        .unwrap_or(DEFAULT_LOG_CACHE_MB);
        let spill_mb = megabytes(
            "TRIBUTARY_SPILL_MB",
            var("TRIBUTARY_SPILL_MB").as_deref(),
            "objects larger than this many megabytes are streamed to a local file (default 64; fractions allowed, e.g. 0.5)",
        )?;
        let log_values = match unset(var("TRIBUTARY_LOG_VALUES").as_deref()) {
            None => true,
            Some(v) if v.eq_ignore_ascii_case("true") => true,
            Some(v) if v.eq_ignore_ascii_case("false") => false,
            Some(v) => {
                return Err(refused(
                    "TRIBUTARY_LOG_VALUES",
                    v,
                    "true or false",
                    "whether error messages may quote row values (default true; false writes … instead)",
                ))
            }
        };
        Ok(Tuning {
            log_cache_bytes: log_cache_mb.saturating_mul(1024 * 1024),
            spill_bytes: spill_mb.map(|mb| (mb * 1024.0 * 1024.0) as u64),
            log_values,
            store: Self::store_from(&var),
        })
    }

    /// The S3 endpoint and region variables.
    fn store_from(var: impl Fn(&str) -> Option<String>) -> StoreSettings {
        let set = |k: &str| var(k).filter(|v| !v.is_empty());
        StoreSettings {
            endpoint: set("AWS_ENDPOINT_URL_S3").or_else(|| set("AWS_ENDPOINT_URL")),
            region_set: var("AWS_REGION").is_some() || var("AWS_DEFAULT_REGION").is_some(),
        }
    }

    /// Apply the process-wide parts: whether messages quote row values ([`crate::redact`]),
    /// and the size of the Delta log cache (one per bucket and process).
    pub fn apply(&self) {
        crate::redact::withhold_values(!self.log_values);
        LOG_CACHE_BYTES.store(self.log_cache_bytes, Ordering::Relaxed);
    }
}

fn unset(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

fn refused(name: &str, value: &str, takes: &str, what: &str) -> Error {
    Error::config(
        "environment",
        format!("{name}={value} is not {takes}: {what}"),
    )
}

/// A whole number of megabytes (`None`: unset or empty).
fn whole_megabytes(name: &str, value: Option<&str>, what: &str) -> Result<Option<u64>> {
    let Some(v) = unset(value) else {
        return Ok(None);
    };
    v.parse::<u64>()
        .ok()
        .filter(|mb| mb.checked_mul(1024 * 1024).is_some())
        .map(Some)
        .ok_or_else(|| refused(name, v, "a whole number of megabytes", what))
}

/// A number of megabytes, fractions allowed (`None`: unset or empty).
fn megabytes(name: &str, value: Option<&str>, what: &str) -> Result<Option<f64>> {
    let Some(v) = unset(value) else {
        return Ok(None);
    };
    v.parse::<f64>()
        .ok()
        .filter(|mb| mb.is_finite() && *mb >= 0.0 && *mb < (u64::MAX >> 21) as f64)
        .map(Some)
        .ok_or_else(|| refused(name, v, "a number of megabytes", what))
}

/// A number of seconds, fractions allowed (`None`: unset or empty): for the functions'
/// own variables (`TRIBUTARY_CONFIG_CHECK_SECONDS`).
pub fn seconds(name: &str, value: Option<&str>, what: &str) -> Result<Option<std::time::Duration>> {
    let Some(v) = unset(value) else {
        return Ok(None);
    };
    v.parse::<f64>()
        .ok()
        .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
        .map(Some)
        .ok_or_else(|| refused(name, v, "a number of seconds", what))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuning(vars: &[(&str, &str)]) -> Result<Tuning> {
        Tuning::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn unset_or_empty_variables_mean_the_defaults() {
        let want = Tuning::default();
        assert_eq!(want.log_cache_bytes, 64 * 1024 * 1024);
        assert_eq!((want.spill_bytes, want.log_values), (None, true));
        assert_eq!(tuning(&[]).unwrap(), want);
        let empty = [("TRIBUTARY_LOG_CACHE_MB", " "), ("TRIBUTARY_SPILL_MB", "")];
        assert_eq!(tuning(&empty).unwrap(), want);
    }

    #[test]
    fn row_values_in_messages_are_true_or_false_and_nothing_else() {
        assert!(
            !tuning(&[("TRIBUTARY_LOG_VALUES", "false")])
                .unwrap()
                .log_values
        );
        assert!(
            tuning(&[("TRIBUTARY_LOG_VALUES", "TRUE")])
                .unwrap()
                .log_values
        );
        let e = tuning(&[("TRIBUTARY_LOG_VALUES", "no")]).unwrap_err();
        assert!(e.to_string().contains("TRIBUTARY_LOG_VALUES=no"), "{e}");
    }

    #[test]
    fn values_are_read_in_megabytes() {
        let t = tuning(&[
            ("TRIBUTARY_LOG_CACHE_MB", "0"),
            ("TRIBUTARY_SPILL_MB", " 0.5 "),
        ])
        .unwrap();
        assert_eq!(t.log_cache_bytes, 0);
        assert_eq!(t.spill_bytes, Some(512 * 1024));
        let t = tuning(&[("TRIBUTARY_LOG_CACHE_MB", "256")]).unwrap();
        assert_eq!(t.log_cache_bytes, 256 * 1024 * 1024);
    }

    #[test]
    fn a_value_the_variable_does_not_take_is_refused_by_name() {
        for (name, value) in [
            ("TRIBUTARY_LOG_CACHE_MB", "64MB"),
            ("TRIBUTARY_LOG_CACHE_MB", "-1"),
            ("TRIBUTARY_LOG_CACHE_MB", "0.5"),
            ("TRIBUTARY_LOG_CACHE_MB", "99999999999999999"),
            ("TRIBUTARY_SPILL_MB", "64M"),
            ("TRIBUTARY_SPILL_MB", "-2"),
            ("TRIBUTARY_SPILL_MB", "NaN"),
            ("TRIBUTARY_SPILL_MB", "inf"),
        ] {
            let e = tuning(&[(name, value)]).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{name}={value}")) && e.contains("megabytes"),
                "{name}={value}: {e}"
            );
        }
    }

    #[test]
    fn an_emulator_endpoint_means_plain_http_path_style_and_a_default_region() {
        let t = tuning(&[("AWS_ENDPOINT_URL", "http://127.0.0.1:4566")]).unwrap();
        let o = t.store.options();
        assert_eq!(o["AWS_ENDPOINT_URL"], "http://127.0.0.1:4566");
        assert_eq!(o["AWS_ALLOW_HTTP"], "true");
        assert_eq!(o["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"], "false");
        assert_eq!(o["AWS_REGION"], "us-east-1");
        let t = tuning(&[
            ("AWS_ENDPOINT_URL", "http://a"),
            ("AWS_ENDPOINT_URL_S3", "https://s3.example"),
            ("AWS_REGION", "eu-west-1"),
        ])
        .unwrap();
        let o = t.store.options();
        assert_eq!(o["AWS_ENDPOINT_URL"], "https://s3.example", "S3's own wins");
        assert!(!o.contains_key("AWS_ALLOW_HTTP") && !o.contains_key("AWS_REGION"));
        assert!(tuning(&[])
            .unwrap()
            .store
            .options()
            .keys()
            .eq(["AWS_REGION"]));
    }

    #[test]
    fn seconds_take_numbers_only() {
        let s = |v| seconds("X", Some(v), "what");
        assert_eq!(s("0").unwrap(), Some(std::time::Duration::ZERO));
        assert_eq!(
            s("1.5").unwrap(),
            Some(std::time::Duration::from_millis(1500))
        );
        assert_eq!(seconds("X", None, "w").unwrap(), None);
        for bad in ["60s", "-1", "NaN", "1e400"] {
            let e = s(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("X={bad}")), "{e}");
        }
    }
}
