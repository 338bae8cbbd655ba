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

// The merge's future (the engine's whole pipeline under the handler, instantiated per
// transport) is deeper than rustc's default layout query depth.
#![recursion_limit = "256"]

use std::sync::{Arc, OnceLock};

use serde_json::Value;
use tributary::Engine;
use tributary_lambda::events::{Invocation, Trigger};
use tributary_lambda::queues::Queues;
use tributary_lambda::transport::{Direct, Transport};
use tributary_lambda::{self as lambda, handler, metrics, FunctionError};

/// The queues, read from the environment once per cold start.
static QUEUES: OnceLock<Queues> = OnceLock::new();

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    // An environment that is not valid fails the init, with the reason.
    let queues = Queues::from_env()?;
    let queues: &'static Queues = QUEUES.get_or_init(|| queues);
    lambda::run(move |engine, inv: Invocation| handle(queues, engine, inv)).await
}

/// SQS batches through the queues (forwarding, dead-lettering, back-off); S3 and
/// EventBridge invocations directly.
async fn handle(
    queues: &'static Queues,
    engine: Arc<Engine>,
    inv: Invocation,
) -> Result<Value, FunctionError> {
    match inv.trigger {
        Trigger::Sqs => serve(queues, &engine, &inv).await,
        Trigger::S3 | Trigger::EventBridge => serve(&Direct, &engine, &inv).await,
    }
}

async fn serve(
    transport: &impl Transport,
    engine: &Engine,
    inv: &Invocation,
) -> Result<Value, FunctionError> {
    if let Some(forwarded) = transport.forward(engine, inv).await {
        return forwarded;
    }
    let handled = handler::merge(engine, transport, inv).await;
    for line in metrics::emf(&handled.report, lambda::now_ms()) {
        println!("{line}");
    }
    for f in &handled.failed_messages {
        tracing::error!(message_id = ?f.id, error = %f.reason, "message failed; it will be retried (then dead-lettered)");
    }
    transport
        .settle(inv, &handled.to_back_off(), &handled.go_on)
        .await;
    handled.response()
}
