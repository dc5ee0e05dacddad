//! Custody: who can replace the binary that is running, and who can read a key
//! or a lane credential.
//!
//! The binary check is four clauses about identity (SPEC.md §7), evaluated
//! by a pure function over stat facts so the whole table can be tested
//! without creating accounts:
//!
//! 1. the file is owned by root or by the calling euid (its custodian);
//! 2. neither group nor others can write it;
//! 3. a caller that is not the owner reaches it through others' execute bit,
//!    never through the group (refuse when euid != owner, the file's gid is
//!    among the caller's groups, and o+x is absent);
//! 4. its immediate parent directory is owned by root or the file's owner
//!    and is not writable by group or others.
//!
//! What this does NOT assert is printed with every refusal ([`NOT_ASSERTED`]).
//! It is a barrier against misconfiguration, not against an attacker who can
//! already write the binary: that attacker edits the check out.
#![forbid(unsafe_code)]

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::sys;

/// Printed with every custody-binary-unsafe refusal.
pub const NOT_ASSERTED: &str = "not asserted: which identity is the agent; the ancestors above \
the immediate parent directory; ACLs and extended attributes (which can grant write beyond the \
mode bits a stat can see)";

/// The identity asking: effective uid and every group it holds (the egid
/// included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub euid: u32,
    /// Sorted, without duplicates, including the egid.
    pub groups: Vec<u32>,
}

impl Caller {
    pub fn new(euid: u32, groups: impl IntoIterator<Item = u32>) -> Self {
        let mut groups: Vec<u32> = groups.into_iter().collect();
        groups.sort_unstable();
        groups.dedup();
        Caller { euid, groups }
    }

    /// The running process: geteuid, getegid and getgroups.
    pub fn current() -> io::Result<Self> {
        let mut groups = sys::getgroups()?;
        groups.push(sys::getegid());
        Ok(Caller::new(sys::geteuid(), groups))
    }

    pub fn holds_group(&self, gid: u32) -> bool {
        self.groups.binary_search(&gid).is_ok()
    }

    fn groups_text(&self) -> String {
        let list: Vec<String> = self.groups.iter().map(u32::to_string).collect();
        format!("[{}]", list.join(","))
    }
}

/// The stat facts the four clauses read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatFacts {
    /// The real path that was stat'ed.
    pub path: PathBuf,
    /// The path as given, when it was a symbolic link to `path`.
    pub symlink_from: Option<PathBuf>,
    pub owner_uid: u32,
    pub group_gid: u32,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// The immediate parent directory of `path`.
    pub parent: PathBuf,
    pub parent_owner_uid: u32,
    pub parent_group_gid: u32,
    pub parent_mode: u32,
}

const GROUP_WRITE: u32 = 0o020;
const OTHER_WRITE: u32 = 0o002;
const OTHER_EXEC: u32 = 0o001;

/// The clause a binary failed, numbered as in SPEC.md §7.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clause {
    /// 1: owned by root or the calling euid.
    Custodian = 1,
    /// 2: neither group nor others can write it.
    Writers = 2,
    /// 3: a non-owner reaches it through others' execute bit, not the group.
    Reach = 3,
    /// 4: the parent is owned by root or the owner, not group/other writable.
    Parent = 4,
}

impl Clause {
    pub fn number(self) -> u8 {
        self as u8
    }
}

fn who_writes(mode: u32) -> &'static str {
    match (mode & GROUP_WRITE != 0, mode & OTHER_WRITE != 0) {
        (true, true) => "its group and others",
        (true, false) => "its group",
        _ => "others",
    }
}

/// A failed clause with everything measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CustodyViolation {
    pub clause: Clause,
    /// Boxed: the facts are large and errors should stay small.
    pub facts: Box<StatFacts>,
    pub caller: Caller,
}

impl CustodyViolation {
    /// The human message: the clause, the path, owner:group, modes in octal
    /// and the caller's euid and groups.
    pub fn message(&self) -> String {
        let f = &self.facts;
        let c = &self.caller;
        let path = f.path.display();
        let parent = f.parent.display();
        let why = match self.clause {
            Clause::Custodian => format!(
                "{path} is owned by uid {}, which is neither root nor the caller (euid {})",
                f.owner_uid, c.euid
            ),
            Clause::Writers => format!(
                "{path} has mode {:04o}, so {} can write it",
                f.mode,
                who_writes(f.mode)
            ),
            Clause::Reach => format!(
                "the caller (euid {}) is not the owner (uid {}) and reaches {path} through its \
                 group (gid {}, which the caller holds): mode {:04o} gives others no execute bit",
                c.euid, f.owner_uid, f.group_gid, f.mode
            ),
            Clause::Parent => {
                if f.parent_owner_uid != 0 && f.parent_owner_uid != f.owner_uid {
                    format!(
                        "the parent directory {parent} is owned by uid {}, which is neither root \
                         nor the file's owner (uid {})",
                        f.parent_owner_uid, f.owner_uid
                    )
                } else {
                    format!(
                        "the parent directory {parent} has mode {:04o}, so {} can replace the file",
                        f.parent_mode,
                        who_writes(f.parent_mode)
                    )
                }
            }
        };
        let via = match &f.symlink_from {
            Some(link) => format!(" (reached through the symbolic link {})", link.display()),
            None => String::new(),
        };
        format!(
            "clause {}: {why}; measured: {path}{via} {}:{} mode {:04o}, parent {parent} {}:{} \
             mode {:04o}, caller euid {} groups {}",
            self.clause.number(),
            f.owner_uid,
            f.group_gid,
            f.mode,
            f.parent_owner_uid,
            f.parent_group_gid,
            f.parent_mode,
            c.euid,
            c.groups_text()
        )
    }

    /// What to change so the clause holds.
    pub fn remediation(&self) -> String {
        let f = &self.facts;
        let path = f.path.display();
        let parent = f.parent.display();
        match self.clause {
            Clause::Custodian => format!(
                "chown root:root {path} (and chmod 0755), or install a copy owned by the account \
                 that runs it (uid {})",
                self.caller.euid
            ),
            Clause::Writers => format!("chmod go-w {path} (installers write 0755)"),
            Clause::Reach => format!(
                "chmod 0755 {path} so non-owners execute through others' bit, or run it as its \
                 owner (uid {})",
                f.owner_uid
            ),
            Clause::Parent => format!(
                "make {parent} owned by root or uid {} and chmod go-w {parent}, or install the \
                 binary into a directory only its owner can write",
                f.owner_uid
            ),
        }
    }
}

impl fmt::Display for CustodyViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for CustodyViolation {}

/// The four clauses, in order; the first that fails is reported. Pure.
pub fn evaluate(facts: &StatFacts, caller: &Caller) -> Result<(), CustodyViolation> {
    let fail = |clause| {
        Err(CustodyViolation {
            clause,
            facts: Box::new(facts.clone()),
            caller: caller.clone(),
        })
    };
    // 1. Custodian: root or the caller itself. Anyone else could replace it.
    if facts.owner_uid != 0 && facts.owner_uid != caller.euid {
        return fail(Clause::Custodian);
    }
    // 2. Nobody but the owner may write it.
    if facts.mode & (GROUP_WRITE | OTHER_WRITE) != 0 {
        return fail(Clause::Writers);
    }
    // 3. A non-owner may reach it only through others' execute bit. When
    //    others have x, the group confers nothing extra (0755 root:any passes);
    //    when they do not, a group member is the only non-owner who can run
    //    it, which is the reach this clause denies. No gid is special, 0
    //    included.
    if caller.euid != facts.owner_uid
        && caller.holds_group(facts.group_gid)
        && facts.mode & OTHER_EXEC == 0
    {
        return fail(Clause::Reach);
    }
    // 4. Whoever can write the parent directory can replace the file.
    if (facts.parent_owner_uid != 0 && facts.parent_owner_uid != facts.owner_uid)
        || facts.parent_mode & (GROUP_WRITE | OTHER_WRITE) != 0
    {
        return fail(Clause::Parent);
    }
    Ok(())
}

/// Stats `path` for the clauses: the real path (symbolic links resolved,
/// noting when `path` was one) and its immediate parent directory.
pub fn measure(path: &Path) -> io::Result<StatFacts> {
    let link_meta = std::fs::symlink_metadata(path)?;
    let real = std::fs::canonicalize(path)?;
    // Report a link on the final component, or (for an absolute path) on any
    // component before it.
    let via_link =
        link_meta.file_type().is_symlink() || (path.is_absolute() && real.as_path() != path);
    let symlink_from = via_link.then(|| path.to_owned());
    let meta = std::fs::metadata(&real)?;
    let parent = real
        .parent()
        .map_or_else(|| real.clone(), Path::to_path_buf);
    let parent_meta = std::fs::metadata(&parent)?;
    Ok(StatFacts {
        path: real,
        symlink_from,
        owner_uid: meta.uid(),
        group_gid: meta.gid(),
        mode: meta.mode() & 0o7777,
        parent,
        parent_owner_uid: parent_meta.uid(),
        parent_group_gid: parent_meta.gid(),
        parent_mode: parent_meta.mode() & 0o7777,
    })
}

/// Why a binary's custody could not be established.
#[derive(Debug)]
pub enum BinaryCustodyError {
    /// A clause failed.
    Unsafe(CustodyViolation),
    /// The facts could not be measured (fail closed: no facts, no run).
    Unmeasurable { path: PathBuf, source: io::Error },
}

impl fmt::Display for BinaryCustodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BinaryCustodyError::Unsafe(v) => v.fmt(f),
            BinaryCustodyError::Unmeasurable { path, source } => write!(
                f,
                "the custody of {} cannot be measured: {source}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for BinaryCustodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BinaryCustodyError::Unsafe(v) => Some(v),
            BinaryCustodyError::Unmeasurable { source, .. } => Some(source),
        }
    }
}

/// Measures `path` and evaluates the four clauses for `caller`. On success
/// returns the facts (for the record / the JSON line).
pub fn check_binary(path: &Path, caller: &Caller) -> Result<StatFacts, BinaryCustodyError> {
    let facts = measure(path).map_err(|source| BinaryCustodyError::Unmeasurable {
        path: path.to_owned(),
        source,
    })?;
    evaluate(&facts, caller).map_err(BinaryCustodyError::Unsafe)?;
    Ok(facts)
}

// ---- key and credential files --------------------------------------------

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
    /// `"key"` or `"credential"`.
    pub fn noun(self) -> &'static str {
        match self {
            SecretKind::Key => "key",
            SecretKind::Credential => "credential",
            SecretKind::Lanes => "lanes file",
        }
    }

    /// `"key file"` or `"credential file"`.
    pub fn file_noun(self) -> &'static str {
        match self {
            SecretKind::Key => "key file",
            SecretKind::Credential => "credential file",
            SecretKind::Lanes => "lanes file",
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

    pub fn remediation(&self) -> String {
        match self {
            KeyCustodyError::Io { path, .. } => {
                format!("check that {} exists and is readable", path.display())
            }
            KeyCustodyError::Symlink { what, path } => format!(
                "replace the symbolic link {} with the {} itself",
                path.display(),
                what.file_noun()
            ),
            KeyCustodyError::NotRegular { path, .. } => {
                format!("{} must be a regular file", path.display())
            }
            KeyCustodyError::WrongOwner {
                what, path, euid, ..
            } => {
                format!(
                    "chown {euid} {} (the account that uses the {} must own it)",
                    path.display(),
                    what.noun()
                )
            }
            KeyCustodyError::ModeTooOpen { path, .. } => format!("chmod 0600 {}", path.display()),
            KeyCustodyError::Linked { path, .. } => format!(
                "remove the other links (find / -xdev -samefile {}) or copy the secret to a new \
                 file with mode 0600",
                path.display()
            ),
            KeyCustodyError::WrongLength { what, path, .. }
            | KeyCustodyError::Empty { what, path }
            | KeyCustodyError::TooLong { what, path, .. }
            | KeyCustodyError::Changed { what, path, .. } => match what {
                SecretKind::Key => format!(
                    "restore {} from a backup or create a new key",
                    path.display()
                ),
                SecretKind::Credential => format!(
                    "restore the credential file {} (mode 0600, owned by you, one link)",
                    path.display()
                ),
                SecretKind::Lanes => format!(
                    "restore {} from a backup (mode 0600, owned by you, one link), or move it \
                     aside and declare the lanes again with `saphan lane add`",
                    path.display()
                ),
            },
        }
    }
}

impl fmt::Display for KeyCustodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyCustodyError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            KeyCustodyError::Symlink { what, path } => write!(
                f,
                "{} {} is a symbolic link; {}s are opened without following links",
                what.file_noun(),
                path.display(),
                what.file_noun()
            ),
            KeyCustodyError::NotRegular { what, path, kind } => {
                write!(
                    f,
                    "{} {} is a {kind}, not a regular file",
                    what.file_noun(),
                    path.display()
                )
            }
            KeyCustodyError::WrongOwner {
                what,
                path,
                owner_uid,
                euid,
            } => write!(
                f,
                "{} {} is owned by uid {owner_uid}, not by the caller (euid {euid})",
                what.file_noun(),
                path.display()
            ),
            KeyCustodyError::ModeTooOpen { what, path, mode } => write!(
                f,
                "{} {} has mode {mode:04o}; group and others must have no access (0600)",
                what.file_noun(),
                path.display()
            ),
            KeyCustodyError::Linked { what, path, nlink } => write!(
                f,
                "{} {} has {nlink} hard links; a {} must have exactly one name (a read denial \
                 on this path would not cover the others)",
                what.file_noun(),
                path.display(),
                what.noun()
            ),
            KeyCustodyError::WrongLength {
                what,
                path,
                expected,
                found,
            } => write!(
                f,
                "{} {} is {found} bytes long; a {} is exactly {expected} bytes",
                what.file_noun(),
                path.display(),
                what.noun()
            ),
            KeyCustodyError::Empty { what, path } => {
                write!(f, "{} {} is empty", what.file_noun(), path.display())
            }
            KeyCustodyError::TooLong {
                what,
                path,
                max,
                found,
            } => write!(
                f,
                "{} {} is {found} bytes long; a {} is at most {max} bytes",
                what.file_noun(),
                path.display(),
                what.noun()
            ),
            KeyCustodyError::Changed {
                what,
                path,
                expected,
            } => write!(
                f,
                "{} {} changed while it was read (fstat said {expected} bytes)",
                what.file_noun(),
                path.display()
            ),
        }
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

fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "directory"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_symlink() {
        "symbolic link"
    } else {
        "non-regular file"
    }
}

/// Opens `path` without following a final symbolic link and proves, on the
/// descriptor's fstat (never the path's, which could be swapped), that it is a
/// regular file owned by `euid` that group and others cannot access.
fn open_owner_only(
    path: &Path,
    euid: u32,
    what: SecretKind,
) -> Result<(File, std::fs::Metadata), KeyCustodyError> {
    let file: File = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|source| {
            if source.raw_os_error() == Some(libc::ELOOP) {
                KeyCustodyError::Symlink {
                    what,
                    path: path.to_owned(),
                }
            } else {
                KeyCustodyError::Io {
                    path: path.to_owned(),
                    source,
                }
            }
        })?;
    let meta = file.metadata().map_err(|source| KeyCustodyError::Io {
        path: path.to_owned(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(KeyCustodyError::NotRegular {
            what,
            path: path.to_owned(),
            kind: kind_of(meta.file_type()),
        });
    }
    if meta.uid() != euid {
        return Err(KeyCustodyError::WrongOwner {
            what,
            path: path.to_owned(),
            owner_uid: meta.uid(),
            euid,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyCustodyError::ModeTooOpen {
            what,
            path: path.to_owned(),
            mode,
        });
    }
    Ok((file, meta))
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
    let (file, meta) = open_owner_only(path, euid, what)?;
    let wrong_length = || KeyCustodyError::WrongLength {
        what,
        path: path.to_owned(),
        expected: expected_len,
        found: meta.len(),
    };
    if meta.len() != expected_len {
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
    let (file, meta) = open_owner_only(path, euid, what)?;
    if meta.nlink() != 1 {
        return Err(KeyCustodyError::Linked {
            what,
            path: path.to_owned(),
            nlink: meta.nlink(),
        });
    }
    if meta.len() == 0 {
        return Err(KeyCustodyError::Empty {
            what,
            path: path.to_owned(),
        });
    }
    let too_long = || KeyCustodyError::TooLong {
        what,
        path: path.to_owned(),
        max: max_len,
        found: meta.len(),
    };
    if meta.len() > max_len {
        return Err(too_long());
    }
    let len = usize::try_from(meta.len()).map_err(|_| too_long())?;
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

    const ROOT: u32 = 0;
    const ALICE: u32 = 1000;
    const BOB: u32 = 1001;

    fn facts(owner: u32, group: u32, mode: u32) -> StatFacts {
        StatFacts {
            path: PathBuf::from("/opt/saphan/bin/saphan-launcher"),
            symlink_from: None,
            owner_uid: owner,
            group_gid: group,
            mode,
            parent: PathBuf::from("/opt/saphan/bin"),
            parent_owner_uid: ROOT,
            parent_group_gid: ROOT,
            parent_mode: 0o755,
        }
    }

    fn clause(f: &StatFacts, c: &Caller) -> Option<u8> {
        evaluate(f, c).err().map(|v| v.clause.number())
    }

    fn callers() -> Vec<Caller> {
        vec![
            Caller::new(ROOT, [ROOT]),
            Caller::new(ALICE, [ALICE]),
            Caller::new(ALICE, [ALICE, ROOT]),
            Caller::new(BOB, [BOB, 50, 27]),
            Caller::new(4242, [ROOT]), // arbitrary uid with gid 0 (OpenShift)
        ]
    }

    #[test]
    fn root_owned_0755_with_any_group_passes_for_any_caller() {
        for group in [ROOT, 27, 50, 65534, ALICE] {
            for c in callers() {
                assert_eq!(
                    clause(&facts(ROOT, group, 0o755), &c),
                    None,
                    "{group} {c:?}"
                );
                assert_eq!(
                    clause(&facts(ROOT, group, 0o555), &c),
                    None,
                    "{group} {c:?}"
                );
                assert_eq!(
                    clause(&facts(ROOT, group, 0o711), &c),
                    None,
                    "{group} {c:?}"
                );
            }
        }
    }

    #[test]
    fn owned_by_the_caller_passes() {
        for mode in [0o755, 0o700, 0o500, 0o550, 0o750] {
            let mut f = facts(ALICE, ALICE, mode);
            f.parent_owner_uid = ALICE;
            assert_eq!(
                clause(&f, &Caller::new(ALICE, [ALICE, ROOT])),
                None,
                "{mode:o}"
            );
        }
    }

    #[test]
    fn mode_0550_root_root_run_by_a_non_root_member_of_gid_0_is_clause_3() {
        let f = facts(ROOT, ROOT, 0o550);
        assert_eq!(clause(&f, &Caller::new(4242, [ROOT])), Some(3));
        assert_eq!(clause(&f, &Caller::new(ALICE, [ALICE, ROOT])), Some(3));
        // Root itself is the owner: admitted.
        assert_eq!(clause(&f, &Caller::new(ROOT, [ROOT])), None);
        // Same rule for any group id, none is special.
        assert_eq!(
            clause(&facts(ROOT, 27, 0o750), &Caller::new(BOB, [BOB, 27])),
            Some(3)
        );
        // A non-owner outside the group holds no execute bit at all and is
        // not this clause's business.
        assert_eq!(clause(&f, &Caller::new(BOB, [BOB])), None);
        // With o+x the group confers nothing extra.
        assert_eq!(
            clause(&facts(ROOT, ROOT, 0o551), &Caller::new(4242, [ROOT])),
            None
        );
    }

    #[test]
    fn group_or_other_writable_is_clause_2() {
        for mode in [0o775, 0o757, 0o777, 0o720, 0o702, 0o4775] {
            for c in callers() {
                assert_eq!(
                    clause(&facts(ROOT, ROOT, mode), &c),
                    Some(2),
                    "{mode:o} {c:?}"
                );
            }
            let mut f = facts(ALICE, ALICE, mode);
            f.parent_owner_uid = ALICE;
            assert_eq!(
                clause(&f, &Caller::new(ALICE, [ALICE])),
                Some(2),
                "{mode:o}"
            );
        }
    }

    #[test]
    fn owned_by_another_non_root_account_is_clause_1() {
        for mode in [0o755, 0o700, 0o550] {
            assert_eq!(
                clause(&facts(BOB, BOB, mode), &Caller::new(ALICE, [ALICE])),
                Some(1)
            );
            assert_eq!(
                clause(&facts(BOB, ROOT, mode), &Caller::new(4242, [ROOT])),
                Some(1)
            );
        }
        // Even root, running someone else's binary, is refused.
        assert_eq!(
            clause(&facts(ALICE, ALICE, 0o755), &Caller::new(ROOT, [ROOT])),
            Some(1)
        );
        // Clause 1 is reported before clause 2.
        assert_eq!(
            clause(&facts(BOB, BOB, 0o777), &Caller::new(ALICE, [ALICE])),
            Some(1)
        );
    }

    #[test]
    fn parent_writable_or_foreign_is_clause_4() {
        for pmode in [0o775, 0o757, 0o777, 0o1777, 0o730] {
            let mut f = facts(ROOT, ROOT, 0o755);
            f.parent_mode = pmode;
            assert_eq!(
                clause(&f, &Caller::new(ALICE, [ALICE])),
                Some(4),
                "{pmode:o}"
            );
        }
        let mut f = facts(ROOT, ROOT, 0o755);
        f.parent_owner_uid = BOB;
        assert_eq!(clause(&f, &Caller::new(ALICE, [ALICE])), Some(4));
        // The caller's own binary in a root-owned or own directory passes...
        let mut f = facts(ALICE, ALICE, 0o755);
        assert_eq!(clause(&f, &Caller::new(ALICE, [ALICE])), None);
        f.parent_owner_uid = ALICE;
        assert_eq!(clause(&f, &Caller::new(ALICE, [ALICE])), None);
        // ...a root-owned binary in the caller's directory does not: the
        // directory's owner is neither root nor the file's owner.
        let mut f = facts(ROOT, ROOT, 0o755);
        f.parent_owner_uid = ALICE;
        assert_eq!(clause(&f, &Caller::new(ALICE, [ALICE])), Some(4));
    }

    #[test]
    fn messages_name_owner_group_mode_and_caller() {
        let v = evaluate(&facts(ROOT, ROOT, 0o550), &Caller::new(4242, [ROOT, 7])).unwrap_err();
        let m = v.message();
        assert!(m.starts_with("clause 3: "), "{m}");
        for needle in [
            "/opt/saphan/bin/saphan-launcher 0:0 mode 0550",
            "parent /opt/saphan/bin 0:0 mode 0755",
            "caller euid 4242 groups [0,7]",
        ] {
            assert!(m.contains(needle), "missing {needle:?} in {m}");
        }
        assert!(v.remediation().contains("chmod 0755"));
        assert!(!v.remediation().contains("must not hold"));

        let mut f = facts(BOB, 50, 0o775);
        f.symlink_from = Some(PathBuf::from("/usr/local/bin/saphan-launcher"));
        let v = evaluate(&f, &Caller::new(ALICE, [ALICE])).unwrap_err();
        assert_eq!(v.clause, Clause::Custodian);
        assert!(v.message().contains("1001:50 mode 0775"), "{}", v.message());
        assert!(v
            .message()
            .contains("symbolic link /usr/local/bin/saphan-launcher"));
        assert!(v.to_string() == v.message());

        let mut f = facts(ROOT, ROOT, 0o755);
        f.parent_mode = 0o777;
        let v = evaluate(&f, &Caller::new(ALICE, [ALICE])).unwrap_err();
        assert!(
            v.message()
                .contains("mode 0777, so its group and others can replace"),
            "{}",
            v.message()
        );
    }

    #[test]
    fn measure_reads_real_files_and_notes_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = base.join("bin");
        std::fs::write(&bin, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = base.join("link");
        std::os::unix::fs::symlink(&bin, &link).unwrap();

        let me = Caller::current().unwrap();
        let f = check_binary(&bin, &me).unwrap();
        assert_eq!(f.path, bin);
        assert_eq!(f.symlink_from, None);
        assert_eq!(f.mode, 0o755);
        assert_eq!(f.parent, base);
        assert_eq!(f.parent_mode, 0o755);

        let f = check_binary(&link, &me).unwrap();
        assert_eq!(f.path, bin);
        assert_eq!(f.symlink_from, Some(link.clone()));

        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o775)).unwrap();
        match check_binary(&link, &me) {
            Err(BinaryCustodyError::Unsafe(v)) => assert_eq!(v.clause, Clause::Writers),
            other => panic!("expected clause 2, got {other:?}"),
        }
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o777)).unwrap();
        match check_binary(&bin, &me) {
            Err(BinaryCustodyError::Unsafe(v)) => assert_eq!(v.clause, Clause::Parent),
            other => panic!("expected clause 4, got {other:?}"),
        }
        assert!(matches!(
            check_binary(&base.join("missing"), &me),
            Err(BinaryCustodyError::Unmeasurable { .. })
        ));
    }

    #[test]
    fn caller_current_includes_egid() {
        let c = Caller::current().unwrap();
        assert_eq!(c.euid, sys::geteuid());
        assert!(c.holds_group(sys::getegid()));
        let mut sorted = c.groups.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, c.groups);
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
                e.remediation(),
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
            e.remediation(),
            format!(
                "restore the credential file {} (mode 0600, owned by you, one link)",
                p.display()
            )
        );
        assert!(!e.remediation().contains("new key"));

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
        assert!(e.remediation().contains("uses the credential must own it"));

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
            e.remediation(),
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
            e.remediation(),
            format!(
                "replace the symbolic link {} with the key file itself",
                link.display()
            )
        );
    }
}
