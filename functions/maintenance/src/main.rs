//! Lambda: on a schedule, maintain the configured tables (compaction, checkpoint, vacuum,
//! tombstone expiry, symlink manifests).
//!
//! Event: any scheduled event. `{"table": "name"}`, `{"tables": ["a", "b"]}` (also inside
//! `detail`, as EventBridge rules with input transformers deliver it) limit the run;
//! `"force": true` allows a VACUUM retention below the configured minimum.
//! Environment: as the merge function.

use std::sync::Arc;

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;
use tributary::{lambda, maintenance, metrics};

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Error> {
    lambda::init_tracing();
    let engine = Arc::new(lambda::engine_from_env().await?);
    lambda_runtime::run(service_fn(move |ev: LambdaEvent<Value>| {
        let engine = engine.clone();
        async move {
            let request = maintenance::Request::from_event(&ev.payload);
            let summary = maintenance::handle(&engine, &request).await?;
            for line in metrics::maintenance_emf(&summary, lambda::now_ms()) {
                println!("{line}");
            }
            summary.response().map_err(Error::from)
        }
    }))
    .await
}
