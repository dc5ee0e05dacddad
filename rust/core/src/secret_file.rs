//! Secret-file reads: the record key, a lane credential (an API key), and
//! the lanes file (which says where each credential is sent), each read only
//! after its custody is proved on the open descriptor.
//!
//! The discipline is the same for all three (SPEC.md §7): open with
//! `O_NOFOLLOW` (a planted link is refused, not followed) and `O_NONBLOCK` (a
//! FIFO cannot stall the read), fstat the descriptor — never the path, which
//! could be swapped — and prove a regular file owned by the caller that
//! group and others cannot access; then the size rule of the kind of file,
//! all before a byte is read, and EOF after the last byte.
//!
//! Every refusal is `custody-key-unsafe`; [`KeyCustodyError::describe`]
//! gives its message and remediation.
#![forbid(unsafe_code)]

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::file_facts::{self, FileFacts};
use crate::refusal::RefusalClass;
use crate::sys;

/// Which kind of secret a custody-checked read was for: it names the file in
/// every message and picks the remediation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretKind {
    /// The record key (`read_key_file`): exact length.
    Key,
    /// A lane credential, e.g. an API key (`read_secret_file`): one name,
    /// non-empty, bounded length.
    Credential,
    /// The lanes file (`read_lanes_file`): not a secret, but it says where
    /// each credential is sent, so it gets the credential's custody.
    Lanes,
}

impl SecretKind {
    /// `"key"`, `"credential"` or `"lanes file"`.
    pub fn noun(self) -> &'static str {
        match self {
            SecretKind::Key => "key",
            SecretKind::Credential => "credential",
            SecretKind::Lanes => "lanes file",
        }
    }

    /// `"key file"`, `"credential file"` or `"lanes file"`.
    pub fn file_noun(self) -> &'static str {
        match self {
            SecretKind::Key => "key file",
            SecretKind::Credential => "credential file",
            SecretKind::Lanes => "lanes file",
        }
    }

    /// What to do when the contents are wrong (length, empty, changed).
    fn restore(self, path: &Path) -> String {
        let path = path.display();
        match self {
            SecretKind::Key => format!("restore {path} from a backup or create a new key"),
            SecretKind::Credential => {
                format!("restore the credential file {path} (mode 0600, owned by you, one link)")
            }
            SecretKind::Lanes => format!(
                "restore {path} from a backup (mode 0600, owned by you, one link), or move it \
                 aside and declare the lanes again with `saphan lane add`"
            ),
        }
    }
}

/// Why a key or credential file was not read. Every variant except `Io` is a
/// custody refusal (custody-key-unsafe) and carries `what`, the kind of file
/// it was; `Io` is a plain I/O error (missing file, permission denied, read
/// error) whose message is the system's own.
#[derive(Debug)]
pub enum KeyCustodyError {
    Io {
        path: PathBuf,
        source: io::Error,
    },
    /// The final component is a symbolic link (O_NOFOLLOW answered ELOOP).
    Symlink {
        what: SecretKind,
        path: PathBuf,
    },
    NotRegular {
        what: SecretKind,
        path: PathBuf,
        kind: &'static str,
    },
    WrongOwner {
        what: SecretKind,
        path: PathBuf,
        owner_uid: u32,
        euid: u32,
    },
    ModeTooOpen {
        what: SecretKind,
        path: PathBuf,
        mode: u32,
    },
    /// More than one hard link: another name for the same secret, which a
    /// read denial on this path would not cover.
    Linked {
        what: SecretKind,
        path: PathBuf,
        nlink: u64,
    },
    WrongLength {
        what: SecretKind,
        path: PathBuf,
        expected: u64,
        found: u64,
    },
    Empty {
        what: SecretKind,
        path: PathBuf,
    },
    TooLong {
        what: SecretKind,
        path: PathBuf,
        max: u64,
        found: u64,
    },
    /// The contents changed between fstat and the read.
    Changed {
        what: SecretKind,
        path: PathBuf,
        expected: u64,
    },
}

impl KeyCustodyError {
    /// True for custody refusals; false for plain I/O errors.
    pub fn is_custody(&self) -> bool {
        !matches!(self, KeyCustodyError::Io { .. })
    }

    /// `custody-key-unsafe` for a custody refusal; `None` for a plain I/O
    /// error.
    pub fn refusal_class(&self) -> Option<RefusalClass> {
        self.is_custody().then_some(RefusalClass::CustodyKeyUnsafe)
    }

    /// The kind of file refused; `None` for plain I/O errors.
    pub fn what(&self) -> Option<SecretKind> {
        match self {
            KeyCustodyError::Io { .. } => None,
            KeyCustodyError::Symlink { what, .. }
            | KeyCustodyError::NotRegular { what, .. }
            | KeyCustodyError::WrongOwner { what, .. }
            | KeyCustodyError::ModeTooOpen { what, .. }
            | KeyCustodyError::Linked { what, .. }
            | KeyCustodyError::WrongLength { what, .. }
            | KeyCustodyError::Empty { what, .. }
            | KeyCustodyError::TooLong { what, .. }
            | KeyCustodyError::Changed { what, .. } => Some(*what),
        }
    }

    /// `(message, remediation)`. A custody refusal's message opens with the
    /// kind of file and its path (`credential file /p is empty`); a plain I/O
    /// error's is `path: the system's message`.
    pub fn describe(&self) -> (String, String) {
        match self {
            KeyCustodyError::Io { path, source } => (
                format!("{}: {source}", path.display()),
                format!("check that {} exists and is readable", path.display()),
            ),
            KeyCustodyError::Symlink { what, path } => (
                format!(
                    "{} {} is a symbolic link; {}s are opened without following links",
                    what.file_noun(),
                    path.display(),
                    what.file_noun()
                ),
                format!(
                    "replace the symbolic link {} with the {} itself",
                    path.display(),
                    what.file_noun()
                ),
            ),
            KeyCustodyError::NotRegular { what, path, kind } => (
                format!(
                    "{} {} is a {kind}, not a regular file",
                    what.file_noun(),
                    path.display()
                ),
                format!("{} must be a regular file", path.display()),
            ),
            KeyCustodyError::WrongOwner {
                what,
                path,
                owner_uid,
                euid,
            } => (
                format!(
                    "{} {} is owned by uid {owner_uid}, not by the caller (euid {euid})",
                    what.file_noun(),
                    path.display()
                ),
                format!(
                    "chown {euid} {} (the account that uses the {} must own it)",
                    path.display(),
                    what.noun()
                ),
            ),
            KeyCustodyError::ModeTooOpen { what, path, mode } => (
                format!(
                    "{} {} has mode {mode:04o}; group and others must have no access (0600)",
                    what.file_noun(),
                    path.display()
                ),
                format!("chmod 0600 {}", path.display()),
            ),
            KeyCustodyError::Linked { what, path, nlink } => (
                format!(
                    "{} {} has {nlink} hard links; a {} must have exactly one name (a read \
                     denial on this path would not cover the others)",
                    what.file_noun(),
                    path.display(),
                    what.noun()
                ),
                format!(
                    "remove the other links (find / -xdev -samefile {}) or copy the secret to a \
                     new file with mode 0600",
                    path.display()
                ),
            ),
            KeyCustodyError::WrongLength {
                what,
                path,
                expected,
                found,
            } => (
                format!(
                    "{} {} is {found} bytes long; a {} is exactly {expected} bytes",
                    what.file_noun(),
                    path.display(),
                    what.noun()
                ),
                what.restore(path),
            ),
            KeyCustodyError::Empty { what, path } => (
                format!("{} {} is empty", what.file_noun(), path.display()),
                what.restore(path),
            ),
            KeyCustodyError::TooLong {
                what,
                path,
                max,
                found,
            } => (
                format!(
                    "{} {} is {found} bytes long; a {} is at most {max} bytes",
                    what.file_noun(),
                    path.display(),
                    what.noun()
                ),
                what.restore(path),
            ),
            KeyCustodyError::Changed {
                what,
                path,
                expected,
            } => (
                format!(
                    "{} {} changed while it was read (fstat said {expected} bytes)",
                    what.file_noun(),
                    path.display()
                ),
                what.restore(path),
            ),
        }
    }
}

impl fmt::Display for KeyCustodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe().0)
    }
}

impl std::error::Error for KeyCustodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KeyCustodyError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Opens `path` without following a final symbolic link and proves, on the
/// descriptor's fstat (never the path's, which could be swapped), that it is a
/// regular file owned by `euid` that group and others cannot access.
fn open_owner_only(
    path: &Path,
    euid: u32,
    what: SecretKind,
) -> Result<(File, FileFacts), KeyCustodyError> {
    let io_error = |source| KeyCustodyError::Io {
        path: path.to_owned(),
        source,
    };
    let file =
        file_facts::open_nofollow(path, libc::O_NONBLOCK | libc::O_NOCTTY).map_err(|source| {
            if file_facts::is_final_symlink(&source) {
                KeyCustodyError::Symlink {
                    what,
                    path: path.to_owned(),
                }
            } else {
                io_error(source)
            }
        })?;
    let facts = FileFacts::fstat(&file).map_err(io_error)?;
    if !facts.is_regular() {
        return Err(KeyCustodyError::NotRegular {
            what,
            path: path.to_owned(),
            kind: facts.kind(),
        });
    }
    if facts.owner_uid != euid {
        return Err(KeyCustodyError::WrongOwner {
            what,
            path: path.to_owned(),
            owner_uid: facts.owner_uid,
            euid,
        });
    }
    if facts.mode & 0o077 != 0 {
        return Err(KeyCustodyError::ModeTooOpen {
            what,
            path: path.to_owned(),
            mode: facts.mode,
        });
    }
    Ok((file, facts))
}

/// Reads exactly `len` bytes (the fstat size) and then proves EOF: a file
/// that shrank or grew since the fstat is `Changed`.
fn read_exactly(
    file: &File,
    path: &Path,
    len: usize,
    what: SecretKind,
) -> Result<Vec<u8>, KeyCustodyError> {
    let changed = || KeyCustodyError::Changed {
        what,
        path: path.to_owned(),
        expected: len as u64,
    };
    let mut buf = vec![0u8; len];
    let mut reader = file;
    reader.read_exact(&mut buf).map_err(|source| {
        if source.kind() == io::ErrorKind::UnexpectedEof {
            changed()
        } else {
            KeyCustodyError::Io {
                path: path.to_owned(),
                source,
            }
        }
    })?;
    let mut probe = [0u8; 1];
    match reader.read(&mut probe) {
        Ok(0) => Ok(buf),
        Ok(_) => Err(changed()),
        Err(source) => Err(KeyCustodyError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Reads a key file after proving its custody, for the process's own euid.
pub fn read_key_file(path: &Path, expected_len: u64) -> Result<Vec<u8>, KeyCustodyError> {
    read_key_file_as(path, expected_len, sys::geteuid())
}

/// Reads a key file after proving its custody for `euid`.
///
/// Order matters: open with `O_NOFOLLOW` (a planted link is refused, not
/// followed) and `O_NONBLOCK` (a FIFO cannot stall us), then fstat the
/// descriptor — never the path, which could be swapped — and check type,
/// owner, mode and exact length, all before a byte is read.
pub fn read_key_file_as(
    path: &Path,
    expected_len: u64,
    euid: u32,
) -> Result<Vec<u8>, KeyCustodyError> {
    let what = SecretKind::Key;
    let (file, facts) = open_owner_only(path, euid, what)?;
    let wrong_length = || KeyCustodyError::WrongLength {
        what,
        path: path.to_owned(),
        expected: expected_len,
        found: facts.len,
    };
    if facts.len != expected_len {
        return Err(wrong_length());
    }
    let len = usize::try_from(expected_len).map_err(|_| wrong_length())?;
    read_exactly(&file, path, len, what)
}

/// Reads a lane credential file (an API key for a model endpoint) after
/// proving its custody, for the process's own euid. The bytes are returned as
/// they are (a trailing newline included); the caller strips.
pub fn read_secret_file(path: &Path, max_len: u64) -> Result<Vec<u8>, KeyCustodyError> {
    read_secret_file_as(path, max_len, sys::geteuid())
}

/// Reads a credential file after proving its custody for `euid`.
///
/// The key file's discipline (no final symlink, fstat of the descriptor, a
/// regular file owned by `euid` with no group or other access), and then:
/// exactly one hard link (a second name for the secret is one a read denial
/// on this path would not cover), and a size from 1 to `max_len` bytes, all
/// before a byte is read.
pub fn read_secret_file_as(
    path: &Path,
    max_len: u64,
    euid: u32,
) -> Result<Vec<u8>, KeyCustodyError> {
    read_single_name_as(path, max_len, euid, SecretKind::Credential)
}

/// Reads the lanes file with a credential's custody, for the process's own
/// euid: it names where every lane's key is sent, so whoever could rewrite
/// it could redirect a key to their own endpoint.
pub fn read_lanes_file(path: &Path, max_len: u64) -> Result<Vec<u8>, KeyCustodyError> {
    read_single_name_as(path, max_len, sys::geteuid(), SecretKind::Lanes)
}

fn read_single_name_as(
    path: &Path,
    max_len: u64,
    euid: u32,
    what: SecretKind,
) -> Result<Vec<u8>, KeyCustodyError> {
    let (file, facts) = open_owner_only(path, euid, what)?;
    if facts.nlink != 1 {
        return Err(KeyCustodyError::Linked {
            what,
            path: path.to_owned(),
            nlink: facts.nlink,
        });
    }
    if facts.len == 0 {
        return Err(KeyCustodyError::Empty {
            what,
            path: path.to_owned(),
        });
    }
    let too_long = || KeyCustodyError::TooLong {
        what,
        path: path.to_owned(),
        max: max_len,
        found: facts.len,
    };
    if facts.len > max_len {
        return Err(too_long());
    }
    let len = usize::try_from(facts.len).map_err(|_| too_long())?;
    read_exactly(&file, path, len, what)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn lanes_file_gets_a_credential_custody_under_its_own_name() {
        let dir = std::env::temp_dir().join(format!("saphan-lanes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("lanes.toml");
        std::fs::write(&p, b"[lane.a]\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_lanes_file(&p, 1 << 20).unwrap(), b"[lane.a]\n");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o620)).unwrap();
        let e = read_lanes_file(&p, 1 << 20).unwrap_err();
        assert_eq!(e.what(), Some(SecretKind::Lanes));
        assert!(e
            .to_string()
            .starts_with(&format!("lanes file {} has mode 0620", p.display())));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let other = dir.join("second-name");
        std::fs::hard_link(&p, &other).unwrap();
        let e = read_lanes_file(&p, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("has 2 hard links"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    // ---- key files ----

    fn key(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn key_file_owner_only_exact_length_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = key(dir.path(), "k", &[7u8; 32], 0o600);
        assert_eq!(read_key_file(&p, 32).unwrap(), vec![7u8; 32]);
        let p = key(dir.path(), "k4", &[1u8; 32], 0o400);
        assert_eq!(read_key_file(&p, 32).unwrap(), vec![1u8; 32]);
    }

    #[test]
    fn key_file_refusals_are_distinct() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let euid = sys::geteuid();

        let p = key(d, "open", &[0u8; 32], 0o640);
        let e = read_key_file(&p, 32).unwrap_err();
        assert!(
            matches!(e, KeyCustodyError::ModeTooOpen { mode: 0o640, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("mode 0640") && e.to_string().contains("open"));
        let p = key(d, "open2", &[0u8; 32], 0o604);
        assert!(matches!(
            read_key_file(&p, 32),
            Err(KeyCustodyError::ModeTooOpen { .. })
        ));

        let p = key(d, "short", &[0u8; 31], 0o600);
        let e = read_key_file(&p, 32).unwrap_err();
        assert!(
            matches!(
                e,
                KeyCustodyError::WrongLength {
                    expected: 32,
                    found: 31,
                    ..
                }
            ),
            "{e}"
        );
        let p = key(d, "long", &[0u8; 33], 0o600);
        assert!(matches!(
            read_key_file(&p, 32),
            Err(KeyCustodyError::WrongLength { found: 33, .. })
        ));

        let target = key(d, "target", &[0u8; 32], 0o600);
        let link = d.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = read_key_file(&link, 32).unwrap_err();
        assert!(matches!(e, KeyCustodyError::Symlink { .. }), "{e}");
        assert!(e.is_custody());

        let e = read_key_file(d, 32).unwrap_err();
        assert!(
            matches!(
                e,
                KeyCustodyError::NotRegular {
                    kind: "directory",
                    ..
                }
            ),
            "{e}"
        );
        let e = read_key_file(Path::new("/dev/null"), 0).unwrap_err();
        assert!(
            matches!(
                e,
                KeyCustodyError::NotRegular {
                    kind: "character device",
                    ..
                }
            ),
            "{e}"
        );

        // Owner: measured against another euid (no second account needed).
        let p = key(d, "mine", &[0u8; 32], 0o600);
        let e = read_key_file_as(&p, 32, euid + 1).unwrap_err();
        assert!(matches!(e, KeyCustodyError::WrongOwner { .. }), "{e}");
        assert!(e.to_string().contains(&format!("owned by uid {euid}")));

        let e = read_key_file(&d.join("absent"), 32).unwrap_err();
        assert!(
            matches!(&e, KeyCustodyError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
        );
        assert!(!e.is_custody());
    }

    #[test]
    fn key_file_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fifo");
        let status = std::process::Command::new("mkfifo")
            .arg(&p)
            .status()
            .unwrap();
        assert!(status.success());
        let e = read_key_file(&p, 32).unwrap_err();
        assert!(
            matches!(e, KeyCustodyError::NotRegular { kind: "FIFO", .. }),
            "{e}"
        );
    }

    // ---- credential files ----

    #[test]
    fn credential_file_owner_only_one_link_is_read_as_is() {
        let dir = tempfile::tempdir().unwrap();
        let p = key(dir.path(), "api", b"sk-test-123\n", 0o600);
        assert_eq!(
            read_secret_file(&p, 4096).unwrap(),
            b"sk-test-123\n".to_vec()
        );
        // Exactly max_len bytes is still within bounds.
        assert_eq!(read_secret_file(&p, 12).unwrap(), b"sk-test-123\n".to_vec());
        let p = key(dir.path(), "api4", b"x", 0o400);
        assert_eq!(read_secret_file(&p, 1).unwrap(), b"x".to_vec());
    }

    #[test]
    fn credential_file_refusals_are_distinct_and_say_credential() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let euid = sys::geteuid();
        let cred = SecretKind::Credential;

        let target = key(d, "target", b"secret", 0o600);
        let link = d.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = read_secret_file(&link, 64).unwrap_err();
        assert!(matches!(e, KeyCustodyError::Symlink { .. }), "{e}");
        assert!(e.is_custody());
        assert_eq!(e.what(), Some(cred));
        assert_eq!(
            e.to_string(),
            format!(
                "credential file {} is a symbolic link; credential files are opened without \
                 following links",
                link.display()
            )
        );

        let e = read_secret_file(d, 64).unwrap_err();
        assert!(
            matches!(
                e,
                KeyCustodyError::NotRegular {
                    kind: "directory",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().starts_with("credential file "), "{e}");

        let p = key(d, "open", b"secret", 0o640);
        let e = read_secret_file(&p, 64).unwrap_err();
        assert!(
            matches!(e, KeyCustodyError::ModeTooOpen { mode: 0o640, .. }),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "credential file {} has mode 0640; group and others must have no access (0600)",
                p.display()
            )
        );

        let p = key(d, "linked", b"secret", 0o600);
        let second = d.join("second-name");
        std::fs::hard_link(&p, &second).unwrap();
        for name in [&p, &second] {
            let e = read_secret_file(name, 64).unwrap_err();
            assert!(matches!(e, KeyCustodyError::Linked { nlink: 2, .. }), "{e}");
            assert_eq!(
                e.to_string(),
                format!(
                    "credential file {} has 2 hard links; a credential must have exactly one \
                     name (a read denial on this path would not cover the others)",
                    name.display()
                )
            );
            assert_eq!(
                e.describe().1,
                format!(
                    "remove the other links (find / -xdev -samefile {}) or copy the secret to a \
                     new file with mode 0600",
                    name.display()
                )
            );
        }
        std::fs::remove_file(&second).unwrap();
        assert_eq!(read_secret_file(&p, 64).unwrap(), b"secret".to_vec());

        let p = key(d, "empty", b"", 0o600);
        let e = read_secret_file(&p, 64).unwrap_err();
        assert!(matches!(e, KeyCustodyError::Empty { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            format!("credential file {} is empty", p.display())
        );
        assert_eq!(
            e.describe().1,
            format!(
                "restore the credential file {} (mode 0600, owned by you, one link)",
                p.display()
            )
        );
        assert!(!e.describe().1.contains("new key"));

        let p = key(d, "long", &[b'a'; 65], 0o600);
        let e = read_secret_file(&p, 64).unwrap_err();
        assert!(
            matches!(
                e,
                KeyCustodyError::TooLong {
                    max: 64,
                    found: 65,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "credential file {} is 65 bytes long; a credential is at most 64 bytes",
                p.display()
            )
        );

        // Owner: measured against another euid (no second account needed).
        let p = key(d, "mine", b"secret", 0o600);
        let e = read_secret_file_as(&p, 64, euid + 1).unwrap_err();
        assert!(matches!(e, KeyCustodyError::WrongOwner { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            format!(
                "credential file {} is owned by uid {euid}, not by the caller (euid {})",
                p.display(),
                euid + 1
            )
        );
        assert!(e.describe().1.contains("uses the credential must own it"));

        let e = read_secret_file(&d.join("absent"), 64).unwrap_err();
        assert!(
            matches!(&e, KeyCustodyError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
        );
        assert!(!e.is_custody());
        assert_eq!(e.what(), None);
    }

    #[test]
    fn key_file_messages_are_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let p = key(d, "open", &[0u8; 32], 0o644);
        let e = read_key_file(&p, 32).unwrap_err();
        assert_eq!(e.what(), Some(SecretKind::Key));
        assert_eq!(
            e.to_string(),
            format!(
                "key file {} has mode 0644; group and others must have no access (0600)",
                p.display()
            )
        );
        let p = key(d, "short", &[0u8; 31], 0o600);
        let e = read_key_file(&p, 32).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "key file {} is 31 bytes long; a key is exactly 32 bytes",
                p.display()
            )
        );
        assert_eq!(
            e.describe().1,
            format!("restore {} from a backup or create a new key", p.display())
        );
        let link = d.join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        let e = read_key_file(&link, 32).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "key file {} is a symbolic link; key files are opened without following links",
                link.display()
            )
        );
        assert_eq!(
            e.describe().1,
            format!(
                "replace the symbolic link {} with the key file itself",
                link.display()
            )
        );
    }

    /// Every refusal's message and remediation, word for word, for each kind
    /// of file (the texts the Python side shows and tests/ match).
    #[test]
    fn describe_each_refusal_for_each_kind() {
        let p = || PathBuf::from("/a/b");
        let expected: [(SecretKind, [(&str, &str); 9]); 3] = [
            (
                SecretKind::Key,
                [
                    (
                        "key file /a/b is a symbolic link; key files are opened without following links",
                        "replace the symbolic link /a/b with the key file itself",
                    ),
                    (
                        "key file /a/b is a FIFO, not a regular file",
                        "/a/b must be a regular file",
                    ),
                    (
                        "key file /a/b is owned by uid 5, not by the caller (euid 7)",
                        "chown 7 /a/b (the account that uses the key must own it)",
                    ),
                    (
                        "key file /a/b has mode 0644; group and others must have no access (0600)",
                        "chmod 0600 /a/b",
                    ),
                    (
                        "key file /a/b has 3 hard links; a key must have exactly one name (a read denial on this path would not cover the others)",
                        "remove the other links (find / -xdev -samefile /a/b) or copy the secret to a new file with mode 0600",
                    ),
                    (
                        "key file /a/b is 31 bytes long; a key is exactly 32 bytes",
                        "restore /a/b from a backup or create a new key",
                    ),
                    (
                        "key file /a/b is empty",
                        "restore /a/b from a backup or create a new key",
                    ),
                    (
                        "key file /a/b is 65 bytes long; a key is at most 64 bytes",
                        "restore /a/b from a backup or create a new key",
                    ),
                    (
                        "key file /a/b changed while it was read (fstat said 12 bytes)",
                        "restore /a/b from a backup or create a new key",
                    ),
                ],
            ),
            (
                SecretKind::Credential,
                [
                    (
                        "credential file /a/b is a symbolic link; credential files are opened without following links",
                        "replace the symbolic link /a/b with the credential file itself",
                    ),
                    (
                        "credential file /a/b is a FIFO, not a regular file",
                        "/a/b must be a regular file",
                    ),
                    (
                        "credential file /a/b is owned by uid 5, not by the caller (euid 7)",
                        "chown 7 /a/b (the account that uses the credential must own it)",
                    ),
                    (
                        "credential file /a/b has mode 0644; group and others must have no access (0600)",
                        "chmod 0600 /a/b",
                    ),
                    (
                        "credential file /a/b has 3 hard links; a credential must have exactly one name (a read denial on this path would not cover the others)",
                        "remove the other links (find / -xdev -samefile /a/b) or copy the secret to a new file with mode 0600",
                    ),
                    (
                        "credential file /a/b is 31 bytes long; a credential is exactly 32 bytes",
                        "restore the credential file /a/b (mode 0600, owned by you, one link)",
                    ),
                    (
                        "credential file /a/b is empty",
                        "restore the credential file /a/b (mode 0600, owned by you, one link)",
                    ),
                    (
                        "credential file /a/b is 65 bytes long; a credential is at most 64 bytes",
                        "restore the credential file /a/b (mode 0600, owned by you, one link)",
                    ),
                    (
                        "credential file /a/b changed while it was read (fstat said 12 bytes)",
                        "restore the credential file /a/b (mode 0600, owned by you, one link)",
                    ),
                ],
            ),
            (
                SecretKind::Lanes,
                [
                    (
                        "lanes file /a/b is a symbolic link; lanes files are opened without following links",
                        "replace the symbolic link /a/b with the lanes file itself",
                    ),
                    (
                        "lanes file /a/b is a FIFO, not a regular file",
                        "/a/b must be a regular file",
                    ),
                    (
                        "lanes file /a/b is owned by uid 5, not by the caller (euid 7)",
                        "chown 7 /a/b (the account that uses the lanes file must own it)",
                    ),
                    (
                        "lanes file /a/b has mode 0644; group and others must have no access (0600)",
                        "chmod 0600 /a/b",
                    ),
                    (
                        "lanes file /a/b has 3 hard links; a lanes file must have exactly one name (a read denial on this path would not cover the others)",
                        "remove the other links (find / -xdev -samefile /a/b) or copy the secret to a new file with mode 0600",
                    ),
                    (
                        "lanes file /a/b is 31 bytes long; a lanes file is exactly 32 bytes",
                        "restore /a/b from a backup (mode 0600, owned by you, one link), or move it aside and declare the lanes again with `saphan lane add`",
                    ),
                    (
                        "lanes file /a/b is empty",
                        "restore /a/b from a backup (mode 0600, owned by you, one link), or move it aside and declare the lanes again with `saphan lane add`",
                    ),
                    (
                        "lanes file /a/b is 65 bytes long; a lanes file is at most 64 bytes",
                        "restore /a/b from a backup (mode 0600, owned by you, one link), or move it aside and declare the lanes again with `saphan lane add`",
                    ),
                    (
                        "lanes file /a/b changed while it was read (fstat said 12 bytes)",
                        "restore /a/b from a backup (mode 0600, owned by you, one link), or move it aside and declare the lanes again with `saphan lane add`",
                    ),
                ],
            ),
        ];
        for (what, texts) in expected {
            let errors = [
                KeyCustodyError::Symlink { what, path: p() },
                KeyCustodyError::NotRegular {
                    what,
                    path: p(),
                    kind: "FIFO",
                },
                KeyCustodyError::WrongOwner {
                    what,
                    path: p(),
                    owner_uid: 5,
                    euid: 7,
                },
                KeyCustodyError::ModeTooOpen {
                    what,
                    path: p(),
                    mode: 0o644,
                },
                KeyCustodyError::Linked {
                    what,
                    path: p(),
                    nlink: 3,
                },
                KeyCustodyError::WrongLength {
                    what,
                    path: p(),
                    expected: 32,
                    found: 31,
                },
                KeyCustodyError::Empty { what, path: p() },
                KeyCustodyError::TooLong {
                    what,
                    path: p(),
                    max: 64,
                    found: 65,
                },
                KeyCustodyError::Changed {
                    what,
                    path: p(),
                    expected: 12,
                },
            ];
            for (e, (message, fix)) in errors.iter().zip(texts) {
                assert_eq!(e.describe(), (message.to_owned(), fix.to_owned()), "{e:?}");
                assert_eq!(e.to_string(), message);
                assert!(e.is_custody());
                assert_eq!(e.what(), Some(what));
                assert_eq!(e.refusal_class(), Some(RefusalClass::CustodyKeyUnsafe));
            }
        }
    }

    #[test]
    fn describe_a_plain_io_error() {
        let e = KeyCustodyError::Io {
            path: PathBuf::from("/x"),
            source: io::Error::from_raw_os_error(libc::ENOENT),
        };
        let (message, fix) = e.describe();
        assert!(
            message.starts_with("/x: No such file or directory"),
            "{message}"
        );
        assert_eq!(fix, "check that /x exists and is readable");
        assert_eq!(e.to_string(), message);
        assert!(!e.is_custody());
        assert_eq!(e.what(), None);
        assert_eq!(e.refusal_class(), None);
    }
}
