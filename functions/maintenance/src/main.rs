//! Lambda: on a schedule, maintain the configured tables (compaction, checkpoint, vacuum,
//! tombstone expiry, symlink manifests), or apply a DMS table reload.
//!
//! Event: any scheduled event. `{"table": "name"}`, `{"tables": ["a", "b"]}` (also inside
//! `detail`, as EventBridge rules with input transformers deliver it) limit the run;
//! `"force": true` allows a VACUUM retention below the configured minimum;
//! `{"reload": "name"}` applies that table's DMS reload instead (parsed at the edge:
//! `tributary_lambda::maintenance::MaintenanceRequest`).
//! Environment: as the merge function.

use std::sync::Arc;

use serde_json::Value;
use tributary::{maintenance, Engine};
use tributary_lambda::maintenance::MaintenanceRequest;
use tributary_lambda::{self as lambda, metrics, FunctionError};

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    lambda::run(handle).await
}

async fn handle(engine: Arc<Engine>, request: MaintenanceRequest) -> Result<Value, FunctionError> {
    let summary = maintenance::handle(&engine, &request.into()).await?;
    for line in metrics::maintenance_emf(&summary, lambda::now_ms()) {
        println!("{line}");
    }
    lambda::maintenance_response(&summary)
}
