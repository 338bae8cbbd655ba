//! Lambda: merge the DMS files announced by S3 notifications (direct or through SQS) and
//! EventBridge "Object Created" events into their Delta tables.
//!
//! Environment: `TRIBUTARY_CONFIG` (path or s3:// URI of the table configuration, required),
//! `RUST_LOG`, `AWS_ENDPOINT_URL` for emulators, `TRIBUTARY_LOCAL_S3_ROOT` to serve
//! `s3://bucket/key` from `<root>/bucket/key` when running locally.

use std::sync::Arc;

use serde_json::Value;
use tributary::lambda::{self, events, metrics, FunctionError};
use tributary::Engine;

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    lambda::run(handle).await
}

async fn handle(engine: Arc<Engine>, event: Value) -> Result<Value, FunctionError> {
    let handled = events::handle(&engine, &event).await?;
    for line in metrics::emf(&handled.report, lambda::now_ms()) {
        println!("{line}");
    }
    for (id, reason) in &handled.failed_messages {
        tracing::error!(message_id = ?id, error = %reason, "message failed; it will be retried (then dead-lettered)");
    }
    handled.response()
}
