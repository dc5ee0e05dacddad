//! Refusals: a class from the closed table, a message with the measured
//! numbers, a remediation. Printed exactly as the Python CLI prints them:
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
use std::path::Path;

use saphan_core::custody::NOT_ASSERTED;
use saphan_core::{BinaryCustodyError, GrantError, LandlockError, PolicyError};

/// The single exit code of every refusal.
pub const EXIT_REFUSED: u8 = 3;

#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub class: &'static str,
    pub message: String,
    pub fix: String,
    /// Lines printed after `fix:` (custody refusals state what is not asserted).
    pub notes: Vec<String>,
}

impl Refusal {
    pub fn new(class: &'static str, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Refusal {
            class,
            message: message.into(),
            fix: fix.into(),
            notes: Vec::new(),
        }
    }

    pub fn policy(e: &PolicyError) -> Self {
        Refusal::new(
            "policy-invalid",
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
            "workdir-unsafe",
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
            "workdir-missing",
            format!(
                "the working directory {} is not usable on this machine: {why}",
                workdir.display()
            ),
            "create the working directory on this machine (the preflight dial proves it \
             exists) and dispatch the run again; the launcher never recreates it",
        )
    }

    pub fn custody(e: &BinaryCustodyError) -> Self {
        let fix = match e {
            BinaryCustodyError::Unsafe(v) => v.remediation(),
            BinaryCustodyError::Unmeasurable { .. } => {
                "run the launcher from an installed file this process can stat (and its parent \
                 directory)"
                    .to_owned()
            }
        };
        let mut r = Refusal::new("custody-binary-unsafe", e.to_string(), fix);
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
        let r = Refusal::new("seat-full", "m", "f");
        assert_eq!(r.to_string(), "refused [seat-full]: m\nfix: f");
    }

    #[test]
    fn status_line_is_one_line() {
        let r = Refusal::new("workdir-unsafe", "a\nb", "f");
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
        assert_eq!(r.class, "workdir-missing");
        assert!(r.message.contains("/far does not exist"), "{}", r.message);
        let e = LandlockError::Grant(GrantError::Missing {
            path: PathBuf::from("/home/a/.claude/projects/x"),
            component: PathBuf::from("/home/a/.claude"),
        });
        let r = Refusal::landlock(&e, Path::new("/far/wd"));
        assert_eq!(r.class, "policy-invalid");
        assert_eq!(r.message, e.to_string());
    }

    #[test]
    fn below_floor_names_the_measured_level() {
        let r = Refusal::landlock(&LandlockError::BelowFloor { measured: 2 }, Path::new("/w"));
        assert_eq!(r.class, "landlock-below-floor");
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
                "workdir-missing"
            );
        }
        let e = LandlockError::PathOpen {
            path: PathBuf::from("/home/a/.claude/projects/x"),
            source: nf(),
        };
        assert_eq!(
            Refusal::landlock(&e, Path::new("/far/wd")).class,
            "policy-invalid"
        );
    }
}
