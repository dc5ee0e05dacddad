//! saphan-core: the security-critical code shared by the PyO3 module
//! (`saphan._native`) and the `saphan-launcher` binary, so the same Rust
//! decides on both sides.
//!
//! * [`landlock`] — ABI measurement and the write boundary;
//! * [`policy`] — the one JSON value the engine sends to the launcher;
//! * [`digest`] — streaming SHA-256;
//! * [`custody`] — the four custody clauses and key-file custody;
//! * [`grant`] — the one rule for a writable directory grant (no symbolic
//!   link anywhere on its path), shared by both lanes;
//! * [`process`] — the dumpable flag, the parent-death signal, and what a
//!   supervisor needs (subreaper, signals, wait, kill, an inherited status
//!   descriptor).
//!
//! `unsafe` is confined to the private `sys` module (raw syscalls); every
//! other module carries `#![forbid(unsafe_code)]`.

pub mod custody;
pub mod digest;
pub mod grant;
pub mod landlock;
pub mod policy;
mod sys;

/// Process attributes the engine sets on itself and on a child between fork
/// and exec, and what the launcher's supervisor needs (child subreaper,
/// blocked signals taken synchronously, waitpid, kill, an inherited status
/// descriptor): the safe face of the wrappers in `sys`.
pub mod process {
    pub use crate::sys::{
        adopt_inherited_fd, block_signals, is_child_subreaper, is_cloexec,
        prepare_supervised_child, send_signal, set_child_subreaper, set_default_disposition,
        set_dumpable, set_parent_death_signal, wait_any_nohang, wait_signal, ChildEnd, SignalSet,
    };
    /// The signal numbers the supervisor uses (so the launcher needs no libc).
    pub use libc::{SIGCHLD, SIGHUP, SIGINT, SIGKILL, SIGTERM};
}

use std::fmt;
use std::io;
use std::path::PathBuf;

pub use custody::{
    BinaryCustodyError, Caller, Clause, CustodyViolation, KeyCustodyError, StatFacts,
};
pub use grant::{check_grant_dir, GrantError};
pub use landlock::{Abi, AbiProbe, LandlockError};
pub use policy::{Policy, PolicyError};

/// The crate version (the workspace's shared version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The running kernel's release string (`uname -r`).
pub fn kernel_release() -> io::Result<String> {
    sys::kernel_release()
}

/// Every error saphan-core returns, with one `From` per module error so that
/// each seam (launcher, PyO3 module) translates exactly one type.
#[derive(Debug)]
pub enum Error {
    Landlock(LandlockError),
    Policy(PolicyError),
    BinaryCustody(BinaryCustodyError),
    KeyCustody(KeyCustodyError),
    Io { path: PathBuf, source: io::Error },
}

impl Error {
    /// The refusal class (SPEC.md §4) when this error is a refusal; `None`
    /// for plain I/O errors.
    pub fn refusal_class(&self) -> Option<&'static str> {
        match self {
            Error::Landlock(e) => Some(e.refusal_class()),
            Error::Policy(_) => Some("policy-invalid"),
            Error::BinaryCustody(_) => Some("custody-binary-unsafe"),
            Error::KeyCustody(e) if e.is_custody() => Some("custody-key-unsafe"),
            Error::KeyCustody(_) | Error::Io { .. } => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Landlock(e) => e.fmt(f),
            Error::Policy(e) => e.fmt(f),
            Error::BinaryCustody(e) => e.fmt(f),
            Error::KeyCustody(e) => e.fmt(f),
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Landlock(e) => Some(e),
            Error::Policy(e) => Some(e),
            Error::BinaryCustody(e) => Some(e),
            Error::KeyCustody(e) => Some(e),
            Error::Io { source, .. } => Some(source),
        }
    }
}

impl From<LandlockError> for Error {
    fn from(e: LandlockError) -> Self {
        Error::Landlock(e)
    }
}

impl From<PolicyError> for Error {
    fn from(e: PolicyError) -> Self {
        Error::Policy(e)
    }
}

impl From<BinaryCustodyError> for Error {
    fn from(e: BinaryCustodyError) -> Self {
        Error::BinaryCustody(e)
    }
}

impl From<KeyCustodyError> for Error {
    fn from(e: KeyCustodyError) -> Self {
        Error::KeyCustody(e)
    }
}
