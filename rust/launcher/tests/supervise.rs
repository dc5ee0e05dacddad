//! `exec` and `reap` as supervisors: the status descriptor, signal
//! forwarding, exit codes, killing what the command leaves behind, and the
//! scratch directory created without following links. The real binary, the
//! real kernel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_status_descriptor_holds_only_the_launchers_lines() {
    let tree = Tree::new();
    let status = tree.base.join("status");
    let script = "echo 'saphan-launcher: landlock abi=99 enforced writable=[/] scopes=[]'; \
                  echo 'saphan-launcher: exited code=0 reaped=0' >&2; \
                  (echo 'saphan-launcher: forged' >&5) 2>/dev/null && echo WROTE5; \
                  test -e /proc/self/fd/5 && echo HAS5; exit 4";
    let policy = policy_json(&tree.wd, &[&tree.wd, Path::new("/dev/null")], None);
    let out = run_with_status(
        &status,
        &[
            "exec",
            "--status-fd",
            "5",
            "--policy",
            &policy,
            "--",
            "/bin/sh",
            "-c",
            script,
        ],
    );
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let got = lines_of(&status);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got[0].starts_with("saphan-launcher: landlock abi="),
        "{got:?}"
    );
    assert!(!got[0].contains("abi=99"));
    assert_eq!(got[1], "saphan-launcher: exited code=4 reaped=0");
    let out_text = stdout(&out);
    assert!(
        !out_text.contains("WROTE5") && !out_text.contains("HAS5"),
        "{out_text}"
    );
    // stderr keeps the lines for humans (and whatever the command printed).
    let err = stderr(&out);
    assert!(err.lines().any(|l| l == got[0]), "{err}");
    assert!(
        err.ends_with("saphan-launcher: exited code=4 reaped=0\n"),
        "{err}"
    );
}

#[test]
fn reap_has_no_domain_and_only_the_exited_line() {
    let tree = Tree::new();
    let status = tree.base.join("status");
    let outside = tree.outside.join("written-by-reap");
    let script = format!("echo x > {}; exit 0", outside.display());
    let out = run_with_status(
        &status,
        &["reap", "--status-fd=5", "--", "/bin/sh", "-c", &script],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        lines_of(&status),
        ["saphan-launcher: exited code=0 reaped=0"]
    );
    assert!(outside.exists(), "reap confines nothing");
}

#[test]
fn exit_status_and_signals_pass_through() {
    let tree = Tree::new();
    let status = tree.base.join("status");
    for (script, expected) in [
        ("exit 0", 0),
        ("exit 42", 42),
        ("kill -TERM $$", 143),
        ("kill -KILL $$", 137),
    ] {
        let out = run_with_status(
            &status,
            &["reap", "--status-fd", "5", "--", "/bin/sh", "-c", script],
        );
        assert_eq!(code(&out), expected, "{script}: {}", stderr(&out));
        assert_eq!(
            lines_of(&status),
            [format!("saphan-launcher: exited code={expected} reaped=0")],
            "{script}"
        );
    }
}

#[test]
fn the_command_starts_with_an_empty_signal_mask() {
    let out = run(&[
        "reap",
        "--",
        "/bin/sh",
        "-c",
        "exec grep -E '^Sig(Blk|Ign)' /proc/self/status",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains("SigBlk:\t0000000000000000"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn sigterm_to_the_launcher_is_forwarded_to_the_command() {
    let tree = Tree::new();
    let ready = tree.base.join("ready");
    let script = format!(
        "trap 'echo got-term; exit 9' TERM; touch {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let child = Command::new(LAUNCHER)
        .args(["reap", "--", "/bin/sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !ready.exists() {
        assert!(start.elapsed() < Duration::from_secs(10), "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 9, "{}", stderr(&out));
    assert!(stdout(&out).contains("got-term"));
    // The loop's last `sleep` was the shell's child and was left behind.
    assert!(
        stderr(&out).starts_with("saphan-launcher: exited code=9 reaped="),
        "{}",
        stderr(&out)
    );
}

/// A daemon that would write `marker` after `secs` seconds.
fn daemon(marker: &Path, secs: u32) -> String {
    format!(
        "setsid sh -c 'sleep {secs}; echo late > {}' </dev/null >/dev/null 2>&1 & \
         sleep 0.3; exit 5",
        marker.display()
    )
}

fn reaped(line: &str) -> usize {
    line.rsplit_once("reaped=").unwrap().1.parse().unwrap()
}

#[test]
fn what_the_command_leaves_behind_is_killed() {
    let tree = Tree::new();
    let status = tree.base.join("status");
    let policy = policy_json(&tree.wd, &[&tree.wd, Path::new("/dev/null")], None);
    for verb in ["reap", "exec"] {
        let marker = tree.wd.join(format!("late-{verb}"));
        let script = daemon(&marker, 2);
        let mut args = vec![verb, "--status-fd", "5"];
        if verb == "exec" {
            args.extend(["--policy", &policy]);
        }
        args.extend(["--", "/bin/sh", "-c", &script]);
        let started = Instant::now();
        let out = run_with_status(&status, &args);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{verb} waited for the daemon"
        );
        assert_eq!(code(&out), 5, "{verb}: {}", stderr(&out));
        let got = lines_of(&status);
        let last = got.last().unwrap();
        assert!(
            last.starts_with("saphan-launcher: exited code=5 reaped="),
            "{got:?}"
        );
        assert!(reaped(last) >= 1, "{verb}: {got:?}");
        std::thread::sleep(Duration::from_secs(3));
        assert!(!marker.exists(), "{verb}: the daemon outlived the run");
    }
}

#[test]
fn a_deep_chain_of_orphans_is_killed_round_by_round() {
    let tree = Tree::new();
    let marker = tree.wd.join("late");
    // Each level forks the next in the background and exits at once: the
    // leaf is reparented several times before it sleeps.
    let leaf = format!("sleep 2; echo late > {}", marker.display());
    let mut script = leaf;
    for _ in 0..5 {
        script = format!("sh -c '{}' & exit 0", script.replace('\'', "'\\''"));
    }
    let script = format!("{script}\n");
    let out = run(&[
        "reap",
        "--",
        "/bin/sh",
        "-c",
        &format!("{script}; sleep 0.5"),
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    let line = err.lines().last().unwrap();
    assert!(reaped(line) >= 1, "{err}");
    std::thread::sleep(Duration::from_secs(3));
    assert!(!marker.exists(), "a descendant outlived the run");
}

#[test]
fn a_planted_scratch_link_is_refused_as_workdir_unsafe() {
    for planted in [".saphan-run", ".saphan-run/tmp"] {
        let tree = Tree::new();
        let status = tree.base.join("status");
        if planted.contains('/') {
            std::fs::create_dir(tree.wd.join(".saphan-run")).unwrap();
        }
        std::os::unix::fs::symlink(&tree.outside, tree.wd.join(planted)).unwrap();
        let marker = tree.wd.join("ran");
        let script = format!("touch {}", marker.display());
        let out = run_with_status(
            &status,
            &[
                "exec",
                "--policy",
                &tree.policy(),
                "--status-fd",
                "5",
                "--",
                "/bin/sh",
                "-c",
                &script,
            ],
        );
        assert_eq!(code(&out), 3, "{planted}: {}", stderr(&out));
        let got = lines_of(&status);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            got[1],
            format!(
                "saphan-launcher: refused [workdir-unsafe] the working directory {wd} is not \
                 safe to run in: {wd}/{planted} is a symbolic link (-> {}); the scratch \
                 directory .saphan-run/tmp is created without following links",
                tree.outside.display(),
                wd = tree.wd.display()
            )
        );
        let err = stderr(&out);
        assert!(err.contains("refused [workdir-unsafe]: "), "{err}");
        assert!(err.contains("\nfix: remove "), "{err}");
        assert!(!marker.exists());
        tree.assert_outside_untouched();
    }
    // A file where the directory goes.
    let tree = Tree::new();
    std::fs::write(tree.wd.join(".saphan-run"), b"").unwrap();
    let out = exec_sh(&tree.policy(), "true");
    assert_eq!(code(&out), 3);
    assert!(
        stderr(&out).contains(&format!(
            "{}/.saphan-run is not a directory",
            tree.wd.display()
        )),
        "{}",
        stderr(&out)
    );
}

#[test]
fn refusals_reach_the_status_descriptor_as_one_line() {
    let tree = Tree::new();
    let status = tree.base.join("status");
    let policy = tree
        .policy()
        .replace("\"readable\"", "\"network\":\"none\",\"readable\"");
    let out = run_with_status(
        &status,
        &[
            "exec",
            "--status-fd",
            "5",
            "--policy",
            &policy,
            "--",
            "/bin/true",
        ],
    );
    assert_eq!(code(&out), 3);
    let got = lines_of(&status);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("saphan-launcher: refused [policy-invalid] unknown field `network`"),
        "{got:?}"
    );
}

#[test]
fn a_status_fd_that_was_not_inherited_is_a_usage_error() {
    for args in [
        &["reap", "--status-fd", "57", "--", "/bin/true"][..],
        &[
            "exec",
            "--status-fd",
            "57",
            "--policy",
            "{}",
            "--",
            "/bin/true",
        ],
    ] {
        let out = run(args);
        assert_eq!(code(&out), 2, "{args:?}");
        assert!(
            stderr(&out).contains("--status-fd 57 is not a descriptor this launcher inherited"),
            "{}",
            stderr(&out)
        );
    }
}

/// `exec` applies the boundary: its own custody is its run condition. (`reap`
/// leaves custody to the engine, which measures it outside the jail's user
/// namespace — saphan.confine.compose — so it is not refused here.)
#[test]
fn a_custody_refusal_reaches_the_status_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("saphan-launcher");
    std::fs::copy(LAUNCHER, &bin).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o775)).unwrap();
    let status = dir.path().join("status");
    let mut out = None;
    for _ in 0..50 {
        let o = Command::new("/bin/sh")
            .args([
                "-c",
                "s=$1; shift; exec \"$@\" 5>\"$s\"",
                "sh",
                status.to_str().unwrap(),
                bin.to_str().unwrap(),
                "exec",
                "--status-fd",
                "5",
                "--policy",
                "{}",
                "--",
                "/bin/true",
            ])
            .output()
            .unwrap();
        // A copy another test's fork still holds open for writing: retry.
        if !stderr(&o).contains("Text file busy") {
            out = Some(o);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = out.expect("the copy stayed busy");
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    let got = lines_of(&status);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("saphan-launcher: refused [custody-binary-unsafe] clause 2: "),
        "{got:?}"
    );
}

/// At ABI >= 6 the command runs one Landlock domain below the launcher: it
/// cannot signal (stop, kill) its supervisor, and the supervisor still
/// kills what it leaves behind (`what_the_command_leaves_behind_is_killed`).
#[test]
fn the_command_cannot_signal_its_supervisor() {
    let probe: serde_json::Value = serde_json::from_str(&stdout(&run(&["probe"]))).unwrap();
    let tree = Tree::new();
    let script = "if kill -0 $PPID 2>>err.log; then echo REACHED; else echo BLOCKED; fi; \
                  kill -STOP $PPID 2>>err.log; kill -KILL $PPID 2>>err.log; exit 0";
    let out = exec_sh(&tree.policy(), script);
    if probe["landlock_abi"].as_u64().unwrap() >= 6 {
        assert_eq!(stdout(&out), "BLOCKED\n", "{}", stderr(&out));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(stderr(&out).ends_with("saphan-launcher: exited code=0 reaped=0\n"));
    }
    // Under reap too (a signal scope of its own, no filesystem rule): the
    // command can neither stop nor kill its supervisor (review: it stopped
    // it and the run was never reaped), and still writes anywhere.
    let out = run(&[
        "reap",
        "--",
        "/bin/sh",
        "-c",
        "if kill -0 $PPID 2>/dev/null; then echo REACHED; else echo BLOCKED; fi; \
         kill -STOP $PPID 2>/dev/null; exit 0",
    ]);
    let scoped = probe["landlock_abi"].as_u64().unwrap() >= 6;
    assert_eq!(
        stdout(&out),
        if scoped { "BLOCKED\n" } else { "REACHED\n" },
        "{}",
        stderr(&out)
    );
}

/// `--expect-sha256`: the launcher hashes the inode it runs from before it
/// does anything; the right digest is reported first on the status
/// descriptor, a wrong one is refused with nothing run.
#[test]
fn the_launcher_proves_its_digest_before_it_acts() {
    let own = saphan_core::digest::sha256_file(Path::new(LAUNCHER)).unwrap();
    let wrong = "0".repeat(64);
    let tree = Tree::new();
    let policy = tree.policy();
    for verb in ["reap", "exec"] {
        let status = tree.base.join(format!("status-{verb}"));
        let marker = tree.wd.join(format!("ran-{verb}"));
        let script = format!("touch {}", marker.display());
        for expected in [&own, &wrong] {
            let mut args = vec![verb, "--status-fd", "5", "--expect-sha256", expected];
            if verb == "exec" {
                args.extend(["--policy", &policy]);
            }
            args.extend(["--", "/bin/sh", "-c", &script]);
            let out = run_with_status(&status, &args);
            let got = lines_of(&status);
            if expected == &own {
                assert_eq!(code(&out), 0, "{}", stderr(&out));
                assert!(marker.exists(), "{verb}: the command did not run");
                std::fs::remove_file(&marker).unwrap();
                assert_eq!(got[0], format!("saphan-launcher: self sha256={own}"));
                let rest: Vec<&str> = got[1..].iter().map(String::as_str).collect();
                match verb {
                    "exec" => {
                        assert_eq!(rest.len(), 2, "{got:?}");
                        assert!(rest[0].starts_with("saphan-launcher: landlock abi="));
                    }
                    _ => assert_eq!(rest.len(), 1, "{got:?}"),
                }
                assert_eq!(
                    rest[rest.len() - 1],
                    "saphan-launcher: exited code=0 reaped=0"
                );
            } else {
                assert_eq!(code(&out), 3, "{}", stderr(&out));
                assert!(!marker.exists(), "{verb}: the command ran");
                assert_eq!(
                    got,
                    [format!(
                        "saphan-launcher: refused [digest-mismatch] the running launcher \
                         /proc/self/exe has sha256 {own}, the engine expects sha256 {wrong}"
                    )]
                );
                assert!(
                    stderr(&out).contains("fix: deliver the launcher to this machine again"),
                    "{}",
                    stderr(&out)
                );
            }
        }
    }
}
