//! Lambda: merge the DMS files announced by S3 notifications (direct or through SQS) and
//! EventBridge "Object Created" events into their Delta tables.
//!
//! Environment: `TRIBUTARY_CONFIG` (path or s3:// URI of the table configuration, required),
//! `RUST_LOG` (default `info`), `AWS_ENDPOINT_URL` for emulators, `TRIBUTARY_LOCAL_S3_ROOT`
//! to serve `s3://bucket/key` from `<root>/bucket/key` when running locally.

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
    // Built once per cold start; a bad configuration fails the init with a clear message.
    let mut engine = Engine::from_config_location(&location).await?;
    if let Ok(root) = std::env::var("TRIBUTARY_LOCAL_S3_ROOT") {
        // Local loop: serve s3://bucket/key from <root>/bucket/key (no AWS needed).
        engine = engine.with_local_s3_root(root);
    }
    let engine = Arc::new(engine);
    tracing::info!(config = %location, tables = engine.config().tables.len(), "tributary merge function ready");
    lambda_runtime::run(service_fn(move |ev: LambdaEvent<Value>| {
        let engine = engine.clone();
        async move { handle(&engine, ev).await }
    }))
    .await
}

async fn handle(engine: &Engine, ev: LambdaEvent<Value>) -> Result<Value, Error> {
    let handled = tributary::events::handle(engine, &ev.payload).await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default();
    for line in tributary::metrics::emf(&handled.report, now) {
        println!("{line}");
    }
    for (id, reason) in &handled.failed_messages {
        tracing::error!(message_id = ?id, error = %reason, "message failed; it will be retried (then dead-lettered)");
    }
    Ok(handled.response()?)
}
