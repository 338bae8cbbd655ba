//! Lambda: on a schedule, maintain the configured tables (compaction, checkpoint, vacuum,
//! tombstone expiry, symlink manifests).
//!
//! Event: any scheduled event. `{"table": "name"}`, `{"tables": ["a", "b"]}` (also inside
//! `detail`, as EventBridge rules with input transformers deliver it) limit the run;
//! `"force": true` allows a VACUUM retention below the configured minimum.
//! Environment: `TRIBUTARY_CONFIG` (required), `RUST_LOG`, `AWS_ENDPOINT_URL`,
//! `TRIBUTARY_LOCAL_S3_ROOT` (local loop, as for the merge function).

use std::sync::Arc;

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;
use tributary::Engine;

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(tributary::LOG_FILTER)),
        )
        .with_current_span(false)
        .without_time()
        .with_target(false)
        .init();
    let location = std::env::var("TRIBUTARY_CONFIG").map_err(|_| {
        "TRIBUTARY_CONFIG is not set: point it at the table configuration (s3://bucket/key or a file path)"
    })?;
    let mut engine = Engine::from_config_location(&location).await?;
    if let Ok(root) = std::env::var("TRIBUTARY_LOCAL_S3_ROOT") {
        // Local loop: serve s3://bucket/key from <root>/bucket/key (no AWS needed).
        engine = engine.with_local_s3_root(root);
    }
    let engine = Arc::new(engine);
    tracing::info!(config = %location, tables = engine.config().tables.len(), "tributary maintenance function ready");
    lambda_runtime::run(service_fn(move |ev: LambdaEvent<Value>| {
        let engine = engine.clone();
        async move {
            let request = tributary::maintenance::Request::from_event(&ev.payload);
            let summary = tributary::maintenance::handle(&engine, &request).await?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or_default();
            for line in tributary::metrics::maintenance_emf(&summary, now) {
                println!("{line}");
            }
            summary.response().map_err(Error::from)
        }
    }))
    .await
}
