//! The verbs. Each returns the process exit code.
//!
//! `exec` and `reap` are one function ([`launch`]): `exec` confines the
//! launcher with Landlock first, `reap` does not (it runs inside a jail that
//! is already built, e.g. bubblewrap's); both then supervise the command.
//! With `--expect-sha256` either first proves what it is: it hashes the
//! inode it runs from and refuses unless that is the expected launcher
//! ([`verify_self`]).
//!
//! With `--stdin-frame` either then reads the command's environment and
//! stdin from a frame on fd 0 (format in `frame`), and only once it has
//! proved what it is: a swapped launcher never receives the secrets. The
//! command's environment is cleared and holds only what the frame names
//! (plus TMPDIR under `exec`), its stdin is the frame's stdin payload
//! (written from a thread into a pipe) or /dev/null, never fd 0; the
//! launcher never sets a variable on itself. The rest of fd 0 is the
//! lifeline: a line `stop` makes the launcher send itself SIGHUP, which the
//! supervisor forwards to the command like any SIGHUP sent with kill(2);
//! end of input stops nothing.
#![forbid(unsafe_code)]

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::process::{Child, Stdio};

use serde::Serialize;

use saphan_core::binary_custody::{self, Caller, CustodyViolation, StatFacts};
use saphan_core::digest::{self, VerifyError};
use saphan_core::landlock::{self, AbiProbe};
use saphan_core::{policy, process, BinaryCustodyError, RefusalClass};

use crate::bridge::Bridge;
use crate::cli::Launch;
use crate::frame::{self, Frame, Secret};
use crate::refusal::{Refusal, EXIT_REFUSED};
use crate::supervise::{Outcome, StartError, Supervisor};

const EXIT_IO: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_EXEC_FAILED: u8 = 127;
/// The lifeline was readable before the command started: not started (as
/// if hung up, 128 + SIGHUP).
const EXIT_NOT_STARTED: u8 = 129;
const SELF_EXE: &str = "/proc/self/exe";

/// The scratch directory, relative to the working directory, and its two
/// components (created one at a time).
const SCRATCH: &str = ".saphan-run/tmp";
const SCRATCH_PARTS: [&str; 2] = [".saphan-run", "tmp"];

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
    match binary_custody::check_binary(&real, &caller) {
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

// ---- exec and reap ------------------------------------------------------------

/// Where the control lines go: always stderr (for humans), and the status
/// descriptor when saphan passed one (for the engine; the command cannot
/// write to it — it is close-on-exec, and the launcher is not dumpable).
pub struct Status {
    fd: Option<File>,
}

impl Status {
    /// Adopts the inherited descriptor (setting FD_CLOEXEC on it).
    fn open(fd: Option<i32>) -> Result<Self, String> {
        let Some(fd) = fd else {
            return Ok(Status { fd: None });
        };
        process::adopt_inherited_fd(fd)
            .map(|owned| Status {
                fd: Some(File::from(owned)),
            })
            .map_err(|e| {
                format!(
                    "--status-fd {fd} is not a descriptor this launcher inherited open \
                     (without close-on-exec): {e}"
                )
            })
    }

    /// One control line, on the status descriptor first and then on stderr
    /// (one write each, so a line never interleaves). A reader that went
    /// away is ignored: stderr may be a pipe to an SSH channel that was lost
    /// while the run went on, and the status descriptor must still get every
    /// line (`eprintln!` would panic there).
    fn line(&mut self, line: &str) {
        self.status_only(line);
        let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
    }

    fn status_only(&mut self, line: &str) {
        if let Some(f) = &mut self.fd {
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
    }

    /// A refusal: the two lines on stderr, the one line on the descriptor.
    fn refuse(&mut self, r: &Refusal) -> ExitCode {
        self.status_only(&r.status_line());
        let _ = std::io::stderr().write_all(format!("{r}\n").as_bytes());
        exit_refused()
    }
}

/// The line the launcher ends every supervised run with.
/// The line that says the launcher could not end every process of the run
/// (`None` when it did): the engine must not record a clean end.
pub fn abandoned_line(outcome: &Outcome) -> Option<String> {
    if outcome.unlisted {
        return Some("saphan-launcher: abandoned pids=[unknown]".to_owned());
    }
    if outcome.abandoned.is_empty() {
        return None;
    }
    let pids: Vec<String> = outcome.abandoned.iter().map(|p| p.to_string()).collect();
    Some(format!(
        "saphan-launcher: abandoned pids=[{}]",
        pids.join(",")
    ))
}

pub fn exited_line(outcome: &Outcome) -> String {
    format!(
        "saphan-launcher: exited code={} reaped={}",
        outcome.code, outcome.reaped
    )
}

/// `exec [--status-fd N] --policy JSON -- CMD ARGS...` and
/// `reap [--status-fd N] -- CMD ARGS...`.
///
/// The order is the boundary's:
/// 1. PR_SET_DUMPABLE 0 before anything else: a same-uid process (the
///    command included) can then neither ptrace the launcher nor open
///    `/proc/<launcher>/fd/N` (the status descriptor among them);
/// 2. adopt the status descriptor and set FD_CLOEXEC on it, so the command
///    never inherits it;
/// 3. with `--expect-sha256`: [`verify_self`] — hash `/proc/self/exe` and
///    refuse `digest-mismatch` unless it is the expected digest (or when it
///    cannot be read), else print `saphan-launcher: self sha256=HEX`;
/// 4. a failed custody check (measured at entry) is refused here, so the
///    refusal reaches the status descriptor too;
/// 5. with `--stdin-frame`: [`read_stdin_frame`] — read the frame from fd 0
///    (exactly up to its `end` line; a bad frame is refused
///    `policy-invalid`, naming the item, never a value), clear the
///    command's environment and set what the frame names;
/// 6. `exec` only: [`prepare`] — parse the policy, apply the Landlock domain
///    to the launcher itself (so everything it forks is inside), print the
///    confirmation line, enter the workdir, create the scratch directory
///    without following links, verify a pinned digest;
///    `reap --bridge` only: [`Bridge::open`] — listen on 127.0.0.1:PORT and
///    connect once to the door's socket, either failing refused
///    `egress-uncuttable` (the command never starts);
/// 7. become a child subreaper, spawn the command (for `exec`: TMPDIR set,
///    and a scope-only domain nested in the launcher's from ABI 6),
///    forward SIGTERM/SIGINT/SIGHUP to it, wait for it, then SIGKILL every
///    process it left behind ([`Supervisor`]);
///    with `--stdin-frame`, once the command is started: a thread writes the
///    frame's stdin payload into the command's stdin pipe (then closes it
///    and zeroes the buffer), and a thread reads the lifeline (the rest of
///    fd 0; `stop` → SIGHUP to the launcher itself, forwarded); with
///    `--bridge`, the bridge's accept thread. All are started after the
///    signals are blocked, so they inherit the mask, and none is joined:
///    the launcher exits when the command's run ends;
/// 8. `saphan-launcher: exited code=N reaped=M`, and exit with the
///    command's status (128+signal when it was killed; 127 with
///    `code=127 reaped=0` when it could not be executed).
///
/// Every run that gets past step 2 ends with exactly one control line of
/// its own kind: a refusal (exit 3) or the exited line. (A `--status-fd`
/// that was not inherited open is a usage error, exit 2, on stderr only.)
pub fn launch(custody: Result<(), &Refusal>, launch: Launch, confine: bool) -> ExitCode {
    if let Err(e) = process::set_dumpable(false) {
        let r = Refusal::new(
            RefusalClass::ConfinementUnavailable,
            format!("the launcher cannot make itself non-dumpable: {e}"),
            "report the kernel release with this message",
        );
        return refuse(&r);
    }
    let mut status = match Status::open(launch.status_fd) {
        Ok(s) => s,
        Err(msg) => {
            eprintln!("saphan-launcher: {msg}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // Adopted at once (close-on-exec from here): the command never holds it.
    let local_lifeline = match launch.lifeline_fd.map(process::adopt_inherited_fd) {
        None => None,
        Some(Ok(fd)) => Some(File::from(fd)),
        Some(Err(e)) => {
            eprintln!(
                "saphan-launcher: --lifeline-fd {} is not a descriptor this launcher \
                 inherited open (without close-on-exec): {e}",
                launch.lifeline_fd.unwrap_or(-1)
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // Before anything the launcher applies or runs: is this the launcher the
    // engine checked? (It hashed the file by path; the path may have been
    // swapped since. The running inode cannot be.)
    if let Some(expected) = &launch.expect_sha256 {
        match verify_self(Path::new(SELF_EXE), expected) {
            Ok(actual) => status.line(&self_digest_line(&actual)),
            Err(r) => return status.refuse(&r),
        }
    }
    // `exec` applies the boundary, so its own custody is its run condition.
    // `reap` applies none: it runs as the first process inside a jail that
    // bubblewrap already built, in the jail's user namespace, where a
    // root-owned launcher shows as the overflow uid and no ownership can be
    // told apart. The engine checks the reaper's custody (the same rust/core
    // clauses) and digest outside the namespace before composing; a reaper
    // swapped after that is confined by the same jail as the command.
    if let (Err(r), true) = (custody, confine) {
        return status.refuse(r);
    }

    // Only now, with the launcher proved (digest, custody), may it receive
    // the secrets; and before the policy is applied, so a refusal there
    // still comes after the frame was consumed whole.
    let framed = if launch.stdin_frame {
        match read_stdin_frame() {
            // Under `exec` the launcher sets TMPDIR (the policy's scratch).
            Ok((frame, _)) if confine && frame.names("TMPDIR") => {
                return status.refuse(&frame_refusal(
                    "TMPDIR may not be given in the frame under exec (the launcher sets it \
                     to the policy's scratch directory)",
                ));
            }
            Ok(framed) => Some(framed),
            Err(r) => return status.refuse(&r),
        }
    } else {
        None
    };

    let mut command = std::process::Command::new(&launch.cmd);
    command.args(&launch.args);
    let (stdin_payload, lifeline) = match framed {
        Some((frame, fd0)) => (apply_frame(&mut command, frame), Some(fd0)),
        None => (None, None),
    };
    let mut nested_domain = None;
    if !confine {
        // `reap` confines nothing, but its command must not stop, kill or
        // trace the supervisor or the jail's process 1 (a run left unreaped,
        // a forged exit status: review, measured): a signal scope of its
        // own where the kernel has one.
        match landlock::signal_scope_ruleset() {
            Ok(domain) => nested_domain = domain,
            Err(e) => status.line(&format!(
                "saphan-launcher: reap: no signal scope for the command: {e}"
            )),
        }
    }
    if confine {
        let policy = launch.policy.as_deref().unwrap_or_default();
        match prepare(policy, &launch.cmd, &mut status) {
            Ok(prepared) => {
                command.env("TMPDIR", prepared.tmpdir);
                nested_domain = prepared.nested_domain;
            }
            Err(r) => return status.refuse(&r),
        }
    }

    // Listening, and the door reached once, before anything starts: a run
    // that could never get out is refused whole, not left to fail inside.
    let bridge = match launch.bridge.as_ref().map(Bridge::open).transpose() {
        Ok(bridge) => bridge,
        Err(r) => return status.refuse(&r),
    };

    let supervisor = match Supervisor::prepare() {
        Ok(s) => s,
        Err(e) => return status.refuse(&start_refusal(&e)),
    };
    if let Some(fd) = &local_lifeline {
        // Its caller said stop, or is gone (its end closed: it died, or the
        // boundary process between us ended): the command never starts.
        // Otherwise a line or the end that comes later reaches the thread
        // started with the command, which stops it.
        if process::poll_readable(fd.as_fd(), 0).unwrap_or(true) {
            status.line("saphan-launcher: not started: the lifeline ended or said stop first");
            return ExitCode::from(EXIT_NOT_STARTED);
        }
    }
    let after_spawn = |child: &mut Child| {
        if let (Some(payload), Some(pipe)) = (stdin_payload, child.stdin.take()) {
            feed_stdin(pipe, payload);
        }
        if let Some(fd0) = lifeline {
            start_lifeline(fd0);
        }
        if let Some(fd) = local_lifeline {
            start_local_lifeline(fd);
        }
        if let Some(bridge) = bridge {
            start_bridge(bridge);
        }
    };
    let outcome = match supervisor.run(command, nested_domain, after_spawn) {
        Ok(outcome) => outcome,
        Err(StartError::Spawn(err)) => {
            eprintln!(
                "saphan-launcher: cannot execute {}: {err}",
                Path::new(&launch.cmd).display()
            );
            Outcome {
                code: i32::from(EXIT_EXEC_FAILED),
                reaped: 0,
                abandoned: Vec::new(),
                unlisted: false,
            }
        }
        Err(e) => return status.refuse(&start_refusal(&e)),
    };
    if let Some(line) = abandoned_line(&outcome) {
        status.line(&line);
    }
    status.line(&exited_line(&outcome));
    ExitCode::from(u8::try_from(outcome.code).unwrap_or(EXIT_IO))
}

/// Step 5 of [`launch`]: reads the frame from a duplicate of fd 0 (a plain
/// `File`: std's `Stdin` buffers and would read past the frame), and
/// returns it with that descriptor (close-on-exec), which the lifeline
/// reads on.
fn read_stdin_frame() -> Result<(Frame, File), Refusal> {
    let fd0 = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| frame_refusal(&format!("fd 0 cannot be read: {e}")))?;
    let mut fd0 = File::from(fd0);
    let frame = frame::read_frame(&mut fd0).map_err(|e| frame_refusal(&e.0))?;
    Ok((frame, fd0))
}

/// A frame that cannot be taken (the message never holds a value).
fn frame_refusal(what: &str) -> Refusal {
    Refusal::new(
        RefusalClass::PolicyInvalid,
        format!("the --stdin-frame frame on fd 0 is refused: {what}"),
        format!(
            "send `saphan-frame 1`, then `keep NAME`, `env NAME LEN` + LEN bytes and at most \
             one `stdin LEN` + LEN bytes, then `end` (saphan-launcher --help); this launcher is \
             saphan-launcher {}",
            saphan_core::VERSION
        ),
    )
}

/// The command's environment and stdin from `frame`: the inherited
/// environment is cleared, the kept names get the launcher's own values
/// (when it has them), the env items their bytes; stdin is a pipe when the
/// frame has a payload for it (returned, to be written once the command
/// runs), /dev/null otherwise. The env values are zeroed as `frame` is
/// dropped here (`Command` holds its own copies, freed when it is dropped
/// after the spawn).
fn apply_frame(command: &mut std::process::Command, frame: Frame) -> Option<Secret> {
    let Frame { keep, env, stdin } = frame;
    command.env_clear();
    for name in &keep {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    for (name, value) in &env {
        command.env(name, OsStr::from_bytes(value.bytes()));
    }
    drop(env);
    command.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    stdin
}

/// Writes `payload` into the command's stdin from a thread (a payload
/// larger than the pipe cannot deadlock the supervisor), then closes the
/// pipe and zeroes the buffer. A command that exits without reading ends
/// the write (EPIPE; SIGPIPE is ignored in the launcher).
fn feed_stdin(mut pipe: std::process::ChildStdin, payload: Secret) {
    let spawned = std::thread::Builder::new()
        .name("stdin-frame".to_owned())
        .spawn(move || {
            let _ = pipe.write_all(payload.bytes());
            drop(pipe);
            drop(payload);
        });
    if let Err(e) = spawned {
        // The closure (pipe and payload) was dropped: the command reads
        // end of input at once.
        let _ = writeln!(
            std::io::stderr(),
            "saphan-launcher: cannot start the stdin writer: {e}"
        );
    }
}

/// Starts the lifeline thread on the rest of fd 0: a line `stop` sends
/// SIGHUP to the launcher itself (process-directed, SI_USER), which the
/// supervisor takes and forwards to the command; end of input or a read
/// error ends the thread and stops nothing. The thread is never joined.
fn start_lifeline(fd0: File) {
    let me = i32::try_from(std::process::id()).unwrap_or(-1);
    let spawned = std::thread::Builder::new()
        .name("lifeline".to_owned())
        .spawn(move || {
            frame::watch_lifeline(fd0, || {
                let _ = process::send_signal(me, process::SIGHUP);
            });
        });
    if let Err(e) = spawned {
        let _ = writeln!(
            std::io::stderr(),
            "saphan-launcher: cannot start the lifeline reader (a `stop` will not be heard): {e}"
        );
    }
}

/// Starts the local lifeline's thread (`--lifeline-fd`): each `signal NAME`
/// line is a signal the launcher sends itself (process-directed, SI_USER),
/// which the supervisor takes and passes to the command; `signal KILL` and
/// the end of input are SIGUSR2, on which the supervisor kills the command
/// (and then, as always, everything it left). The thread is never joined.
fn start_local_lifeline(fd: File) {
    let me = i32::try_from(std::process::id()).unwrap_or(-1);
    let spawned = std::thread::Builder::new()
        .name("local-lifeline".to_owned())
        .spawn(move || {
            frame::watch_control(fd, |control| {
                let sig = match control {
                    frame::Control::Signal(sig) => sig,
                    frame::Control::Kill | frame::Control::End => process::SIGUSR2,
                };
                let _ = process::send_signal(me, sig);
            });
        });
    if let Err(e) = spawned {
        // No thread: nobody would hear the caller go. Stop the command now
        // rather than let it run unheld.
        let _ = writeln!(
            std::io::stderr(),
            "saphan-launcher: cannot start the lifeline reader, the command is stopped: {e}"
        );
        let _ = process::send_signal(me, process::SIGUSR2);
    }
}

/// Starts the bridge's accept thread, from the supervisor's thread after the
/// spawn, so it inherits the blocked signals. A bridge that cannot start is
/// closed: clients are refused at once, and the run goes on without a way
/// out (its egress stays cut).
fn start_bridge(bridge: Bridge) {
    if let Err(e) = bridge.start() {
        let _ = writeln!(
            std::io::stderr(),
            "saphan-launcher: cannot start the egress bridge (the port is closed): {e}"
        );
    }
}

/// The line a launcher that proved its digest prints.
pub fn self_digest_line(sha256: &str) -> String {
    format!("saphan-launcher: self sha256={sha256}")
}

/// Step 3 of [`launch`]: hashes `exe` — `/proc/self/exe`, the inode this
/// process was executed from, whatever its path now names: a rename over
/// the path does not change it, and writing to a running executable fails
/// (ETXTBSY) — and returns its digest when it is `expected`. A mismatch, and
/// a file that cannot be read (cannot verify = refused), are `digest-mismatch`.
fn verify_self(exe: &Path, expected: &str) -> Result<String, Refusal> {
    digest::verify_sha256_file(exe, expected).map_err(|e| match e {
        VerifyError::Mismatch { actual } => Refusal::self_digest_mismatch(exe, &actual, expected),
        VerifyError::Unreadable(e) => Refusal::self_digest_unreadable(exe, expected, &e),
    })
}

fn start_refusal(e: &StartError) -> Refusal {
    let message = match e {
        StartError::Setup(what, err) => format!("the supervisor cannot be set up: {what}: {err}"),
        StartError::Spawn(err) => format!("the command cannot be started: {err}"),
    };
    Refusal::new(
        RefusalClass::ConfinementUnavailable,
        message,
        "report the kernel release with this message; without a supervisor the launcher \
         cannot promise that no process outlives the run, so it runs nothing",
    )
}

/// What [`prepare`] hands to the supervisor.
struct Prepared {
    /// The TMPDIR to set.
    tmpdir: PathBuf,
    /// The scope-only ruleset the command starts in (ABI >= 6).
    nested_domain: Option<OwnedFd>,
}

/// Step 6 of [`launch`] for `exec`.
///
/// 1. parse the policy (an unknown key is refused by name);
/// 2. refuse a pinned digest on a command that is not an absolute path;
/// 3. re-measure the live ABI and apply the domain (refusing below the floor
///    and on anything but full enforcement; every writable directory must
///    pass the grant rule, no symbolic link on its path) — from here on
///    nothing this process or the command does can write outside
///    `writable`, and at ABI >= 6 nothing can signal a process outside the
///    domain or connect to an abstract unix socket outside it;
/// 4. the confirmation line; at ABI >= 6, a scope-only ruleset for the
///    command, so it runs one domain below the launcher and cannot signal
///    it ([`landlock::nested_scope_ruleset`]);
/// 5. chdir(workdir), then create `.saphan-run`, then `.saphan-run/tmp`
///    RELATIVE to the new cwd, one at a time, each checked with lstat to be
///    a real directory (a planted link is refused as `workdir-unsafe`); a
///    vanished working directory fails loudly instead of being recreated;
/// 6. verify the agent's SHA-256 when pinned.
fn prepare(policy_json: &str, cmd: &OsString, status: &mut Status) -> Result<Prepared, Refusal> {
    let policy = policy::parse(policy_json).map_err(|e| Refusal::policy(&e))?;
    let cmd_path = Path::new(cmd);

    if policy.agent_sha256.is_some() && !cmd_path.is_absolute() {
        return Err(Refusal::new(
            RefusalClass::PolicyInvalid,
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
    status.line(&landlock::confirmation_line(&enforced));
    let nested_domain = landlock::nested_scope_ruleset(&enforced)
        .map_err(|e| Refusal::landlock(&e, &policy.workdir))?;

    std::env::set_current_dir(&policy.workdir)
        .map_err(|e| Refusal::workdir_missing(&policy.workdir, &format!("chdir failed: {e}")))?;
    make_scratch(&policy.workdir)?;
    let tmpdir = policy.workdir.join(SCRATCH);

    if let Some(pinned) = &policy.agent_sha256 {
        let actual = digest::sha256_file(cmd_path).map_err(|e| {
            Refusal::new(
                RefusalClass::DigestMismatch,
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
                RefusalClass::DigestMismatch,
                format!(
                    "agent {} has sha256 {actual}, the policy pins sha256 {pinned}",
                    cmd_path.display()
                ),
                "deliver the pinned agent binary to this machine again, or pin the digest of \
                 the binary you mean to run",
            ));
        }
    }
    Ok(Prepared {
        tmpdir,
        nested_domain,
    })
}

/// Creates `.saphan-run/tmp` relative to the cwd (the workdir), one
/// component at a time, following no link: `mkdir` never follows a final
/// link (an existing one answers EEXIST), and each component is then
/// checked with lstat to be a real directory before the next is made
/// inside it.
fn make_scratch(workdir: &Path) -> Result<(), Refusal> {
    let mut rel = PathBuf::new();
    for part in SCRATCH_PARTS {
        rel.push(part);
        match std::fs::create_dir(&rel) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(Refusal::workdir_missing(
                    workdir,
                    &format!("cannot create {} inside it: {e}", rel.display()),
                ))
            }
        }
        let meta = std::fs::symlink_metadata(&rel).map_err(|e| {
            Refusal::workdir_missing(
                workdir,
                &format!("cannot inspect {} inside it: {e}", rel.display()),
            )
        })?;
        let ft = meta.file_type();
        if ft.is_dir() {
            continue;
        }
        let shown = workdir.join(&rel);
        let what = if ft.is_symlink() {
            let target = std::fs::read_link(&rel)
                .map(|t| t.display().to_string())
                .unwrap_or_else(|e| format!("<unreadable: {e}>"));
            format!("{} is a symbolic link (-> {target})", shown.display())
        } else {
            format!("{} is not a directory", shown.display())
        };
        return Err(Refusal::workdir_unsafe(
            workdir,
            &format!("{what}; the scratch directory {SCRATCH} is created without following links"),
            &format!(
                "remove {} (an earlier run may have left it there) and dispatch the run again",
                shown.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {

    #[test]
    fn an_abandoned_process_gets_its_own_line_and_a_clean_end_none() {
        let clean = Outcome {
            code: 0,
            reaped: 1,
            abandoned: Vec::new(),
            unlisted: false,
        };
        assert_eq!(abandoned_line(&clean), None);
        let left = Outcome {
            code: 0,
            reaped: 1,
            abandoned: vec![41, 42],
            unlisted: false,
        };
        assert_eq!(
            abandoned_line(&left).as_deref(),
            Some("saphan-launcher: abandoned pids=[41,42]")
        );
        // what was left could not be listed: never a clean end
        let unknown = Outcome {
            code: 0,
            reaped: 0,
            abandoned: Vec::new(),
            unlisted: true,
        };
        assert_eq!(
            abandoned_line(&unknown).as_deref(),
            Some("saphan-launcher: abandoned pids=[unknown]")
        );
        assert_eq!(
            exited_line(&left),
            "saphan-launcher: exited code=0 reaped=1"
        );
    }

    use super::*;

    #[test]
    fn verify_self_confirms_the_running_executable_and_refuses_any_other_digest() {
        let exe = Path::new(SELF_EXE);
        let digest = digest::sha256_file(exe).unwrap();
        assert_eq!(verify_self(exe, &digest), Ok(digest.clone()));
        assert_eq!(
            self_digest_line(&digest),
            format!("saphan-launcher: self sha256={digest}")
        );

        let wrong = "0".repeat(64);
        let r = verify_self(exe, &wrong).unwrap_err();
        assert_eq!(r, Refusal::self_digest_mismatch(exe, &digest, &wrong));
        assert!(r.message.contains(&digest) && r.message.contains(&wrong));
        assert!(r.message.contains("/proc/self/exe"), "{}", r.message);
    }

    #[test]
    fn an_unreadable_launcher_is_refused_as_a_digest_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("saphan-launcher");
        let r = verify_self(&gone, &"0".repeat(64)).unwrap_err();
        assert_eq!(r.class, RefusalClass::DigestMismatch);
        assert!(
            r.message.contains("cannot be read to verify its sha256"),
            "{}",
            r.message
        );
    }
}
