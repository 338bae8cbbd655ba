//! The Glue calls of a build without the `glue` feature (no AWS SDK for Glue in the
//! binary): each refuses, naming the feature. Configurations with `[table.catalog]` are
//! refused at start-up in such a build (`config`), so these are reached only by calls that
//! name an entry on purpose (`tributary catalog`).

use std::collections::HashMap;

use super::entry::{Desired, Existing, GluePartition};
use super::Failure;
use crate::error::Error;

/// No client: this build has no Glue support.
#[derive(Debug)]
pub(crate) struct Connection;

impl Connection {
    pub(crate) fn new() -> Self {
        Connection
    }

    pub(crate) async fn glue(&self) -> Glue {
        Glue
    }
}

/// Glue calls that refuse.
#[derive(Debug)]
pub(crate) struct Glue;

fn off<T>(entry: &str) -> Result<T, Failure> {
    Err(Failure::Other(Box::new(Error::catalog(
        entry,
        "this tributary was built without the `glue` feature: build it with the default features to keep Glue Data Catalog entries",
        false,
    ))))
}

impl Glue {
    pub(crate) fn calls(&self) -> u64 {
        0
    }

    pub(crate) async fn create_database(&self, database: &str) -> Result<(), Failure> {
        off(database)
    }

    pub(crate) async fn get_table(&self, database: &str, name: &str) -> Result<Existing, Failure> {
        off(&format!("{database}.{name}"))
    }

    pub(crate) async fn create_table(
        &self,
        database: &str,
        d: &Desired,
        _: HashMap<String, String>,
    ) -> Result<(), Failure> {
        off(&format!("{database}.{}", d.name))
    }

    pub(crate) async fn update_table(
        &self,
        database: &str,
        d: &Desired,
        _: HashMap<String, String>,
        _: &Existing,
    ) -> Result<(), Failure> {
        off(&format!("{database}.{}", d.name))
    }

    pub(crate) async fn get_partitions(
        &self,
        database: &str,
        name: &str,
    ) -> Result<Vec<GluePartition>, Failure> {
        off(&format!("{database}.{name}"))
    }

    pub(crate) async fn create_partitions(
        &self,
        database: &str,
        d: &Desired,
        _: &[GluePartition],
    ) -> Result<(), Failure> {
        off(&format!("{database}.{}", d.name))
    }

    pub(crate) async fn update_partitions(
        &self,
        database: &str,
        d: &Desired,
        _: &[GluePartition],
    ) -> Result<(), Failure> {
        off(&format!("{database}.{}", d.name))
    }

    pub(crate) async fn delete_partitions(
        &self,
        database: &str,
        name: &str,
        _: &[Vec<String>],
    ) -> Result<(), Failure> {
        off(&format!("{database}.{name}"))
    }
}
