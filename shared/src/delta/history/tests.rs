//! The fold on hand-made chains.

use super::fold::{Fold, Step, Version};

/// Two columns: 0 tracked, 1 untracked; rows hold (tracked, untracked) values.
fn fold_with(values: &[(i32, i32)], flag: bool) -> impl Fn(Vec<Step>) -> Vec<Version> + '_ {
    move |steps| {
        let same = |c: usize, a: Option<usize>, b: usize| match a {
            Some(a) => {
                let (x, y) = (values[a], values[b]);
                if c == 0 {
                    x.0 == y.0
                } else {
                    x.1 == y.1
                }
            }
            None => false,
        };
        let f = Fold {
            tracked: vec![true, false],
            flag_deletes: flag,
            same: &same,
        };
        f.run(None, &steps)
    }
}

fn step(seq: &str, row: usize, delete: bool) -> Step {
    Step {
        seq: seq.into(),
        start: Some(seq.into()),
        delete,
        row,
        absent: vec![],
    }
}

/// (first order key, closing order key, deleted flag, value rows) of each version.
type Link = (String, Option<String>, bool, Vec<Option<usize>>);

fn chain(vs: &[Version]) -> Vec<Link> {
    vs.iter()
        .map(|v| {
            (
                v.seq.clone(),
                v.end_seq.clone(),
                v.deleted,
                v.values.clone(),
            )
        })
        .collect()
}

#[test]
fn untracked_changes_update_in_place_and_tracked_ones_open_versions() {
    let rows = [(1, 10), (1, 11), (2, 11), (2, 12)];
    let run = fold_with(&rows, false);
    let out = run(vec![
        step("a", 0, false),
        step("b", 1, false),
        step("c", 2, false),
        step("d", 3, false),
    ]);
    assert_eq!(
        chain(&out),
        vec![
            ("a".into(), Some("c".into()), false, vec![Some(1), Some(1)]),
            ("c".into(), None, false, vec![Some(3), Some(3)]),
        ]
    );
    assert_eq!(out[0].last_seq, "b");
    assert_eq!(out[0].end.as_deref(), Some("c"));
}

#[test]
fn order_and_duplicates_do_not_matter() {
    let rows = [(1, 10), (2, 10), (1, 10), (3, 10)];
    let run = fold_with(&rows, false);
    let a = run(vec![
        step("a", 0, false),
        step("b", 1, false),
        step("c", 2, false),
        step("d", 3, true),
    ]);
    let b = run(vec![
        step("d", 3, true),
        step("b", 1, false),
        step("a", 0, false),
        step("c", 2, false),
        step("b", 1, false),
    ]);
    assert_eq!(a, b);
    assert_eq!(a.len(), 3, "a, b, c: c closed by the delete");
    assert_eq!(a[2].end_seq.as_deref(), Some("d"));
}

#[test]
fn a_late_change_splits_a_run() {
    // x=1 at a, (untracked change at c), x=1 ... a late x=2 at b splits [a, c] into a | b | c
    let rows = [(1, 10), (2, 20), (1, 30)];
    let run = fold_with(&rows, false);
    let out = run(vec![
        step("a", 0, false),
        step("c", 2, false),
        step("b", 1, false),
    ]);
    assert_eq!(
        chain(&out).iter().map(|v| v.0.as_str()).collect::<Vec<_>>(),
        vec!["a", "b", "c"]
    );
}

#[test]
fn deletes_close_or_flag_and_reinserts_start_empty() {
    let rows = [(1, 10), (1, 10), (1, 11)];
    let close = fold_with(&rows, false)(vec![
        step("a", 0, false),
        step("b", 1, true),
        step("c", 2, false),
    ]);
    assert_eq!(
        chain(&close),
        vec![
            ("a".into(), Some("b".into()), false, vec![Some(0), Some(0)]),
            ("c".into(), None, false, vec![Some(2), Some(2)]),
        ]
    );
    let flag = fold_with(&rows, true)(vec![
        step("a", 0, false),
        step("b", 1, true),
        step("c", 2, false),
    ]);
    assert_eq!(
        chain(&flag)
            .iter()
            .map(|v| (v.0.as_str(), v.2))
            .collect::<Vec<_>>(),
        vec![("a", false), ("b", true), ("c", false)]
    );
    // a change without a column after a delete starts empty there
    let mut absent = step("c", 2, false);
    absent.absent = vec![1];
    let out = fold_with(&rows, false)(vec![step("a", 0, false), step("b", 1, true), absent]);
    assert_eq!(out[1].values, vec![Some(2), None]);
}

#[test]
fn a_version_never_starts_before_the_one_it_follows() {
    let rows = [(1, 10), (2, 10)];
    let mut load = step("0 LOAD", 0, false);
    load.start = Some("2022-10-25 21:00:03".into());
    let mut cached = step("1 x", 1, false);
    cached.start = Some("2022-10-25 20:59:00".into());
    let out = fold_with(&rows, false)(vec![load, cached]);
    assert_eq!(out[0].start, out[0].end, "the load's version is empty");
    assert_eq!(out[1].start.as_deref(), Some("2022-10-25 21:00:03"));
}

#[test]
fn a_delete_before_any_version_is_remembered_as_an_empty_version() {
    let rows = [(1, 10), (1, 10)];
    let out = fold_with(&rows, false)(vec![step("d", 1, true)]);
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].start.as_deref(), out[0].end.as_deref()),
        (Some("d"), Some("d"))
    );
    assert_eq!(out[0].newest_seq(), "d");
    // with the insert, the chain is the usual one
    let out = fold_with(&rows, false)(vec![step("d", 1, true), step("a", 0, false)]);
    assert_eq!(
        chain(&out),
        vec![("a".into(), Some("d".into()), false, vec![Some(0), Some(0)])]
    );
}
