//! Lambda event payloads → object URIs (the merge handler, `crate::handler`, merges them).
//!
//! Accepted: S3 notifications (direct), SQS messages whose body is an S3 notification, an
//! EventBridge event or an SNS envelope of either, and EventBridge "Object Created" events.
//! `s3:TestEvent` and non-create events are ignored. S3 notification keys are URL-encoded
//! (`+` is a space) and decoded here; EventBridge keys arrive as-is.

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

/// One unit that succeeds or fails as a whole (an SQS message, or the whole event).
#[derive(Debug)]
pub struct Message {
    /// SQS message id (for partial batch responses).
    pub id: Option<String>,
    /// The objects it announces, or why it cannot be understood.
    pub objects: Result<Vec<Url>, String>,
}

/// A parsed invocation.
#[derive(Debug)]
pub struct Invocation {
    pub trigger: Trigger,
    pub messages: Vec<Message>,
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

/// Parse any supported payload.
pub fn parse(event: &Value) -> Result<Invocation, String> {
    if let Some(records) = event.get("Records").and_then(Value::as_array) {
        let source = records
            .first()
            .and_then(|r| r.get("eventSource").or_else(|| r.get("EventSource")))
            .and_then(Value::as_str)
            .unwrap_or("");
        return match source {
            "aws:sqs" => Ok(Invocation {
                trigger: Trigger::Sqs,
                messages: records
                    .iter()
                    .map(|r| Message {
                        id: r
                            .get("messageId")
                            .and_then(Value::as_str)
                            .map(str::to_string),
                        objects: match r.get("body").and_then(Value::as_str) {
                            Some(body) => serde_json::from_str::<Value>(body)
                                .map_err(|e| format!("SQS message body is not JSON: {e}"))
                                .and_then(|v| objects_of(&v)),
                            None => Err("SQS message has no body".into()),
                        },
                    })
                    .collect(),
            }),
            "" if records.is_empty() => Ok(Invocation {
                trigger: Trigger::S3,
                messages: vec![],
            }),
            _ => Ok(Invocation {
                trigger: Trigger::S3,
                messages: vec![Message {
                    id: None,
                    objects: objects_of(event),
                }],
            }),
        };
    }
    if event.get("detail-type").is_some() {
        return Ok(Invocation {
            trigger: Trigger::EventBridge,
            messages: vec![Message {
                id: None,
                objects: objects_of(event),
            }],
        });
    }
    if is_test_event(event) {
        return Ok(Invocation {
            trigger: Trigger::S3,
            messages: vec![],
        });
    }
    Err("unrecognised event: expected an S3 notification, an SQS batch or an EventBridge Object Created event".into())
}

fn is_test_event(v: &Value) -> bool {
    v.get("Event").and_then(Value::as_str) == Some("s3:TestEvent")
}

/// Objects announced by one notification document (S3, EventBridge, SNS envelope).
fn objects_of(v: &Value) -> Result<Vec<Url>, String> {
    announced_of(v).map(|a| a.into_iter().map(|(u, _)| u).collect())
}

/// The objects an SQS message body announces, each with its size in bytes when the
/// notification gives it (S3 and EventBridge do).
pub fn announced(body: &str) -> Result<Vec<(Url, Option<u64>)>, String> {
    serde_json::from_str::<Value>(body)
        .map_err(|e| format!("SQS message body is not JSON: {e}"))
        .and_then(|v| announced_of(&v))
}

fn announced_of(v: &Value) -> Result<Vec<(Url, Option<u64>)>, String> {
    if is_test_event(v) {
        return Ok(vec![]);
    }
    if v.get("Type").and_then(Value::as_str) == Some("Notification") {
        let msg = v
            .get("Message")
            .and_then(Value::as_str)
            .ok_or("SNS envelope without Message")?;
        let inner: Value =
            serde_json::from_str(msg).map_err(|e| format!("SNS Message is not JSON: {e}"))?;
        return announced_of(&inner);
    }
    let size = |v: &Value, at: &str| v.pointer(at).and_then(Value::as_u64);
    if let Some(records) = v.get("Records").and_then(Value::as_array) {
        // Read the few fields we need: emulators and older producers omit others that the
        // strict `aws_lambda_events` S3 types require.
        let mut out = Vec::new();
        for r in records {
            let name = r
                .get("eventName")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if !name.starts_with("ObjectCreated:") {
                continue;
            }
            let (bucket, key) = bucket_and_key(r, "/s3", "S3 record without s3")?;
            let url = storage::s3_url(bucket, &decode_s3_key(key)).map_err(|e| e.to_string())?;
            out.push((url, size(r, "/s3/object/size")));
        }
        return Ok(out);
    }
    if let Some(dt) = v.get("detail-type").and_then(Value::as_str) {
        if dt != "Object Created" {
            return Ok(vec![]);
        }
        let (bucket, key) =
            bucket_and_key(v, "/detail", "EventBridge Object Created without detail")?;
        let url = storage::s3_url(bucket, key).map_err(|e| e.to_string())?;
        return Ok(vec![(url, size(v, "/detail/object/size"))]);
    }
    Err("message is neither an S3 notification nor an EventBridge event".into())
}

/// `<at>/bucket/name` and `<at>/object/key` of a notification (as sent: S3 keys still
/// URL-encoded).
fn bucket_and_key<'a>(v: &'a Value, at: &str, missing: &str) -> Result<(&'a str, &'a str), String> {
    let field = |path: &str| {
        v.pointer(&format!("{at}{path}"))
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{missing}{}", path.replace('/', ".")))
    };
    Ok((field("/bucket/name")?, field("/object/key")?))
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
            storage::display(&objs[0]),
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
        let got: Vec<String> = inv.messages[0]
            .objects
            .as_ref()
            .unwrap()
            .iter()
            .map(storage::display)
            .collect();
        let want: Vec<String> = keys
            .iter()
            .map(|k| format!("s3://raw-bucket/{k}"))
            .collect();
        assert_eq!(got, want);
        assert_eq!(inv.messages[0].objects.as_ref().unwrap(), &urls);
        let sizes: Vec<Option<u64>> = announced(&body)
            .unwrap()
            .into_iter()
            .map(|(_, n)| n)
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
            storage::display(&inv.messages[0].objects.as_ref().unwrap()[0]),
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
            storage::display(&inv.messages[0].objects.as_ref().unwrap()[0]),
            "s3://tributary-raw/dms/delta_emr_source/travel_details/2022/10/25/20221025-2110000000.parquet"
        );
        let inv = parse(&sample("s3-put-encoded-key.json")).unwrap();
        assert_eq!(
            storage::display(&inv.messages[0].objects.as_ref().unwrap()[0]),
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
