//! The merge engine on Delta Lake tables: [`crate::engine::Engine`] built with the Delta
//! sink, and what only a Delta engine has (the Glue catalog its commits keep in step,
//! delta-rs's storage options, a reload's one commit, the commits' test hooks).

use std::collections::HashMap;

use crate::config::{Config, TableConfig};
use crate::delta::catalog::Catalog;
use crate::delta::sink::DeltaSink;
use crate::engine::{Batch, ProcessReport, TableReport};
use crate::error::Result;
use crate::sink::Sink;
use crate::tuning::Tuning;

/// The merge engine on Delta Lake tables.
pub type Engine = crate::engine::Engine<DeltaSink>;

/// How an [`Engine`] is built: its configuration, the tuning carried down to its storage and
/// tables, its catalog client ([`Engine::builder`]).
#[derive(Debug)]
pub struct EngineBuilder {
    config: Config,
    tuning: Option<Tuning>,
    catalog: Option<Catalog>,
}

impl EngineBuilder {
    /// The tuning its storage and tables use (default: the environment's,
    /// [`Tuning::from_env_or_default`]).
    pub fn tuning(mut self, tuning: Tuning) -> Self {
        self.tuning = Some(tuning);
        self
    }

    /// The Glue client entries are kept with (default: configured from the environment on
    /// first use, [`Catalog::from_env`]).
    pub fn catalog(mut self, catalog: Catalog) -> Self {
        self.catalog = Some(catalog);
        self
    }

    pub fn build(self) -> Engine {
        let tuning = self.tuning.unwrap_or_else(Tuning::from_env_or_default);
        let catalog = self.catalog.unwrap_or_default();
        Engine::on(self.config, &tuning, |storage| {
            DeltaSink::new(storage, catalog)
        })
    }
}

impl crate::engine::Engine<DeltaSink> {
    /// The engine of `config` with the environment's tuning ([`Engine::builder`] to give it).
    pub fn new(config: Config) -> Self {
        Self::builder(config).build()
    }

    /// A builder of the engine of `config`.
    pub fn builder(config: Config) -> EngineBuilder {
        EngineBuilder {
            config,
            tuning: None,
            catalog: None,
        }
    }

    /// Load the configuration from a local path or `s3://` URI and build the engine, after
    /// checking the environment's tuning ([`crate::tuning::Tuning`]).
    pub async fn from_config_location(location: &str) -> Result<Self> {
        let tuning = Tuning::from_env()?;
        tuning.apply();
        let config = crate::engine::load_config(location, &tuning).await?;
        Ok(Self::builder(config).tuning(tuning).build())
    }

    /// Keep the Glue Data Catalog with this client (default: configured from the
    /// environment on first use).
    pub fn with_catalog(mut self, catalog: Catalog) -> Self {
        self.sink.catalog = std::sync::Arc::new(catalog);
        self
    }

    /// The catalog client (maintenance and `tributary catalog sync` reconcile with it).
    pub fn catalog(&self) -> &Catalog {
        &self.sink.catalog
    }

    /// Delta storage options (endpoint overrides) used for every table.
    pub fn storage_options(&self) -> &HashMap<String, String> {
        &self.sink.options
    }

    /// Merge these files. Files of one table go into one commit; tables are independent;
    /// a bad file fails alone. Never panics on input; every file gets an outcome.
    pub async fn process(&self, files: &[url::Url]) -> ProcessReport {
        self.process_into(&self.sink, files).await
    }

    /// One batch into a table through the Delta sink (a reload's one commit).
    pub(crate) async fn merge_batch(
        &self,
        table: &TableConfig,
        batch: &Batch<'_>,
        loaded: Option<deltalake::DeltaTable>,
    ) -> Result<TableReport> {
        self.sink.commit(table, batch, loaded).await
    }

    /// The hooks of this engine's commits (tests).
    #[cfg(test)]
    pub(crate) fn hooks(&self) -> &crate::delta::testing::Hooks {
        &self.sink.hooks
    }
}

#[cfg(test)]
mod tests;
