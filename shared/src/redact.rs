//! Row values left out of messages (`TRIBUTARY_LOG_VALUES=false`, #44): an error that names
//! a file's offending value — a cell that does not fit the table's type, a key that breaks a
//! constraint, a CSV field Arrow cannot parse — is good for debugging but may be personal
//! data, and error messages go to CloudWatch Logs, the functions' reports and the
//! dead-letter queues. With the setting off they still name the file, row, column and what
//! is wrong; the values become `…`.
//!
//! The setting is the process's: read once with the rest of the environment's tuning
//! ([`crate::tuning::Tuning`]) at start-up and set here, because the messages are made deep
//! in decoders and converters that carry no configuration.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};

static WITHHELD: AtomicBool = AtomicBool::new(false);

/// What stands for a value left out.
pub const WITHHELD_VALUE: &str = "…";

/// Leave row values out of messages from now on (`true`) or keep them (`false`, the default).
pub fn withhold_values(on: bool) {
    WITHHELD.store(on, Ordering::Relaxed);
}

/// Whether row values are left out of messages.
pub fn values_withheld() -> bool {
    WITHHELD.load(Ordering::Relaxed)
}

/// A row value for a message: itself, or [`WITHHELD_VALUE`].
pub(crate) fn value(v: &str) -> Cow<'_, str> {
    match values_withheld() {
        true => Cow::Borrowed(WITHHELD_VALUE),
        false => Cow::Borrowed(v),
    }
}

/// A message that may quote row values (tributary's `{:?}` of a value, Arrow's and the CSV
/// reader's `'value'`): as it is, or with every quoted text (`"…"`, `'…'`) replaced by
/// [`WITHHELD_VALUE`] — column names are in backticks and stay.
pub(crate) fn text(message: &str) -> Cow<'_, str> {
    if !values_withheld() || !message.contains(['"', '\'']) {
        return Cow::Borrowed(message);
    }
    Cow::Owned(scrub(message))
}

/// `message` with the inside of every pair of double or single quotes replaced.
fn scrub(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut chars = message.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c != '"' && c != '\'' {
            out.push(c);
            continue;
        }
        // A quote that closes on the same line encloses a value; an apostrophe in prose
        // ("doesn't") has no partner before the line ends and stays.
        let rest = &message[i + 1..];
        let line_end = rest.find('\n').unwrap_or(rest.len());
        match rest[..line_end].find(c) {
            Some(close) if !(c == '\'' && is_apostrophe(message, i)) => {
                out.push(c);
                out.push_str(WITHHELD_VALUE);
                out.push(c);
                let end = i + 1 + close;
                while chars.peek().is_some_and(|(j, _)| *j <= end) {
                    chars.next();
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// A single quote between two letters (`doesn't`, `table's`): prose, not a value's quote.
fn is_apostrophe(message: &str, i: usize) -> bool {
    let before = message[..i].chars().next_back();
    let after = message[i + 1..].chars().next();
    before.is_some_and(char::is_alphanumeric) && after.is_some_and(char::is_alphanumeric)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_values_are_withheld_and_prose_stays() {
        let m = "row 7, column `amount`: value \"12.5x\" cannot be represented; the table's type \
                 is int64 (Arrow: Error while parsing value 'abc' as type Int64)";
        assert_eq!(
            scrub(m),
            "row 7, column `amount`: value \"…\" cannot be represented; the table's type \
             is int64 (Arrow: Error while parsing value '…' as type Int64)"
        );
        assert_eq!(scrub("an \"open quote"), "an \"open quote");
    }
}
