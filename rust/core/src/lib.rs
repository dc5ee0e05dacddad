//! saphan-core: the security-critical code shared by the PyO3 module
//! (`saphan._native`) and the `saphan-launcher` binary, so the same Rust
//! decides on both sides.
//!
//! * [`landlock`] — ABI measurement and the write boundary;
//! * [`policy`] — the one JSON value the engine sends to the launcher;
//! * [`digest`] — streaming SHA-256, and a file verified against a digest;
//! * [`binary_custody`] — the four custody clauses (SPEC.md §7): who can
//!   replace the binary that is running;
//! * [`secret_file`] — custody-checked reads of the record key, lane
//!   credential files and the lanes file;
//! * [`refusal`] — the closed table of refusal classes ([`RefusalClass`]);
//! * [`grant`] — the one rule for a writable directory grant (no symbolic
//!   link anywhere on its path), shared by both lanes;
//! * [`process`] — the dumpable flag, the parent-death signal, and what a
//!   supervisor needs (subreaper, signals, wait, kill, an inherited status
//!   descriptor).
//!
//! The private `file_facts` module holds what the custody checks, the grant
//! rule and the Landlock rule builder share: open without following a final
//! link, fstat the descriptor, name a file's kind, owner and mode.
//!
//! `unsafe` is confined to the private `sys` module (raw syscalls); every
//! other module carries `#![forbid(unsafe_code)]`.

pub mod binary_custody;
pub mod digest;
mod file_facts;
pub mod grant;
pub mod landlock;
pub mod policy;
pub mod refusal;
pub mod secret_file;
mod sys;

/// Process attributes the engine sets on itself and on a child between fork
/// and exec, and what the launcher's supervisor needs (child subreaper,
/// blocked signals taken synchronously, waitpid, kill, an inherited status
/// descriptor): the safe face of the wrappers in `sys`.
pub mod process {
    pub use crate::sys::{
        adopt_inherited_fd, block_signals, is_child_subreaper, is_cloexec, poll_readable,
        prepare_supervised_child, send_signal, set_child_subreaper, set_default_disposition,
        set_dumpable, set_parent_death_signal, wait_any_nohang, wait_signal, ChildEnd, SignalSet,
    };
    /// The signal numbers the supervisor uses (so the launcher needs no libc).
    pub use libc::{SIGCHLD, SIGHUP, SIGINT, SIGKILL, SIGTERM, SIGUSR2};
}

use std::fmt;
use std::io;
use std::path::PathBuf;

pub use binary_custody::{BinaryCustodyError, Caller, Clause, CustodyViolation, StatFacts};
pub use grant::{check_grant_dir, GrantError};
pub use landlock::{Abi, AbiProbe, LandlockError};
pub use policy::{Policy, PolicyError};
pub use refusal::RefusalClass;
pub use secret_file::{KeyCustodyError, SecretKind};

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
    pub fn refusal_class(&self) -> Option<RefusalClass> {
        match self {
            Error::Landlock(e) => Some(e.refusal_class()),
            Error::Policy(e) => Some(e.refusal_class()),
            Error::BinaryCustody(e) => Some(e.refusal_class()),
            Error::KeyCustody(e) => e.refusal_class(),
            Error::Io { .. } => None,
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn each_error_names_its_refusal_class() {
        let io = || io::Error::from_raw_os_error(libc::EACCES);
        let p = || PathBuf::from("/p");
        let cases: Vec<(Error, Option<RefusalClass>)> = vec![
            (
                LandlockError::BelowFloor { measured: 2 }.into(),
                Some(RefusalClass::LandlockBelowFloor),
            ),
            (
                policy::parse("{}").unwrap_err().into(),
                Some(RefusalClass::PolicyInvalid),
            ),
            (
                BinaryCustodyError::Unmeasurable {
                    path: p(),
                    source: io(),
                }
                .into(),
                Some(RefusalClass::CustodyBinaryUnsafe),
            ),
            (
                KeyCustodyError::Empty {
                    what: SecretKind::Key,
                    path: p(),
                }
                .into(),
                Some(RefusalClass::CustodyKeyUnsafe),
            ),
            (
                KeyCustodyError::Io {
                    path: p(),
                    source: io(),
                }
                .into(),
                None,
            ),
            (
                Error::Io {
                    path: p(),
                    source: io(),
                },
                None,
            ),
        ];
        for (e, class) in cases {
            assert_eq!(e.refusal_class(), class, "{e:?}");
        }
    }
}
