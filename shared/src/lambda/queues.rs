//! One writer per table: the merge function, fed by the standard queue S3 notifies,
//! forwards each notification to a FIFO queue with the table as message group; fed by that
//! FIFO queue, the same function merges. SQS gives a message group's messages to one
//! consumer at a time, so each table's files are merged by one invocation at a time, in
//! batches, while different tables proceed in parallel — a burst or a backfill of one table
//! becomes a few large commits instead of many commits fighting over the table.
//!
//! A FIFO message whose file cannot be merged (a named, non-retryable error) would hold its
//! table's group until SQS dead-letters it; it is moved to the dead-letter queue at once
//! instead (with the error as a message attribute), so the table goes on. Retryable
//! failures (storage, contention) stay in place and are retried, in order.
//!
//! Environment: `TRIBUTARY_ROUTE_TO` (the FIFO queue's URL: forwarding on),
//! `TRIBUTARY_ROUTE_FROM` (the ARN of the queue whose messages are forwarded; default: any
//! standard queue), `TRIBUTARY_DEAD_LETTER_TO` (where such FIFO messages are moved).

use std::collections::BTreeMap;

use aws_lambda_events::event::sqs::SqsBatchResponse;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use serde_json::Value;
use tokio::sync::OnceCell;
use url::Url;

use super::events;
use super::FunctionError;
use crate::engine::Engine;

/// Message group of notifications no configured table claims (the merge ignores them).
pub const UNROUTED_GROUP: &str = "_unrouted";

/// The queues the merge function forwards to and dead-letters into.
#[derive(Debug, Default)]
pub struct Queues {
    pub route_to: Option<String>,
    pub route_from: Option<String>,
    pub dead_letter_to: Option<String>,
    client: OnceCell<aws_sdk_sqs::Client>,
}

/// One SQS record of an event.
struct Record<'a> {
    id: &'a str,
    body: &'a str,
    source: &'a str,
}

fn records(event: &Value) -> Vec<Record<'_>> {
    event
        .get("Records")
        .and_then(Value::as_array)
        .map(|rs| {
            rs.iter()
                .filter(|r| r.get("eventSource").and_then(Value::as_str) == Some("aws:sqs"))
                .map(|r| Record {
                    id: r.get("messageId").and_then(Value::as_str).unwrap_or(""),
                    body: r.get("body").and_then(Value::as_str).unwrap_or(""),
                    source: r
                        .get("eventSourceARN")
                        .and_then(Value::as_str)
                        .unwrap_or(""),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn is_fifo(arn: &str) -> bool {
    arn.ends_with(".fifo")
}

impl Queues {
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        Queues {
            route_to: var("TRIBUTARY_ROUTE_TO"),
            route_from: var("TRIBUTARY_ROUTE_FROM"),
            dead_letter_to: var("TRIBUTARY_DEAD_LETTER_TO"),
            client: OnceCell::new(),
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

    /// Whether this event is to be forwarded rather than merged: SQS messages of the
    /// routed (standard) queue, with forwarding on.
    pub fn forwards(&self, event: &Value) -> bool {
        if self.route_to.is_none() {
            return false;
        }
        let rs = records(event);
        !rs.is_empty()
            && rs.iter().all(|r| match &self.route_from {
                Some(from) => r.source == from,
                None => !is_fifo(r.source),
            })
    }

    /// Whether failed messages of this event are moved to the dead-letter queue rather than
    /// reported failed (FIFO messages, with a dead-letter queue configured).
    pub fn dead_letters(&self, event: &Value) -> bool {
        self.dead_letter_to.is_some() && records(event).iter().any(|r| is_fifo(r.source))
    }

    /// Forward every message to the FIFO queue, grouped by table. Returns the partial batch
    /// response (messages that could not be forwarded are retried).
    pub async fn forward(&self, engine: &Engine, event: &Value) -> Result<Value, FunctionError> {
        let Some(to) = &self.route_to else {
            return Err(FunctionError::Event("forwarding is not configured".into()));
        };
        let plan = plan_forward(engine, event);
        let mut failed: Vec<String> = plan.unreadable.clone();
        let entries: Vec<(String, SendMessageBatchRequestEntry)> = plan
            .sends
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
                    .map(|e| (s.source_id.clone(), e))
            })
            .collect();
        let sqs = self.sqs().await;
        for chunk in entries.chunks(10) {
            let ids: BTreeMap<String, String> = chunk
                .iter()
                .map(|(src, e)| (e.id().to_string(), src.clone()))
                .collect();
            let res = sqs
                .send_message_batch()
                .queue_url(to)
                .set_entries(Some(chunk.iter().map(|(_, e)| e.clone()).collect()))
                .send()
                .await;
            match res {
                Ok(out) => {
                    for f in out.failed() {
                        tracing::error!(
                            entry = f.id(),
                            code = f.code(),
                            message = f.message(),
                            "not forwarded; the message will be retried"
                        );
                        if let Some(src) = ids.get(f.id()) {
                            failed.push(src.clone());
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "forwarding failed; the messages will be retried");
                    failed.extend(ids.into_values());
                }
            }
        }
        for (group, n) in &plan.per_group {
            tracing::info!(group = %group, messages = n, "forwarded to the table's message group");
        }
        failed.sort();
        failed.dedup();
        let mut r = SqsBatchResponse::default();
        for id in failed {
            r.add_failure(id);
        }
        Ok(serde_json::to_value(r)?)
    }

    /// Move a FIFO message whose files cannot be merged to the dead-letter queue. `Err`
    /// when that fails (the message is then reported failed, as without a dead-letter
    /// queue).
    pub async fn dead_letter(&self, event: &Value, id: &str, reason: &str) -> Result<(), String> {
        let Some(to) = &self.dead_letter_to else {
            return Err("no dead-letter queue configured".into());
        };
        let Some(r) = records(event).into_iter().find(|r| r.id == id) else {
            return Err(format!("message {id} is not in the event"));
        };
        // SQS attribute values are limited; the logs carry the whole error.
        let reason: String = reason.chars().take(4000).collect();
        let attr = |v: &str| {
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(v)
                .build()
                .map_err(|e| e.to_string())
        };
        self.sqs()
            .await
            .send_message()
            .queue_url(to)
            .message_body(r.body)
            .message_attributes("tributary_error", attr(&reason)?)
            .message_attributes("tributary_source_queue", attr(r.source)?)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())
    }
}

/// What forwarding one event sends.
#[derive(Debug, Default)]
struct ForwardPlan {
    sends: Vec<Send>,
    /// Messages whose body is not a notification tributary understands (reported failed:
    /// retried, then dead-lettered, as the merge would).
    unreadable: Vec<String>,
    per_group: BTreeMap<String, usize>,
}

#[derive(Debug)]
struct Send {
    source_id: String,
    group: String,
    dedup: String,
    body: String,
}

/// One send per message and table it announces files of (the body unchanged; a message
/// announcing files of two tables goes to both groups, each merge ignoring nothing it must
/// not: files of the other table are merged there too, harmlessly).
fn plan_forward(engine: &Engine, event: &Value) -> ForwardPlan {
    let mut plan = ForwardPlan::default();
    let parsed = events::parse(event).ok();
    for (i, r) in records(event).iter().enumerate() {
        let objects: Result<Vec<Url>, String> =
            match parsed.as_ref().and_then(|p| p.messages.get(i)) {
                Some(m) => m.objects.clone(),
                None => Err("not an SQS message".into()),
            };
        let objects = match objects {
            Ok(o) => o,
            Err(reason) => {
                tracing::error!(message_id = r.id, error = %reason, "cannot understand message");
                plan.unreadable.push(r.id.to_string());
                continue;
            }
        };
        let mut groups: Vec<String> = objects
            .iter()
            .map(|o| {
                engine
                    .config()
                    .table_for(&engine.resolve(o))
                    .map(|t| t.name.clone())
                    .unwrap_or_else(|| UNROUTED_GROUP.to_string())
            })
            .collect();
        groups.sort();
        groups.dedup();
        for (n, group) in groups.into_iter().enumerate() {
            *plan.per_group.entry(group.clone()).or_default() += 1;
            plan.sends.push(Send {
                source_id: r.id.to_string(),
                dedup: if n == 0 {
                    r.id.to_string()
                } else {
                    format!("{}-{n}", r.id)
                },
                group,
                body: r.body.to_string(),
            });
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sqs(id: &str, arn: &str, key: &str) -> Value {
        json!({"messageId": id, "eventSource": "aws:sqs", "eventSourceARN": arn,
               "body": json!({"Records":[{"eventSource":"aws:s3","eventName":"ObjectCreated:Put",
                   "s3":{"bucket":{"name":"raw"},"object":{"key":key}}}]}).to_string()})
    }

    fn engine() -> Engine {
        let text =
            crate::config::test_table("orders", "s3://raw/dms/s/orders/", "s3://c/orders", "")
                + &crate::config::test_table("items", "s3://raw/dms/s/items/", "s3://c/items", "");
        Engine::new(crate::config::Config::from_toml(&text, "t", None).unwrap())
    }

    #[test]
    fn messages_go_to_their_tables_groups_and_only_routed_queues_forward() {
        let std_arn = "arn:aws:sqs:us-east-1:1:merge";
        let fifo_arn = "arn:aws:sqs:us-east-1:1:merge.fifo";
        let event = json!({"Records": [
            sqs("a", std_arn, "dms/s/orders/20240101-1.parquet"),
            sqs("b", std_arn, "dms/s/items/20240101-1.parquet"),
            sqs("c", std_arn, "elsewhere/x.parquet"),
            {"messageId": "d", "eventSource": "aws:sqs", "eventSourceARN": std_arn, "body": "not json"},
        ]});
        let plan = plan_forward(&engine(), &event);
        let got: Vec<(&str, &str, &str)> = plan
            .sends
            .iter()
            .map(|s| (s.source_id.as_str(), s.group.as_str(), s.dedup.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", "orders", "a"),
                ("b", "items", "b"),
                ("c", UNROUTED_GROUP, "c")
            ]
        );
        assert_eq!(plan.unreadable, vec!["d".to_string()]);

        let on = Queues {
            route_to: Some("https://sqs/merge.fifo".into()),
            ..Default::default()
        };
        assert!(on.forwards(&event));
        let from_fifo = json!({"Records": [sqs("a", fifo_arn, "dms/s/orders/x.parquet")]});
        assert!(
            !on.forwards(&from_fifo),
            "the FIFO queue's messages are merged"
        );
        assert!(
            !Queues::default().forwards(&event),
            "forwarding off: merged"
        );
        let only = Queues {
            route_from: Some("arn:aws:sqs:us-east-1:1:other".into()),
            ..on
        };
        assert!(!only.forwards(&event), "not the routed queue");
        let dl = Queues {
            dead_letter_to: Some("https://sqs/dlq".into()),
            ..Default::default()
        };
        assert!(dl.dead_letters(&from_fifo) && !dl.dead_letters(&event));
    }
}
