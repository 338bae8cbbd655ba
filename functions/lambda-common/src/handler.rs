//! The merge handler: an invocation's payload parsed (`crate::events`), every announced file
//! merged, the messages that failed worked out — FIFO messages with files that cannot be
//! merged moved to the dead-letter queue when `crate::queues` says so — and the response.

use std::collections::{HashMap, HashSet};

use aws_lambda_events::event::sqs::SqsBatchResponse;
use serde_json::Value;
use url::Url;

use tributary::{Engine, FileStatus, ProcessReport};

use crate::events::{parse, Invocation, Trigger};
use crate::FunctionError;

/// What the merge handler did with one invocation.
#[derive(Debug)]
pub struct Handled {
    pub trigger: Trigger,
    pub report: ProcessReport,
    /// Message ids to report as failed (SQS), with reasons and whether trying again may
    /// succeed (a retryable error, or a dead-lettering that failed): those are retried after
    /// a short, growing delay ([`crate::queues::Queues::back_off`]).
    pub failed_messages: Vec<(Option<String>, String, bool)>,
    /// FIFO messages with files that cannot be merged (not retryable): those files were
    /// moved to the dead-letter queue (the message's other files merged) so that they do not
    /// hold up their table: (message id, reason).
    pub dead_lettered: Vec<(String, String)>,
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
            .filter(|(_, _, retryable)| *retryable)
            .filter_map(|(id, ..)| id.clone())
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
                for id in self
                    .failed_messages
                    .iter()
                    .filter_map(|(id, ..)| id.as_ref())
                {
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
                    .map(|(_, r, _)| r.as_str())
                    .collect::<Vec<_>>()
                    .join("; "),
            }),
        }
    }
}

/// Parse the event, merge every announced file, and work out which messages failed.
pub async fn handle(engine: &Engine, event: &Value) -> Result<Handled, FunctionError> {
    handle_with(engine, None, event).await
}

/// [`handle`], moving FIFO messages that cannot be merged to the dead-letter queue when
/// `queues` says so (see [`crate::queues`]).
pub async fn handle_with(
    engine: &Engine,
    queues: Option<&crate::queues::Queues>,
    event: &Value,
) -> Result<Handled, FunctionError> {
    let inv = parse(event).map_err(FunctionError::Event)?;
    let all = announced(&inv);
    let report = engine.process(&all).await;
    let failures = Failures::of(engine, &all, &report);
    let dead_letter_to = queues.filter(|q| q.dead_letters(event));
    let mut fates = Fates::default();
    for m in &inv.messages {
        match &m.objects {
            Err(reason) => fates.not_understood(&m.id, reason),
            Ok(objs) => {
                if let Some(failed) = failures.of_message(engine, objs) {
                    fates.failed(&m.id, failed, event, dead_letter_to).await;
                }
            }
        }
    }
    Ok(Handled {
        trigger: inv.trigger,
        report,
        failed_messages: fates.failed,
        dead_lettered: fates.dead_lettered,
        go_on: fates.go_on,
    })
}

/// The files the invocation's messages announce, in message order.
fn announced(inv: &Invocation) -> Vec<Url> {
    let mut all = Vec::new();
    for m in &inv.messages {
        if let Ok(objs) = &m.objects {
            all.extend(objs.iter().cloned());
        }
    }
    all
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
    fn of_message(&self, engine: &Engine, objs: &[Url]) -> Option<MessageFailure> {
        let (files, errs): (Vec<Url>, Vec<&(String, bool)>) = objs
            .iter()
            .filter_map(|o| self.errors.get(o).map(|e| (o.clone(), e)))
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
    failed: Vec<(Option<String>, String, bool)>,
    dead_lettered: Vec<(String, String)>,
    go_on: Vec<String>,
}

impl Fates {
    /// A message whose body cannot be understood: failed, not retryable.
    fn not_understood(&mut self, id: &Option<String>, reason: &str) {
        tracing::error!(message_id = ?id, error = %reason, "cannot understand message");
        // Not retryable: the same body fails again (SQS redelivers it after the
        // queue's timeout, then dead-letters it).
        self.failed.push((id.clone(), reason.to_string(), false));
    }

    /// A message with files that failed: moved to the dead-letter queue when
    /// `dead_letter_to` takes it and trying again cannot help, reported failed otherwise.
    async fn failed(
        &mut self,
        id: &Option<String>,
        failure: MessageFailure,
        event: &Value,
        dead_letter_to: Option<&crate::queues::Queues>,
    ) {
        if let (Some(id), true) = (id, failure.staged) {
            self.go_on.push(id.clone());
        }
        let MessageFailure {
            files,
            reason,
            retryable,
            ..
        } = failure;
        if let (false, Some(q), Some(id)) = (retryable, dead_letter_to, id) {
            match q.dead_letter(event, id, &files, &reason).await {
                Ok(()) => {
                    tracing::error!(message_id = %id, error = %reason, "moved to the dead-letter queue (cannot be merged; its table goes on)");
                    self.dead_lettered.push((id.clone(), reason));
                }
                Err(e) => {
                    tracing::error!(message_id = %id, error = %e, "could not move the message to the dead-letter queue; reporting it failed");
                    // The move, not the file, failed: tried again soon.
                    self.failed.push((Some(id.clone()), reason, true));
                }
            }
            return;
        }
        self.failed.push((id.clone(), reason, retryable));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        let failed: Vec<(Option<&str>, bool)> = handled
            .failed_messages
            .iter()
            .map(|(id, _, r)| (id.as_deref(), *r))
            .collect();
        assert_eq!(
            failed,
            vec![(Some("unowned"), true), (Some("unreadable"), false)]
        );
        assert_eq!(handled.to_back_off(), vec!["unowned".to_string()]);
        let dead = Handled {
            trigger: Trigger::Sqs,
            report: handled.report,
            failed_messages: vec![(Some("a".into()), "x".into(), false)],
            dead_lettered: vec![("b".into(), "y".into())],
            go_on: vec![],
        };
        assert!(
            dead.to_back_off().is_empty(),
            "not retryable, or dead-lettered"
        );
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
        let (id, reason, retryable) = &handled.failed_messages[0];
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
