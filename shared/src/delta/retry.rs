//! One retry policy for commit conflicts: jittered exponential backoff (~50 ms doubling to
//! ~3 s, ±50 %), a bounded number of attempts, then a retryable [`Error::Contention`].
//! Every optimistic-concurrency loop (merges, tombstone appends, maintenance) uses it.

use crate::delta::is_conflict;
use crate::error::{Error, Result};

/// Attempts of one operation on one table.
#[derive(Debug)]
pub(crate) struct Retry {
    table: String,
    max_attempts: u32,
    attempt: u32,
}

impl Retry {
    pub(crate) fn new(table: &str, max_attempts: u32) -> Self {
        Retry {
            table: table.to_string(),
            max_attempts: max_attempts.max(1),
            attempt: 1,
        }
    }

    /// After a failed attempt: a commit conflict with attempts left sleeps and returns
    /// `Ok(())` (try again); the last conflict becomes [`Error::Contention`]; any other error
    /// is returned as it is.
    async fn on_error(&mut self, e: Error, what: &str) -> Result<()> {
        if !is_conflict(&e) {
            return Err(e);
        }
        if self.attempt >= self.max_attempts {
            tracing::warn!(table = %self.table, attempts = self.attempt, operation = what, "giving up after commit conflicts");
            return Err(Error::Contention {
                table: self.table.clone(),
                attempts: self.attempt,
            });
        }
        tracing::info!(table = %self.table, attempt = self.attempt, of = self.max_attempts, operation = what, "commit conflict with a concurrent writer; retrying");
        backoff(self.attempt).await;
        self.attempt += 1;
        Ok(())
    }
}

/// One writer's attempts at a commit (a batch MERGE, a whole-file append, a history
/// MERGE): what [`Retry::drive`] repeats.
pub(crate) trait Attempts {
    type Out;
    /// Attempt `n` (1-based): read the table, check, write, commit.
    async fn attempt(&mut self, n: u32) -> Result<Self::Out>;
}

impl Retry {
    /// The commit loop — the one loop of every optimistic-concurrency writer: `attempt(n)`
    /// (1-based) until one succeeds, a commit conflict with attempts to spare sleeping in
    /// between ([`Retry::on_error`]; an attempt after the first reads the table again). The
    /// value and the attempts made.
    /// An attempt's future owns what it works on (it is `Send` wherever its writer runs):
    /// state an attempt changes comes back in its value.
    pub(crate) async fn run<T, F, Fut>(mut self, what: &str, mut attempt: F) -> Result<(T, u32)>
    where
        F: FnMut(u32) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        loop {
            match attempt(self.attempt).await {
                Ok(t) => return Ok((t, self.attempt)),
                Err(e) => self.on_error(e, what).await?,
            }
        }
    }

    /// [`Retry::run`] over a writer's [`Attempts`], whose attempts borrow the writer's state
    /// (the tombstones, the report) across the loop: the same loop, over `&mut A`.
    pub(crate) async fn drive<A: Attempts>(
        mut self,
        what: &str,
        a: &mut A,
    ) -> Result<(A::Out, u32)> {
        loop {
            match a.attempt(self.attempt).await {
                Ok(t) => return Ok((t, self.attempt)),
                Err(e) => self.on_error(e, what).await?,
            }
        }
    }
}

async fn backoff(attempt: u32) {
    use rand::Rng;
    let base = 50u64 << attempt.min(6);
    let ms = rand::rng().random_range(base / 2..=base + base / 2);
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}
