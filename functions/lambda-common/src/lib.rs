//! The Lambda adapter the two function crates share (`functions/merge`,
//! `functions/maintenance`), kept out of the core library `tributary` so that it builds and
//! tests without any Lambda crate: the merge function's event payloads ([`events`]) and the
//! maintenance function's request ([`maintenance`]), each parsed into a type at the edge
//! ([`Payload`]); the merge handler ([`handler`]: merge, dead-letter, respond), how
//! messages came and how their fates are settled ([`transport`]: directly, or through SQS
//! with FIFO forwarding, back-off and dead-lettering in [`queues`]), the configuration in
//! force ([`live`]), CloudWatch metrics ([`metrics`]), what both binaries do at cold start
//! ([`run`]), and the typed errors a handler returns ([`FunctionError`], mapped to the
//! runtime's diagnostic).

pub mod events;
pub mod handler;
pub mod live;
pub mod maintenance;
pub mod metrics;
pub mod queues;
pub mod transport;

use tributary::{Engine, Error, Result};
use url::Url;

use events::{Announces, EventError};

/// A function's payload, parsed from the invocation's JSON before its handler runs: the
/// merge function's [`events::Invocation`], the maintenance function's
/// [`maintenance::MaintenanceRequest`]. A payload that does not parse fails the invocation
/// with the [`EventError`] (`tributary.event`).
pub trait Payload: Announces + Sized + Send + 'static {
    fn parse(payload: serde_json::Value) -> std::result::Result<Self, EventError>;
}

/// JSON logs on stdout (CloudWatch), filtered by `RUST_LOG` or [`tributary::LOG_FILTER`].
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(tributary::LOG_FILTER)),
        )
        .with_current_span(false)
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .init();
}

/// Load and validate the configuration named by `TRIBUTARY_CONFIG`; with
/// `TRIBUTARY_LOCAL_S3_ROOT`, serve `s3://bucket/key` from `<root>/bucket/key` (local loop).
pub async fn engine_from_env() -> Result<Engine> {
    engine_at(&config_location()?).await
}

/// `TRIBUTARY_CONFIG`.
// The core's `Error` unboxed, as every fallible function of the core returns it (clippy
// flags it only outside its crate); read once per cold start.
#[allow(clippy::result_large_err)]
fn config_location() -> Result<String> {
    std::env::var("TRIBUTARY_CONFIG").map_err(|_| {
        Error::config(
            "environment",
            "TRIBUTARY_CONFIG is not set: point it at the table configuration (s3://bucket/key or a file path)",
        )
    })
}

/// The engine of the configuration at `location` (with `TRIBUTARY_LOCAL_S3_ROOT` applied).
async fn engine_at(location: &str) -> Result<Engine> {
    let location = location.to_string();
    let mut engine = Engine::from_config_location(&location).await?;
    if let Some(root) = std::env::var("TRIBUTARY_TABLES_LOCATION")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        let root = Url::parse(root.trim()).map_err(|e| {
            Error::config(
                "environment",
                format!(
                    "TRIBUTARY_TABLES_LOCATION={root} is not a URL ({e}): use s3://bucket/prefix/"
                ),
            )
        })?;
        engine.config().check_within(&root)?;
    }
    if let Ok(root) = std::env::var("TRIBUTARY_LOCAL_S3_ROOT") {
        engine = engine.with_local_s3_root(root);
    }
    tracing::info!(config = %location, tables = engine.config().tables.len(), "tributary ready");
    Ok(engine)
}

/// A function's life: JSON logs, the engine built at cold start (a bad configuration fails
/// the init with the reason) and again when the configuration changes ([`live`]), then
/// `handler` for every invocation's payload, parsed into `P`.
pub async fn run<P, F, Fut>(handler: F) -> std::result::Result<(), lambda_runtime::Error>
where
    P: Payload,
    F: Fn(std::sync::Arc<Engine>, P) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<serde_json::Value, FunctionError>>,
{
    init_tracing();
    let location = config_location()?;
    let live = std::sync::Arc::new(
        live::LiveEngine::start(&location, live::LiveEngine::interval_from_env()?, |l| {
            let l = l.to_string();
            Box::pin(async move { engine_at(&l).await })
        })
        .await?,
    );
    let handler = std::sync::Arc::new(handler);
    lambda_runtime::run(lambda_runtime::service_fn(
        move |ev: lambda_runtime::LambdaEvent<serde_json::Value>| {
            let live = live.clone();
            let handler = handler.clone();
            async move {
                let payload = P::parse(ev.payload)?;
                let engine = live.engine_for(&payload).await?;
                match work_deadline(ev.context.deadline, now_ms()) {
                    Some(deadline) => {
                        tributary::budget::within(deadline, handler(engine, payload)).await
                    }
                    None => handler(engine, payload).await,
                }
            }
        },
    ))
    .await
}

/// The time the library's work must be done by: the invocation's deadline (`deadline_ms`,
/// since the epoch) less what the handler needs after it — the response, the visibility
/// changes, the metrics: a quarter of the invocation's time, at most a minute. `None` for a
/// deadline that is not ahead (`cargo lambda watch` sends its timeout, `600000`, not an
/// instant): the work then runs to its end, as in the CLI.
fn work_deadline(deadline_ms: u64, now_ms: i64) -> Option<std::time::Instant> {
    let now_ms = u64::try_from(now_ms).ok()?;
    let total =
        std::time::Duration::from_millis(deadline_ms.checked_sub(now_ms).filter(|t| *t > 0)?);
    let reserve = (total / 4).min(std::time::Duration::from_secs(60));
    Some(std::time::Instant::now() + (total - reserve))
}

/// Milliseconds since the Unix epoch (EMF timestamps).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// The maintenance function's result: the summary, or an error naming the failed tables
/// (after all tables were attempted) so that the invocation counts as failed and alarms
/// fire.
pub fn maintenance_response(
    summary: &tributary::maintenance::Summary,
) -> std::result::Result<serde_json::Value, FunctionError> {
    summary.outcome()?;
    Ok(serde_json::to_value(summary)?)
}

/// Why an invocation failed (Lambda then retries it, or SQS redelivers its messages).
#[derive(Debug, thiserror::Error)]
pub enum FunctionError {
    /// The payload is none of the events the function accepts.
    #[error(transparent)]
    Event(#[from] EventError),
    /// Files of a direct (not SQS) invocation could not be merged.
    #[error("{count} file(s) not merged: {reasons}")]
    Files { count: usize, reasons: String },
    /// Maintenance (or a reload) failed for some tables, after all were attempted.
    #[error(transparent)]
    Maintenance(#[from] tributary::maintenance::Failed),
    /// The engine failed before any file or table was attempted.
    #[error(transparent)]
    Engine(Box<Error>),
    /// The response could not be encoded.
    #[error("cannot encode the response: {0}")]
    Response(#[from] serde_json::Error),
}

impl From<Error> for FunctionError {
    fn from(e: Error) -> Self {
        FunctionError::Engine(Box::new(e))
    }
}

impl FunctionError {
    /// The diagnostic's error type: `tributary.<kind>`.
    pub fn error_type(&self) -> String {
        let kind = match self {
            FunctionError::Event(_) => "event",
            FunctionError::Files { .. } => "files",
            FunctionError::Maintenance(_) => "maintenance",
            FunctionError::Engine(e) => e.kind(),
            FunctionError::Response(_) => "response",
        };
        format!("tributary.{kind}")
    }
}

impl From<FunctionError> for lambda_runtime::Diagnostic {
    fn from(e: FunctionError) -> Self {
        lambda_runtime::Diagnostic {
            error_type: e.error_type(),
            error_message: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary::maintenance::Summary;

    #[test]
    fn the_work_deadline_keeps_a_quarter_of_the_invocation_at_most_a_minute() {
        let secs = |d: Option<std::time::Instant>| {
            d.expect("a deadline ahead")
                .saturating_duration_since(std::time::Instant::now())
                .as_secs_f64()
        };
        let now = 1_000_000;
        // 15 minutes: a minute kept
        let d = secs(work_deadline(now as u64 + 900_000, now));
        assert!((839.0..=840.0).contains(&d), "{d}");
        // 30 s: a quarter
        let d = secs(work_deadline(now as u64 + 30_000, now));
        assert!((22.0..=22.5).contains(&d), "{d}");
        // passed, or not an instant (`cargo lambda watch` sends its timeout): none
        assert_eq!(work_deadline(0, now), None);
        assert_eq!(work_deadline(now as u64, now), None);
        assert_eq!(work_deadline(600_000, 1_796_351_617_817), None);
    }

    #[test]
    fn failed_tables_fail_the_maintenance_invocation_naming_them() {
        let done = maintenance_response(&Summary::default()).unwrap();
        assert_eq!(done["failed"], serde_json::json!([]));
        let failed = Summary {
            failed: vec![("a".into(), "boom".into())],
            ..Default::default()
        };
        let d = lambda_runtime::Diagnostic::from(maintenance_response(&failed).unwrap_err());
        assert_eq!(d.error_type, "tributary.maintenance");
        assert_eq!(
            d.error_message,
            "maintenance failed for 1 table(s): a: boom"
        );
    }

    /// Every sample in `events/` (what `cargo lambda invoke --data-file` sends) parses as
    /// the payload of the function it is for, every message of it understood.
    #[test]
    fn every_sample_event_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../events");
        let mut parsed = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            let payload: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
            if name.contains("maintenance") {
                maintenance::MaintenanceRequest::parse(&payload)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            } else {
                let inv =
                    events::Invocation::parse(&payload).unwrap_or_else(|e| panic!("{name}: {e}"));
                for m in &inv.messages {
                    assert!(m.objects.is_ok(), "{name}: {:?}", m.objects);
                }
            }
            parsed.push(name);
        }
        parsed.sort();
        assert!(parsed.len() >= 9, "the samples were not found: {parsed:?}");
    }

    #[test]
    fn the_maintenance_samples_ask_what_the_state_machine_asks() {
        use maintenance::MaintenanceRequest as R;
        let sample = |name: &str| {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../events")
                .join(name);
            let text = std::fs::read_to_string(path).unwrap();
            R::parse(&serde_json::from_str(&text).unwrap()).unwrap()
        };
        assert_eq!(sample("maintenance-list.json"), R::List);
        assert_eq!(sample("maintenance-cuts.json"), R::Cuts { tables: vec![] });
        assert_eq!(
            sample("maintenance-table.json"),
            R::Maintain {
                tables: vec!["travel_details".into()],
                force: false
            }
        );
        assert_eq!(sample("scheduled-maintenance.json"), R::every_table());
    }
}
