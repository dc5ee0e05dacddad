//! The supervisor `exec` and `reap` share: run the command as a child, pass
//! on the signals saphan sends, and when the command exits kill everything
//! it left behind, so no process outlives a run.
//!
//! Why each step is there:
//! * the launcher is a *child subreaper*: a process the command orphans
//!   (a `setsid … &` daemon, a double fork) is re-parented to the launcher,
//!   not to init, so the launcher can still find, kill and wait for it;
//! * SIGTERM, SIGINT and SIGHUP sent to the launcher with kill(2) are
//!   passed on to the command. One the kernel generated (a terminal's Ctrl-C
//!   or hangup, `si_code == SI_KERNEL`) is not: the terminal sent it to its
//!   whole foreground process group, the command included, and a second
//!   copy would read as a second Ctrl-C (which some agents take as "quit");
//! * SIGUSR2 sent to the launcher kills the command (SIGKILL): the local
//!   lifeline's thread sends it when its caller says `signal KILL` or goes
//!   away (commands::start_local_lifeline). The pid is the supervisor's own
//!   unreaped child when it is killed, so the kill can never miss;
//! * SIGTERM, SIGINT, SIGHUP, SIGUSR2 and SIGCHLD are reset to their default
//!   disposition (an inherited SIG_IGN on SIGCHLD would make the kernel reap
//!   children behind our back) and blocked, then taken synchronously with
//!   `sigtimedwait`: no handler runs, nothing is lost between two waits;
//! * the child empties its signal mask before exec (std passes the parent's
//!   mask on, and a command that inherited SIGTERM blocked would never see
//!   the SIGTERM forwarded to it) and inherits the default dispositions;
//! * the child is spawned with PR_SET_PDEATHSIG=SIGKILL, so a launcher that
//!   is itself SIGKILLed still takes its command with it;
//! * under `exec` at ABI >= 6 the child enters a scope-only Landlock domain
//!   nested in the launcher's: the launcher can signal everything the
//!   command starts, the command cannot signal the launcher;
//! * after the command exits, each round reaps what has ended and SIGKILLs
//!   every remaining *direct* child. Only direct children are signalled: a
//!   child's pid cannot be reused until the launcher reaps it, so the kill
//!   can never hit an unrelated process. A grandchild becomes a direct child
//!   the moment its parent dies, so a chain of depth D is gone after D
//!   rounds. The rounds end when `waitpid` answers ECHILD, or at a deadline
//!   (a process that cannot be killed in time is named on stderr), so a
//!   fork storm cannot hold the launcher forever.
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::io;
use std::os::fd::OwnedFd;
use std::process::Command;
use std::time::{Duration, Instant};

use saphan_core::process::{self, ChildEnd, SignalSet};

/// The signals passed on to the command.
pub const FORWARDED: [i32; 3] = [process::SIGTERM, process::SIGINT, process::SIGHUP];

/// `ESRCH` (no such process): a /proc entry whose process ended meanwhile.
const ESRCH: i32 = 3;

/// How long the launcher keeps killing after the command exited.
const KILL_DEADLINE: Duration = Duration::from_secs(10);

/// How long one round waits for a SIGCHLD before looking again.
const ROUND_WAIT: Duration = Duration::from_millis(20);

/// How the run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The command's exit status, or 128 + the signal that killed it.
    pub code: i32,
    /// How many left-behind processes the launcher killed.
    pub reaped: usize,
    /// Processes still there when the launcher gave up (empty: none).
    pub abandoned: Vec<i32>,
    /// The processes left could not be listed when it gave up (`/proc`
    /// unreadable: the command may have lowered the launcher's open-file
    /// limit, which the same user can): what was left is unknown.
    pub unlisted: bool,
}

/// The launcher, ready to supervise: subreaper set, signals blocked.
pub struct Supervisor {
    signals: SignalSet,
}

/// Why nothing could be started.
#[derive(Debug)]
pub enum StartError {
    /// Becoming a subreaper or arranging the signals failed.
    Setup(&'static str, io::Error),
    /// The command could not be executed.
    Spawn(io::Error),
}

impl Supervisor {
    /// Makes this process a child subreaper and blocks the signals it will
    /// take synchronously. Nothing has been started yet.
    pub fn prepare() -> Result<Self, StartError> {
        process::set_child_subreaper(true)
            .map_err(|e| StartError::Setup("PR_SET_CHILD_SUBREAPER", e))?;
        let mut taken = FORWARDED.to_vec();
        taken.push(process::SIGUSR2);
        taken.push(process::SIGCHLD);
        for sig in &taken {
            process::set_default_disposition(*sig)
                .map_err(|e| StartError::Setup("sigaction(SIG_DFL)", e))?;
        }
        let signals = SignalSet::new(&taken).map_err(|e| StartError::Setup("sigaddset", e))?;
        process::block_signals(&signals).map_err(|e| StartError::Setup("sigprocmask", e))?;
        Ok(Supervisor { signals })
    }

    /// Spawns `command`, waits for it (forwarding signals), then kills and
    /// reaps whatever it left behind.
    /// `nested_domain`: a scope-only Landlock ruleset the command is
    /// restricted with between fork and exec (see
    /// `saphan_core::landlock::nested_scope_ruleset`).
    /// `after_spawn` runs once the command is started, before the wait (it
    /// may take the child's stdin pipe, and start threads: a thread started
    /// there inherits the blocked signals, so a process-directed signal is
    /// still taken here). `command` is dropped right after the spawn, so
    /// its copy of the environment does not live on through the run.
    pub fn run(
        &self,
        mut command: Command,
        nested_domain: Option<OwnedFd>,
        after_spawn: impl FnOnce(&mut std::process::Child),
    ) -> Result<Outcome, StartError> {
        process::prepare_supervised_child(&mut command, nested_domain)
            .map_err(|e| StartError::Setup("the child's signal mask", e))?;
        let spawned = command.spawn();
        drop(command);
        let mut child = spawned.map_err(StartError::Spawn)?;
        let pid = i32::try_from(child.id()).unwrap_or(-1);
        after_spawn(&mut child);
        // The child is reaped with waitpid(-1) below, never through `child`.
        drop(child);
        let end = self.wait_for(pid);
        let (reaped, abandoned, unlisted) = self.kill_the_rest();
        Ok(Outcome {
            code: end.code(),
            reaped,
            abandoned,
            unlisted,
        })
    }

    /// Waits for `pid`, passing on every forwarded signal that arrives;
    /// orphans that end meanwhile are reaped on the way.
    fn wait_for(&self, pid: i32) -> ChildEnd {
        loop {
            loop {
                match process::wait_any_nohang() {
                    Ok(Some((p, end))) if p == pid => return end,
                    Ok(Some(_)) => continue,
                    Ok(None) => break,
                    Err(e) => {
                        // ECHILD while the command was never collected: it
                        // cannot happen with SIGCHLD at its default; say so.
                        eprintln!("saphan-launcher: lost the command (pid {pid}): {e}");
                        return ChildEnd::Exited(1);
                    }
                }
            }
            match process::wait_signal(&self.signals, None) {
                Ok(Some(got)) if FORWARDED.contains(&got.signal) && !got.from_kernel => {
                    // The command may have just exited: ESRCH is fine.
                    let _ = process::send_signal(pid, got.signal);
                }
                Ok(Some(got)) if got.signal == process::SIGUSR2 => {
                    // Only this loop reaps: `pid` is still ours to kill.
                    let _ = process::send_signal(pid, process::SIGKILL);
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("saphan-launcher: sigtimedwait failed: {e}");
                    std::thread::sleep(ROUND_WAIT);
                }
            }
        }
    }

    /// Kills every process left behind; returns how many were killed, the
    /// pids still there if it had to give up, and whether it could not list
    /// them then (nothing is claimed clean that was not seen gone: only
    /// `waitpid`'s ECHILD says no child is left, without `/proc`).
    ///
    /// Every child is sent SIGKILL, zombies included: a process whose main
    /// thread exited shows as `Z` while its other threads run on (waitpid
    /// cannot reap it), and SIGKILL to it ends the whole thread group (a
    /// true zombie ignores it). Skipping `Z` let such a process outlive its
    /// run (measured).
    fn kill_the_rest(&self) -> (usize, Vec<i32>, bool) {
        let deadline = Instant::now() + KILL_DEADLINE;
        let mut killed: HashSet<i32> = HashSet::new();
        loop {
            loop {
                match process::wait_any_nohang() {
                    Ok(Some(_)) => continue,
                    Ok(None) => break,
                    // ECHILD: nothing is left.
                    Err(_) => return (killed.len(), Vec::new(), false),
                }
            }
            let listed = children();
            if Instant::now() >= deadline {
                eprintln!(
                    "saphan-launcher: gave up after {}s; still running: {}",
                    KILL_DEADLINE.as_secs(),
                    listed
                        .as_ref()
                        .map_or("(cannot be listed)".to_owned(), |c| format!("{c:?}"))
                );
                return (
                    killed.len(),
                    listed.clone().unwrap_or_default(),
                    listed.is_none(),
                );
            }
            for pid in listed.unwrap_or_default() {
                let running = !is_zombie(pid) || has_other_threads(pid);
                if process::send_signal(pid, process::SIGKILL).is_ok() && running {
                    killed.insert(pid);
                }
            }
            // Woken by the next SIGCHLD (or a forwarded signal, which no
            // longer has anyone to go to).
            let _ = process::wait_signal(&self.signals, Some(ROUND_WAIT));
        }
    }
}

/// This process's direct children: `/proc/self/task/*/children`, or a scan
/// of `/proc/*/stat` for our pid as parent where that file is not built in;
/// `None` when neither can be read.
fn children() -> Option<Vec<i32>> {
    let mut found: Vec<i32> = Vec::new();
    let mut built_in = true;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let task = task.ok()?;
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(text) => found.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            ),
            // A thread that ended meanwhile: its directory is gone.
            Err(_) if !task.path().exists() => {}
            // The file is not built into this kernel: scan /proc instead.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                built_in = false;
                break;
            }
            // Anything else (EMFILE: the open-file limit was lowered) is
            // not "no children": the list is unknown.
            Err(_) => return None,
        }
    }
    if !built_in {
        found.clear();
        let me = i32::try_from(std::process::id()).unwrap_or(-1);
        for entry in std::fs::read_dir("/proc").ok()? {
            let entry = entry.ok()?;
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Ok(text) => {
                    if parse_stat(&text).is_some_and(|(_, ppid)| ppid == me) {
                        found.push(pid);
                    }
                }
                // It ended meanwhile.
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(ESRCH) => {}
                Err(_) => return None,
            }
        }
    }
    found.sort_unstable();
    found.dedup();
    Some(found)
}

/// `(state, ppid)` from `/proc/PID/stat` (the fields after the command
/// name, which is parenthesised and may itself hold spaces or parentheses).
fn stat_fields(pid: i32) -> Option<(char, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

fn parse_stat(text: &str) -> Option<(char, i32)> {
    let after = &text[text.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// A zombie has exited already; it is reaped, not killed (and not counted).
fn is_zombie(pid: i32) -> bool {
    matches!(stat_fields(pid), Some(('Z', _)))
}

/// A zombie thread-group leader whose other threads still run: more than
/// one entry in `/proc/PID/task`.
fn has_other_threads(pid: i32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.flatten().take(2).count() > 1)
        .unwrap_or(false)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_parsed_after_the_last_parenthesis() {
        assert_eq!(parse_stat("42 (sh) S 7 42 42 0 -1 4194560"), Some(('S', 7)));
        assert_eq!(parse_stat("43 (a) b) (c) Z 1 43 43 0"), Some(('Z', 1)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x)"), None);
    }

    #[test]
    fn our_own_children_are_listed() {
        let mut child = Command::new("/bin/sleep").arg("5").spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let listed = children().expect("/proc is readable here");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(listed.contains(&pid), "{pid} not in {listed:?}");
        assert!(!is_zombie(i32::try_from(std::process::id()).unwrap()));
    }
}
