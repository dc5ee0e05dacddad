//! Refusals: a class from the closed table (a
//! [`saphan_core::RefusalClass`], never a bare string), a message with the
//! measured numbers, a remediation. Printed exactly as the Python CLI prints
//! them:
//!
//! ```text
//! refused [CLASS]: MESSAGE
//! fix: REMEDIATION
//! ```
//!
//! On the status descriptor (`--status-fd`) the same refusal is one line,
//! `saphan-launcher: refused [CLASS] MESSAGE` ([`Refusal::status_line`]).
//!
//! Every refusal exits 3.
#![forbid(unsafe_code)]

use std::fmt;
use std::net::SocketAddrV4;
use std::path::Path;

use saphan_core::binary_custody::NOT_ASSERTED;
use saphan_core::{BinaryCustodyError, GrantError, LandlockError, PolicyError, RefusalClass};

/// The single exit code of every refusal.
pub const EXIT_REFUSED: u8 = 3;

/// What to do when the running launcher is not the expected one.
const SELF_DIGEST_FIX: &str =
    "deliver the launcher to this machine again (`saphan machine deliver \
     <machine> --probe`) and dispatch the run again; if it recurs, investigate the host: \
     something there replaced the launcher after it was delivered";

#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub class: RefusalClass,
    pub message: String,
    pub fix: String,
    /// Lines printed after `fix:` (custody refusals state what is not asserted).
    pub notes: Vec<String>,
}

impl Refusal {
    pub fn new(class: RefusalClass, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Refusal {
            class,
            message: message.into(),
            fix: fix.into(),
            notes: Vec::new(),
        }
    }

    pub fn policy(e: &PolicyError) -> Self {
        Refusal::new(
            e.refusal_class(),
            e.to_string(),
            format!(
                "send one JSON object with exactly the keys version (1), workdir, writable, \
                 readable (\"everything\") and optionally agent_sha256; this launcher is \
                 saphan-launcher {}",
                saphan_core::VERSION
            ),
        )
    }

    /// A Landlock error, with a missing workdir (or a missing directory above
    /// it) reported as `workdir-missing`.
    pub fn landlock(e: &LandlockError, workdir: &Path) -> Self {
        match e {
            LandlockError::PathOpen { path, source }
                if source.kind() == std::io::ErrorKind::NotFound && workdir.starts_with(path) =>
            {
                return Refusal::workdir_missing(workdir, &source.to_string());
            }
            LandlockError::Grant(g @ GrantError::Missing { path, .. })
                if workdir.starts_with(path) =>
            {
                return Refusal::workdir_missing(workdir, &g.to_string());
            }
            _ => {}
        }
        Refusal::new(e.refusal_class(), e.to_string(), e.remediation())
    }

    /// The working directory holds something the launcher will not follow
    /// (a symbolic link or a non-directory where its scratch directory goes).
    pub fn workdir_unsafe(workdir: &Path, why: &str, fix: &str) -> Self {
        Refusal::new(
            RefusalClass::WorkdirUnsafe,
            format!(
                "the working directory {} is not safe to run in: {why}",
                workdir.display()
            ),
            fix,
        )
    }

    /// The one-line form written to the status descriptor.
    pub fn status_line(&self) -> String {
        let one_line = |s: &str| s.replace(['\n', '\r'], " ");
        format!(
            "saphan-launcher: refused [{}] {}",
            self.class,
            one_line(&self.message)
        )
    }

    pub fn workdir_missing(workdir: &Path, why: &str) -> Self {
        Refusal::new(
            RefusalClass::WorkdirMissing,
            format!(
                "the working directory {} is not usable on this machine: {why}",
                workdir.display()
            ),
            "create the working directory on this machine (the preflight dial proves it \
             exists) and dispatch the run again; the launcher never recreates it",
        )
    }

    /// The running launcher (`exe`, i.e. `/proc/self/exe`) is not the one
    /// the engine expects (`--expect-sha256`).
    pub fn self_digest_mismatch(exe: &Path, actual: &str, expected: &str) -> Self {
        Refusal::new(
            RefusalClass::DigestMismatch,
            format!(
                "the running launcher {} has sha256 {actual}, the engine expects sha256 \
                 {expected}",
                exe.display()
            ),
            SELF_DIGEST_FIX,
        )
    }

    /// The running launcher cannot be read, so it cannot prove what it is:
    /// refused like a mismatch.
    pub fn self_digest_unreadable(exe: &Path, expected: &str, e: &std::io::Error) -> Self {
        Refusal::new(
            RefusalClass::DigestMismatch,
            format!(
                "the running launcher {} cannot be read to verify its sha256 (the engine \
                 expects sha256 {expected}): {e}; a launcher that cannot be verified runs nothing",
                exe.display()
            ),
            SELF_DIGEST_FIX,
        )
    }

    /// `--bridge`: the port cannot be listened on (in a run's own network
    /// namespace nothing else should hold it).
    pub fn bridge_cannot_listen(addr: SocketAddrV4, e: &std::io::Error) -> Self {
        Refusal::new(
            RefusalClass::EgressUncuttable,
            format!(
                "the egress bridge cannot listen on {addr}: {e}; without it the run has no way \
                 to its door, so nothing runs"
            ),
            format!(
                "the bridge listens in the run's own network namespace, where nothing else \
                 holds {addr}: dispatch the run again; if it recurs, report this message with \
                 how the jail was built (it must unshare the network)"
            ),
        )
    }

    /// `--bridge`: the door's unix socket cannot be connected to.
    pub fn bridge_door_unreachable(socket: &Path, e: &std::io::Error) -> Self {
        Refusal::new(
            RefusalClass::EgressUncuttable,
            format!(
                "the egress bridge cannot connect to the door's unix socket {}: {e}; without \
                 it the run has no way out, so nothing runs",
                socket.display()
            ),
            "the door is served by saphan outside the jail and bound into it at this path: \
             check that the run's door is still serving and that its socket is bound into the \
             jail there, then dispatch the run again",
        )
    }

    /// The running binary failed its custody check (or could not be
    /// measured); the refusal also states what the check does not assert.
    pub fn custody(e: &BinaryCustodyError) -> Self {
        let (message, fix) = e.describe();
        let mut r = Refusal::new(e.refusal_class(), message, fix);
        r.notes.push(NOT_ASSERTED.to_owned());
        r
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "refused [{}]: {}\nfix: {}",
            self.class, self.message, self.fix
        )?;
        for note in &self.notes {
            write!(f, "\n{note}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn format_matches_the_python_cli() {
        let r = Refusal::new(RefusalClass::SeatFull, "m", "f");
        assert_eq!(r.to_string(), "refused [seat-full]: m\nfix: f");
    }

    #[test]
    fn every_class_prints_its_table_name() {
        for class in RefusalClass::ALL {
            let r = Refusal::new(class, "m", "f");
            let name = class.as_str();
            assert_eq!(r.to_string(), format!("refused [{name}]: m\nfix: f"));
            assert_eq!(
                r.status_line(),
                format!("saphan-launcher: refused [{name}] m")
            );
        }
    }

    #[test]
    fn an_unmeasurable_binary_is_refused_with_its_fix_and_the_note() {
        let e = BinaryCustodyError::Unmeasurable {
            path: PathBuf::from("/proc/self/exe"),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        let r = Refusal::custody(&e);
        assert_eq!(r.class, RefusalClass::CustodyBinaryUnsafe);
        assert_eq!(
            r.to_string(),
            format!(
                "refused [custody-binary-unsafe]: the custody of /proc/self/exe cannot be \
                 measured: entity not found\nfix: run the launcher from an installed file this \
                 process can stat (and its parent directory)\n{NOT_ASSERTED}"
            )
        );
    }

    #[test]
    fn a_self_digest_refusal_names_both_digests_and_the_running_file() {
        let (actual, expected) = ("a".repeat(64), "b".repeat(64));
        let exe = Path::new("/proc/self/exe");
        let r = Refusal::self_digest_mismatch(exe, &actual, &expected);
        assert_eq!(r.class, RefusalClass::DigestMismatch);
        assert_eq!(
            r.status_line(),
            format!(
                "saphan-launcher: refused [digest-mismatch] the running launcher /proc/self/exe \
                 has sha256 {actual}, the engine expects sha256 {expected}"
            )
        );
        assert!(
            r.fix.contains("`saphan machine deliver <machine> --probe`"),
            "{}",
            r.fix
        );
        assert!(r.fix.contains("investigate the host"), "{}", r.fix);

        let e = std::io::Error::from(std::io::ErrorKind::NotFound);
        let r = Refusal::self_digest_unreadable(exe, &expected, &e);
        assert_eq!(r.class, RefusalClass::DigestMismatch);
        assert!(
            r.message.starts_with(&format!(
                "the running launcher /proc/self/exe cannot be read to verify its sha256 (the \
                 engine expects sha256 {expected}): "
            )),
            "{}",
            r.message
        );
        assert!(r
            .message
            .ends_with("; a launcher that cannot be verified runs nothing"));
        assert_eq!(r.fix, Refusal::self_digest_mismatch(exe, "", "").fix);
    }

    #[test]
    fn bridge_refusals_are_egress_uncuttable_naming_the_address_or_path_and_the_error() {
        let addr = SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 3128);
        let e = std::io::Error::from_raw_os_error(98);
        let r = Refusal::bridge_cannot_listen(addr, &e);
        assert_eq!(r.class, RefusalClass::EgressUncuttable);
        assert!(
            r.status_line().starts_with(&format!(
                "saphan-launcher: refused [egress-uncuttable] the egress bridge cannot listen \
                 on 127.0.0.1:3128: {e}"
            )),
            "{}",
            r.status_line()
        );
        assert!(r.fix.contains("127.0.0.1:3128"), "{}", r.fix);

        let e = std::io::Error::from(std::io::ErrorKind::NotFound);
        let r = Refusal::bridge_door_unreachable(Path::new("/run/door.sock"), &e);
        assert_eq!(r.class, RefusalClass::EgressUncuttable);
        assert!(
            r.message.starts_with(&format!(
                "the egress bridge cannot connect to the door's unix socket /run/door.sock: {e}"
            )),
            "{}",
            r.message
        );
        assert!(r.fix.contains("bound into the jail"), "{}", r.fix);
    }

    #[test]
    fn status_line_is_one_line() {
        let r = Refusal::new(RefusalClass::WorkdirUnsafe, "a\nb", "f");
        assert_eq!(
            r.status_line(),
            "saphan-launcher: refused [workdir-unsafe] a b"
        );
    }

    #[test]
    fn a_missing_grant_above_the_workdir_is_workdir_missing() {
        let e = LandlockError::Grant(GrantError::Missing {
            path: PathBuf::from("/far/wd"),
            component: PathBuf::from("/far"),
        });
        let r = Refusal::landlock(&e, Path::new("/far/wd"));
        assert_eq!(r.class, RefusalClass::WorkdirMissing);
        assert!(r.message.contains("/far does not exist"), "{}", r.message);
        let e = LandlockError::Grant(GrantError::Missing {
            path: PathBuf::from("/home/a/.claude/projects/x"),
            component: PathBuf::from("/home/a/.claude"),
        });
        let r = Refusal::landlock(&e, Path::new("/far/wd"));
        assert_eq!(r.class, RefusalClass::PolicyInvalid);
        assert_eq!(r.message, e.to_string());
    }

    #[test]
    fn below_floor_names_the_measured_level() {
        let r = Refusal::landlock(&LandlockError::BelowFloor { measured: 2 }, Path::new("/w"));
        assert_eq!(r.class, RefusalClass::LandlockBelowFloor);
        assert_eq!(
            r.message,
            "this kernel measures landlock abi=2, the floor is 3"
        );
        assert!(r.fix.contains("6.2"));
    }

    #[test]
    fn a_missing_workdir_or_ancestor_is_workdir_missing() {
        let nf = || std::io::Error::from(std::io::ErrorKind::NotFound);
        for path in ["/far/wd", "/far"] {
            let e = LandlockError::PathOpen {
                path: PathBuf::from(path),
                source: nf(),
            };
            assert_eq!(
                Refusal::landlock(&e, Path::new("/far/wd")).class,
                RefusalClass::WorkdirMissing
            );
        }
        let e = LandlockError::PathOpen {
            path: PathBuf::from("/home/a/.claude/projects/x"),
            source: nf(),
        };
        assert_eq!(
            Refusal::landlock(&e, Path::new("/far/wd")).class,
            RefusalClass::PolicyInvalid
        );
    }
}
