//! The Glue API calls the catalog sync makes, on the AWS SDK: every call counted, every
//! answer turned into tributary's types, every error into [`Error::Catalog`] naming the
//! entry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_glue::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_glue::types::{
    Column, DatabaseInput, PartitionInput, PartitionValueList, SerDeInfo, StorageDescriptor,
    TableInput,
};
use aws_sdk_glue::Client;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, SdkConfig};
use tokio::sync::OnceCell;

use super::entry::{Desired, Existing, GluePartition};
use super::Failure;
use crate::error::{Error, Result};

/// Largest batches Glue accepts.
const CREATE_BATCH: usize = 100;
const DELETE_BATCH: usize = 25;
/// BatchUpdatePartition takes at most 100 entries.
const UPDATE_BATCH: usize = 100;

/// A Glue client that counts its calls.
#[derive(Debug)]
pub(crate) struct Glue {
    client: Client,
    calls: AtomicU64,
}

/// The Glue client of a process: built on first use from the environment (as the AWS CLI
/// is) or from a given AWS configuration.
#[derive(Debug, Default)]
pub(crate) struct Connection {
    preset: Option<SdkConfig>,
    client: OnceCell<Client>,
}

impl Connection {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn with(config: SdkConfig) -> Self {
        Connection {
            preset: Some(config),
            client: OnceCell::new(),
        }
    }

    pub(crate) async fn glue(&self) -> Glue {
        let client = self
            .client
            .get_or_init(|| async {
                let config = match &self.preset {
                    Some(c) => c.clone(),
                    None => {
                        // As for S3 (`tuning`): us-east-1 when nothing names a region.
                        let region =
                            aws_config::meta::region::RegionProviderChain::default_provider()
                                .or_else("us-east-1");
                        aws_config::defaults(BehaviorVersion::latest())
                            .region(region)
                            .retry_config(RetryConfig::standard().with_max_attempts(3))
                            .timeout_config(
                                TimeoutConfig::builder()
                                    .connect_timeout(Duration::from_secs(3))
                                    .operation_timeout(Duration::from_secs(20))
                                    .build(),
                            )
                            .load()
                            .await
                    }
                };
                Client::new(&config)
            })
            .await;
        Glue::new(client.clone())
    }
}

fn classify<E: ProvideErrorMetadata + std::error::Error + 'static, R: std::fmt::Debug>(
    entry: &str,
    op: &str,
    e: SdkError<E, R>,
) -> Failure {
    let code = e.code().unwrap_or_default().to_string();
    match code.as_str() {
        "EntityNotFoundException" => Failure::NotFound,
        "AlreadyExistsException" => Failure::AlreadyExists,
        "ConcurrentModificationException" => Failure::Concurrent,
        _ => {
            // Access, validation and input errors need a person; the rest (network,
            // throttling past the SDK's retries, service errors) can pass on their own.
            let retryable = !matches!(
                code.as_str(),
                "AccessDeniedException" | "InvalidInputException" | "ValidationException"
            );
            Failure::Other(Box::new(Error::catalog(
                entry,
                format!("{op} failed: {}", DisplayErrorContext(&e)),
                retryable,
            )))
        }
    }
}

fn build<T>(entry: &str, r: Result<T, aws_sdk_glue::error::BuildError>) -> Result<T, Failure> {
    r.map_err(|e| {
        Failure::Other(Box::new(Error::catalog(
            entry,
            format!("request: {e}"),
            false,
        )))
    })
}

impl Glue {
    fn new(client: Client) -> Self {
        Glue {
            client,
            calls: AtomicU64::new(0),
        }
    }

    /// Glue calls made so far.
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) async fn create_database(&self, database: &str) -> Result<(), Failure> {
        self.count();
        let input = build(database, DatabaseInput::builder().name(database).build())?;
        match self
            .client
            .create_database()
            .database_input(input)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match classify(database, "CreateDatabase", e) {
                Failure::AlreadyExists => Ok(()),
                f => Err(f),
            },
        }
    }

    pub(crate) async fn get_table(&self, database: &str, name: &str) -> Result<Existing, Failure> {
        self.count();
        let entry = format!("{database}.{name}");
        let out = self
            .client
            .get_table()
            .database_name(database)
            .name(name)
            .send()
            .await
            .map_err(|e| classify(&entry, "GetTable", e))?;
        let t = out.table().ok_or(Failure::NotFound)?;
        let sd = t.storage_descriptor();
        let cols = |c: &[Column]| {
            c.iter()
                .map(|c| {
                    (
                        c.name().to_string(),
                        c.r#type().unwrap_or_default().to_string(),
                        c.comment().map(str::to_string),
                    )
                })
                .collect::<Vec<_>>()
        };
        Ok(Existing {
            columns: sd.map(|s| cols(s.columns())).unwrap_or_default(),
            partition_keys: cols(t.partition_keys())
                .into_iter()
                .map(|(n, t, _)| (n, t))
                .collect(),
            location: sd.and_then(|s| s.location()).map(str::to_string),
            input_format: sd.and_then(|s| s.input_format()).map(str::to_string),
            output_format: sd.and_then(|s| s.output_format()).map(str::to_string),
            serde: sd
                .and_then(|s| s.serde_info())
                .and_then(|s| s.serialization_library())
                .map(str::to_string),
            serde_parameters: sd
                .and_then(|s| s.serde_info())
                .and_then(|s| s.parameters())
                .cloned()
                .unwrap_or_default(),
            parameters: t.parameters().cloned().unwrap_or_default(),
            table_type: t.table_type().map(str::to_string),
            version_id: t.version_id().map(str::to_string),
        })
    }

    /// Create the entry; `Failure::NotFound` when the database does not exist.
    pub(crate) async fn create_table(
        &self,
        database: &str,
        d: &Desired,
        parameters: HashMap<String, String>,
    ) -> Result<(), Failure> {
        self.count();
        let entry = format!("{database}.{}", d.name);
        let input = table_input(&entry, d, parameters, &[])?;
        self.client
            .create_table()
            .database_name(database)
            .table_input(input)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| classify(&entry, "CreateTable", e))
    }

    /// Replace the entry, if it is still at `version_id` (Glue's optimistic concurrency).
    pub(crate) async fn update_table(
        &self,
        database: &str,
        d: &Desired,
        parameters: HashMap<String, String>,
        existing: &Existing,
    ) -> Result<(), Failure> {
        self.count();
        let entry = format!("{database}.{}", d.name);
        let input = table_input(&entry, d, parameters, &existing.columns)?;
        self.client
            .update_table()
            .database_name(database)
            .table_input(input)
            .set_version_id(existing.version_id.clone())
            .send()
            .await
            .map(|_| ())
            .map_err(|e| classify(&entry, "UpdateTable", e))
    }

    /// Every partition of an entry: values → location.
    pub(crate) async fn get_partitions(
        &self,
        database: &str,
        name: &str,
    ) -> Result<Vec<GluePartition>, Failure> {
        let entry = format!("{database}.{name}");
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            self.count();
            let page = self
                .client
                .get_partitions()
                .database_name(database)
                .table_name(name)
                .set_next_token(token.take())
                .send()
                .await
                .map_err(|e| classify(&entry, "GetPartitions", e))?;
            for p in page.partitions() {
                out.push(GluePartition {
                    values: p.values().to_vec(),
                    location: p
                        .storage_descriptor()
                        .and_then(|s| s.location())
                        .unwrap_or_default()
                        .to_string(),
                });
            }
            match page.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => return Ok(out),
            }
        }
    }

    /// Register partitions (those already there are left as they are).
    pub(crate) async fn create_partitions(
        &self,
        database: &str,
        d: &Desired,
        parts: &[GluePartition],
    ) -> Result<(), Failure> {
        let entry = format!("{database}.{}", d.name);
        for chunk in parts.chunks(CREATE_BATCH) {
            self.count();
            let inputs = chunk
                .iter()
                .map(|p| {
                    Ok(PartitionInput::builder()
                        .set_values(Some(p.values.clone()))
                        .storage_descriptor(storage(&entry, d, &p.location, None)?)
                        .build())
                })
                .collect::<Result<Vec<_>, Failure>>()?;
            let out = self
                .client
                .batch_create_partition()
                .database_name(database)
                .table_name(&d.name)
                .set_partition_input_list(Some(inputs))
                .send()
                .await
                .map_err(|e| classify(&entry, "BatchCreatePartition", e))?;
            partition_errors(&entry, "BatchCreatePartition", out.errors(), |code| {
                code == "AlreadyExistsException"
            })?;
        }
        Ok(())
    }

    /// Give registered partitions the entry's columns and storage again (after the table's
    /// schema changed: a partition keeps the columns it was registered with, and engines
    /// read a partition's files by its own columns). Partitions gone meanwhile are fine.
    pub(crate) async fn update_partitions(
        &self,
        database: &str,
        d: &Desired,
        parts: &[GluePartition],
    ) -> Result<(), Failure> {
        use aws_sdk_glue::types::BatchUpdatePartitionRequestEntry;
        let entry = format!("{database}.{}", d.name);
        for chunk in parts.chunks(UPDATE_BATCH) {
            self.count();
            let entries = chunk
                .iter()
                .map(|p| {
                    let input = PartitionInput::builder()
                        .set_values(Some(p.values.clone()))
                        .storage_descriptor(storage(&entry, d, &p.location, None)?)
                        .build();
                    build(
                        &entry,
                        BatchUpdatePartitionRequestEntry::builder()
                            .set_partition_value_list(Some(p.values.clone()))
                            .partition_input(input)
                            .build(),
                    )
                })
                .collect::<Result<Vec<_>, Failure>>()?;
            let out = self
                .client
                .batch_update_partition()
                .database_name(database)
                .table_name(&d.name)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| classify(&entry, "BatchUpdatePartition", e))?;
            for e in out.errors() {
                let code = e
                    .error_detail()
                    .and_then(|d| d.error_code())
                    .unwrap_or_default();
                if code == "EntityNotFoundException" {
                    continue;
                }
                let message = e
                    .error_detail()
                    .and_then(|d| d.error_message())
                    .unwrap_or_default();
                return Err(Failure::Other(Box::new(Error::catalog(
                    &entry,
                    format!(
                        "BatchUpdatePartition: partition {:?}: {code} {message}",
                        e.partition_value_list()
                    ),
                    true,
                ))));
            }
        }
        Ok(())
    }

    /// Remove partitions (those already gone are fine).
    pub(crate) async fn delete_partitions(
        &self,
        database: &str,
        name: &str,
        values: &[Vec<String>],
    ) -> Result<(), Failure> {
        let entry = format!("{database}.{name}");
        for chunk in values.chunks(DELETE_BATCH) {
            self.count();
            let list = chunk
                .iter()
                .map(|v| {
                    build(
                        &entry,
                        PartitionValueList::builder()
                            .set_values(Some(v.clone()))
                            .build(),
                    )
                })
                .collect::<Result<Vec<_>, Failure>>()?;
            let out = self
                .client
                .batch_delete_partition()
                .database_name(database)
                .table_name(name)
                .set_partitions_to_delete(Some(list))
                .send()
                .await
                .map_err(|e| classify(&entry, "BatchDeletePartition", e))?;
            partition_errors(&entry, "BatchDeletePartition", out.errors(), |code| {
                code == "EntityNotFoundException"
            })?;
        }
        Ok(())
    }
}

/// The first per-partition error of a batch call that is not a benign one.
fn partition_errors(
    entry: &str,
    op: &str,
    errors: &[aws_sdk_glue::types::PartitionError],
    benign: impl Fn(&str) -> bool,
) -> Result<(), Failure> {
    for e in errors {
        let code = e
            .error_detail()
            .and_then(|d| d.error_code())
            .unwrap_or_default();
        if benign(code) {
            continue;
        }
        let message = e
            .error_detail()
            .and_then(|d| d.error_message())
            .unwrap_or_default();
        return Err(Failure::Other(Box::new(Error::catalog(
            entry,
            format!(
                "{op}: partition {:?}: {code} {message}",
                e.partition_values()
            ),
            true,
        ))));
    }
    Ok(())
}

fn storage(
    entry: &str,
    d: &Desired,
    location: &str,
    comments: Option<&[(String, String, Option<String>)]>,
) -> Result<StorageDescriptor, Failure> {
    let columns = d
        .columns
        .iter()
        .map(|(name, ty)| {
            // Keep the comments people wrote on columns that are still there.
            let comment = comments.and_then(|c| {
                c.iter()
                    .find(|(n, _, _)| n.eq_ignore_ascii_case(name))
                    .and_then(|(_, _, c)| c.clone())
            });
            build(
                entry,
                Column::builder()
                    .name(name)
                    .r#type(ty)
                    .set_comment(comment)
                    .build(),
            )
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    Ok(StorageDescriptor::builder()
        .set_columns(Some(columns))
        .location(location)
        .input_format(d.input_format)
        .output_format(d.output_format)
        .serde_info(
            SerDeInfo::builder()
                .serialization_library(d.serde)
                .set_parameters(
                    (!d.serde_parameters.is_empty())
                        .then(|| d.serde_parameters.iter().cloned().collect()),
                )
                .build(),
        )
        .build())
}

fn table_input(
    entry: &str,
    d: &Desired,
    parameters: HashMap<String, String>,
    comments: &[(String, String, Option<String>)],
) -> Result<TableInput, Failure> {
    let keys = d
        .partition_keys
        .iter()
        .map(|(n, t)| build(entry, Column::builder().name(n).r#type(t).build()))
        .collect::<Result<Vec<_>, Failure>>()?;
    build(
        entry,
        TableInput::builder()
            .name(&d.name)
            .table_type(super::entry::TABLE_TYPE)
            .storage_descriptor(storage(entry, d, &d.location, Some(comments))?)
            .set_partition_keys(Some(keys))
            .set_parameters(Some(parameters))
            .build(),
    )
}
