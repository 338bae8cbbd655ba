//! The transport seam: how an invocation's messages reached the merge function, and how
//! each message's fate is settled with what delivered it. The merge itself
//! (`crate::handler::merge`) is the same whatever the transport.
//!
//! - [`Direct`]: S3 notifications and EventBridge events invoking the function themselves.
//!   Lambda retries a failed invocation whole (then its on-failure destination takes it):
//!   nothing is forwarded, moved aside or backed off here, the response says what failed.
//! - `crate::queues::Queues`: SQS. Notifications of the standard queue forwarded to the
//!   FIFO queue, one message group per table; FIFO messages with files that cannot be
//!   merged moved to the dead-letter queue; failed messages backed off.
//!
//! A new transport (Kinesis, say) is another implementation, and an [`crate::events`]
//! parser for its envelope.

use std::future::Future;

use serde_json::Value;
use url::Url;

use tributary::Engine;

use crate::events::{Invocation, Message};
use crate::FunctionError;

/// Why a message's failed files could not be moved aside (the message is then reported
/// failed, and tried again soon).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// This transport moves nothing aside.
    #[error("no dead-letter queue configured")]
    NoDeadLetterQueue,
    /// The message carries no id, or no delivery to name its source queue by.
    #[error("the message has no id or source queue to dead-letter it with")]
    Undeliverable,
    /// A message attribute could not be built (`name`; the SDK's reason).
    #[error("cannot build the message attribute {name}: {error}")]
    Attribute { name: &'static str, error: String },
    /// SQS refused or could not be reached (the SDK's error with its context).
    #[error("{0}")]
    Sqs(String),
}

/// How an invocation's messages came, and how their fates are settled with it.
pub trait Transport: Sync {
    /// Take the invocation elsewhere instead of merging it: `Some(response)` when this
    /// transport forwards it, `None` when it is merged here.
    fn forward(
        &self,
        engine: &Engine,
        inv: &Invocation,
    ) -> impl Future<Output = Option<Result<Value, FunctionError>>> + Send;

    /// Whether messages of `inv` with files that cannot be merged (not retryable) are moved
    /// aside at once ([`Transport::dead_letter`]) rather than reported failed.
    fn dead_letters(&self, inv: &Invocation) -> bool;

    /// Move the failed `files` of `message` aside with `reason` (its other files merged).
    fn dead_letter(
        &self,
        message: &Message,
        files: &[Url],
        reason: &str,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// After the merge: the messages `back_off` (failed, retryable) come back after a short,
    /// growing delay; the messages `go_on` (a widening staged as far as the invocation's
    /// time allowed) at once.
    fn settle(
        &self,
        inv: &Invocation,
        back_off: &[String],
        go_on: &[String],
    ) -> impl Future<Output = ()> + Send;
}

/// S3 and EventBridge invoking the function directly (and any caller without queues:
/// `crate::handler::handle`): nothing forwarded, moved aside or backed off.
#[derive(Debug, Clone, Copy, Default)]
pub struct Direct;

impl Transport for Direct {
    async fn forward(&self, _: &Engine, _: &Invocation) -> Option<Result<Value, FunctionError>> {
        None
    }

    fn dead_letters(&self, _: &Invocation) -> bool {
        false
    }

    async fn dead_letter(&self, _: &Message, _: &[Url], _: &str) -> Result<(), TransportError> {
        Err(TransportError::NoDeadLetterQueue)
    }

    async fn settle(&self, _: &Invocation, _: &[String], _: &[String]) {}
}
