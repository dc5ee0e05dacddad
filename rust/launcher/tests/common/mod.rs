//! Shared helpers for the launcher's integration tests: they run the built
//! binary, never a stand-in.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const LAUNCHER: &str = env!("CARGO_BIN_EXE_saphan-launcher");

/// A scratch tree: `<base>/wd` (the workdir), `<base>/outside` (a sibling
/// holding `keep.txt`), all on real (canonical) paths.
pub struct Tree {
    _tmp: tempfile::TempDir,
    pub base: PathBuf,
    pub wd: PathBuf,
    pub outside: PathBuf,
}

pub const KEEP: &[u8] = b"precious bytes\n\x00\x01\x02 do not touch\n";

impl Tree {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        let wd = base.join("wd");
        let outside = base.join("outside");
        std::fs::create_dir(&wd).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep.txt"), KEEP).unwrap();
        Tree {
            _tmp: tmp,
            base,
            wd,
            outside,
        }
    }

    /// The policy granting only the workdir.
    pub fn policy(&self) -> String {
        policy_json(&self.wd, &[&self.wd], None)
    }

    pub fn keep(&self) -> PathBuf {
        self.outside.join("keep.txt")
    }

    /// Asserts `outside/` still holds exactly `keep.txt` with its bytes.
    pub fn assert_outside_untouched(&self) {
        assert_eq!(
            std::fs::read(self.keep()).unwrap(),
            KEEP,
            "keep.txt changed"
        );
        let names: Vec<String> = std::fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            vec!["keep.txt".to_owned()],
            "outside/ gained entries"
        );
    }
}

pub fn policy_json(workdir: &Path, writable: &[&Path], digest: Option<&str>) -> String {
    let mut v = serde_json::json!({
        "version": 1,
        "workdir": workdir.to_str().unwrap(),
        "writable": writable.iter().map(|p| p.to_str().unwrap()).collect::<Vec<_>>(),
        "readable": "everything",
    });
    if let Some(d) = digest {
        v["agent_sha256"] = serde_json::Value::String(d.to_owned());
    }
    v.to_string()
}

/// Runs the launcher with `args`, retrying on ETXTBSY (a binary copied by
/// one test can be briefly held open by another test's fork).
pub fn run_bin(bin: &Path, args: &[&str]) -> Output {
    for _ in 0..50 {
        match Command::new(bin).args(args).output() {
            Ok(out) => return out,
            Err(e) if e.raw_os_error() == Some(26) => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("cannot run {}: {e}", bin.display()),
        }
    }
    panic!("{} stayed busy", bin.display());
}

pub fn run(args: &[&str]) -> Output {
    run_bin(Path::new(LAUNCHER), args)
}

/// `exec --policy POLICY -- /bin/sh -c SCRIPT`.
pub fn exec_sh(policy: &str, script: &str) -> Output {
    run(&["exec", "--policy", policy, "--", "/bin/sh", "-c", script])
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn code(out: &Output) -> i32 {
    out.status.code().expect("terminated by a signal")
}

/// Runs the launcher through `/bin/sh` so that descriptor 5 is a file the
/// launcher inherits (without close-on-exec), as saphan passes it.
pub fn run_with_status(status: &Path, args: &[&str]) -> Output {
    let mut sh_args = vec![
        "-c".to_owned(),
        "s=$1; shift; exec \"$@\" 5>\"$s\"".to_owned(),
        "sh".to_owned(),
        status.to_str().unwrap().to_owned(),
        LAUNCHER.to_owned(),
    ];
    sh_args.extend(args.iter().map(|a| (*a).to_owned()));
    Command::new("/bin/sh").args(&sh_args).output().unwrap()
}
