//! The raw system calls saphan-core needs that std does not wrap.
//!
//! This is the only module of the crate that may contain `unsafe`. Each call
//! is a thin wrapper that turns the C convention (return value + errno) into a
//! Rust value; no pointer escapes a wrapper.
#![allow(unsafe_code)]

use std::io;
use std::mem::MaybeUninit;

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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn dumpable_is_reported_and_restored() {
        let was = set_dumpable(false).unwrap();
        assert!(!set_dumpable(false).unwrap());
        assert!(!set_dumpable(was).unwrap());
        assert_eq!(set_dumpable(was).unwrap(), was);
    }

    #[test]
    fn parent_death_signal_rejects_a_negative_signal() {
        assert_eq!(
            set_parent_death_signal(-1).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
    }
}
