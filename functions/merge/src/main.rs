//! Lambda: merge the DMS files announced by S3 notifications (direct or through SQS) and
//! EventBridge "Object Created" events into their Delta tables.
//!
//! Fed by the standard queue with `TRIBUTARY_ROUTE_TO` set, it forwards each notification to
//! that FIFO queue with the table as message group, and merges what the FIFO queue feeds
//! it: one writer per table (`tributary_lambda::queues`).
//!
//! Environment: `TRIBUTARY_CONFIG` (path or s3:// URI of the table configuration, required),
//! `RUST_LOG`, `AWS_ENDPOINT_URL` for emulators, `TRIBUTARY_LOCAL_S3_ROOT` to serve
//! `s3://bucket/key` from `<root>/bucket/key` when running locally, `TRIBUTARY_ROUTE_TO`,
//! `TRIBUTARY_ROUTE_FROM`, `TRIBUTARY_DEAD_LETTER_TO`, `TRIBUTARY_CONFIG_CHECK_SECONDS`,
//! `TRIBUTARY_TABLES_LOCATION`, `TRIBUTARY_SPILL_MB`, `TRIBUTARY_RETRY_BASE_SECONDS`
//! (docs/configuration.md, "Environment").

use std::sync::{Arc, OnceLock};

use serde_json::Value;
use tributary::Engine;
use tributary_lambda::queues::Queues;
use tributary_lambda::{self as lambda, handler, metrics, FunctionError};

/// The queues, read from the environment once per cold start.
static QUEUES: OnceLock<Queues> = OnceLock::new();

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    // An environment that is not valid fails the init, with the reason.
    let queues = Queues::from_env()?;
    let queues: &'static Queues = QUEUES.get_or_init(|| queues);
    lambda::run(move |engine, event| handle(queues, engine, event)).await
}

async fn handle(
    queues: &'static Queues,
    engine: Arc<Engine>,
    event: Value,
) -> Result<Value, FunctionError> {
    if queues.forwards(&event) {
        return queues.forward(&engine, &event).await;
    }
    let handled = handler::handle_with(&engine, Some(queues), &event).await?;
    for line in metrics::emf(&handled.report, lambda::now_ms()) {
        println!("{line}");
    }
    for (id, reason, _) in &handled.failed_messages {
        tracing::error!(message_id = ?id, error = %reason, "message failed; it will be retried (then dead-lettered)");
    }
    queues.back_off(&event, &handled.to_back_off()).await;
    queues.go_on(&event, &handled.go_on).await;
    handled.response()
}
