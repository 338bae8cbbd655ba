//! The library's tuning from the environment (`TRIBUTARY_LOG_CACHE_MB`,
//! `TRIBUTARY_SPILL_MB`, `TRIBUTARY_LOG_VALUES`), read and checked in one place: a value that is not what the
//! variable takes is refused with the variable, the value and what it takes — at start-up
//! ([`Tuning::from_env`], from [`crate::Engine::from_config_location`]: the function's init
//! or the CLI command fails with it) — never replaced by the default.

use crate::error::{Error, Result};

/// Default size of the Delta log cache, in MB (`TRIBUTARY_LOG_CACHE_MB`).
pub const DEFAULT_LOG_CACHE_MB: u64 = 64;

/// The environment's tuning of the library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Bytes of Delta log files a process keeps (`TRIBUTARY_LOG_CACHE_MB`; 0: none).
    pub log_cache_bytes: u64,
    /// Objects larger than this are spilled to disk (`TRIBUTARY_SPILL_MB`; `None`: the
    /// default, 64 MB).
    pub spill_bytes: Option<u64>,
    /// Row values in error messages (`TRIBUTARY_LOG_VALUES`, default true; false: `…`
    /// instead, [`crate::redact`]).
    pub log_values: bool,
}

impl Tuning {
    /// The tuning from this process's environment; `Err` names the variable that is wrong.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok())
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
        })
    }

    /// Apply the process-wide parts: whether messages quote row values ([`crate::redact`]).
    pub fn apply(&self) {
        crate::redact::withhold_values(!self.log_values);
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
        let want = Tuning {
            log_cache_bytes: 64 * 1024 * 1024,
            spill_bytes: None,
            log_values: true,
        };
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
