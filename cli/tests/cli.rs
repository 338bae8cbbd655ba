//! The `tributary` command as a user runs it.

use std::path::Path;
use std::process::{Command, Stdio};

fn tributary(args: &[&str], dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tributary"));
    c.args(args).current_dir(dir);
    c
}

/// Merge the demo's raw files one per commit.
const MERGE_ONE_BY_ONE: [&str; 6] = [
    "merge",
    "--config",
    "d/tributary.toml",
    "--batch",
    "1",
    "d/raw/",
];

/// A folder with the demo's files and table under `d/` (40 rows, 5 new).
fn demo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let demo = tributary(
        &["demo", "--dir", "d", "--rows", "40", "--new-rows", "5"],
        dir.path(),
    )
    .stdout(Stdio::null())
    .status()
    .unwrap();
    assert!(demo.success());
    dir
}

/// `tributary merge … | head` closes stdout early: the command must keep merging every
/// batch and exit 0 (before: a panic on the broken pipe, exit 101, remaining batches
/// skipped).
#[test]
fn a_closed_stdout_does_not_stop_the_work() {
    let dir = demo();
    std::fs::remove_dir_all(dir.path().join("d/curated")).unwrap();
    let mut child = tributary(&MERGE_ONE_BY_ONE, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader goes away before the first line
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every file was applied: merging them again changes nothing.
    let again = tributary(
        &["merge", "--config", "d/tributary.toml", "d/raw/"],
        dir.path(),
    )
    .output()
    .unwrap();
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(again.status.success(), "{text}");
    assert!(text.contains("inserted=0 updated=0 deleted=0"), "{text}");
    assert!(!text.contains("inserted=1"), "{text}");
    assert!(text.contains(" 0 failed"), "{text}");
}

/// Long runs show progress on a terminal (a pseudo-terminal made by util-linux `script`)
/// and nothing extra when stderr is piped.
#[test]
fn progress_appears_on_a_terminal_and_not_in_a_pipe() {
    let dir = demo();
    let args = MERGE_ONE_BY_ONE;
    let command = std::iter::once(env!("CARGO_BIN_EXE_tributary"))
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ");
    let tty = Command::new("script")
        .args(["-qefc", &command, "/dev/null"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("util-linux `script` (Debian: bsdutils) runs the command on a pseudo-terminal");
    let shown = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.status.success(), "{shown}");
    assert!(
        shown.contains("\r\x1b[2K1/5 files (20%)") && shown.contains("files/s, ETA"),
        "{shown:?}"
    );
    let piped = tributary(&args, dir.path()).output().unwrap();
    assert!(piped.status.success());
    let err = String::from_utf8_lossy(&piped.stderr);
    assert!(!err.contains("files/s") && !err.contains('\r'), "{err:?}");
    let out = String::from_utf8_lossy(&piped.stdout);
    assert!(!out.contains("files/s") && !out.contains('\r'), "{out:?}");
    assert!(out.contains("5 merged, 0 ignored, 0 failed"), "{out}");
}

/// A tuning variable whose value it does not take fails the command, naming it, before
/// anything is merged (before: `TRIBUTARY_LOG_CACHE_MB=64MB` meant the default, silently).
#[test]
fn an_unparsable_tuning_variable_fails_the_command_by_name() {
    let dir = demo();
    std::fs::remove_dir_all(dir.path().join("d/curated")).unwrap();
    for (name, value) in [
        ("TRIBUTARY_LOG_CACHE_MB", "64MB"),
        ("TRIBUTARY_SPILL_MB", "-1"),
    ] {
        let out = tributary(&MERGE_ONE_BY_ONE, dir.path())
            .env(name, value)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}={value}: exit 0");
        assert!(
            err.contains(&format!("{name}={value} is not")),
            "{name}={value}: {err}"
        );
        assert!(
            !dir.path().join("d/curated").exists(),
            "a table was written"
        );
    }
}

/// `TRIBUTARY_LOG_VALUES=false` (#44): a failed file's error leaves the value out and still
/// names the file, row and column; without it the value is named.
#[test]
fn row_values_are_left_out_of_errors_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("raw/s/t")).unwrap();
    std::fs::write(
        d.join("t.toml"),
        "[[table]]\nname = \"t\"\nsource = \"raw/s/t/\"\ntarget = \"curated/t\"\nprimary_key = [\"id\"]\nformat = \"csv\"\n[table.csv]\ncolumns = [{ name = \"id\", type = \"int64\" }, { name = \"amount\", type = \"int64\" }]\n",
    )
    .unwrap();
    let file = "raw/s/t/20240101-120000000.csv";
    std::fs::write(d.join(file), "I,1,10\nI,2,secret-4711\n").unwrap();
    for (setting, shown) in [("true", true), ("false", false)] {
        let out = tributary(&["merge", "--config", "t.toml", file], d)
            .env("TRIBUTARY_LOG_VALUES", setting)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{text}");
        assert_eq!(text.contains("secret-4711"), shown, "{setting}: {text}");
        assert!(text.contains("20240101-120000000.csv"), "{text}");
        assert!(
            text.contains("amount") || text.contains("column 3"),
            "{text}"
        );
    }
}
