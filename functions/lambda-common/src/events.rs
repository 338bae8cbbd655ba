//! Lambda event payloads → object URIs (the merge handler, `crate::handler`, merges them).
//!
//! Accepted: S3 notifications (direct), SQS messages whose body is an S3 notification, an
//! EventBridge event or an SNS envelope of either, and EventBridge "Object Created" events.
//! `s3:TestEvent` and non-create events are ignored. S3 notification keys are URL-encoded
//! (`+` is a space) and decoded here; EventBridge keys arrive as-is.
//!
//! Each envelope is read into a type: `aws_lambda_events`' where it takes what arrives (the
//! SQS batch, the EventBridge event), a lenient struct of the fields read where it would
//! refuse payloads that do arrive (the S3 notification, the SNS envelope: each says why).
//! What is not understood is an [`EventError`]: a whole payload fails the invocation, one
//! SQS message fails that message alone.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use serde::Deserialize;
use serde_json::Value;
use url::Url;

use tributary::storage;

/// How the function was invoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Sqs,
    S3,
    EventBridge,
}

/// Why a payload, or one message of it, is not understood. Never retryable: the same
/// payload fails the same way again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// The payload is none of the events the merge function accepts.
    #[error("unrecognised event: expected an S3 notification, an SQS batch or an EventBridge Object Created event")]
    Unrecognised,
    /// An envelope recognised by its keys whose fields are not of their types (`what`: the
    /// envelope; `error`: serde's account, naming the field).
    #[error("{what} is malformed: {error}")]
    Malformed { what: &'static str, error: String },
    #[error("SQS message has no body")]
    NoBody,
    #[error("SQS message body is not JSON: {0}")]
    BodyNotJson(String),
    #[error("SNS envelope without Message")]
    SnsWithoutMessage,
    #[error("SNS Message is not JSON: {0}")]
    SnsMessageNotJson(String),
    /// A notification of a created object without its bucket or key: (the notification, the
    /// missing field).
    #[error("{0} without {1}")]
    Missing(&'static str, &'static str),
    /// An SQS body (or SNS Message) that is no notification tributary reads.
    #[error("message is neither an S3 notification nor an EventBridge event")]
    NotANotification,
    /// A bucket name that makes no object URL (the library's error, as it reads).
    #[error("{0}")]
    Location(String),
    /// A maintenance payload whose fields are not of their types
    /// (`crate::maintenance::MaintenanceRequest`).
    #[error("not a maintenance request: {0} (expected {{\"table\": \"name\"}}, {{\"tables\": [\"a\", \"b\"]}}, {{\"reload\": \"name\"}}, {{\"list\": true}}, {{\"cuts\": true}}, \"force\": true, or any scheduled event)")]
    Maintenance(String),
}

impl EventError {
    fn malformed(what: &'static str) -> impl FnOnce(serde_json::Error) -> Self {
        move |e| EventError::Malformed {
            what,
            error: e.to_string(),
        }
    }
}

/// An object a notification announces: its `s3://` URL and its size in bytes when the
/// notification gives it (S3 and EventBridge do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub url: Url,
    pub size: Option<u64>,
}

/// How SQS delivered a message: what backing it off or dead-lettering it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// `eventSourceARN`: the queue it came from (empty when absent).
    pub queue_arn: String,
    /// `receiptHandle` (a visibility change needs it).
    pub receipt: Option<String>,
    /// `attributes.ApproximateReceiveCount` (1 when absent).
    pub receive_count: u32,
}

/// One unit that succeeds or fails as a whole (an SQS message, or the whole event).
#[derive(Debug)]
pub struct Message {
    /// SQS message id (for partial batch responses).
    pub id: Option<String>,
    /// How SQS delivered it; `None` for a direct invocation.
    pub delivery: Option<Delivery>,
    /// The objects it announces, or why it cannot be understood.
    pub objects: Result<Vec<Object>, EventError>,
}

impl Message {
    /// The URLs of the objects it announces (none when it is not understood).
    pub fn urls(&self) -> impl Iterator<Item = &Url> {
        self.objects.iter().flatten().map(|o| &o.url)
    }
}

/// A parsed invocation.
#[derive(Debug)]
pub struct Invocation {
    pub trigger: Trigger,
    pub messages: Vec<Message>,
}

/// What a payload announces: the objects whose tables the configuration in force must
/// know (`crate::live::LiveEngine::engine_for`).
pub trait Announces {
    fn objects(&self) -> Vec<Url>;
}

impl Announces for Invocation {
    fn objects(&self) -> Vec<Url> {
        self.messages
            .iter()
            .flat_map(Message::urls)
            .cloned()
            .collect()
    }
}

/// A raw payload (a caller that holds the JSON): what it announces once parsed; nothing
/// when it is not a merge event.
impl Announces for Value {
    fn objects(&self) -> Vec<Url> {
        Invocation::parse(self)
            .map(|i| i.objects())
            .unwrap_or_default()
    }
}

impl crate::Payload for Invocation {
    fn parse(payload: Value) -> Result<Self, EventError> {
        Invocation::parse(&payload)
    }
}

/// Decode an S3 notification key: `+` is a space, then percent-decoding.
pub fn decode_s3_key(key: &str) -> String {
    storage::percent_decode(&key.replace('+', " "))
}

/// Characters an S3 notification leaves as they are in a key (the others are
/// percent-encoded; [`decode_s3_key`] reverses it).
const KEY_KEEP: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

/// One S3 notification record announcing the creation of `object` (an `s3://` URL) of
/// `size` bytes (when known), in the form S3 sends (key URL-encoded), with only the fields
/// [`parse`] and [`announced`] read.
pub fn s3_record(object: &Url, size: Option<u64>) -> Value {
    let key = storage::percent_decode(object.path().trim_start_matches('/'));
    let mut o = serde_json::json!({"key": percent_encoding::utf8_percent_encode(&key, KEY_KEEP).to_string()});
    if let Some(n) = size {
        o["size"] = n.into();
    }
    serde_json::json!({
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "eventName": "ObjectCreated:Put",
        "s3": {
            "bucket": {"name": object.host_str().unwrap_or_default()},
            "object": o,
        },
    })
}

/// An S3 notification announcing `objects` (with their sizes when known): what forwarded
/// and dead-lettered messages carry, so that a redrive to the merge queue replays exactly
/// these files.
pub fn s3_notification<'a>(objects: impl IntoIterator<Item = (&'a Url, Option<u64>)>) -> Value {
    serde_json::json!({"Records": objects.into_iter().map(|(u, n)| s3_record(u, n)).collect::<Vec<_>>()})
}

/// Parse any supported payload ([`Invocation::parse`]).
pub fn parse(event: &Value) -> Result<Invocation, EventError> {
    Invocation::parse(event)
}

/// The objects an SQS message body announces.
pub fn announced(body: &str) -> Result<Vec<Object>, EventError> {
    let v: Value =
        serde_json::from_str(body).map_err(|e| EventError::BodyNotJson(e.to_string()))?;
    objects_of(&v)
}

impl Invocation {
    /// Parse any supported payload: a `Records` batch is SQS when its first record comes
    /// from SQS and a direct S3 notification otherwise; then an EventBridge event; then an
    /// `s3:TestEvent` (nothing to merge).
    pub fn parse(event: &Value) -> Result<Self, EventError> {
        if let Some(records) = event.get("Records").and_then(Value::as_array) {
            let source = records
                .first()
                .and_then(|r| r.get("eventSource").or_else(|| r.get("EventSource")))
                .and_then(Value::as_str);
            return match source {
                Some("aws:sqs") => Self::sqs(event),
                None if records.is_empty() => Ok(Self::nothing()),
                _ => Ok(Self::direct(Trigger::S3, objects_of(event))),
            };
        }
        match Document::of(event) {
            Document::EventBridge => Ok(Self::direct(Trigger::EventBridge, objects_of(event))),
            Document::Test => Ok(Self::nothing()),
            _ => Err(EventError::Unrecognised),
        }
    }

    /// An SQS batch: one message per record, each understood or not on its own.
    fn sqs(event: &Value) -> Result<Self, EventError> {
        let batch = SqsEvent::deserialize(event).map_err(EventError::malformed("SQS batch"))?;
        Ok(Invocation {
            trigger: Trigger::Sqs,
            messages: batch.records.into_iter().map(sqs_message).collect(),
        })
    }

    /// A direct invocation: one message, the whole event.
    fn direct(trigger: Trigger, objects: Result<Vec<Object>, EventError>) -> Self {
        Invocation {
            trigger,
            messages: vec![Message {
                id: None,
                delivery: None,
                objects,
            }],
        }
    }

    /// An invocation with nothing to merge (a test event, an empty batch).
    fn nothing() -> Self {
        Invocation {
            trigger: Trigger::S3,
            messages: vec![],
        }
    }
}

fn sqs_message(m: SqsMessage) -> Message {
    let receive_count = m
        .attributes
        .get("ApproximateReceiveCount")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(1);
    Message {
        objects: match &m.body {
            Some(body) => announced(body),
            None => Err(EventError::NoBody),
        },
        id: m.message_id,
        delivery: Some(Delivery {
            queue_arn: m.event_source_arn.unwrap_or_default(),
            receipt: m.receipt_handle,
            receive_count,
        }),
    }
}

/// What a notification document (a direct payload, an SQS body, an SNS `Message`) is, by
/// the keys that tell them apart.
enum Document {
    Test,
    Sns,
    S3,
    EventBridge,
    Other,
}

impl Document {
    fn of(v: &Value) -> Self {
        if v.get("Event").and_then(Value::as_str) == Some("s3:TestEvent") {
            Document::Test
        } else if v.get("Type").and_then(Value::as_str) == Some("Notification") {
            Document::Sns
        } else if v.get("Records").is_some_and(Value::is_array) {
            Document::S3
        } else if v.get("detail-type").is_some() {
            Document::EventBridge
        } else {
            Document::Other
        }
    }
}

/// Objects announced by one notification document (S3, EventBridge, SNS envelope).
fn objects_of(v: &Value) -> Result<Vec<Object>, EventError> {
    match Document::of(v) {
        Document::Test => Ok(vec![]),
        Document::Sns => {
            let envelope =
                SnsEnvelope::deserialize(v).map_err(EventError::malformed("SNS envelope"))?;
            let message = envelope.message.ok_or(EventError::SnsWithoutMessage)?;
            let inner: Value = serde_json::from_str(&message)
                .map_err(|e| EventError::SnsMessageNotJson(e.to_string()))?;
            objects_of(&inner)
        }
        Document::S3 => S3Notification::deserialize(v)
            .map_err(EventError::malformed("S3 notification"))?
            .objects(),
        Document::EventBridge => object_created(v),
        Document::Other => Err(EventError::NotANotification),
    }
}

/// The object an EventBridge "Object Created" event announces; none for another event.
fn object_created(v: &Value) -> Result<Vec<Object>, EventError> {
    let event = EventBridgeEvent::<Value>::deserialize(v)
        .map_err(EventError::malformed("EventBridge event"))?;
    if event.detail_type != "Object Created" {
        return Ok(vec![]);
    }
    const WHAT: &str = "EventBridge Object Created";
    let detail =
        Located::deserialize(&event.detail).map_err(EventError::malformed("EventBridge detail"))?;
    let (bucket, key, size) = detail.fields(WHAT, ["detail.bucket.name", "detail.object.key"])?;
    let url = storage::s3_url(bucket, key).map_err(|e| EventError::Location(e.to_string()))?;
    Ok(vec![Object { url, size }])
}

/// An S3 notification, read leniently: `aws_lambda_events`' `S3EventRecord` requires
/// `eventTime`, `userIdentity` and `requestParameters`, which tributary never reads and which
/// the notifications it writes itself ([`s3_record`]: forwarded and dead-lettered messages,
/// replayed by a redrive) leave out, as do events written by hand or by emulators' tests.
/// Only the fields below are read; any other is ignored.
#[derive(Debug, Deserialize)]
struct S3Notification {
    #[serde(rename = "Records")]
    records: Vec<S3Record>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct S3Record {
    #[serde(default)]
    event_name: Option<String>,
    #[serde(default)]
    s3: Option<Located>,
}

/// Where an object is: an S3 record's `s3`, an EventBridge event's `detail` (both
/// `bucket.name`, `object.key`, `object.size`). Every field optional, so that a missing
/// one is named ([`EventError::Missing`]) rather than reported as serde's.
#[derive(Debug, Default, Deserialize)]
struct Located {
    #[serde(default)]
    bucket: Option<BucketRef>,
    #[serde(default)]
    object: Option<ObjectRef>,
}

#[derive(Debug, Deserialize)]
struct BucketRef {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ObjectRef {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    size: Option<u64>,
}

impl Located {
    /// A record without `s3`: its bucket and key are missing.
    const NOWHERE: Located = Located {
        bucket: None,
        object: None,
    };

    /// Bucket, key (as sent) and size; `what` and the paths name a missing one.
    fn fields(
        &self,
        what: &'static str,
        [bucket_at, key_at]: [&'static str; 2],
    ) -> Result<(&str, &str, Option<u64>), EventError> {
        let bucket = self.bucket.as_ref().and_then(|b| b.name.as_deref());
        let object = self.object.as_ref();
        let key = object.and_then(|o| o.key.as_deref());
        Ok((
            bucket.ok_or(EventError::Missing(what, bucket_at))?,
            key.ok_or(EventError::Missing(what, key_at))?,
            object.and_then(|o| o.size),
        ))
    }
}

impl S3Notification {
    /// The created objects (other records ignored), keys URL-decoded.
    fn objects(&self) -> Result<Vec<Object>, EventError> {
        const WHAT: &str = "S3 record";
        let mut out = Vec::new();
        for r in &self.records {
            if !r
                .event_name
                .as_deref()
                .is_some_and(|n| n.starts_with("ObjectCreated:"))
            {
                continue;
            }
            let located = r.s3.as_ref().unwrap_or(&Located::NOWHERE);
            let (bucket, key, size) = located.fields(WHAT, ["s3.bucket.name", "s3.object.key"])?;
            let url = storage::s3_url(bucket, &decode_s3_key(key))
                .map_err(|e| EventError::Location(e.to_string()))?;
            out.push(Object { url, size });
        }
        Ok(out)
    }
}

/// An SNS notification as SNS delivers it to an SQS queue (raw message delivery off), read
/// leniently: `aws_lambda_events`' `SnsMessage` (its `sns` feature is not built) requires
/// every signature field (`Signature`, `SigningCertURL`, `UnsubscribeURL`, …), which
/// tributary neither verifies (the queue's policy decides who may send) nor needs. Only
/// `Message` is read.
#[derive(Debug, Deserialize)]
struct SnsEnvelope {
    #[serde(rename = "Message", default)]
    message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decodes_keys() {
        assert_eq!(
            decode_s3_key("a/my+file%2B1%3A2.parquet"),
            "a/my file+1:2.parquet"
        );
        assert_eq!(decode_s3_key("100%"), "100%");
    }

    #[test]
    fn parses_sqs_wrapped_s3_and_test_event() {
        let s3 = json!({"Records":[{"eventVersion":"2.1","eventSource":"aws:s3","awsRegion":"us-east-1",
            "eventTime":"2024-01-01T00:00:00.000Z","eventName":"ObjectCreated:Put",
            "s3":{"bucket":{"name":"raw"},"object":{"key":"dms/s/t/20240101-1+2.parquet","size":10}}}]});
        let test = json!({"Service":"Amazon S3","Event":"s3:TestEvent","Bucket":"raw"});
        let ev = json!({"Records":[
            {"messageId":"m1","eventSource":"aws:sqs","body": s3.to_string()},
            {"messageId":"m2","eventSource":"aws:sqs","body": test.to_string()},
            {"messageId":"m3","eventSource":"aws:sqs","body": "not json"}
        ]});
        let inv = parse(&ev).unwrap();
        assert_eq!(inv.trigger, Trigger::Sqs);
        let objs = inv.messages[0].objects.as_ref().unwrap();
        assert_eq!(
            storage::display(&objs[0].url),
            "s3://raw/dms/s/t/20240101-1 2.parquet"
        );
        assert!(inv.messages[1].objects.as_ref().unwrap().is_empty());
        assert!(inv.messages[2].objects.is_err());
    }

    #[test]
    fn a_built_notification_announces_exactly_its_objects() {
        let keys = [
            "dms/s/t/20240101-1.parquet",
            "dms/s/order lines/a+b%41 é:=?#&.parquet",
            "dms/s/t/100%.csv.gz",
        ];
        let urls: Vec<Url> = keys
            .iter()
            .map(|k| storage::s3_url("raw-bucket", k).unwrap())
            .collect();
        let body = s3_notification(urls.iter().zip([Some(7), None, Some(0)])).to_string();
        let ev = json!({"Records": [{"messageId": "m", "eventSource": "aws:sqs", "body": body}]});
        let inv = parse(&ev).unwrap();
        let got: Vec<String> = inv.messages[0].urls().map(storage::display).collect();
        let want: Vec<String> = keys
            .iter()
            .map(|k| format!("s3://raw-bucket/{k}"))
            .collect();
        assert_eq!(got, want);
        assert_eq!(&inv.messages[0].urls().cloned().collect::<Vec<_>>(), &urls);
        let sizes: Vec<Option<u64>> = announced(&body)
            .unwrap()
            .into_iter()
            .map(|o| o.size)
            .collect();
        assert_eq!(sizes, vec![Some(7), None, Some(0)]);
    }

    #[test]
    fn parses_eventbridge_and_ignores_removals() {
        let ev = json!({"version":"0","id":"x","detail-type":"Object Created","source":"aws.s3",
            "detail":{"bucket":{"name":"raw"},"object":{"key":"dms/s/t/a b.parquet"}}});
        let inv = parse(&ev).unwrap();
        assert_eq!(inv.trigger, Trigger::EventBridge);
        assert_eq!(
            storage::display(&inv.messages[0].objects.as_ref().unwrap()[0].url),
            "s3://raw/dms/s/t/a b.parquet"
        );
        let del = json!({"Records":[{"eventSource":"aws:s3","eventTime":"2024-01-01T00:00:00Z",
            "eventName":"ObjectRemoved:Delete","s3":{"bucket":{"name":"raw"},"object":{"key":"k"}}}]});
        assert!(parse(&del).unwrap().messages[0]
            .objects
            .as_ref()
            .unwrap()
            .is_empty());
        assert!(parse(&json!({"hello": 1})).is_err());
    }

    /// What an emulator or a hand-written test sends: an SQS record without receipt,
    /// attributes or queue, an S3 record without `eventTime`, `userIdentity`,
    /// `requestParameters` or size — which `aws_lambda_events`' S3 type refuses.
    #[test]
    fn an_emulator_shaped_payload_without_optional_fields_parses() {
        let body = json!({"Records":[{"eventName":"ObjectCreated:CompleteMultipartUpload",
            "s3":{"bucket":{"name":"raw"},"object":{"key":"dms/s/t/LOAD00000001.parquet"}}}]})
        .to_string();
        assert!(
            serde_json::from_str::<aws_lambda_events::event::s3::S3Event>(&body).is_err(),
            "the strict type refuses it: why the S3 notification is read leniently"
        );
        let ev =
            json!({"Records":[{"messageId":"m","eventSource":"aws:sqs","body": body.clone()}]});
        let inv = parse(&ev).unwrap();
        assert_eq!(inv.trigger, Trigger::Sqs);
        let m = &inv.messages[0];
        assert_eq!(m.id.as_deref(), Some("m"));
        assert_eq!(
            m.delivery,
            Some(Delivery {
                queue_arn: String::new(),
                receipt: None,
                receive_count: 1
            })
        );
        let objs = m.objects.as_ref().unwrap();
        assert_eq!(objs.len(), 1);
        assert_eq!(
            storage::display(&objs[0].url),
            "s3://raw/dms/s/t/LOAD00000001.parquet"
        );
        assert_eq!(objs[0].size, None);
        // Directly, the same notification.
        let direct = parse(&serde_json::from_str(&body).unwrap()).unwrap();
        assert_eq!(direct.trigger, Trigger::S3);
        assert_eq!(direct.messages[0].delivery, None);
        assert_eq!(direct.objects(), vec![objs[0].url.clone()]);
    }

    #[test]
    fn the_delivery_of_an_sqs_message_is_read() {
        let ev = json!({"Records":[{"messageId":"m","eventSource":"aws:sqs",
            "eventSourceARN":"arn:aws:sqs:us-east-1:1:q.fifo","receiptHandle":"rh",
            "attributes":{"ApproximateReceiveCount":"3"},"body":"{\"Event\":\"s3:TestEvent\"}"}]});
        let inv = parse(&ev).unwrap();
        assert_eq!(
            inv.messages[0].delivery,
            Some(Delivery {
                queue_arn: "arn:aws:sqs:us-east-1:1:q.fifo".into(),
                receipt: Some("rh".into()),
                receive_count: 3
            })
        );
    }

    /// An SNS topic between S3 (or EventBridge) and the queue: the envelope's `Message` is
    /// the notification.
    #[test]
    fn an_sns_wrapped_notification_is_unwrapped() {
        let s3 = json!({"Records":[{"eventName":"ObjectCreated:Put",
            "s3":{"bucket":{"name":"raw"},"object":{"key":"dms/s/t/a%20b.parquet","size":5}}}]});
        let eb = json!({"version":"0","detail-type":"Object Created","source":"aws.s3",
            "detail":{"bucket":{"name":"raw"},"object":{"key":"dms/s/t/c d.parquet","size":6}}});
        let sns = |inner: &Value| {
            json!({"Type":"Notification","MessageId":"x","TopicArn":"arn:aws:sns:us-east-1:1:t",
                "Message": inner.to_string(),"Timestamp":"2024-01-01T00:00:00.000Z"})
            .to_string()
        };
        let ev = json!({"Records":[
            {"messageId":"s3","eventSource":"aws:sqs","body": sns(&s3)},
            {"messageId":"eb","eventSource":"aws:sqs","body": sns(&eb)},
            {"messageId":"empty","eventSource":"aws:sqs","body": json!({"Type":"Notification"}).to_string()},
            {"messageId":"bad","eventSource":"aws:sqs","body": json!({"Type":"Notification","Message":"{"}).to_string()}
        ]});
        let inv = parse(&ev).unwrap();
        let got: Vec<(String, Option<u64>)> = inv.messages[..2]
            .iter()
            .flat_map(|m| m.objects.as_ref().unwrap())
            .map(|o| (storage::display(&o.url), o.size))
            .collect();
        assert_eq!(
            got,
            vec![
                ("s3://raw/dms/s/t/a b.parquet".to_string(), Some(5)),
                ("s3://raw/dms/s/t/c d.parquet".to_string(), Some(6))
            ]
        );
        assert_eq!(inv.messages[2].objects, Err(EventError::SnsWithoutMessage));
        assert!(matches!(
            inv.messages[3].objects,
            Err(EventError::SnsMessageNotJson(_))
        ));
    }

    #[test]
    fn events_other_than_creations_announce_nothing() {
        let eventbridge = |detail_type: &str| {
            json!({"version":"0","detail-type":detail_type,"source":"aws.s3",
                "detail":{"bucket":{"name":"raw"},"object":{"key":"dms/s/t/x.parquet"}}})
        };
        for ev in [
            eventbridge("Object Deleted"),
            eventbridge("Object Restore Completed"),
            json!({"version":"0","detail-type":"Scheduled Event","source":"aws.events","detail":{}}),
        ] {
            let inv = parse(&ev).unwrap();
            assert_eq!(inv.trigger, Trigger::EventBridge);
            assert!(inv.objects().is_empty(), "{ev}");
            assert!(inv.messages[0].objects.is_ok());
        }
        let removal = json!({"Records":[{"eventName":"ObjectRemoved:DeleteMarkerCreated",
            "s3":{"bucket":{"name":"raw"},"object":{"key":"dms/s/t/x.parquet"}}},
            {"eventName":"ObjectRestore:Completed"}]});
        let ev = json!({"Records":[{"messageId":"m","eventSource":"aws:sqs","body": removal.to_string()}]});
        assert_eq!(parse(&ev).unwrap().messages[0].objects, Ok(vec![]));
        assert_eq!(parse(&json!({"Records": []})).unwrap().messages.len(), 0);
    }

    /// A message that cannot be understood fails alone, with a named error.
    #[test]
    fn messages_not_understood_are_named() {
        let ev = json!({"Records":[
            {"messageId":"a","eventSource":"aws:sqs","body": "not json"},
            {"messageId":"b","eventSource":"aws:sqs"},
            {"messageId":"c","eventSource":"aws:sqs","body": "{\"hello\": 1}"},
            {"messageId":"d","eventSource":"aws:sqs","body": json!({"Records":[{"eventName":"ObjectCreated:Put","s3":{"bucket":{"name":"raw"}}}]}).to_string()},
            {"messageId":"e","eventSource":"aws:sqs","body": json!({"Records":[{"eventName":"ObjectCreated:Put"}]}).to_string()},
            {"messageId":"f","eventSource":"aws:sqs","body": json!({"Records":[{"eventName":"ObjectCreated:Put","s3":{"bucket":{"name":"raw"},"object":{"key":7}}}]}).to_string()},
            {"messageId":"g","eventSource":"aws:sqs","body": json!({"detail-type":"Object Created","source":"aws.s3","detail":{"object":{"key":"k"}}}).to_string()},
        ]});
        let inv = parse(&ev).unwrap();
        let errors: Vec<String> = inv
            .messages
            .iter()
            .map(|m| m.objects.as_ref().unwrap_err().to_string())
            .collect();
        assert!(
            errors[0].starts_with("SQS message body is not JSON: "),
            "{}",
            errors[0]
        );
        assert_eq!(errors[1], "SQS message has no body");
        assert_eq!(
            errors[2],
            "message is neither an S3 notification nor an EventBridge event"
        );
        assert_eq!(errors[3], "S3 record without s3.object.key");
        assert_eq!(errors[4], "S3 record without s3.bucket.name");
        assert!(
            errors[5].starts_with("S3 notification is malformed: "),
            "{}",
            errors[5]
        );
        assert_eq!(
            errors[6],
            "EventBridge Object Created without detail.bucket.name"
        );
    }

    #[test]
    fn a_payload_that_is_no_event_is_refused_by_name() {
        for ev in [
            json!({"hello": 1}),
            json!("text"),
            json!(null),
            json!({"Type": "Notification", "Message": "{}"}),
        ] {
            assert_eq!(parse(&ev).unwrap_err(), EventError::Unrecognised, "{ev}");
        }
        let bad = json!({"Records":[{"eventSource":"aws:sqs","messageId":"m","body": 5}]});
        assert!(matches!(
            parse(&bad),
            Err(EventError::Malformed {
                what: "SQS batch",
                ..
            })
        ));
        let e = crate::FunctionError::from(EventError::Unrecognised);
        assert_eq!(e.error_type(), "tributary.event");
        assert_eq!(
            e.to_string(),
            "unrecognised event: expected an S3 notification, an SQS batch or an EventBridge Object Created event"
        );
    }
}

#[cfg(test)]
mod sample_events {
    use super::*;

    fn sample(name: &str) -> Value {
        let text = match name {
            "s3-put-cdc.json" => include_str!("../../../events/s3-put-cdc.json"),
            "s3-put-encoded-key.json" => include_str!("../../../events/s3-put-encoded-key.json"),
            "s3-test-event.json" => include_str!("../../../events/s3-test-event.json"),
            "sqs-s3-batch.json" => include_str!("../../../events/sqs-s3-batch.json"),
            "eventbridge-object-created.json" => {
                include_str!("../../../events/eventbridge-object-created.json")
            }
            other => panic!("no sample event {other}"),
        };
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn samples_in_events_folder_parse() {
        let inv = parse(&sample("s3-put-cdc.json")).unwrap();
        assert_eq!(inv.trigger, Trigger::S3);
        assert_eq!(
            storage::display(&inv.messages[0].objects.as_ref().unwrap()[0].url),
            "s3://tributary-raw/dms/delta_emr_source/travel_details/2022/10/25/20221025-2110000000.parquet"
        );
        let inv = parse(&sample("s3-put-encoded-key.json")).unwrap();
        assert_eq!(
            storage::display(&inv.messages[0].objects.as_ref().unwrap()[0].url),
            "s3://tributary-raw/dms/sales/order lines/2022/10/25/20221025-2110000000+part=1.parquet"
        );
        assert!(parse(&sample("s3-test-event.json"))
            .unwrap()
            .messages
            .is_empty());
        let inv = parse(&sample("sqs-s3-batch.json")).unwrap();
        assert_eq!(inv.trigger, Trigger::Sqs);
        assert_eq!(inv.messages.len(), 3);
        assert_eq!(
            inv.messages[0].id.as_deref(),
            Some("0f4e4b0a-6d1c-4b7e-9b2e-2f0d5a8c1e01")
        );
        assert!(inv.messages[2].objects.as_ref().unwrap().is_empty());
        let inv = parse(&sample("eventbridge-object-created.json")).unwrap();
        assert_eq!(inv.trigger, Trigger::EventBridge);
        assert_eq!(inv.messages[0].objects.as_ref().unwrap().len(), 1);
    }
}
