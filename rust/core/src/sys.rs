//! The raw system calls saphan-core needs that std does not wrap.
//!
//! This is the only module of the crate that may contain `unsafe`. Each call
//! is a thin wrapper that turns the C convention (return value + errno) into a
//! Rust value; no pointer escapes a wrapper.
#![allow(unsafe_code)]

use std::ffi::{CString, OsStr};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

/// `LANDLOCK_CREATE_RULESET_VERSION` from `<linux/landlock.h>`: with a NULL
/// attribute and size 0, `landlock_create_ruleset` returns the ABI version
/// instead of a file descriptor.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1 << 0;

/// Asks the running kernel for its Landlock ABI version.
///
/// Returns the version (>= 1) or the errno the kernel answered with
/// (ENOSYS: not built in; EOPNOTSUPP: built in but disabled at boot; anything
/// else, e.g. EPERM from a seccomp filter, is passed through as measured).
pub fn landlock_abi_version() -> Result<i64, i32> {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    // is the documented version query: the kernel does not dereference the
    // NULL attribute pointer when the size is 0 and this flag is given, and
    // no file descriptor or memory is handed back, only an integer.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(ret)
    }
}

/// The effective user id of this process.
pub fn geteuid() -> u32 {
    // SAFETY: geteuid takes no arguments, touches no memory and cannot fail.
    unsafe { libc::geteuid() }
}

/// The effective group id of this process.
pub fn getegid() -> u32 {
    // SAFETY: getegid takes no arguments, touches no memory and cannot fail.
    unsafe { libc::getegid() }
}

/// The supplementary group ids of this process (the egid is not necessarily
/// among them; callers add it).
pub fn getgroups() -> io::Result<Vec<u32>> {
    loop {
        // SAFETY: with size 0 the list pointer is not accessed; the call only
        // returns the number of supplementary groups.
        let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
        if count < 0 {
            return Err(io::Error::last_os_error());
        }
        let capacity = usize::try_from(count).unwrap_or(0);
        let mut groups: Vec<libc::gid_t> = vec![0; capacity];
        // SAFETY: `groups` holds exactly `count` initialised gid_t slots and
        // we pass that same count, so the kernel writes inside the buffer.
        let got = unsafe { libc::getgroups(count, groups.as_mut_ptr()) };
        if got < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINVAL) {
                // The set grew between the two calls: measure again.
                continue;
            }
            return Err(err);
        }
        groups.truncate(usize::try_from(got).unwrap_or(0));
        return Ok(groups);
    }
}

/// The running kernel's release string (`uname -r`).
pub fn kernel_release() -> io::Result<String> {
    let mut uts = MaybeUninit::<libc::utsname>::uninit();
    // SAFETY: uname writes a complete `struct utsname` into the pointer it is
    // given; the pointer refers to storage of exactly that type and size.
    let ret = unsafe { libc::uname(uts.as_mut_ptr()) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: uname returned 0, so every field of the struct is initialised.
    let uts = unsafe { uts.assume_init() };
    // The field is NUL-terminated inside its fixed-size array; stop at the
    // terminator (or the array's end, should it be missing).
    let bytes: Vec<u8> = uts
        .release
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| c.to_ne_bytes()[0])
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `prctl(PR_SET_PDEATHSIG, sig)`: the kernel sends `sig` to this process
/// when its parent thread exits (set in a child between fork and exec, so a
/// killed engine takes its boundary process with it).
pub fn set_parent_death_signal(sig: i32) -> io::Result<()> {
    let sig =
        libc::c_ulong::try_from(sig).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: PR_SET_PDEATHSIG takes one integer argument (the signal) and
    // reads or writes no memory of ours; the trailing arguments are unused.
    let ret = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig, 0, 0, 0) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets this process's dumpable flag; returns the previous setting.
///
/// Not dumpable, `/proc/<pid>/{environ,mem,root}` and ptrace are closed to
/// every same-user process without CAP_SYS_PTRACE.
pub fn set_dumpable(on: bool) -> io::Result<bool> {
    // SAFETY: PR_GET_DUMPABLE takes no argument and returns an integer; no
    // memory is passed to or written by the kernel.
    let previous = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
    if previous < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: PR_SET_DUMPABLE takes one integer (0 or 1) and touches no
    // memory of ours.
    let ret = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, libc::c_ulong::from(on), 0, 0, 0) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(previous == 1)
}

/// `prctl(PR_SET_CHILD_SUBREAPER, on)`: orphaned descendants of this process
/// are re-parented to it (instead of to init or an outer subreaper), so it
/// can wait for them and kill them.
pub fn set_child_subreaper(on: bool) -> io::Result<()> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes one integer (0 or 1) and reads or
    // writes no memory of ours.
    let ret = unsafe {
        libc::prctl(
            libc::PR_SET_CHILD_SUBREAPER,
            libc::c_ulong::from(on),
            0,
            0,
            0,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `prctl(PR_GET_CHILD_SUBREAPER)`.
pub fn is_child_subreaper() -> io::Result<bool> {
    let mut value: libc::c_int = 0;
    // SAFETY: PR_GET_CHILD_SUBREAPER writes one int through the pointer it is
    // given; the pointer refers to a live, aligned c_int on our stack.
    let ret = unsafe {
        libc::prctl(
            libc::PR_GET_CHILD_SUBREAPER,
            &mut value as *mut libc::c_int,
            0,
            0,
            0,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value != 0)
}

/// `openat(dir, name, O_PATH | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC)`: one
/// step of a walk that follows no symbolic link. `name` must be a single
/// path component (not empty, no `/`, not `.` or `..`), else EINVAL.
///
/// O_DIRECTORY makes a symbolic link (not followed) or any non-directory an
/// ENOTDIR, and triggers an automount point the way a real lookup would.
pub fn open_dir_nofollow_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.contains(&b'/') || bytes == b"." || bytes == b".." {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let c = CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `dir` is a live descriptor borrowed for the call, `c` is a
    // NUL-terminated string that outlives it, and openat hands back either
    // -1 or a new descriptor; nothing else is read or written.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat just returned this descriptor to us; nothing else in the
    // process knows its number, so the OwnedFd is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Takes ownership of a descriptor this process INHERITED across exec (e.g.
/// a status pipe its parent opened) and sets FD_CLOEXEC on it, so nothing
/// this process executes inherits it.
///
/// Refused (EBADF) unless `fd` is >= 3 (not stdio, which std owns), open,
/// and without FD_CLOEXEC. The last condition is what makes the ownership
/// claim sound: every descriptor Rust code opens in this process (std,
/// the landlock crate, the kernel for a Landlock ruleset) carries
/// FD_CLOEXEC from birth, so one without it was inherited, and no value in
/// this process owns it; and since the flag is set here, a second call on
/// the same number is refused instead of creating a second owner.
pub fn adopt_inherited_fd(fd: i32) -> io::Result<OwnedFd> {
    if fd < 3 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: F_GETFD takes no argument and only reads the descriptor's
    // flags; an unopened number answers EBADF.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & libc::FD_CLOEXEC != 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: F_SETFD takes one integer (the new descriptor flags) and
    // touches no memory of ours.
    let ret = unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor is open (F_GETFD answered) and was inherited
    // (it lacked FD_CLOEXEC, which every descriptor opened by Rust code in
    // this process has), so no other value owns it; the flag just set makes
    // any later adoption of the same number fail above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether FD_CLOEXEC is set on `fd`.
pub fn is_cloexec(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: F_GETFD on a borrowed, live descriptor only reads its flags.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags & libc::FD_CLOEXEC != 0)
}

/// Whether `fd` has something to read or its writer is gone (end of input,
/// an error), waiting at most `timeout_ms` milliseconds (0: only look).
pub fn poll_readable(fd: BorrowedFd<'_>, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: poll reads and writes exactly one pollfd, the one on our
        // stack that outlives the call (nfds = 1); the descriptor is
        // borrowed, so it stays open for the call.
        let ret = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if ret < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(err);
        }
        return Ok(ret > 0 && pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0);
    }
}

/// A set of signals, built from signal numbers.
#[derive(Clone, Copy)]
pub struct SignalSet(libc::sigset_t);

impl SignalSet {
    pub fn new(signals: &[i32]) -> io::Result<Self> {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the whole sigset_t it is pointed at;
        // the pointer refers to storage of exactly that type.
        if unsafe { libc::sigemptyset(set.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: sigemptyset returned 0, so the set is initialised.
        let mut set = unsafe { set.assume_init() };
        for &sig in signals {
            // SAFETY: `set` is an initialised sigset_t we own; an invalid
            // signal number answers EINVAL without touching it.
            if unsafe { libc::sigaddset(&mut set, sig) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(SignalSet(set))
    }
}

/// Sets the disposition of `sig` to SIG_DFL (undoing an inherited SIG_IGN:
/// an ignored SIGCHLD would make the kernel reap children on its own).
pub fn set_default_disposition(sig: i32) -> io::Result<()> {
    // SAFETY: an all-zero sigaction is valid (no flags, empty mask); we then
    // set its handler to SIG_DFL, a constant, not a function of ours.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = libc::SIG_DFL;
    // SAFETY: `action` is a fully initialised sigaction that outlives the
    // call; the old action is not requested (NULL).
    let ret = unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Adds `set` to the calling thread's blocked signals, so they stay pending
/// until [`wait_signal`] takes them. (std resets the mask in every child it
/// spawns, so the command does not inherit the blocking.)
pub fn block_signals(set: &SignalSet) -> io::Result<()> {
    // SAFETY: `set.0` is an initialised sigset_t that outlives the call; the
    // previous mask is not requested (NULL).
    let ret = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set.0, std::ptr::null_mut()) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    Ok(())
}

/// A signal taken by [`wait_signal`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    pub signal: i32,
    /// `si_code == SI_KERNEL`: generated by the kernel itself, e.g. by a
    /// terminal for its whole foreground process group (Ctrl-C), rather
    /// than sent by a process with kill(2).
    pub from_kernel: bool,
}

/// Takes one pending signal of `set` (which must be blocked), waiting up to
/// `timeout` (`None`: until one arrives). `Ok(None)` on timeout or when
/// another signal interrupted the wait.
pub fn wait_signal(set: &SignalSet, timeout: Option<Duration>) -> io::Result<Option<Received>> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(t.subsec_nanos()),
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    let mut info = MaybeUninit::<libc::siginfo_t>::zeroed();
    // SAFETY: `set.0` is initialised; `ts_ptr` is NULL or points to a
    // timespec on our stack that outlives the call; `info` is storage of
    // exactly a siginfo_t, which the kernel fills when a signal is taken.
    let ret = unsafe { libc::sigtimedwait(&set.0, info.as_mut_ptr(), ts_ptr) };
    if ret < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(err),
        };
    }
    // SAFETY: the storage was zero-initialised (a valid siginfo_t) and the
    // kernel has just written the taken signal's record into it.
    let info = unsafe { info.assume_init() };
    Ok(Some(Received {
        signal: ret,
        from_kernel: info.si_code == libc::SI_KERNEL,
    }))
}

/// How a child ended, from `waitpid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildEnd {
    Exited(i32),
    Signaled(i32),
}

impl ChildEnd {
    /// The shell convention: the exit status, or 128 + the signal.
    pub fn code(self) -> i32 {
        match self {
            ChildEnd::Exited(c) => c,
            ChildEnd::Signaled(s) => 128 + s,
        }
    }
}

/// `waitpid(-1, WNOHANG)`: `Ok(Some((pid, end)))` for a child that ended,
/// `Ok(None)` when children remain but none has ended, `Err` (ECHILD) when
/// there is no child left.
pub fn wait_any_nohang() -> io::Result<Option<(i32, ChildEnd)>> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid writes one int through the pointer, which refers to
        // a live c_int on our stack.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(err);
        }
        if pid == 0 {
            return Ok(None);
        }
        let end = if libc::WIFEXITED(status) {
            ChildEnd::Exited(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            ChildEnd::Signaled(libc::WTERMSIG(status))
        } else {
            // Without WUNTRACED/WCONTINUED only the two above are reported.
            continue;
        };
        return Ok(Some((pid, end)));
    }
}

/// `kill(pid, sig)`. A pid <= 0 (a process group, or every process) is
/// refused with EINVAL: callers name one process.
pub fn send_signal(pid: i32, sig: i32) -> io::Result<()> {
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: kill takes two integers and touches no memory of ours.
    let ret = unsafe { libc::kill(pid, sig) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Arranges, between fork and exec, the child a supervisor spawns with
/// `cmd`:
/// * its signal mask is emptied: std passes the parent's mask on, and the
///   supervisor blocks the signals it takes synchronously, which the
///   command must receive normally;
/// * PR_SET_PDEATHSIG=SIGKILL, so a supervisor killed with SIGKILL still
///   takes its command with it (and if the supervisor is already gone when
///   the flag is set, the spawn fails instead of running an orphan);
/// * with `nested_domain` (a Landlock ruleset descriptor, created by the
///   parent), `landlock_restrict_self` on it: the command starts in a domain
///   nested inside the supervisor's. The descriptor is close-on-exec (the
///   kernel creates ruleset descriptors so), so the command never holds it.
pub fn prepare_supervised_child(
    cmd: &mut Command,
    nested_domain: Option<OwnedFd>,
) -> io::Result<()> {
    let parent = libc::pid_t::try_from(std::process::id())
        .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
    let empty = SignalSet::new(&[])?;
    let hook = move || -> io::Result<()> {
        // Between fork and exec: only async-signal-safe calls, no allocation
        // (an io::Error built from an errno does not allocate).
        // SAFETY: `empty.0` is an initialised sigset_t copied into this
        // closure; the old mask is not requested (NULL).
        let ret =
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &empty.0, std::ptr::null_mut()) };
        if ret != 0 {
            return Err(io::Error::from_raw_os_error(ret));
        }
        let sigkill = libc::c_ulong::try_from(libc::SIGKILL).unwrap_or(9);
        // SAFETY: PR_SET_PDEATHSIG takes one integer and touches no memory.
        let ret = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sigkill, 0, 0, 0) };
        if ret != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: getppid takes no arguments and cannot fail.
        if unsafe { libc::getppid() } != parent {
            // The supervisor died before the flag was set: nobody would
            // signal this process, so it must not run.
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        if let Some(ruleset) = &nested_domain {
            // landlock_restrict_self needs no_new_privs: under `exec` it is
            // inherited from the supervisor (set when it restricted itself);
            // under `reap` it is set here, for the command only.
            // SAFETY: PR_SET_NO_NEW_PRIVS takes one integer and touches no
            // memory.
            let ret = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            if ret != 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: landlock_restrict_self takes a ruleset descriptor (live:
            // owned by this closure) and a flags integer (0); it reads or
            // writes no memory of ours.
            let ret = unsafe {
                libc::syscall(
                    libc::SYS_landlock_restrict_self,
                    ruleset.as_raw_fd(),
                    0 as libc::c_uint,
                )
            };
            if ret != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec and calls only
    // pthread_sigmask, prctl, getppid and landlock_restrict_self (raw system
    // calls, async-signal-safe); it allocates nothing, takes no lock and
    // touches no state shared with the parent (its captures are two plain
    // values and a descriptor moved into the closure).
    unsafe {
        cmd.pre_exec(hook);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn dumpable_is_reported_and_restored() {
        let was = set_dumpable(false).unwrap();
        assert!(!set_dumpable(false).unwrap());
        assert!(!set_dumpable(was).unwrap());
        assert_eq!(set_dumpable(was).unwrap(), was);
    }

    #[test]
    fn walk_step_refuses_links_files_and_non_components() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        std::fs::write(tmp.path().join("f"), b"").unwrap();
        std::os::unix::fs::symlink("d", tmp.path().join("l")).unwrap();
        let base = std::fs::File::open(tmp.path()).unwrap();
        let at = |name: &str| open_dir_nofollow_at(base.as_fd(), OsStr::new(name));
        assert!(at("d").is_ok());
        assert_eq!(at("l").unwrap_err().raw_os_error(), Some(libc::ENOTDIR));
        assert_eq!(at("f").unwrap_err().raw_os_error(), Some(libc::ENOTDIR));
        assert_eq!(at("nope").unwrap_err().raw_os_error(), Some(libc::ENOENT));
        for bad in ["", ".", "..", "d/x", "a\0b"] {
            assert_eq!(
                at(bad).unwrap_err().raw_os_error(),
                Some(libc::EINVAL),
                "{bad:?}"
            );
        }
        let fd = at("d").unwrap();
        assert!(is_cloexec(fd.as_fd()).unwrap());
    }

    #[test]
    fn adopting_refuses_stdio_unopened_and_owned_descriptors() {
        assert_eq!(
            adopt_inherited_fd(1).unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
        assert_eq!(
            adopt_inherited_fd(-4).unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
        assert_eq!(
            adopt_inherited_fd(999_999).unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
        // A descriptor std opened carries FD_CLOEXEC: never adopted twice.
        let f = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(
            adopt_inherited_fd(f.as_raw_fd())
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EBADF)
        );
    }

    #[test]
    fn signal_and_kill_reject_bad_arguments() {
        assert!(SignalSet::new(&[libc::SIGTERM, libc::SIGCHLD]).is_ok());
        assert!(SignalSet::new(&[4096]).is_err());
        assert_eq!(
            send_signal(0, 0).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            send_signal(-1, 0).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        send_signal(i32::try_from(std::process::id()).unwrap(), 0).unwrap();
        assert_eq!(ChildEnd::Exited(7).code(), 7);
        assert_eq!(ChildEnd::Signaled(9).code(), 137);
    }

    #[test]
    fn poll_sees_data_and_end_of_input_but_not_an_idle_pipe() {
        use std::io::Write;
        let (r, mut w) = std::io::pipe().unwrap();
        assert!(!poll_readable(r.as_fd(), 0).unwrap());
        assert!(!poll_readable(r.as_fd(), 20).unwrap());
        w.write_all(b"x").unwrap();
        assert!(poll_readable(r.as_fd(), 0).unwrap());
        let (r2, w2) = std::io::pipe().unwrap();
        drop(w2);
        assert!(poll_readable(r2.as_fd(), 0).unwrap());
    }

    #[test]
    fn subreaper_flag_is_set_and_read_back() {
        let was = is_child_subreaper().unwrap();
        set_child_subreaper(true).unwrap();
        assert!(is_child_subreaper().unwrap());
        set_child_subreaper(was).unwrap();
        assert_eq!(is_child_subreaper().unwrap(), was);
    }

    #[test]
    fn parent_death_signal_rejects_a_negative_signal() {
        assert_eq!(
            set_parent_death_signal(-1).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
    }
}
