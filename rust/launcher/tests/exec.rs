//! `exec`: the boundary, end to end, with the real binary and the real kernel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::*;

const CONFIRM_PREFIX: &str = "saphan-launcher: landlock abi=";

/// The line the launcher must print: the handled ABI is the live one, capped
/// at the highest this build knows; scoping from ABI 6.
fn confirmation(tree: &Tree) -> String {
    let probe: serde_json::Value = serde_json::from_str(&stdout(&run(&["probe"]))).unwrap();
    let live = probe["landlock_abi"].as_u64().unwrap();
    let handled = live.min(probe["highest_known"].as_u64().unwrap());
    let scopes = if handled >= 6 {
        "signal,abstract-unix-socket"
    } else {
        ""
    };
    format!(
        "{CONFIRM_PREFIX}{handled} enforced writable=[{}] scopes=[{scopes}]",
        tree.wd.display()
    )
}

#[test]
fn prints_one_confirmation_line_then_runs_and_reports_the_exit() {
    let tree = Tree::new();
    let out = run(&["exec", "--policy", &tree.policy(), "--", "/bin/true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!(
            "{}\nsaphan-launcher: exited code=0 reaped=0\n",
            confirmation(&tree)
        )
    );
    assert_eq!(stdout(&out), "");
}

#[test]
fn arguments_and_exit_status_pass_through() {
    let tree = Tree::new();
    let out = exec_sh(&tree.policy(), "printf '%s|' \"$0\" \"$1\"; exit 42");
    assert_eq!(code(&out), 42);
    let out = run(&[
        "exec",
        "--policy",
        &tree.policy(),
        "--",
        "/bin/sh",
        "-c",
        "printf '%s|' \"$@\"",
        "sh",
        "a b",
        "--",
        "",
    ]);
    assert_eq!(stdout(&out), "a b|--||");
}

#[test]
fn unknown_policy_key_is_refused_by_name_before_anything_runs() {
    let tree = Tree::new();
    let policy = tree
        .policy()
        .replace("\"readable\"", "\"network\":\"none\",\"readable\"");
    let marker = tree.wd.join("ran");
    let out = exec_sh(&policy, &format!("touch {}", marker.display()));
    assert_eq!(code(&out), 3);
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with("refused [policy-invalid]: unknown field `network`"),
        "{err}"
    );
    assert!(lines[1].starts_with("fix: "), "{err}");
    assert!(!err.contains(CONFIRM_PREFIX));
    assert!(!marker.exists());
}

#[test]
fn invalid_policies_are_refused_with_the_field_named() {
    let tree = Tree::new();
    let wd = tree.wd.to_str().unwrap();
    for (policy, needle) in [
        (
            format!(
                r#"{{"version":2,"workdir":"{wd}","writable":["{wd}"],"readable":"everything"}}"#
            ),
            "field `version`",
        ),
        (
            format!(
                r#"{{"version":1,"workdir":"wd","writable":["{wd}"],"readable":"everything"}}"#
            ),
            "field `workdir`",
        ),
        (
            format!(r#"{{"version":1,"workdir":"{wd}","writable":["{wd}"],"readable":"nothing"}}"#),
            "field `readable`",
        ),
        (
            format!(
                r#"{{"version":1,"workdir":"{wd}","writable":["{wd}","/"],"readable":"everything"}}"#
            ),
            "field `writable[1]`",
        ),
        (
            format!(
                r#"{{"version":1,"workdir":"{wd}","writable":["{wd}"],"readable":"everything","agent_sha256":"XYZ"}}"#
            ),
            "field `agent_sha256`",
        ),
        ("not json".to_owned(), "JSON object"),
    ] {
        let out = run(&["exec", "--policy", &policy, "--", "/bin/true"]);
        assert_eq!(code(&out), 3, "{policy}");
        let err = stderr(&out);
        assert!(err.starts_with("refused [policy-invalid]: "), "{err}");
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

#[test]
fn writes_inside_the_workdir_succeed() {
    let tree = Tree::new();
    let out = exec_sh(
        &tree.policy(),
        "set -e; echo hi > a.txt; mkdir -p d/e; echo x > d/e/f; mv a.txt b.txt; rm d/e/f; \
         : > b.txt; ln -s b.txt l; ln b.txt h; truncate -s 3 h",
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(std::fs::metadata(tree.wd.join("b.txt")).unwrap().len(), 3);
    tree.assert_outside_untouched();
}

#[test]
fn tmpdir_is_set_and_created_inside_the_workdir() {
    let tree = Tree::new();
    let out = exec_sh(
        &tree.policy(),
        "printf '%s' \"$TMPDIR\"; test -d .saphan-run/tmp && f=$(mktemp) && echo ok > \"$f\" && ls \"$TMPDIR\" >&2",
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let expected = tree.wd.join(".saphan-run/tmp");
    assert_eq!(stdout(&out), expected.to_str().unwrap());
    assert!(expected.is_dir());
    assert_eq!(std::fs::read_dir(&expected).unwrap().count(), 1);
}

/// Each attempt runs in its own launch; every one must fail, and afterwards
/// `outside/` must be byte-for-byte what it was.
#[test]
fn escape_attempts_all_fail_and_outside_is_unchanged() {
    let tree = Tree::new();
    let keep = tree.keep();
    let keep_s = keep.to_str().unwrap();
    let out_dir = tree.outside.to_str().unwrap();
    let tmp_victim = std::env::temp_dir().join(format!("saphan-escape-{}", std::process::id()));
    let sibling = tree.base.join("sibling.txt");

    // Planted before the run, as a hostile repository would ship them.
    std::os::unix::fs::symlink(&keep, tree.wd.join("planted-file-link")).unwrap();
    std::os::unix::fs::symlink(&tree.outside, tree.wd.join("planted-dir-link")).unwrap();
    std::fs::write(tree.wd.join("mine.txt"), b"inside\n").unwrap();

    let attempts: Vec<(&str, String)> = vec![
        ("write /tmp", format!("echo pwn > {}", tmp_victim.display())),
        (
            "write a sibling of the workdir",
            format!("echo pwn > {}", sibling.display()),
        ),
        (
            "write into outside/",
            format!("echo pwn > {out_dir}/new.txt"),
        ),
        ("mkdir in outside/", format!("mkdir {out_dir}/d")),
        ("O_TRUNC an outside file", format!(": > {keep_s}")),
        (
            "truncate(2) an outside file",
            format!("truncate -s 0 {keep_s}"),
        ),
        ("append to an outside file", format!("echo pwn >> {keep_s}")),
        (
            "overwrite in place",
            format!("printf X | dd of={keep_s} conv=notrunc status=none"),
        ),
        (
            "rename into outside/",
            format!("mv mine.txt {out_dir}/mine.txt"),
        ),
        ("rename outside file in", format!("mv {keep_s} stolen.txt")),
        ("delete an outside file", format!("rm -f {keep_s}")),
        (
            "write through a planted file symlink",
            "echo pwn > planted-file-link".to_owned(),
        ),
        (
            "append through a planted file symlink",
            "echo pwn >> planted-file-link".to_owned(),
        ),
        (
            "create through a planted dir symlink",
            "echo pwn > planted-dir-link/new.txt".to_owned(),
        ),
        (
            "symlink made inside, pointing outside",
            format!("ln -s {keep_s} made-link && echo pwn > made-link"),
        ),
        (
            "hard link of an outside file",
            format!("ln {keep_s} hard-link"),
        ),
        (
            "hard link then write",
            format!("ln {keep_s} hard-link2 && echo pwn >> hard-link2"),
        ),
        (
            "via /proc/self/root",
            format!("echo pwn > /proc/self/root{keep_s}"),
        ),
        (
            "TMPDIR cannot point out",
            format!("TMPDIR={out_dir} mktemp"),
        ),
    ];

    for (what, script) in &attempts {
        // A subshell, so a failed redirection on a special builtin ends only
        // the attempt; stderr goes to a file inside the workdir (/dev/null is
        // not granted here, and a failed `2>/dev/null` would skip the attempt).
        let out = exec_sh(
            &tree.policy(),
            &format!("( {script} ) 2>>attempts.log || exit 99; exit 0"),
        );
        assert_eq!(
            code(&out),
            99,
            "{what}: `{script}` was not refused\nstderr: {}\nlog: {}",
            stderr(&out),
            std::fs::read_to_string(tree.wd.join("attempts.log")).unwrap_or_default()
        );
        tree.assert_outside_untouched();
    }
    assert!(!tmp_victim.exists(), "/tmp write escaped");
    assert!(!sibling.exists(), "sibling write escaped");
    assert!(tree.wd.join("mine.txt").exists());
    assert!(!tree.wd.join("stolen.txt").exists());
    assert!(!tree.wd.join("hard-link").exists());
    // Every attempt reached the kernel and was denied (none was skipped).
    let log = std::fs::read_to_string(tree.wd.join("attempts.log")).unwrap();
    assert!(log.lines().count() >= attempts.len(), "{log}");
    assert!(!log.contains("not found"), "{log}");
}

#[test]
fn a_vanished_workdir_is_a_loud_failure_and_is_not_recreated() {
    let tree = Tree::new();
    // The writable grant is the parent; the workdir below it is gone.
    let gone = tree.wd.join("gone");
    let policy = policy_json(&gone, &[&tree.wd], None);
    let out = exec_sh(&policy, "echo ran");
    assert_eq!(code(&out), 3);
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(lines[0].starts_with(CONFIRM_PREFIX), "{err}");
    assert!(
        lines[1].starts_with(&format!(
            "refused [workdir-missing]: the working directory {}",
            gone.display()
        )),
        "{err}"
    );
    assert!(lines[2].starts_with("fix: "));
    assert_eq!(stdout(&out), "");
    assert!(!gone.exists(), "the workdir was recreated");
    assert!(
        !tree.wd.join(".saphan-run").exists(),
        "scratch created in the wrong place"
    );

    // The workdir itself is the (missing) grant: refused before applying.
    let policy = policy_json(&gone, &[&gone], None);
    let out = exec_sh(&policy, "echo ran");
    assert_eq!(code(&out), 3);
    assert!(
        stderr(&out).starts_with("refused [workdir-missing]: "),
        "{}",
        stderr(&out)
    );
    assert!(!gone.exists());
}

#[test]
fn a_missing_extra_grant_is_refused() {
    let tree = Tree::new();
    let missing = tree.base.join("session-leaf");
    let policy = policy_json(&tree.wd, &[&tree.wd, &missing], None);
    let out = run(&["exec", "--policy", &policy, "--", "/bin/true"]);
    assert_eq!(code(&out), 3);
    assert_eq!(
        stderr(&out).lines().next().unwrap(),
        format!(
            "refused [policy-invalid]: the writable directory {0} cannot be granted: {0} does \
             not exist",
            missing.display()
        )
    );
}

#[test]
fn a_symlinked_grant_is_refused() {
    let tree = Tree::new();
    let link = tree.base.join("wd-link");
    std::os::unix::fs::symlink(&tree.wd, &link).unwrap();
    let policy = policy_json(&tree.wd, &[&tree.wd, &link], None);
    let out = run(&["exec", "--policy", &policy, "--", "/bin/true"]);
    assert_eq!(code(&out), 3);
    assert_eq!(
        stderr(&out).lines().next().unwrap(),
        format!(
            "refused [workdir-unsafe]: the writable directory {0} cannot be granted: {0} is a \
             symbolic link (-> {1}); a grant follows no symbolic link anywhere on its path",
            link.display(),
            tree.wd.display()
        )
    );
}

#[test]
fn a_device_file_can_be_granted() {
    let tree = Tree::new();
    let policy = policy_json(&tree.wd, &[&tree.wd, Path::new("/dev/null")], None);
    let out = exec_sh(&policy, "echo x > /dev/null");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = exec_sh(&tree.policy(), "(echo x > /dev/null) 2>>log || exit 99");
    assert_eq!(code(&out), 99, "/dev/null is not writable unless granted");
}

fn sha256_of(path: &str) -> String {
    let out = run(&["sha256", path]);
    stdout(&out).trim().to_owned()
}

#[test]
fn digest_mismatch_is_refused_with_both_digests() {
    let tree = Tree::new();
    let pinned = "0".repeat(64);
    let policy = policy_json(&tree.wd, &[&tree.wd], Some(&pinned));
    let out = run(&["exec", "--policy", &policy, "--", "/bin/true"]);
    assert_eq!(code(&out), 3);
    let err = stderr(&out);
    let actual = sha256_of("/bin/true");
    assert!(err.contains("refused [digest-mismatch]: "), "{err}");
    assert!(err.contains(&pinned), "{err}");
    assert!(err.contains(&actual), "{err}");
}

#[test]
fn digest_match_runs_the_agent() {
    let tree = Tree::new();
    let actual = sha256_of("/bin/true");
    let policy = policy_json(&tree.wd, &[&tree.wd], Some(&actual));
    let out = run(&["exec", "--policy", &policy, "--", "/bin/true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn a_pinned_digest_requires_an_absolute_command() {
    let tree = Tree::new();
    let actual = sha256_of("/bin/true");
    let policy = policy_json(&tree.wd, &[&tree.wd], Some(&actual));
    let out = run(&["exec", "--policy", &policy, "--", "true"]);
    assert_eq!(code(&out), 3);
    assert!(
        stderr(&out).starts_with("refused [policy-invalid]: the policy pins agent_sha256"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_command_that_cannot_be_executed_exits_127() {
    let tree = Tree::new();
    let missing = tree.wd.join("no-such-agent");
    let out = run(&[
        "exec",
        "--policy",
        &tree.policy(),
        "--",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 127);
    let err = stderr(&out);
    assert!(err.contains("cannot execute"), "{err}");
    // Without a slash, the command is looked up on PATH.
    let out = run(&["exec", "--policy", &tree.policy(), "--", "true"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}
