//! Refusals: a class from the closed table, a message with the measured
//! numbers, a remediation. Printed exactly as the Python CLI prints them:
//!
//! ```text
//! refused [CLASS]: MESSAGE
//! fix: REMEDIATION
//! ```
//!
//! Every refusal exits 3.
#![forbid(unsafe_code)]

use std::fmt;
use std::path::Path;

use saphan_core::custody::NOT_ASSERTED;
use saphan_core::{BinaryCustodyError, LandlockError, PolicyError};

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
        if let LandlockError::PathOpen { path, source } = e {
            if source.kind() == std::io::ErrorKind::NotFound && workdir.starts_with(path) {
                return Refusal::workdir_missing(workdir, &source.to_string());
            }
        }
        Refusal::new(e.refusal_class(), e.to_string(), e.remediation())
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
