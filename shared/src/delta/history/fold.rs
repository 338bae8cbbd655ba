//! The versions of one key, folded from its changes in order-key order.
//!
//! A version is a maximal run of changes whose tracked columns are equal; a delete ends it.
//! Its untracked columns are those of the run's last change; a change without a column (a
//! file that lacks it) leaves that column as it was, and a row inserted after a delete starts
//! empty. The fold works on row positions of one batch (all candidate rows of a call), so
//! that values are compared and copied without being decoded.

use std::cmp::Ordering;

/// One change of a key.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    /// Order key.
    pub(crate) seq: String,
    /// Normalised sequence value (when the change happened); `None` when unknown.
    pub(crate) start: Option<String>,
    pub(crate) delete: bool,
    /// Its row in the candidate batch.
    pub(crate) row: usize,
    /// Columns (by position) the change does not carry.
    pub(crate) absent: Vec<usize>,
}

/// A version of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Version {
    /// Order key of the change that opened it (the version's identity).
    pub(crate) seq: String,
    /// Order key of the last change it absorbed.
    pub(crate) last_seq: String,
    pub(crate) start: Option<String>,
    pub(crate) end: Option<String>,
    /// Order key of the change that closed it.
    pub(crate) end_seq: Option<String>,
    /// A version recording a delete (`deletes = "flag"`).
    pub(crate) deleted: bool,
    /// Per column: the row its value comes from (`None`: null).
    pub(crate) values: Vec<Option<usize>>,
}

impl Version {
    /// The newest change this version has seen (a change at or below it is known or late).
    pub(crate) fn newest_seq(&self) -> &str {
        match &self.end_seq {
            Some(e) if e.as_str() > self.last_seq.as_str() => e,
            _ => &self.last_seq,
        }
    }
}

/// What the fold needs to know about the columns.
pub(crate) struct Fold<'a> {
    /// Per column: whether a change of it opens a new version.
    pub(crate) tracked: Vec<bool>,
    /// Whether a delete opens a flagged version.
    pub(crate) flag_deletes: bool,
    /// Whether column `c` has equal values in row `a` (`None`: a null) and row `b`.
    pub(crate) same: &'a dyn Fn(usize, Option<usize>, usize) -> bool,
}

impl Fold<'_> {
    /// Fold `steps` (any order; duplicates allowed) onto `current` (the key's open version,
    /// if the fold continues an existing chain). Returns every version it touched or opened,
    /// in order.
    pub(crate) fn run(&self, current: Option<Version>, steps: &[Step]) -> Vec<Version> {
        let mut steps: Vec<&Step> = steps.iter().collect();
        steps.sort_by(|a, b| a.seq.cmp(&b.seq));
        steps.dedup_by(|a, b| a.seq == b.seq);
        let mut out = Vec::new();
        let mut cur = current;
        for s in steps {
            cur = if s.delete {
                self.delete(cur, s, &mut out)
            } else {
                Some(self.upsert(cur, s, &mut out))
            };
        }
        out.extend(cur);
        out
    }

    fn delete(&self, cur: Option<Version>, s: &Step, out: &mut Vec<Version>) -> Option<Version> {
        let Some(mut v) = cur else {
            // A delete of a key without a version (its insert is late, or predates the
            // history): an empty version [d, d) with the deleted row's image, so that the
            // key's history remembers the delete (a later, older insert is then known to be
            // late) and "as of" never shows it.
            let empty = vec![None; self.tracked.len()];
            let marker = Version {
                seq: s.seq.clone(),
                last_seq: s.seq.clone(),
                start: s.start.clone(),
                end: if self.flag_deletes {
                    None
                } else {
                    s.start.clone()
                },
                end_seq: (!self.flag_deletes).then(|| s.seq.clone()),
                deleted: self.flag_deletes,
                values: overlay(&empty, s),
            };
            if self.flag_deletes {
                return Some(marker);
            }
            out.push(marker);
            return None;
        };
        if v.deleted {
            v.last_seq = s.seq.clone();
            return Some(v);
        }
        let start = later(s.start.clone(), v.start.clone());
        let before = overlay(&v.values, s);
        v.end = start.clone();
        v.end_seq = Some(s.seq.clone());
        out.push(v);
        self.flag_deletes.then(|| Version {
            seq: s.seq.clone(),
            last_seq: s.seq.clone(),
            start,
            end: None,
            end_seq: None,
            deleted: true,
            values: before,
        })
    }

    fn upsert(&self, cur: Option<Version>, s: &Step, out: &mut Vec<Version>) -> Version {
        match cur {
            Some(mut v) if !v.deleted && self.tracked_unchanged(&v, s) => {
                v.values = overlay(&v.values, s);
                v.last_seq = s.seq.clone();
                v
            }
            cur => {
                let (base, prev_start) = match &cur {
                    Some(v) if !v.deleted => (v.values.clone(), v.start.clone()),
                    Some(v) => (vec![None; v.values.len()], v.start.clone()),
                    None => (vec![None; self.tracked.len()], None),
                };
                let start = later(s.start.clone(), prev_start);
                if let Some(mut v) = cur {
                    v.end = start.clone();
                    v.end_seq = Some(s.seq.clone());
                    out.push(v);
                }
                Version {
                    seq: s.seq.clone(),
                    last_seq: s.seq.clone(),
                    start,
                    end: None,
                    end_seq: None,
                    deleted: false,
                    values: overlay(&base, s),
                }
            }
        }
    }

    fn tracked_unchanged(&self, v: &Version, s: &Step) -> bool {
        self.tracked.iter().enumerate().all(|(c, tracked)| {
            !tracked || s.absent.contains(&c) || (self.same)(c, v.values[c], s.row)
        })
    }
}

/// A version never starts before the one it follows (a full load's transfer time can be
/// later than the changes cached during it).
fn later(start: Option<String>, previous: Option<String>) -> Option<String> {
    match (start, previous) {
        (Some(s), Some(p)) => Some(if s.cmp(&p) == Ordering::Less { p } else { s }),
        (s, p) => s.or(p),
    }
}

fn overlay(values: &[Option<usize>], s: &Step) -> Vec<Option<usize>> {
    values
        .iter()
        .enumerate()
        .map(|(c, v)| {
            if s.absent.contains(&c) {
                *v
            } else {
                Some(s.row)
            }
        })
        .collect()
}
