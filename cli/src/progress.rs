//! Progress of long runs on a terminal: one status line on stderr, redrawn in place (done /
//! total, rows, rate, ETA). Nothing at all when stderr is not a terminal (piped, redirected,
//! CI logs), so scripts see only the results.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub(crate) struct Progress {
    what: &'static str,
    total: usize,
    done: usize,
    rows: u64,
    started: Instant,
    on: bool,
    drawn: bool,
}

impl Progress {
    /// A progress line over `total` items (`what`: "files", "tables"), shown when stderr is
    /// a terminal.
    pub(crate) fn new(what: &'static str, total: usize) -> Self {
        Progress {
            what,
            total,
            done: 0,
            rows: 0,
            started: Instant::now(),
            on: std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    /// `n` more items done, with `rows` more rows.
    pub(crate) fn advance(&mut self, n: usize, rows: u64) {
        self.done += n;
        self.rows += rows;
        self.draw();
    }

    /// Take the line away (before printing results, and at the end).
    pub(crate) fn clear(&mut self) {
        if self.on && self.drawn {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[2K");
            let _ = e.flush();
            self.drawn = false;
        }
    }

    fn draw(&mut self) {
        if !self.on {
            return;
        }
        let line = render(
            self.what,
            self.done,
            self.total,
            self.rows,
            self.started.elapsed(),
        );
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[2K{line}");
        let _ = e.flush();
        self.drawn = true;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

fn duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// The status line.
fn render(what: &str, done: usize, total: usize, rows: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64().max(1e-3);
    let rate = done as f64 / secs;
    let mut line = format!(
        "{done}/{total} {what} ({:.0}%), {rows} rows, {rate:.1} {what}/s",
        if total == 0 {
            100.0
        } else {
            100.0 * done as f64 / total as f64
        }
    );
    if done > 0 && done < total {
        let eta = Duration::from_secs_f64((total - done) as f64 / rate);
        line.push_str(&format!(", ETA {}", duration(eta)));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_done_rate_and_eta() {
        assert_eq!(
            render("files", 30, 120, 45000, Duration::from_secs(10)),
            "30/120 files (25%), 45000 rows, 3.0 files/s, ETA 30s"
        );
        assert_eq!(
            render("tables", 2, 2, 0, Duration::from_secs(5)),
            "2/2 tables (100%), 0 rows, 0.4 tables/s"
        );
        assert_eq!(duration(Duration::from_secs(3725)), "1h02m");
    }
}
