//! `probe`, `--version`, `sha256`, `custody` and usage errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::*;

#[test]
fn version_line() {
    let out = run(&["--version"]);
    assert_eq!(code(&out), 0);
    assert_eq!(stdout(&out), "saphan-launcher 0.1.0\n");
}

#[test]
fn probe_prints_exactly_one_json_line_of_the_documented_shape() {
    let out = run(&["probe"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.ends_with('\n'));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let obj = v.as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "floor",
            "highest_known",
            "kernel_release",
            "landlock_abi",
            "landlock_reason",
            "launcher_sha256",
            "launcher_version",
        ]
    );
    // The documented key order.
    assert!(text.starts_with("{\"landlock_abi\":"), "{text}");
    assert_eq!(v["floor"], 3);
    assert_eq!(v["highest_known"], 7);
    assert_eq!(v["launcher_version"], "0.1.0");
    // This machine's kernel has Landlock.
    assert!(v["landlock_abi"].as_u64().unwrap() >= 3);
    assert_eq!(v["landlock_reason"], "supported");
    let uname = Command::new("uname").arg("-r").output().unwrap();
    assert_eq!(
        v["kernel_release"],
        String::from_utf8_lossy(&uname.stdout).trim()
    );
    // The digest is of the very binary that ran, as the platform's own
    // utility computes it.
    let sum = Command::new("sha256sum").arg(LAUNCHER).output().unwrap();
    let expected = String::from_utf8_lossy(&sum.stdout);
    assert_eq!(
        v["launcher_sha256"],
        expected.split_whitespace().next().unwrap()
    );
}

#[test]
fn sha256_verb_matches_sha256sum() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f");
    std::fs::write(&f, b"abc").unwrap();
    let out = run(&["sha256", f.to_str().unwrap()]);
    assert_eq!(code(&out), 0);
    assert_eq!(
        stdout(&out),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n"
    );
    let out = run(&["sha256", dir.path().join("missing").to_str().unwrap()]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("No such file"), "{}", stderr(&out));
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &[][..],
        &["frobnicate"],
        &["probe", "extra"],
        &["exec", "--policy", "{}"],
        &["exec", "--", "/bin/true"],
    ] {
        let out = run(args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("usage: saphan-launcher"));
    }
}

#[test]
fn custody_passes_for_the_built_binary() {
    let out = run(&["custody"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["custody"], "pass");
    assert_eq!(
        v["path"],
        std::fs::canonicalize(LAUNCHER).unwrap().to_str().unwrap()
    );
    assert_eq!(v["clause"], serde_json::Value::Null);
}

/// A copy of the launcher at `mode` inside a directory at `dir_mode`.
fn copy_at(dir_mode: u32, mode: u32) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("saphan-launcher");
    std::fs::copy(LAUNCHER, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(mode)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(dir_mode)).unwrap();
    (dir, bin)
}

#[test]
fn group_writable_binary_is_refused_at_entry_for_every_verb() {
    let (_dir, bin) = copy_at(0o755, 0o775);
    for args in [
        &["--version"][..],
        &["probe"],
        &["exec", "--policy", "{}", "--", "/bin/true"],
        &["bogus"],
    ] {
        let out = run_bin(&bin, args);
        assert_eq!(code(&out), 3, "{args:?}");
        assert_eq!(stdout(&out), "", "{args:?} printed on stdout");
        let err = stderr(&out);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 3, "{err}");
        assert!(
            lines[0].starts_with("refused [custody-binary-unsafe]: clause 2: "),
            "{err}"
        );
        assert!(lines[0].contains("mode 0775"), "{err}");
        assert!(lines[1].starts_with("fix: chmod go-w "), "{err}");
        assert!(
            lines[2].starts_with("not asserted: which identity is the agent"),
            "{err}"
        );
        assert!(lines[2].contains("ancestors above the immediate parent"));
        assert!(lines[2].contains("ACLs and extended attributes"));
    }
}

#[test]
fn custody_verb_reports_the_failed_clause_as_json() {
    let (_dir, bin) = copy_at(0o777, 0o755);
    let out = run_bin(&bin, &["custody"]);
    assert_eq!(code(&out), 3);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["custody"], "refused");
    assert_eq!(v["clause"], 4);
    assert_eq!(v["parent_mode"], 0o777);
    assert!(stderr(&out).starts_with("refused [custody-binary-unsafe]: clause 4: "));
}
