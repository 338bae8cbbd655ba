//! Lambda: merge the DMS files announced by S3 notifications (direct or through SQS) and
//! EventBridge "Object Created" events into their Delta tables.
//!
//! Environment: `TRIBUTARY_CONFIG` (path or s3:// URI of the table configuration, required),
//! `RUST_LOG`, `AWS_ENDPOINT_URL` for emulators, `TRIBUTARY_LOCAL_S3_ROOT` to serve
//! `s3://bucket/key` from `<root>/bucket/key` when running locally.

use std::sync::Arc;

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;
use tributary::{lambda, Engine};

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Error> {
    lambda::init_tracing();
    // Built once per cold start; a bad configuration fails the init with a clear message.
    let engine = Arc::new(lambda::engine_from_env().await?);
    lambda_runtime::run(service_fn(move |ev: LambdaEvent<Value>| {
        let engine = engine.clone();
        async move { handle(&engine, ev).await }
    }))
    .await
}

async fn handle(engine: &Engine, ev: LambdaEvent<Value>) -> Result<Value, Error> {
    let handled = tributary::events::handle(engine, &ev.payload).await?;
    for line in tributary::metrics::emf(&handled.report, lambda::now_ms()) {
        println!("{line}");
    }
    for (id, reason) in &handled.failed_messages {
        tracing::error!(message_id = ?id, error = %reason, "message failed; it will be retried (then dead-lettered)");
    }
    Ok(handled.response()?)
}
