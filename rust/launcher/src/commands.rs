//! The verbs. Each returns the process exit code.
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;

use saphan_core::custody::{self, Caller, CustodyViolation, StatFacts};
use saphan_core::landlock::{self, AbiProbe};
use saphan_core::{digest, policy, BinaryCustodyError};

use crate::refusal::{Refusal, EXIT_REFUSED};

const EXIT_IO: u8 = 1;
const EXIT_EXEC_FAILED: u8 = 127;
const SELF_EXE: &str = "/proc/self/exe";

/// The scratch directory, relative to the working directory.
const SCRATCH: &str = ".saphan/tmp";

fn exit_refused() -> ExitCode {
    ExitCode::from(EXIT_REFUSED)
}

/// Prints a refusal on stderr and returns exit 3.
pub fn refuse(r: &Refusal) -> ExitCode {
    eprintln!("{r}");
    exit_refused()
}

/// Prints one JSON line on stdout.
fn print_json<T: Serialize>(value: &T) -> Result<(), String> {
    let line = serde_json::to_string(value).map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| e.to_string())
}

// ---- custody --------------------------------------------------------------

/// The measured custody of the running binary.
pub struct SelfCustody {
    pub facts: StatFacts,
    pub caller: Caller,
}

/// Why the running binary may not run.
pub struct CustodyFailure {
    pub refusal: Refusal,
    /// Present when a clause failed (absent when nothing could be measured).
    pub violation: Option<Box<CustodyViolation>>,
}

/// Measures `/proc/self/exe` (its real path) against the four clauses.
pub fn self_custody() -> Result<SelfCustody, CustodyFailure> {
    let unmeasurable = |path: &Path, source: std::io::Error| {
        let e = BinaryCustodyError::Unmeasurable {
            path: path.to_owned(),
            source,
        };
        CustodyFailure {
            refusal: Refusal::custody(&e),
            violation: None,
        }
    };
    let caller = Caller::current().map_err(|e| unmeasurable(Path::new(SELF_EXE), e))?;
    let real = std::fs::canonicalize(SELF_EXE).map_err(|e| unmeasurable(Path::new(SELF_EXE), e))?;
    match custody::check_binary(&real, &caller) {
        Ok(facts) => Ok(SelfCustody { facts, caller }),
        Err(e) => Err(CustodyFailure {
            refusal: Refusal::custody(&e),
            violation: match e {
                BinaryCustodyError::Unsafe(v) => Some(Box::new(v)),
                BinaryCustodyError::Unmeasurable { .. } => None,
            },
        }),
    }
}

#[derive(Serialize)]
struct CustodyLine<'a> {
    custody: &'static str,
    clause: Option<u8>,
    path: Option<String>,
    owner_uid: Option<u32>,
    group_gid: Option<u32>,
    mode: Option<u32>,
    parent: Option<String>,
    parent_owner_uid: Option<u32>,
    parent_mode: Option<u32>,
    caller_euid: Option<u32>,
    caller_groups: Option<&'a [u32]>,
    message: Option<String>,
}

impl<'a> CustodyLine<'a> {
    fn from_facts(
        custody: &'static str,
        clause: Option<u8>,
        f: &StatFacts,
        c: &'a Caller,
        message: Option<String>,
    ) -> Self {
        CustodyLine {
            custody,
            clause,
            path: Some(f.path.display().to_string()),
            owner_uid: Some(f.owner_uid),
            group_gid: Some(f.group_gid),
            mode: Some(f.mode),
            parent: Some(f.parent.display().to_string()),
            parent_owner_uid: Some(f.parent_owner_uid),
            parent_mode: Some(f.parent_mode),
            caller_euid: Some(c.euid),
            caller_groups: Some(&c.groups),
            message,
        }
    }
}

/// `custody`: one JSON line; exit 0 on pass, 3 (with the refusal on stderr)
/// otherwise.
pub fn custody(outcome: &Result<SelfCustody, CustodyFailure>) -> ExitCode {
    let line = match outcome {
        Ok(s) => CustodyLine::from_facts("pass", None, &s.facts, &s.caller, None),
        Err(CustodyFailure {
            violation: Some(v),
            refusal,
        }) => CustodyLine::from_facts(
            "refused",
            Some(v.clause.number()),
            &v.facts,
            &v.caller,
            Some(refusal.message.clone()),
        ),
        Err(CustodyFailure {
            violation: None,
            refusal,
        }) => CustodyLine {
            custody: "refused",
            clause: None,
            path: None,
            owner_uid: None,
            group_gid: None,
            mode: None,
            parent: None,
            parent_owner_uid: None,
            parent_mode: None,
            caller_euid: None,
            caller_groups: None,
            message: Some(refusal.message.clone()),
        },
    };
    if let Err(e) = print_json(&line) {
        eprintln!("saphan-launcher: cannot write to stdout: {e}");
        return ExitCode::from(EXIT_IO);
    }
    match outcome {
        Ok(_) => ExitCode::SUCCESS,
        Err(f) => refuse(&f.refusal),
    }
}

// ---- probe ------------------------------------------------------------------

#[derive(Serialize)]
struct ProbeLine {
    landlock_abi: u32,
    landlock_reason: String,
    kernel_release: String,
    launcher_version: &'static str,
    launcher_sha256: String,
    floor: u32,
    highest_known: u32,
}

/// `probe`: exactly one JSON line describing this machine's Landlock level
/// and this launcher's identity.
pub fn probe() -> ExitCode {
    let abi = AbiProbe::detect();
    let kernel_release = match saphan_core::kernel_release() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("saphan-launcher: cannot read the kernel release: {e}");
            return ExitCode::from(EXIT_IO);
        }
    };
    let launcher_sha256 = match digest::sha256_file(Path::new(SELF_EXE)) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("saphan-launcher: cannot read {SELF_EXE}: {e}");
            return ExitCode::from(EXIT_IO);
        }
    };
    let line = ProbeLine {
        landlock_abi: abi.level(),
        landlock_reason: abi.reason(),
        kernel_release,
        launcher_version: saphan_core::VERSION,
        launcher_sha256,
        floor: landlock::FLOOR,
        highest_known: landlock::HIGHEST_KNOWN,
    };
    match print_json(&line) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("saphan-launcher: cannot write to stdout: {e}");
            ExitCode::from(EXIT_IO)
        }
    }
}

// ---- sha256 -----------------------------------------------------------------

/// `sha256 FILE`: the digest as one line of 64 lowercase hex digits.
pub fn sha256(file: &Path) -> ExitCode {
    match digest::sha256_file(file) {
        Ok(d) => {
            println!("{d}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("saphan-launcher: {}: {e}", file.display());
            ExitCode::from(EXIT_IO)
        }
    }
}

// ---- exec -------------------------------------------------------------------

/// `exec --policy JSON -- CMD ARGS...`. Returns only on failure.
///
/// The order is the boundary's:
/// 1. parse the policy (an unknown key is refused by name);
/// 2. refuse a pinned digest on a command that is not an absolute path;
/// 3. re-measure the live ABI and apply the domain (refusing below the floor
///    and on anything but full enforcement) — from here on nothing this
///    process or the agent does can write outside `writable`;
/// 4. print the one confirmation line;
/// 5. chdir(workdir), then create `.saphan/tmp` RELATIVE to the new cwd, so a
///    vanished working directory fails loudly instead of being recreated;
/// 6. TMPDIR=<workdir>/.saphan/tmp;
/// 7. verify the agent's SHA-256 when pinned;
/// 8. exec.
pub fn exec(policy_json: &str, cmd: OsString, args: Vec<OsString>) -> ExitCode {
    match prepare(policy_json, &cmd) {
        Ok(tmpdir) => {
            let err = std::process::Command::new(&cmd)
                .args(&args)
                .env("TMPDIR", &tmpdir)
                .exec();
            eprintln!(
                "saphan-launcher: cannot execute {}: {err}",
                Path::new(&cmd).display()
            );
            ExitCode::from(EXIT_EXEC_FAILED)
        }
        Err(r) => refuse(&r),
    }
}

/// Steps 1-7 of [`exec`]; returns the TMPDIR to set.
fn prepare(policy_json: &str, cmd: &OsString) -> Result<PathBuf, Refusal> {
    let policy = policy::parse(policy_json).map_err(|e| Refusal::policy(&e))?;
    let cmd_path = Path::new(cmd);

    if policy.agent_sha256.is_some() && !cmd_path.is_absolute() {
        return Err(Refusal::new(
            "policy-invalid",
            format!(
                "the policy pins agent_sha256 but the command {} is not an absolute path; a \
                 pinned digest names one exact file, never a PATH lookup",
                cmd_path.display()
            ),
            "send the agent's absolute path as the command",
        ));
    }

    let enforced = landlock::apply_domain(&policy.writable)
        .map_err(|e| Refusal::landlock(&e, &policy.workdir))?;
    eprintln!("{}", landlock::confirmation_line(&enforced));

    std::env::set_current_dir(&policy.workdir)
        .map_err(|e| Refusal::workdir_missing(&policy.workdir, &format!("chdir failed: {e}")))?;
    std::fs::create_dir_all(SCRATCH).map_err(|e| {
        Refusal::workdir_missing(
            &policy.workdir,
            &format!("cannot create {SCRATCH} inside it: {e}"),
        )
    })?;
    let tmpdir = policy.workdir.join(SCRATCH);

    if let Some(pinned) = &policy.agent_sha256 {
        let actual = digest::sha256_file(cmd_path).map_err(|e| {
            Refusal::new(
                "digest-mismatch",
                format!(
                    "the pinned agent {} cannot be read to verify its digest (pinned sha256 \
                     {pinned}): {e}",
                    cmd_path.display()
                ),
                "deliver the pinned agent binary to this machine again",
            )
        })?;
        if &actual != pinned {
            return Err(Refusal::new(
                "digest-mismatch",
                format!(
                    "agent {} has sha256 {actual}, the policy pins sha256 {pinned}",
                    cmd_path.display()
                ),
                "deliver the pinned agent binary to this machine again, or pin the digest of \
                 the binary you mean to run",
            ));
        }
    }
    Ok(tmpdir)
}
