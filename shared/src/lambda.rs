//! What both Lambda binaries do at cold start: JSON logs, and the engine built from the
//! environment (`TRIBUTARY_CONFIG`, optional `TRIBUTARY_LOCAL_S3_ROOT`).

use crate::engine::Engine;
use crate::error::{Error, Result};

/// JSON logs on stdout (CloudWatch), filtered by `RUST_LOG` or [`crate::LOG_FILTER`].
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(crate::LOG_FILTER)),
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
    let location = std::env::var("TRIBUTARY_CONFIG").map_err(|_| {
        Error::config(
            "environment",
            "TRIBUTARY_CONFIG is not set: point it at the table configuration (s3://bucket/key or a file path)",
        )
    })?;
    let mut engine = Engine::from_config_location(&location).await?;
    if let Ok(root) = std::env::var("TRIBUTARY_LOCAL_S3_ROOT") {
        engine = engine.with_local_s3_root(root);
    }
    tracing::info!(config = %location, tables = engine.config().tables.len(), "tributary ready");
    Ok(engine)
}

/// Milliseconds since the Unix epoch (EMF timestamps).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}
