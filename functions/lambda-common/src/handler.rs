//! The merge handler: an invocation's messages (`crate::events`) merged, the messages that
//! failed worked out — messages with files that cannot be merged moved aside when the
//! transport (`crate::transport`) does that — and the response.

use std::collections::{HashMap, HashSet};

use aws_lambda_events::event::sqs::SqsBatchResponse;
use serde_json::Value;
use url::Url;

use tributary::{Engine, FileStatus, ProcessReport};

use crate::events::{EventError, Invocation, Message, Object, Trigger};
use crate::transport::{Direct, Transport};
use crate::FunctionError;

/// A message reported failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Its SQS message id (`None`: the one message of a direct invocation).
    pub id: Option<String>,
    /// Why: its failed files' errors, joined with `; `, or why it is not understood.
    pub reason: String,
    /// Whether trying again may succeed (a retryable error, or a dead-lettering that
    /// failed): those are retried after a short, growing delay
    /// ([`crate::transport::Transport::settle`]).
    pub retryable: bool,
}

/// A message whose failed files were moved to the dead-letter queue (its other files
/// merged): not reported failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLettered {
    pub id: String,
    /// Its failed files' errors, joined with `; `.
    pub reason: String,
}

/// What the merge handler did with one invocation.
#[derive(Debug)]
pub struct Handled {
    pub trigger: Trigger,
    pub report: ProcessReport,
    /// The messages to report as failed (SQS), with reasons and whether trying again may
    /// succeed.
    pub failed_messages: Vec<Failure>,
    /// FIFO messages with files that cannot be merged (not retryable): those files were
    /// moved to the dead-letter queue (the message's other files merged) so that they do not
    /// hold up their table.
    pub dead_lettered: Vec<DeadLettered>,
    /// Failed messages whose every failed file only waits for a widening that went as far as
    /// the invocation's time allowed (`tributary::Error::Widening`, staged): received again
    /// at once, not backed off, so that the next attempt goes on with the rewrite.
    pub go_on: Vec<String>,
}

impl Handled {
    /// The failed messages to retry after a short delay rather than the queue's visibility
    /// timeout: those reported failed whose failure is retryable (the others fail the same
    /// way again; dead-lettered messages are not reported failed).
    pub fn to_back_off(&self) -> Vec<String> {
        self.failed_messages
            .iter()
            .filter(|f| f.retryable)
            .filter_map(|f| f.id.clone())
            .filter(|id| !self.go_on.contains(id))
            .collect()
    }

    /// The Lambda response: for SQS a partial batch response; otherwise `null` when
    /// everything merged and an error naming the files when anything failed (so Lambda
    /// retries it).
    pub fn response(&self) -> Result<Value, FunctionError> {
        match self.trigger {
            Trigger::Sqs => {
                let mut r = SqsBatchResponse::default();
                for id in self.failed_messages.iter().filter_map(|f| f.id.as_ref()) {
                    r.add_failure(id.clone());
                }
                Ok(serde_json::to_value(r)?)
            }
            _ if self.failed_messages.is_empty() => Ok(Value::Null),
            _ => Err(FunctionError::Files {
                count: self.failed_messages.len(),
                reasons: self
                    .failed_messages
                    .iter()
                    .map(|f| f.reason.as_str())
                    .collect::<Vec<_>>()
                    .join("; "),
            }),
        }
    }
}

/// Parse the event, merge every announced file, and work out which messages failed —
/// moving nothing aside ([`Direct`]): the entry for callers that hold the JSON (tests).
pub async fn handle(engine: &Engine, event: &Value) -> Result<Handled, FunctionError> {
    let inv = Invocation::parse(event)?;
    Ok(merge(engine, &Direct, &inv).await)
}

/// Merge every file the invocation's messages announce, and work out which messages
/// failed, moving those with files that cannot be merged aside when `transport` does that.
pub async fn merge(engine: &Engine, transport: &impl Transport, inv: &Invocation) -> Handled {
    let all: Vec<Url> = inv
        .messages
        .iter()
        .flat_map(Message::urls)
        .cloned()
        .collect();
    let report = engine.process(&all).await;
    let failures = Failures::of(engine, &all, &report);
    let dead_letter_to = Some(transport).filter(|t| t.dead_letters(inv));
    let mut fates = Fates::default();
    for m in &inv.messages {
        match &m.objects {
            Err(e) => fates.not_understood(m.id.as_ref(), e),
            Ok(objs) => {
                if let Some(failed) = failures.of_message(engine, objs) {
                    fates.failed(m, failed, dead_letter_to).await;
                }
            }
        }
    }
    Handled {
        trigger: inv.trigger,
        report,
        failed_messages: fates.failed,
        dead_lettered: fates.dead_lettered,
        go_on: fates.go_on,
    }
}

/// The files of a merge that failed, by the URL their event announced them under.
struct Failures<'r> {
    /// Why each failed announced file failed, and whether trying again may succeed.
    errors: HashMap<Url, (String, bool)>,
    /// The failed files (resolved) that only wait for a widening to go on
    /// (`tributary::Error::Widening`, staged).
    staged: HashSet<&'r Url>,
}

/// The failed files of one message.
struct MessageFailure {
    files: Vec<Url>,
    /// The files' errors, joined.
    reason: String,
    /// Whether trying again may succeed (any of the errors is retryable).
    retryable: bool,
    /// Every failed file only waits for a widening.
    staged: bool,
}

impl<'r> Failures<'r> {
    /// The failures in `report` of the announced files `all`.
    fn of(engine: &Engine, all: &[Url], report: &'r ProcessReport) -> Self {
        let errors: HashMap<&Url, (String, bool)> = report
            .files
            .iter()
            .filter_map(|f| match &f.status {
                FileStatus::Failed { error, .. } => {
                    Some((&f.file, (error.to_string(), error.is_retryable())))
                }
                _ => None,
            })
            .collect();
        let staged = report
            .files
            .iter()
            .filter(|f| matches!(&f.status, FileStatus::Failed { error, .. } if matches!(error.as_ref(), tributary::Error::Widening { .. })))
            .map(|f| &f.file)
            .collect();
        let errors = all
            .iter()
            .filter_map(|o| {
                errors
                    .get(&engine.resolve(o))
                    .map(|e| (o.clone(), e.clone()))
            })
            .collect();
        Self { errors, staged }
    }

    /// The failed files among a message's `objs`; `None` when all of them merged.
    fn of_message(&self, engine: &Engine, objs: &[Object]) -> Option<MessageFailure> {
        let (files, errs): (Vec<Url>, Vec<&(String, bool)>) = objs
            .iter()
            .filter_map(|o| self.errors.get(&o.url).map(|e| (o.url.clone(), e)))
            .unzip();
        if errs.is_empty() {
            return None;
        }
        let staged = files
            .iter()
            .all(|o| self.staged.contains(&engine.resolve(o)));
        let reason = errs
            .iter()
            .map(|(e, _)| e.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        let retryable = errs.iter().any(|(_, r)| *r);
        Some(MessageFailure {
            files,
            reason,
            retryable,
            staged,
        })
    }
}

/// What becomes of the invocation's messages, as [`Handled`] reports it.
#[derive(Default)]
struct Fates {
    failed: Vec<Failure>,
    dead_lettered: Vec<DeadLettered>,
    go_on: Vec<String>,
}

impl Fates {
    /// A message whose body cannot be understood: failed, not retryable.
    fn not_understood(&mut self, id: Option<&String>, error: &EventError) {
        tracing::error!(message_id = ?id, error = %error, "cannot understand message");
        // Not retryable: the same body fails again (SQS redelivers it after the
        // queue's timeout, then dead-letters it).
        self.failed.push(Failure {
            id: id.cloned(),
            reason: error.to_string(),
            retryable: false,
        });
    }

    /// A message with files that failed: moved to the dead-letter queue when
    /// `dead_letter_to` takes it and trying again cannot help, reported failed otherwise.
    async fn failed(
        &mut self,
        m: &Message,
        failure: MessageFailure,
        dead_letter_to: Option<&impl Transport>,
    ) {
        if let (Some(id), true) = (&m.id, failure.staged) {
            self.go_on.push(id.clone());
        }
        let MessageFailure {
            files,
            reason,
            retryable,
            ..
        } = failure;
        if let (false, Some(t), Some(id)) = (retryable, dead_letter_to, &m.id) {
            match t.dead_letter(m, &files, &reason).await {
                Ok(()) => {
                    tracing::error!(message_id = %id, error = %reason, "moved to the dead-letter queue (cannot be merged; its table goes on)");
                    self.dead_lettered.push(DeadLettered {
                        id: id.clone(),
                        reason,
                    });
                }
                Err(e) => {
                    tracing::error!(message_id = %id, error = %e, "could not move the message to the dead-letter queue; reporting it failed");
                    // The move, not the file, failed: tried again soon.
                    self.failed.push(Failure {
                        id: Some(id.clone()),
                        reason,
                        retryable: true,
                    });
                }
            }
            return;
        }
        self.failed.push(Failure {
            id: m.id.clone(),
            reason,
            retryable,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The failed messages' ids, and whether each may be retried.
    fn failed(handled: &Handled) -> Vec<(Option<&str>, bool)> {
        handled
            .failed_messages
            .iter()
            .map(|f| (f.id.as_deref(), f.retryable))
            .collect()
    }

    #[tokio::test]
    async fn retryable_failures_are_backed_off_and_the_others_not() {
        let engine = Engine::new(
            tributary::Config::from_toml(
                "[[table]]\nname = \"t\"\nsource = \"s3://raw/dms/s/t/\"\ntarget = \"s3://c/t\"\nprimary_key = [\"id\"]\n",
                "t",
                None,
            )
            .unwrap(),
        )
        // A file no table owns while the newest configuration does not load: retryable.
        .failing_unowned("the newer configuration does not load");
        let s3 = |key: &str| {
            json!({"Records":[{"eventSource":"aws:s3","eventName":"ObjectCreated:Put",
                "s3":{"bucket":{"name":"raw"},"object":{"key":key}}}]})
            .to_string()
        };
        let ev = json!({"Records":[
            {"messageId":"unowned","eventSource":"aws:sqs","body": s3("dms/other/x.parquet")},
            {"messageId":"unreadable","eventSource":"aws:sqs","body": "not json"},
            {"messageId":"empty","eventSource":"aws:sqs","body": "{\"Event\":\"s3:TestEvent\"}"}
        ]});
        let handled = handle(&engine, &ev).await.unwrap();
        assert_eq!(
            failed(&handled),
            vec![(Some("unowned"), true), (Some("unreadable"), false)]
        );
        assert_eq!(handled.to_back_off(), vec!["unowned".to_string()]);
        let dead = Handled {
            trigger: Trigger::Sqs,
            report: handled.report,
            failed_messages: vec![Failure {
                id: Some("a".into()),
                reason: "x".into(),
                retryable: false,
            }],
            dead_lettered: vec![DeadLettered {
                id: "b".into(),
                reason: "y".into(),
            }],
            go_on: vec![],
        };
        assert!(
            dead.to_back_off().is_empty(),
            "not retryable, or dead-lettered"
        );
    }

    /// Table `t` fed from `s3://raw/dms/s/t/`; files no table owns fail, retryably.
    fn engine_failing_unowned() -> Engine {
        Engine::new(
            tributary::Config::from_toml(
                "[[table]]\nname = \"t\"\nsource = \"s3://raw/dms/s/t/\"\ntarget = \"s3://c/t\"\nprimary_key = [\"id\"]\n",
                "t",
                None,
            )
            .unwrap(),
        )
        .failing_unowned("the newer configuration does not load")
    }

    fn sqs_of(id: &str, key: &str) -> Value {
        let body = json!({"Records":[{"eventName":"ObjectCreated:Put",
            "s3":{"bucket":{"name":"raw"},"object":{"key":key}}}]});
        json!({"messageId": id, "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:1:t.fifo", "body": body.to_string()})
    }

    /// A body that is not JSON fails its message alone, named, not retryable (not backed
    /// off); the batch's other messages merge.
    #[tokio::test]
    async fn an_unparseable_body_is_a_named_failure_that_is_not_retried_soon() {
        let ev = json!({"Records":[
            {"messageId":"ok","eventSource":"aws:sqs","body": "{\"Event\":\"s3:TestEvent\"}"},
            {"messageId":"garbled","eventSource":"aws:sqs","body": "{\"Records\": ["},
        ]});
        let handled = handle(&engine_failing_unowned(), &ev).await.unwrap();
        assert_eq!(
            handled.failed_messages.len(),
            1,
            "{:?}",
            handled.failed_messages
        );
        let garbled = &handled.failed_messages[0];
        assert_eq!(garbled.id.as_deref(), Some("garbled"));
        assert!(!garbled.retryable);
        assert!(
            garbled.reason.starts_with("SQS message body is not JSON: "),
            "{}",
            garbled.reason
        );
        assert!(!handled.to_back_off().contains(&"garbled".to_string()));
        assert_eq!(
            handled.response().unwrap(),
            json!({"batchItemFailures":[{"itemIdentifier":"garbled"}]})
        );
    }

    /// What a transport was asked to move aside: (message id, files, reason).
    type Moved = (Option<String>, Vec<String>, String);

    /// A transport that records what it is asked to move aside, and can fail to.
    #[derive(Default)]
    struct Recorder {
        moved: std::sync::Mutex<Vec<Moved>>,
        refuse: bool,
    }

    impl Transport for Recorder {
        async fn forward(
            &self,
            _: &Engine,
            _: &Invocation,
        ) -> Option<Result<Value, FunctionError>> {
            None
        }

        fn dead_letters(&self, _: &Invocation) -> bool {
            true
        }

        async fn dead_letter(
            &self,
            m: &Message,
            files: &[Url],
            reason: &str,
        ) -> Result<(), crate::transport::TransportError> {
            let files = files.iter().map(tributary::storage::display).collect();
            if let Ok(mut moved) = self.moved.lock() {
                moved.push((m.id.clone(), files, reason.to_string()));
            }
            match self.refuse {
                true => Err(crate::transport::TransportError::Sqs("SQS is down".into())),
                false => Ok(()),
            }
        }

        async fn settle(&self, _: &Invocation, _: &[String], _: &[String]) {}
    }

    /// Through the seam: a message with a file that cannot be merged is moved aside (not
    /// reported failed); a retryable failure and a message not understood are not; a move
    /// that fails reports the message failed, retryable.
    #[tokio::test]
    async fn files_that_cannot_be_merged_are_moved_aside_through_the_transport() {
        let engine = engine_failing_unowned();
        let ev = json!({"Records":[
            sqs_of("bad", "dms/s/t/notes.txt"),
            sqs_of("unowned", "dms/other/x.parquet"),
            {"messageId":"garbled","eventSource":"aws:sqs","body": "not json"},
        ]});
        let inv = Invocation::parse(&ev).unwrap();
        let moving = Recorder::default();
        let handled = merge(&engine, &moving, &inv).await;
        let moved = moving.moved.lock().unwrap().clone();
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert_eq!(moved[0].0.as_deref(), Some("bad"));
        assert_eq!(moved[0].1, vec!["s3://raw/dms/s/t/notes.txt".to_string()]);
        assert_eq!(
            handled.dead_lettered,
            vec![DeadLettered {
                id: "bad".into(),
                reason: moved[0].2.clone()
            }]
        );
        assert_eq!(
            failed(&handled),
            vec![(Some("unowned"), true), (Some("garbled"), false)]
        );

        let refusing = Recorder {
            refuse: true,
            ..Default::default()
        };
        let handled = merge(&engine, &refusing, &inv).await;
        assert!(handled.dead_lettered.is_empty());
        let bad = &handled.failed_messages[0];
        assert_eq!((bad.id.as_deref(), bad.retryable), (Some("bad"), true));
        assert_eq!(
            handled.to_back_off(),
            vec!["bad".to_string(), "unowned".to_string()]
        );
        // Directly: nothing is moved aside.
        let handled = merge(&engine, &Direct, &inv).await;
        assert!(handled.dead_lettered.is_empty());
        assert_eq!(handled.failed_messages.len(), 3);
        assert!(!handled.failed_messages[0].retryable);
    }

    /// A widening staged as far as the invocation's time allowed (`tributary::budget`): its
    /// message goes on at once, it is not backed off like a failure.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_staged_widening_goes_on_at_once_and_is_not_backed_off() {
        use std::sync::Arc;
        use tributary::deltalake::arrow::array::{ArrayRef, Int32Array, Int64Array, StringArray};
        use tributary::deltalake::arrow::record_batch::RecordBatch;
        let root = std::env::temp_dir().join(format!("tributary-go-on-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let engine = Engine::new(
            tributary::Config::from_toml(
                "[[table]]\nname = \"t\"\nsource = \"s3://raw/dms/t/\"\ntarget = \"s3://c/t\"\nprimary_key = [\"id\"]\npartition_by = [\"p\"]\nslice_mb = 0.000001\n",
                "t",
                None,
            )
            .unwrap(),
        )
        .with_local_s3_root(&root);
        let put = |name: &str, cols: Vec<(&str, ArrayRef)>| {
            let path = root.join("raw/dms/t").join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let b = RecordBatch::try_from_iter(cols).unwrap();
            std::fs::write(&path, tributary::demo::to_parquet(&b).unwrap()).unwrap();
            Url::parse(&format!("s3://raw/dms/t/{name}")).unwrap()
        };
        let strs = |v: &[&str]| -> ArrayRef { Arc::new(StringArray::from(v.to_vec())) };
        let load = put(
            "LOAD00000001.parquet",
            vec![
                ("id", Arc::new(Int32Array::from(vec![1, 2])) as ArrayRef),
                ("p", strs(&["a", "b"])),
                ("n", Arc::new(Int32Array::from(vec![10, 20]))),
            ],
        );
        let r = engine.process(&[load]).await;
        assert!(
            matches!(r.files[0].status, FileStatus::Merged { .. }),
            "{:?}",
            r.files[0].status
        );
        put(
            "20240101-000000001.parquet",
            vec![
                ("Op", strs(&["U"])),
                ("id", Arc::new(Int32Array::from(vec![1])) as ArrayRef),
                ("p", strs(&["a"])),
                ("n", Arc::new(Int64Array::from(vec![1i64 << 40]))),
            ],
        );
        let body = json!({"Records":[{"eventSource":"aws:s3","eventName":"ObjectCreated:Put",
            "s3":{"bucket":{"name":"raw"},"object":{"key":"dms/t/20240101-000000001.parquet"}}}]});
        let ev = json!({"Records":[
            {"messageId":"wide","eventSource":"aws:sqs","body": body.to_string()}
        ]});
        let handled = tributary::budget::within(std::time::Instant::now(), handle(&engine, &ev))
            .await
            .unwrap();
        assert_eq!(
            handled.failed_messages.len(),
            1,
            "{:?}",
            handled.failed_messages
        );
        let Failure {
            id,
            reason,
            retryable,
        } = &handled.failed_messages[0];
        assert_eq!(id.as_deref(), Some("wide"));
        assert!(
            *retryable && reason.contains("1 of 2 data files"),
            "{reason}"
        );
        assert_eq!(handled.go_on, vec!["wide".to_string()]);
        assert!(handled.to_back_off().is_empty(), "going on, not backed off");
        // Without a deadline the widening finishes and the file merges.
        let handled = handle(&engine, &ev).await.unwrap();
        assert!(
            handled.failed_messages.is_empty(),
            "{:?}",
            handled.failed_messages
        );
        assert!(handled.go_on.is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }
}
