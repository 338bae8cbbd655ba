//! One writer per table: the merge function, fed by the standard queue S3 notifies,
//! forwards the files each batch of notifications announces to a FIFO queue, one message
//! per table (the message group) announcing all of that table's files; fed by that FIFO
//! queue, the same function merges. SQS gives a message group's messages to one consumer at
//! a time, so each table's files are merged by one invocation at a time, in batches of up to
//! ten messages (a hundred files and more), while different tables proceed in parallel — a
//! burst or a backfill of one table becomes a few large commits instead of many commits
//! fighting over the table.
//!
//! A FIFO message with files that cannot be merged (a named, non-retryable error) would
//! hold its table's group until SQS dead-letters it; those files are moved to the
//! dead-letter queue at once instead — one message announcing just them, with the error as a
//! message attribute — and the message's other files are merged, so the table goes on.
//! A message with a retryable failure (storage, contention) stays in place and is retried
//! whole (its merged files change nothing the second time) — after a short delay, not the
//! queue's visibility timeout (5,400 s in the template): [`Queues::back_off`] sets the
//! visibility of every such message, on either queue, to `base·3^(n−1)` seconds (`n`: its
//! receive count), at most [`RETRY_CAP_SECONDS`], ±20 % jitter. A table's FIFO group is
//! held minutes by a passing failure, not hours.
//!
//! Environment: `TRIBUTARY_ROUTE_TO` (the FIFO queue's URL: forwarding on),
//! `TRIBUTARY_ROUTE_FROM` (the ARN of the queue whose messages are forwarded; default: any
//! standard queue), `TRIBUTARY_DEAD_LETTER_TO` (where such files are moved),
//! `TRIBUTARY_RETRY_BASE_SECONDS` (the backoff's first delay, default 60; 0: off, a failed
//! message waits the queue's visibility timeout).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_lambda_events::event::sqs::SqsBatchResponse;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, MessageAttributeValue, SendMessageBatchRequestEntry,
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;
use url::Url;

use tributary::Engine;

use crate::events::{self, Delivery, Invocation, Message};
use crate::transport::{Transport, TransportError};
use crate::FunctionError;

/// Message group of notifications no configured table claims (the merge ignores them).
pub const UNROUTED_GROUP: &str = "_unrouted";

/// The backoff's longest delay (before jitter).
pub const RETRY_CAP_SECONDS: u32 = 1800;
/// `TRIBUTARY_RETRY_BASE_SECONDS` when not set.
pub const DEFAULT_RETRY_BASE_SECONDS: u32 = 60;
/// The visibility timeout of a message whose widening goes on in the next attempt.
pub const GO_ON_SECONDS: i32 = 1;

/// Most entries of one `ChangeMessageVisibilityBatch` (SQS's limit).
const MAX_VISIBILITY_ENTRIES: usize = 10;

/// The queues the merge function forwards to and dead-letters into.
#[derive(Debug, Default)]
pub struct Queues {
    pub route_to: Option<String>,
    pub route_from: Option<String>,
    pub dead_letter_to: Option<String>,
    /// The backoff's first delay in seconds; 0: off (failed messages wait the queue's
    /// visibility timeout).
    pub retry_base: u32,
    client: OnceCell<aws_sdk_sqs::Client>,
}

/// `TRIBUTARY_RETRY_BASE_SECONDS`: whole seconds from 0 (off) to [`RETRY_CAP_SECONDS`];
/// unset or empty: [`DEFAULT_RETRY_BASE_SECONDS`].
// The core's `Error` unboxed, as the other start-up checks return it.
#[allow(clippy::result_large_err)]
pub fn retry_base(value: Option<&str>) -> tributary::Result<u32> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(DEFAULT_RETRY_BASE_SECONDS);
    };
    v.parse::<u32>()
        .ok()
        .filter(|n| *n <= RETRY_CAP_SECONDS)
        .ok_or_else(|| {
            tributary::Error::config(
                "environment",
                format!(
                    "TRIBUTARY_RETRY_BASE_SECONDS={v} is not a whole number of seconds from 0 to {RETRY_CAP_SECONDS}: the first delay before a failed message is retried (default {DEFAULT_RETRY_BASE_SECONDS}; 0 turns the backoff off)"
                ),
            )
        })
}

/// The visibility timeout, in seconds, a message received `receive_count` times gets after
/// a retryable failure: `base·3^(n−1)`, at most [`RETRY_CAP_SECONDS`], times `1 + 0.2·jitter`
/// (`jitter` in −1..=1, so that messages failed together do not come back together), at
/// least 1.
pub fn retry_delay(base: u32, receive_count: u32, jitter: f64) -> i32 {
    let n = receive_count.clamp(1, 20) - 1;
    let delay = (f64::from(base) * 3f64.powi(n as i32)).min(f64::from(RETRY_CAP_SECONDS));
    (delay * (1.0 + 0.2 * jitter.clamp(-1.0, 1.0)))
        .round()
        .max(1.0) as i32
}

/// A number in −1..=1, different at every call.
fn random_jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

/// One `ChangeMessageVisibilityBatch`: the queue and, per message, (entry id, message id,
/// receipt handle, visibility timeout in seconds).
#[derive(Debug, PartialEq)]
struct VisibilityBatch {
    queue_url: String,
    entries: Vec<(String, String, String, i32)>,
}

/// The SQS messages of an invocation, with their ids (empty when absent) and deliveries.
fn deliveries(inv: &Invocation) -> impl Iterator<Item = (&str, &Delivery, &Message)> {
    inv.messages.iter().filter_map(|m| {
        m.delivery
            .as_ref()
            .map(|d| (m.id.as_deref().unwrap_or(""), d, m))
    })
}

fn is_fifo(arn: &str) -> bool {
    arn.ends_with(".fifo")
}

impl Queues {
    /// The queues and the backoff from the environment; `Err` (at cold start: the init
    /// fails with the reason) when `TRIBUTARY_RETRY_BASE_SECONDS` is not valid.
    #[allow(clippy::result_large_err)]
    pub fn from_env() -> tributary::Result<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        Ok(Queues {
            route_to: var("TRIBUTARY_ROUTE_TO"),
            route_from: var("TRIBUTARY_ROUTE_FROM"),
            dead_letter_to: var("TRIBUTARY_DEAD_LETTER_TO"),
            retry_base: retry_base(var("TRIBUTARY_RETRY_BASE_SECONDS").as_deref())?,
            client: OnceCell::new(),
        })
    }

    /// The URL of the queue with this ARN, without asking SQS (`GetQueueUrl` is not
    /// granted): a configured queue URL naming the same account and queue (the FIFO queue is
    /// `TRIBUTARY_ROUTE_TO`), else the standard form
    /// `https://sqs.<region>.<domain>/<account>/<name>` (SQS reads the account and queue
    /// from it, whatever endpoint the client talks to).
    fn queue_url(&self, arn: &str) -> Option<String> {
        let parts: Vec<&str> = arn.split(':').collect();
        let ["arn", partition, "sqs", region, account, name] = parts[..] else {
            return None;
        };
        if region.is_empty() || account.is_empty() || name.is_empty() {
            return None;
        }
        let tail = format!("/{account}/{name}");
        if let Some(known) = [&self.route_to, &self.dead_letter_to]
            .into_iter()
            .flatten()
            .find(|u| u.trim_end_matches('/').ends_with(&tail))
        {
            return Some(known.trim_end_matches('/').to_string());
        }
        let domain = match partition {
            "aws-cn" => "amazonaws.com.cn",
            _ => "amazonaws.com",
        };
        Some(format!("https://sqs.{region}.{domain}{tail}"))
    }

    /// The visibility changes that back off the messages `ids` of `inv`: per source
    /// queue, calls of at most ten entries, each message's delay from its receive count
    /// ([`retry_delay`], with `jitter`). Nothing when the backoff is off.
    fn plan_back_off(
        &self,
        inv: &Invocation,
        ids: &[String],
        mut jitter: impl FnMut() -> f64,
    ) -> Vec<VisibilityBatch> {
        if self.retry_base == 0 {
            return vec![];
        }
        let base = self.retry_base;
        self.plan_visibility(inv, ids, |n| retry_delay(base, n, jitter()))
    }

    /// The visibility changes that make the messages `ids` of `inv` visible again after
    /// `delay(receive count)` seconds: per source queue, calls of at most ten entries.
    fn plan_visibility(
        &self,
        inv: &Invocation,
        ids: &[String],
        mut delay: impl FnMut(u32) -> i32,
    ) -> Vec<VisibilityBatch> {
        if ids.is_empty() {
            return vec![];
        }
        let wanted: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
        let mut per_queue: BTreeMap<&str, Vec<(String, String, i32)>> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for (id, d, _) in deliveries(inv) {
            let Some(receipt) = d.receipt.as_deref().filter(|r| !r.is_empty()) else {
                continue;
            };
            if !wanted.contains(id) || !seen.insert(id) {
                continue;
            }
            per_queue.entry(&d.queue_arn).or_default().push((
                id.to_string(),
                receipt.to_string(),
                delay(d.receive_count),
            ));
        }
        let mut out = Vec::new();
        for (arn, entries) in per_queue {
            let Some(queue_url) = self.queue_url(arn) else {
                tracing::warn!(
                    queue = arn,
                    messages = entries.len(),
                    "not an SQS queue ARN: failed messages wait the queue's visibility timeout"
                );
                continue;
            };
            for chunk in entries.chunks(MAX_VISIBILITY_ENTRIES) {
                out.push(VisibilityBatch {
                    queue_url: queue_url.clone(),
                    entries: chunk
                        .iter()
                        .enumerate()
                        .map(|(i, (id, receipt, secs))| {
                            (format!("v{i}"), id.clone(), receipt.clone(), *secs)
                        })
                        .collect(),
                });
            }
        }
        out
    }

    /// Make the messages `ids` of `inv` (failed, retryable, reported in the partial
    /// batch response) visible again after a short, growing delay instead of the queue's
    /// visibility timeout. A change that fails is logged (WARN): that message then waits
    /// the full timeout, as without the backoff.
    pub async fn back_off(&self, inv: &Invocation, ids: &[String]) {
        self.change_visibility(self.plan_back_off(inv, ids, random_jitter))
            .await;
    }

    /// Make the messages `ids` of `inv` (failed: a widening staged as far as the
    /// invocation's time allowed) visible again at once ([`GO_ON_SECONDS`]), so that the
    /// next attempt goes on with it — whatever the backoff setting: it is progress, not a
    /// failure to wait out.
    pub async fn go_on(&self, inv: &Invocation, ids: &[String]) {
        self.change_visibility(self.plan_visibility(inv, ids, |_| GO_ON_SECONDS))
            .await;
    }

    async fn change_visibility(&self, batches: Vec<VisibilityBatch>) {
        if batches.is_empty() {
            return;
        }
        let sqs = self.sqs().await;
        for b in batches {
            let entries: Vec<ChangeMessageVisibilityBatchRequestEntry> = b
                .entries
                .iter()
                .filter_map(|(entry, _, receipt, secs)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(entry)
                        .receipt_handle(receipt)
                        .visibility_timeout(*secs)
                        .build()
                        .ok()
                })
                .collect();
            let res = sqs
                .change_message_visibility_batch()
                .queue_url(&b.queue_url)
                .set_entries(Some(entries))
                .send()
                .await;
            match res {
                Ok(out) => {
                    let failed: BTreeMap<&str, (&str, Option<&str>)> = out
                        .failed()
                        .iter()
                        .map(|f| (f.id(), (f.code(), f.message())))
                        .collect();
                    for (entry, id, _, secs) in &b.entries {
                        match failed.get(entry.as_str()) {
                            None => {
                                tracing::info!(message_id = %id, retry_in_seconds = secs, "failed message backed off: retried after a short delay");
                            }
                            Some((code, message)) => {
                                tracing::warn!(message_id = %id, code, message, "cannot back off the failed message: it waits the queue's visibility timeout");
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(queue = %b.queue_url, messages = b.entries.len(), error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "cannot back off the failed messages: they wait the queue's visibility timeout");
                }
            }
        }
    }

    async fn sqs(&self) -> &aws_sdk_sqs::Client {
        self.client
            .get_or_init(|| async {
                let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
                    .load()
                    .await;
                aws_sdk_sqs::Client::new(&config)
            })
            .await
    }

    /// Whether this invocation is to be forwarded rather than merged: SQS messages of the
    /// routed (standard) queue, with forwarding on.
    pub fn forwards(&self, inv: &Invocation) -> bool {
        if self.route_to.is_none() {
            return false;
        }
        let mut sources = deliveries(inv)
            .map(|(_, d, _)| d.queue_arn.as_str())
            .peekable();
        sources.peek().is_some()
            && sources.all(|source| match &self.route_from {
                Some(from) => source == from,
                None => !is_fifo(source),
            })
    }

    /// Forward every message to the FIFO queue `to`, grouped by table. Returns the partial
    /// batch response (messages that could not be forwarded are retried).
    async fn forward_to(
        &self,
        to: &str,
        engine: &Engine,
        inv: &Invocation,
    ) -> Result<Value, FunctionError> {
        let plan = plan_forward(engine, inv);
        let mut failed: Vec<String> = plan.unreadable.clone();
        let sqs = self.sqs().await;
        for batch in send_batches(&plan.sends) {
            let entries: Vec<SendMessageBatchRequestEntry> = batch
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    SendMessageBatchRequestEntry::builder()
                        .id(format!("m{i}"))
                        .message_body(s.body.clone())
                        .message_group_id(s.group.clone())
                        .message_deduplication_id(s.dedup.clone())
                        .build()
                        .ok()
                })
                .collect();
            let res = sqs
                .send_message_batch()
                .queue_url(to)
                .set_entries(Some(entries))
                .send()
                .await;
            match res {
                Ok(out) => {
                    for f in out.failed() {
                        tracing::error!(
                            entry = f.id(),
                            code = f.code(),
                            message = f.message(),
                            "not forwarded; the messages will be retried"
                        );
                        let sent = f
                            .id()
                            .strip_prefix('m')
                            .and_then(|i| i.parse::<usize>().ok())
                            .and_then(|i| batch.get(i));
                        match sent {
                            Some(s) => failed.extend(s.sources.iter().cloned()),
                            // An entry we cannot tell: retry every message of the call.
                            None => {
                                failed.extend(batch.iter().flat_map(|s| s.sources.iter().cloned()))
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "forwarding failed; the messages will be retried");
                    failed.extend(batch.iter().flat_map(|s| s.sources.iter().cloned()));
                }
            }
        }
        for (group, (messages, files)) in &plan.per_group {
            tracing::info!(group = %group, messages, files, "forwarded to the table's message group");
        }
        failed.sort();
        failed.dedup();
        // Those not sent are tried again soon; an unreadable message fails the same way.
        let unsent: Vec<String> = failed
            .iter()
            .filter(|id| !plan.unreadable.contains(id))
            .cloned()
            .collect();
        self.back_off(inv, &unsent).await;
        let mut r = SqsBatchResponse::default();
        for id in failed {
            r.add_failure(id);
        }
        Ok(serde_json::to_value(r)?)
    }

    /// Move the files of a FIFO message that cannot be merged to the dead-letter queue: one
    /// message announcing just those `files` (its other files were merged), with the error
    /// and the source queue as attributes. `Err` when that fails (the message is then
    /// reported failed, as without a dead-letter queue).
    async fn dead_letter_files(
        &self,
        m: &Message,
        files: &[Url],
        reason: &str,
    ) -> Result<(), TransportError> {
        let Some(to) = &self.dead_letter_to else {
            return Err(TransportError::NoDeadLetterQueue);
        };
        let (Some(id), Some(d)) = (&m.id, &m.delivery) else {
            return Err(TransportError::Undeliverable);
        };
        // SQS attribute values are limited; the logs carry the whole error.
        let reason: String = reason.chars().take(4000).collect();
        let attr = |name: &'static str, v: &str| {
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(v)
                .build()
                .map_err(|e| TransportError::Attribute {
                    name,
                    error: e.to_string(),
                })
        };
        self.sqs()
            .await
            .send_message()
            .queue_url(to)
            .message_body(events::s3_notification(files.iter().map(|f| (f, None))).to_string())
            .message_attributes("tributary_message_id", attr("tributary_message_id", id)?)
            .message_attributes("tributary_error", attr("tributary_error", &reason)?)
            .message_attributes(
                "tributary_source_queue",
                attr("tributary_source_queue", &d.queue_arn)?,
            )
            .send()
            .await
            .map(|_| ())
            .map_err(|e| {
                TransportError::Sqs(aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())
            })
    }
}

/// SQS: forwarding to the FIFO queue, dead-lettering FIFO messages, backing off failed
/// messages (the module's documentation).
impl Transport for Queues {
    async fn forward(
        &self,
        engine: &Engine,
        inv: &Invocation,
    ) -> Option<Result<Value, FunctionError>> {
        let to = self.route_to.as_deref().filter(|_| self.forwards(inv))?;
        Some(self.forward_to(to, engine, inv).await)
    }

    /// FIFO messages, with a dead-letter queue configured.
    fn dead_letters(&self, inv: &Invocation) -> bool {
        self.dead_letter_to.is_some() && deliveries(inv).any(|(_, d, _)| is_fifo(&d.queue_arn))
    }

    async fn dead_letter(
        &self,
        message: &Message,
        files: &[Url],
        reason: &str,
    ) -> Result<(), TransportError> {
        self.dead_letter_files(message, files, reason).await
    }

    async fn settle(&self, inv: &Invocation, back_off: &[String], go_on: &[String]) {
        self.back_off(inv, back_off).await;
        self.go_on(inv, go_on).await;
    }
}

/// Most files one forwarded message announces.
pub const MAX_FILES_PER_MESSAGE: usize = 100;
/// Largest body of a forwarded message, and largest `SendMessageBatch` (SQS's limit is
/// 256 KiB for either, attributes included).
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most bytes of source files one forwarded message announces: about what ten files of
/// DMS's largest default size (1 GB) were per invocation before messages carried several.
const MAX_SOURCE_BYTES: u64 = 1024 * 1024 * 1024;
/// The size a file counts for when its notification does not say.
const UNKNOWN_SIZE: u64 = MAX_SOURCE_BYTES / 10;
const MAX_SEND_BYTES: usize = 200 * 1024;

/// What forwarding one event sends.
#[derive(Debug, Default)]
struct ForwardPlan {
    sends: Vec<Send>,
    /// Messages whose body is not a notification tributary understands (reported failed:
    /// retried, then dead-lettered, as the merge would).
    unreadable: Vec<String>,
    /// Per message group: (messages sent, files announced).
    per_group: BTreeMap<String, (usize, usize)>,
}

#[derive(Debug)]
struct Send {
    /// The routed messages announcing its files: reported failed if it cannot be sent.
    sources: BTreeSet<String>,
    group: String,
    dedup: String,
    body: String,
}

/// A file to forward: its URL, its size when the notification says, and the routed
/// messages announcing it.
struct Announced {
    file: Url,
    size: Option<u64>,
    sources: BTreeSet<String>,
}

/// One message per table (message group) and routed batch, announcing all of that
/// table's files the batch announces — at most [`MAX_FILES_PER_MESSAGE`] files,
/// [`MAX_SOURCE_BYTES`] of them (a file of unknown size counts as [`UNKNOWN_SIZE`]) and
/// [`MAX_BODY_BYTES`] of body; more make more messages — as an S3 notification: a FIFO
/// batch of ten messages then merges up to a thousand small files in a few commits
/// instead of ten commits, while a batch of large files stays as much work as ten of them
/// (within the function's time limit). A file announced twice in the batch (duplicate
/// deliveries) is announced once.
///
/// The deduplication id is a hash of the group, the files and the routed messages, so a
/// redelivery of the same messages routed the same way within SQS's five-minute window
/// sends nothing new, while a new notification for a file (a corrected upload) is always
/// sent.
fn plan_forward(engine: &Engine, inv: &Invocation) -> ForwardPlan {
    let mut plan = ForwardPlan::default();
    // Per group, its files in the order announced (and where each file is in its list).
    let mut groups: BTreeMap<String, Vec<Announced>> = BTreeMap::new();
    let mut at: HashMap<(String, Url), usize> = Default::default();
    for (id, _, m) in deliveries(inv) {
        let objects = match &m.objects {
            Ok(o) => o,
            Err(reason) => {
                tracing::error!(message_id = id, error = %reason, "cannot understand message");
                plan.unreadable.push(id.to_string());
                continue;
            }
        };
        for events::Object { url: o, size } in objects.iter().cloned() {
            let group = engine
                .config()
                .table_for(&engine.resolve(&o))
                .map(|t| t.name.clone())
                .unwrap_or_else(|| UNROUTED_GROUP.to_string());
            let files = groups.entry(group.clone()).or_default();
            match at.entry((group, o.clone())) {
                Entry::Occupied(i) => {
                    files[*i.get()].sources.insert(id.to_string());
                }
                Entry::Vacant(v) => {
                    v.insert(files.len());
                    files.push(Announced {
                        file: o,
                        size,
                        sources: BTreeSet::from([id.to_string()]),
                    });
                }
            }
        }
    }
    for (group, files) in groups {
        let mut chunk: Vec<Announced> = Vec::new();
        let (mut body, mut source) = (0, 0);
        for a in files {
            let record = events::s3_record(&a.file, a.size).to_string().len() + 1;
            let size = a.size.unwrap_or(UNKNOWN_SIZE);
            if !chunk.is_empty()
                && (chunk.len() == MAX_FILES_PER_MESSAGE
                    || body + record > MAX_BODY_BYTES
                    || source + size > MAX_SOURCE_BYTES)
            {
                plan.push(&group, std::mem::take(&mut chunk));
                (body, source) = (0, 0);
            }
            body += record;
            source += size;
            chunk.push(a);
        }
        if !chunk.is_empty() {
            plan.push(&group, chunk);
        }
    }
    plan
}

impl ForwardPlan {
    fn push(&mut self, group: &str, files: Vec<Announced>) {
        let sources: BTreeSet<String> = files.iter().flat_map(|a| a.sources.clone()).collect();
        let mut hash = Sha256::new();
        for part in std::iter::once(group)
            .chain(files.iter().map(|a| a.file.as_str()))
            .chain(sources.iter().map(String::as_str))
        {
            hash.update(part.as_bytes());
            hash.update([0]);
        }
        let dedup = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
        let counts = self.per_group.entry(group.to_string()).or_default();
        counts.0 += 1;
        counts.1 += files.len();
        self.sends.push(Send {
            sources,
            group: group.to_string(),
            dedup,
            body: events::s3_notification(files.iter().map(|a| (&a.file, a.size))).to_string(),
        });
    }
}

/// `SendMessageBatch` calls: at most ten entries and [`MAX_SEND_BYTES`] each.
fn send_batches(sends: &[Send]) -> Vec<&[Send]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, s) in sends.iter().enumerate() {
        if i > start && (i - start == 10 || bytes + s.body.len() > MAX_SEND_BYTES) {
            out.push(&sends[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += s.body.len();
    }
    if start < sends.len() {
        out.push(&sends[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sqs(id: &str, arn: &str, key: &str) -> Value {
        sized(id, arn, key, Some(50_000))
    }

    fn sized(id: &str, arn: &str, key: &str, size: Option<u64>) -> Value {
        let mut object = json!({ "key": key });
        if let Some(n) = size {
            object["size"] = n.into();
        }
        json!({"messageId": id, "eventSource": "aws:sqs", "eventSourceARN": arn,
               "body": json!({"Records":[{"eventSource":"aws:s3","eventName":"ObjectCreated:Put",
                   "s3":{"bucket":{"name":"raw"},"object":object}}]}).to_string()})
    }

    fn inv(event: &Value) -> Invocation {
        events::parse(event).unwrap()
    }

    /// Tables `orders` and `items`, fed from `s3://raw/dms/s/<table>/`.
    fn engine() -> Engine {
        let text: String = ["orders", "items"]
            .iter()
            .map(|t| {
                format!("[[table]]\nname = \"{t}\"\nsource = \"s3://raw/dms/s/{t}/\"\ntarget = \"s3://c/{t}\"\nprimary_key = [\"id\"]\n")
            })
            .collect();
        Engine::new(tributary::Config::from_toml(&text, "t", None).unwrap())
    }

    /// Each message a plan sends: its group, the ids of the messages it carries and the keys
    /// of the files it announces.
    fn sends(plan: &ForwardPlan) -> Vec<(&str, Vec<&str>, Vec<String>)> {
        plan.sends
            .iter()
            .map(|s| {
                let body: Value = serde_json::from_str(&s.body).unwrap();
                let keys = body["Records"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["s3"]["object"]["key"].as_str().unwrap().to_string())
                    .collect();
                let ids = s.sources.iter().map(String::as_str).collect();
                (s.group.as_str(), ids, keys)
            })
            .collect()
    }

    #[test]
    fn a_batch_goes_to_its_tables_groups_one_message_each_and_only_routed_queues_forward() {
        let std_arn = "arn:aws:sqs:us-east-1:1:merge";
        let fifo_arn = "arn:aws:sqs:us-east-1:1:merge.fifo";
        let event = json!({"Records": [
            sqs("a", std_arn, "dms/s/orders/20240101-1.parquet"),
            sqs("b", std_arn, "dms/s/items/20240101-1.parquet"),
            sqs("c", std_arn, "elsewhere/x.parquet"),
            {"messageId": "d", "eventSource": "aws:sqs", "eventSourceARN": std_arn, "body": "not json"},
            sqs("e", std_arn, "dms/s/orders/20240101-2.parquet"),
            sqs("f", std_arn, "dms/s/orders/20240101-1.parquet"),
        ]});
        let plan = plan_forward(&engine(), &inv(&event));
        assert_eq!(
            sends(&plan),
            vec![
                (
                    UNROUTED_GROUP,
                    vec!["c"],
                    vec!["elsewhere/x.parquet".to_string()]
                ),
                (
                    "items",
                    vec!["b"],
                    vec!["dms/s/items/20240101-1.parquet".to_string()]
                ),
                (
                    "orders",
                    vec!["a", "e", "f"],
                    vec![
                        "dms/s/orders/20240101-1.parquet".to_string(),
                        "dms/s/orders/20240101-2.parquet".to_string()
                    ]
                ),
            ],
            "one message per table, a file announced twice sent once"
        );
        assert_eq!(plan.unreadable, vec!["d".to_string()]);
        assert_eq!(plan.per_group["orders"], (1, 2));
        let dedups: BTreeSet<&str> = plan.sends.iter().map(|s| s.dedup.as_str()).collect();
        assert_eq!(dedups.len(), 3);
        let again = plan_forward(&engine(), &inv(&event));
        assert_eq!(
            again.sends.iter().map(|s| &s.dedup).collect::<Vec<_>>(),
            plan.sends.iter().map(|s| &s.dedup).collect::<Vec<_>>(),
            "a redelivered batch is deduplicated"
        );
        let renotified = json!({"Records": [sqs("g", std_arn, "dms/s/items/20240101-1.parquet")]});
        assert_ne!(
            plan_forward(&engine(), &inv(&renotified)).sends[0].dedup,
            plan.sends[1].dedup,
            "a new notification of the same file is a new message"
        );

        let on = Queues {
            route_to: Some("https://sqs/merge.fifo".into()),
            ..Default::default()
        };
        assert!(on.forwards(&inv(&event)));
        let from_fifo = json!({"Records": [sqs("a", fifo_arn, "dms/s/orders/x.parquet")]});
        assert!(
            !on.forwards(&inv(&from_fifo)),
            "the FIFO queue's messages are merged"
        );
        assert!(
            !Queues::default().forwards(&inv(&event)),
            "forwarding off: merged"
        );
        let only = Queues {
            route_from: Some("arn:aws:sqs:us-east-1:1:other".into()),
            ..on
        };
        assert!(!only.forwards(&inv(&event)), "not the routed queue");
        let dl = Queues {
            dead_letter_to: Some("https://sqs/dlq".into()),
            ..Default::default()
        };
        assert!(dl.dead_letters(&inv(&from_fifo)) && !dl.dead_letters(&inv(&event)));
    }

    #[test]
    fn the_backoff_grows_threefold_to_its_cap_with_jitter_within_a_fifth() {
        for (n, want) in [
            (0, 60),
            (1, 60),
            (2, 180),
            (3, 540),
            (4, 1620),
            (5, 1800),
            (99, 1800),
        ] {
            assert_eq!(retry_delay(60, n, 0.0), want, "receive count {n}");
            assert_eq!(retry_delay(60, n, -1.0), (want as f64 * 0.8).round() as i32);
            assert_eq!(retry_delay(60, n, 1.0), (want as f64 * 1.2).round() as i32);
        }
        assert_eq!(retry_delay(1, 1, -1.0), 1, "at least a second");
        assert_eq!(retry_delay(1, 3, 0.0), 9);
        for _ in 0..1000 {
            let j = random_jitter();
            assert!((-1.0..=1.0).contains(&j), "{j}");
            let d = retry_delay(60, 2, j);
            assert!((144..=216).contains(&d), "{d}");
        }
        let spread: BTreeSet<i32> = (0..50)
            .map(|_| retry_delay(60, 2, random_jitter()))
            .collect();
        assert!(spread.len() > 5, "jittered: {spread:?}");
        assert_eq!(retry_base(None).unwrap(), DEFAULT_RETRY_BASE_SECONDS);
        assert_eq!(retry_base(Some(" ")).unwrap(), DEFAULT_RETRY_BASE_SECONDS);
        assert_eq!(retry_base(Some("0")).unwrap(), 0);
        assert_eq!(retry_base(Some(" 5 ")).unwrap(), 5);
        for bad in ["-1", "1.5", "soon", "1801"] {
            let e = retry_base(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("TRIBUTARY_RETRY_BASE_SECONDS") && e.contains(bad),
                "{e}"
            );
        }
    }

    fn received(id: &str, arn: &str, count: Option<&str>) -> Value {
        let mut r = sqs(id, arn, "dms/s/orders/x.parquet");
        r["receiptHandle"] = format!("rh-{id}").into();
        if let Some(n) = count {
            r["attributes"] = json!({ "ApproximateReceiveCount": n });
        }
        r
    }

    #[test]
    #[allow(
        clippy::too_many_lines,
        reason = "one scenario: two queues, twelve messages"
    )]
    fn failed_messages_are_backed_off_per_source_queue_in_calls_of_at_most_ten() {
        let std_arn = "arn:aws:sqs:eu-west-1:123456789012:merge";
        let fifo_arn = "arn:aws:sqs:eu-west-1:123456789012:tables.fifo";
        let mut records: Vec<Value> = (0..23)
            .map(|i| received(&format!("s{i:02}"), std_arn, Some(&(1 + i % 3).to_string())))
            .collect();
        records.extend((0..3).map(|i| received(&format!("f{i}"), fifo_arn, Some("2"))));
        records.push(received("nocount", fifo_arn, None));
        let mut no_receipt = received("noreceipt", fifo_arn, Some("1"));
        no_receipt.as_object_mut().unwrap().remove("receiptHandle");
        records.push(no_receipt);
        let event = json!({ "Records": records });
        let q = Queues {
            route_to: Some("http://localhost:4566/123456789012/tables.fifo".into()),
            retry_base: 10,
            ..Default::default()
        };
        let mut ids: Vec<String> = (0..23).map(|i| format!("s{i:02}")).collect();
        ids.extend(["f0", "f2", "nocount", "noreceipt", "unknown", "s00"].map(String::from));
        let batches = q.plan_back_off(&inv(&event), &ids, || 0.0);
        let shape: Vec<(&str, usize)> = batches
            .iter()
            .map(|b| (b.queue_url.as_str(), b.entries.len()))
            .collect();
        let std_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/merge";
        assert_eq!(
            shape,
            vec![
                (std_url, 10),
                (std_url, 10),
                (std_url, 3),
                ("http://localhost:4566/123456789012/tables.fifo", 3),
            ],
            "per queue (the FIFO queue's URL as configured), ten at most, each message once"
        );
        for b in &batches {
            let entries: BTreeSet<&str> = b.entries.iter().map(|e| e.0.as_str()).collect();
            assert_eq!(entries.len(), b.entries.len(), "entry ids unique per call");
            for (_, id, receipt, _) in &b.entries {
                assert_eq!(receipt, &format!("rh-{id}"));
            }
        }
        let delay = |id: &str| {
            batches
                .iter()
                .flat_map(|b| &b.entries)
                .find(|e| e.1 == id)
                .map(|e| e.3)
        };
        assert_eq!(delay("s00"), Some(10));
        assert_eq!(delay("s01"), Some(30));
        assert_eq!(delay("s02"), Some(90));
        assert_eq!(delay("f0"), Some(30));
        assert_eq!(delay("f1"), None, "not failed");
        assert_eq!(delay("nocount"), Some(10), "no receive count: the first");
        assert_eq!(
            delay("noreceipt"),
            None,
            "cannot be changed without its receipt"
        );

        let off = Queues {
            retry_base: 0,
            ..Default::default()
        };
        assert!(
            off.plan_back_off(&inv(&event), &ids, || 0.0).is_empty(),
            "0: off"
        );
        // A staged widening goes on at once, whatever the backoff setting.
        let go_on = off.plan_visibility(&inv(&event), &ids, |_| GO_ON_SECONDS);
        assert!(!go_on.is_empty());
        assert!(go_on
            .iter()
            .flat_map(|b| &b.entries)
            .all(|(_, _, _, secs)| *secs == GO_ON_SECONDS));
        assert_eq!(
            Queues::default().queue_url("arn:aws-cn:sqs:cn-north-1:1:q"),
            Some("https://sqs.cn-north-1.amazonaws.com.cn/1/q".into())
        );
        assert_eq!(
            Queues::default().queue_url("arn:aws:sns:us-east-1:1:q"),
            None
        );
    }

    #[test]
    fn many_files_make_several_messages_and_calls_within_sqs_limits() {
        let std_arn = "arn:aws:sqs:us-east-1:1:merge";
        let long = "x".repeat(900);
        let records: Vec<Value> = (0..1200)
            .map(|i| {
                let key = match i % 2 {
                    0 => format!("dms/s/orders/{i:05}.parquet"),
                    _ => format!("dms/s/items/{long}{i:05}.parquet"),
                };
                sqs(&format!("m{i}"), std_arn, &key)
            })
            .collect();
        let plan = plan_forward(&engine(), &inv(&json!({ "Records": records })));
        let per = |g: &str| {
            plan.sends
                .iter()
                .filter(|s| s.group == g)
                .collect::<Vec<_>>()
        };
        let orders = per("orders");
        assert_eq!(orders.len(), 6, "600 files: 100 per message");
        let files = |s: &Send| {
            serde_json::from_str::<Value>(&s.body).unwrap()["Records"]
                .as_array()
                .unwrap()
                .len()
        };
        assert!(orders.iter().all(|s| files(s) == MAX_FILES_PER_MESSAGE));
        let items = per("items");
        assert!(items.len() > 6, "long keys: the body limit splits sooner");
        assert_eq!(items.iter().map(|s| files(s)).sum::<usize>(), 600);
        assert!(plan.sends.iter().all(|s| s.body.len() <= MAX_BODY_BYTES));
        let dedups: BTreeSet<&str> = plan.sends.iter().map(|s| s.dedup.as_str()).collect();
        assert_eq!(dedups.len(), plan.sends.len());
        // Large files: at most a gigabyte of them per message; a file of unknown size counts
        // as a tenth of that.
        let records: Vec<Value> = (0..30)
            .map(|i| {
                let key = format!("dms/s/orders/LOAD{i:08}.parquet");
                match i % 3 {
                    0 => sized(&format!("u{i}"), std_arn, &key, None),
                    _ => sized(&format!("b{i}"), std_arn, &key, Some(300 << 20)),
                }
            })
            .collect();
        let big = plan_forward(&engine(), &inv(&json!({ "Records": records })));
        let sizes: Vec<Vec<Option<u64>>> = big
            .sends
            .iter()
            .map(|s| {
                events::announced(&s.body)
                    .unwrap()
                    .into_iter()
                    .map(|o| o.size)
                    .collect()
            })
            .collect();
        assert_eq!(sizes.iter().map(Vec::len).sum::<usize>(), 30);
        for m in &sizes {
            let total: u64 = m.iter().map(|n| n.unwrap_or(UNKNOWN_SIZE)).sum();
            assert!(total <= MAX_SOURCE_BYTES || m.len() == 1, "{m:?}");
        }
        assert!(sizes.len() >= 8, "{} messages", sizes.len());
        assert!(sizes
            .iter()
            .any(|m| m.contains(&None) && m.contains(&Some(300 << 20))));
        let batches = send_batches(&plan.sends);
        assert_eq!(
            batches.iter().map(|b| b.len()).sum::<usize>(),
            plan.sends.len()
        );
        for b in batches {
            assert!(b.len() <= 10);
            assert!(b.iter().map(|s| s.body.len()).sum::<usize>() <= MAX_SEND_BYTES);
        }
    }
}
