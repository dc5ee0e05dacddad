//! saphan-core: the security-critical code shared by the PyO3 module
//! (`saphan._native`) and the `saphan-launcher` binary, so the same Rust
//! decides on both sides.
//!
//! * [`landlock`] — ABI measurement and the write boundary;
//! * [`policy`] — the one JSON value the engine sends to the launcher;
//! * [`digest`] — streaming SHA-256;
//! * [`custody`] — the four custody clauses and key-file custody;
//! * [`process`] — the dumpable flag and the parent-death signal.
//!
//! `unsafe` is confined to the private `sys` module (raw syscalls); every
//! other module carries `#![forbid(unsafe_code)]`.

pub mod custody;
pub mod digest;
pub mod landlock;
pub mod policy;
mod sys;

/// Process attributes the engine sets on itself and on a child between fork
/// and exec: the safe face of the `prctl` wrappers in `sys`.
pub mod process {
    pub use crate::sys::{set_dumpable, set_parent_death_signal};
}

use std::fmt;
use std::io;
use std::path::PathBuf;

pub use custody::{
    BinaryCustodyError, Caller, Clause, CustodyViolation, KeyCustodyError, StatFacts,
};
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
