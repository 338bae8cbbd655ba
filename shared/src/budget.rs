//! The time the current invocation has left: a Lambda function's deadline, set by its
//! handler around the call ([`within`]); none elsewhere (the CLI, the tests, unless they set
//! one). Only work that can stop part-way and go on in the next attempt looks at it — a
//! widening's staged rewrite (`widen`) — everything else runs to its end as before.

use std::future::Future;
use std::time::{Duration, Instant};

tokio::task_local! {
    static DEADLINE: Instant;
}

/// Run `f` with `deadline` as the time it must be done by (a Lambda invocation's end, less
/// what the handler needs after it).
pub async fn within<F: Future>(deadline: Instant, f: F) -> F::Output {
    DEADLINE.scope(deadline, f).await
}

/// The time left before the deadline of the [`within`] around this call (zero once it has
/// passed); `None` without one.
pub(crate) fn left() -> Option<Duration> {
    DEADLINE
        .try_with(|d| d.saturating_duration_since(Instant::now()))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_deadline_is_seen_inside_within_only() {
        assert_eq!(left(), None);
        let d = within(Instant::now() + Duration::from_secs(60), async { left() }).await;
        assert!(d.is_some_and(|d| d > Duration::from_secs(50) && d <= Duration::from_secs(60)));
        let passed = within(Instant::now(), async { left() }).await;
        assert_eq!(passed, Some(Duration::ZERO));
        assert_eq!(left(), None);
    }
}
