//! The one rule for a writable directory grant, shared by both lanes: the
//! bubblewrap composer (through `saphan._native.check_grant_dir`) and the
//! Landlock launcher (`landlock::apply_domain`).
//!
//! A directory may be granted only when its path is absolute and normalised
//! and walking it from `/`, one component at a time, with
//! `openat(O_PATH | O_NOFOLLOW | O_DIRECTORY)` relative to the directory
//! reached so far, finds a real directory at every step. No symbolic link
//! anywhere on the way, not even one that points back inside: a layout that
//! an earlier run left behind (`refs -> ../../..`) must not widen what a
//! later run can write. The walk opens each step relative to the previous
//! descriptor, so the directory it ends on is the one it checked, and the
//! Landlock rule is built on that very descriptor.
#![forbid(unsafe_code)]

use std::ffi::OsStr;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::file_facts;
use crate::refusal::RefusalClass;
use crate::sys;

/// Why a path may not be granted. Each variant names the offending
/// component (the prefix of the path that ends at it).
#[derive(Debug)]
pub enum GrantError {
    /// The path does not start with `/`.
    NotAbsolute { path: PathBuf },
    /// `.`/`..` components, `//`, a trailing `/`, or a NUL byte.
    NotNormalised { path: PathBuf },
    /// A component is a symbolic link (not followed); `target` is its text.
    Symlink {
        path: PathBuf,
        component: PathBuf,
        target: PathBuf,
    },
    /// A component is something other than a directory.
    NotDirectory {
        path: PathBuf,
        component: PathBuf,
        kind: &'static str,
    },
    /// A component does not exist.
    Missing { path: PathBuf, component: PathBuf },
    /// A component could not be opened for another reason (e.g. EACCES).
    Inaccessible {
        path: PathBuf,
        component: PathBuf,
        source: io::Error,
    },
}

impl GrantError {
    /// The path that was to be granted.
    pub fn path(&self) -> &Path {
        match self {
            GrantError::NotAbsolute { path }
            | GrantError::NotNormalised { path }
            | GrantError::Symlink { path, .. }
            | GrantError::NotDirectory { path, .. }
            | GrantError::Missing { path, .. }
            | GrantError::Inaccessible { path, .. } => path,
        }
    }

    /// The component the walk stopped at, when it got that far.
    pub fn component(&self) -> Option<&Path> {
        match self {
            GrantError::NotAbsolute { .. } | GrantError::NotNormalised { .. } => None,
            GrantError::Symlink { component, .. }
            | GrantError::NotDirectory { component, .. }
            | GrantError::Missing { component, .. }
            | GrantError::Inaccessible { component, .. } => Some(component),
        }
    }

    /// The refusal class (SPEC.md §4): a layout on disk that makes the
    /// grant unsafe (a link or a non-directory on the way) is
    /// `workdir-unsafe`; a malformed or absent path is `policy-invalid`
    /// (the launcher reports an absent working directory as
    /// `workdir-missing`).
    pub fn refusal_class(&self) -> RefusalClass {
        match self {
            GrantError::Symlink { .. } | GrantError::NotDirectory { .. } => {
                RefusalClass::WorkdirUnsafe
            }
            GrantError::NotAbsolute { .. }
            | GrantError::NotNormalised { .. }
            | GrantError::Missing { .. }
            | GrantError::Inaccessible { .. } => RefusalClass::PolicyInvalid,
        }
    }

    /// `(message, remediation)`: one line each, the same text on both lanes.
    pub fn describe(&self) -> (String, String) {
        let path = self.path().display();
        match self {
            GrantError::NotAbsolute { .. } => (
                format!(
                    "the writable directory {path} cannot be granted: it is not an absolute path"
                ),
                "grant absolute paths only".to_owned(),
            ),
            GrantError::NotNormalised { .. } => (
                format!(
                    "the writable directory {path} cannot be granted: it is not a normalised \
                     path (no `.` or `..` components, no `//`, no trailing `/`, no NUL byte)"
                ),
                "grant the real, normalised path".to_owned(),
            ),
            GrantError::Symlink {
                component, target, ..
            } => (
                format!(
                    "the writable directory {path} cannot be granted: {} is a symbolic link \
                     (-> {}); a grant follows no symbolic link anywhere on its path",
                    component.display(),
                    target.display()
                ),
                format!(
                    "remove the symbolic link {} (an earlier run may have left it there) and \
                     restore the real directory, then dispatch the run again",
                    component.display()
                ),
            ),
            GrantError::NotDirectory {
                component, kind, ..
            } => (
                format!(
                    "the writable directory {path} cannot be granted: {} is a {kind}, not a \
                     directory",
                    component.display()
                ),
                format!(
                    "remove {} (an earlier run may have left it there) and restore the real \
                     directory, then dispatch the run again",
                    component.display()
                ),
            ),
            GrantError::Missing { component, .. } => (
                format!(
                    "the writable directory {path} cannot be granted: {} does not exist",
                    component.display()
                ),
                format!("create {path} before the run, or leave it out of the writable set"),
            ),
            GrantError::Inaccessible {
                component, source, ..
            } => (
                format!(
                    "the writable directory {path} cannot be granted: {} cannot be opened: \
                     {source}",
                    component.display()
                ),
                format!(
                    "make every directory on the way to {path} searchable by the account \
                     that runs the agent"
                ),
            ),
        }
    }
}

impl fmt::Display for GrantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe().0)
    }
}

impl std::error::Error for GrantError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GrantError::Inaccessible { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The components of an absolute, normalised path, or why it is not one.
fn components(path: &Path) -> Result<Vec<&OsStr>, GrantError> {
    let bytes = path.as_os_str().as_bytes();
    if !bytes.starts_with(b"/") {
        return Err(GrantError::NotAbsolute {
            path: path.to_owned(),
        });
    }
    if bytes == b"/" {
        return Ok(Vec::new());
    }
    let not_normalised = || GrantError::NotNormalised {
        path: path.to_owned(),
    };
    if bytes.contains(&0) {
        return Err(not_normalised());
    }
    let mut out = Vec::new();
    for segment in bytes[1..].split(|b| *b == b'/') {
        if segment.is_empty() || segment == b"." || segment == b".." {
            return Err(not_normalised());
        }
        out.push(OsStr::from_bytes(segment));
    }
    Ok(out)
}

/// What a component the walk could not enter is, for the message. Read
/// without following a link at the end (the prefix before it was just
/// walked without following any).
fn classify(path: &Path, component: PathBuf, source: io::Error) -> GrantError {
    let path = path.to_owned();
    if source.raw_os_error() == Some(libc::ENOENT) {
        return GrantError::Missing { path, component };
    }
    match std::fs::symlink_metadata(&component) {
        Ok(meta) if meta.file_type().is_symlink() => {
            let target = std::fs::read_link(&component)
                .unwrap_or_else(|e| PathBuf::from(format!("<unreadable: {e}>")));
            GrantError::Symlink {
                path,
                component,
                target,
            }
        }
        Ok(meta) if !meta.is_dir() => GrantError::NotDirectory {
            path,
            component,
            kind: file_facts::file_kind(meta.file_type()),
        },
        // A directory after all (it changed under us), or unmeasurable: say
        // what the walk itself was answered.
        _ => GrantError::Inaccessible {
            path,
            component,
            source,
        },
    }
}

/// Walks `path` from `/` without following any link and returns an
/// `O_PATH` descriptor of the directory it names.
pub fn open_grant_dir(path: &Path) -> Result<OwnedFd, GrantError> {
    let parts = components(path)?;
    let root: File = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open("/")
        .map_err(|source| GrantError::Inaccessible {
            path: path.to_owned(),
            component: PathBuf::from("/"),
            source,
        })?;
    let mut current = OwnedFd::from(root);
    let mut prefix = PathBuf::from("/");
    for name in parts {
        prefix.push(name);
        current = match sys::open_dir_nofollow_at(current.as_fd(), name) {
            Ok(fd) => fd,
            Err(source) => return Err(classify(path, prefix, source)),
        };
    }
    Ok(current)
}

/// `Ok(())` when `path` may be granted as a writable directory (see the
/// module documentation for the rule); otherwise the component at fault.
pub fn check_grant_dir(path: &Path) -> Result<(), GrantError> {
    open_grant_dir(path).map(drop)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn base() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        (tmp, base)
    }

    #[test]
    fn a_real_directory_path_may_be_granted() {
        let (_tmp, base) = base();
        std::fs::create_dir_all(base.join("a/b/c")).unwrap();
        check_grant_dir(&base.join("a/b/c")).unwrap();
        check_grant_dir(&base).unwrap();
        check_grant_dir(Path::new("/")).unwrap();
        // The descriptor names the directory the walk checked.
        let fd = open_grant_dir(&base.join("a/b")).unwrap();
        let meta = File::from(fd).metadata().unwrap();
        assert!(meta.is_dir());
    }

    #[test]
    fn a_symlink_as_last_component_is_named_with_its_target() {
        let (_tmp, base) = base();
        std::fs::create_dir(base.join("real")).unwrap();
        symlink(base.join("real"), base.join("link")).unwrap();
        let err = check_grant_dir(&base.join("link")).unwrap_err();
        match &err {
            GrantError::Symlink {
                component, target, ..
            } => {
                assert_eq!(component, &base.join("link"));
                assert_eq!(target, &base.join("real"));
            }
            other => panic!("expected a symlink error, got {other:?}"),
        }
        assert_eq!(err.refusal_class(), RefusalClass::WorkdirUnsafe);
        let (message, fix) = err.describe();
        assert_eq!(
            message,
            format!(
                "the writable directory {0}/link cannot be granted: {0}/link is a symbolic \
                 link (-> {0}/real); a grant follows no symbolic link anywhere on its path",
                base.display()
            )
        );
        assert!(fix.contains(&format!("remove the symbolic link {}/link", base.display())));
        assert_eq!(err.to_string(), message);
    }

    #[test]
    fn a_symlink_in_the_middle_is_refused_even_when_relative_and_inside() {
        let (_tmp, base) = base();
        // common/refs -> ../../.. (an earlier run planted it in the repo).
        std::fs::create_dir_all(base.join("repo/.git/common")).unwrap();
        symlink("../../..", base.join("repo/.git/common/refs")).unwrap();
        let asked = base.join("repo/.git/common/refs/heads/saphan");
        // It resolves (to something real) — the walk refuses it anyway.
        let resolved = base.join("repo/.git/common/refs");
        assert!(std::fs::metadata(&resolved).unwrap().is_dir());
        let err = check_grant_dir(&asked).unwrap_err();
        match &err {
            GrantError::Symlink {
                path,
                component,
                target,
            } => {
                assert_eq!(path, &asked);
                assert_eq!(component, &resolved);
                assert_eq!(target, Path::new("../../.."));
            }
            other => panic!("expected a symlink error, got {other:?}"),
        }
        assert!(err.describe().0.contains("(-> ../../..)"));

        // A link inside that points to a sibling inside: still refused.
        std::fs::create_dir(base.join("inside")).unwrap();
        symlink("inside", base.join("alias")).unwrap();
        std::fs::create_dir(base.join("inside/sub")).unwrap();
        let err = check_grant_dir(&base.join("alias/sub")).unwrap_err();
        assert!(matches!(err, GrantError::Symlink { .. }), "{err:?}");
        assert_eq!(err.component(), Some(base.join("alias").as_path()));
    }

    #[test]
    fn a_file_on_the_way_or_at_the_end_is_not_a_directory() {
        let (_tmp, base) = base();
        std::fs::write(base.join("f"), b"").unwrap();
        for asked in [base.join("f"), base.join("f/below")] {
            let err = check_grant_dir(&asked).unwrap_err();
            match &err {
                GrantError::NotDirectory {
                    component, kind, ..
                } => {
                    assert_eq!(component, &base.join("f"));
                    assert_eq!(*kind, "regular file");
                }
                other => panic!("expected not-a-directory, got {other:?}"),
            }
            assert_eq!(err.refusal_class(), RefusalClass::WorkdirUnsafe);
        }
        let err = check_grant_dir(Path::new("/dev/null")).unwrap_err();
        assert!(err.describe().0.contains("/dev/null is a character device"));
    }

    #[test]
    fn a_missing_component_is_named() {
        let (_tmp, base) = base();
        let err = check_grant_dir(&base.join("gone/deeper")).unwrap_err();
        match &err {
            GrantError::Missing { component, .. } => assert_eq!(component, &base.join("gone")),
            other => panic!("expected missing, got {other:?}"),
        }
        assert_eq!(err.refusal_class(), RefusalClass::PolicyInvalid);
        assert!(err
            .describe()
            .0
            .ends_with(&format!("{}/gone does not exist", base.display())));
    }

    #[test]
    fn malformed_paths_are_refused_before_any_walk() {
        for (bad, absolute) in [
            ("relative/dir", false),
            ("", false),
            ("/a//b", true),
            ("/a/./b", true),
            ("/a/../b", true),
            ("/a/b/", true),
            ("/a\0b", true),
        ] {
            let err = check_grant_dir(Path::new(bad)).unwrap_err();
            if absolute {
                assert!(matches!(err, GrantError::NotNormalised { .. }), "{bad:?}");
            } else {
                assert!(matches!(err, GrantError::NotAbsolute { .. }), "{bad:?}");
            }
            assert_eq!(err.refusal_class(), RefusalClass::PolicyInvalid);
            assert_eq!(err.component(), None);
        }
    }
}
