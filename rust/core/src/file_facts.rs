//! A file as its descriptor shows it: open without following a final
//! symbolic link, fstat the descriptor (never the path, which could be
//! swapped between the check and the use), and name the file's kind, owner
//! and mode for a message.
//!
//! Shared by binary custody ([`crate::binary_custody`]), secret-file reads
//! ([`crate::secret_file`]), the grant rule ([`crate::grant`]) and the
//! Landlock rule builder ([`crate::landlock`]).
#![forbid(unsafe_code)]

use std::fs::{File, FileType, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path` for reading with `O_NOFOLLOW | O_CLOEXEC` and `extra_flags`
/// (e.g. `O_PATH`, or `O_NONBLOCK | O_NOCTTY`). A symbolic link as the final
/// component is not followed: the kernel answers `ELOOP`
/// ([`is_final_symlink`]).
pub(crate) fn open_nofollow(path: &Path, extra_flags: i32) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | extra_flags)
        .open(path)
}

/// Whether an [`open_nofollow`] error means the final component is a
/// symbolic link.
pub(crate) fn is_final_symlink(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ELOOP)
}

/// What a stat says about a file: its type, owner, group, permission bits,
/// link count and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileFacts {
    pub file_type: FileType,
    pub owner_uid: u32,
    pub group_gid: u32,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub nlink: u64,
    pub len: u64,
}

impl FileFacts {
    /// The facts of a stat result (from an fstat, or from a path when the
    /// caller means to follow links).
    pub fn of(meta: &Metadata) -> Self {
        FileFacts {
            file_type: meta.file_type(),
            owner_uid: meta.uid(),
            group_gid: meta.gid(),
            mode: meta.mode() & 0o7777,
            nlink: meta.nlink(),
            len: meta.len(),
        }
    }

    /// fstat on the descriptor.
    pub fn fstat(file: &File) -> io::Result<Self> {
        file.metadata().map(|meta| FileFacts::of(&meta))
    }

    pub fn is_regular(&self) -> bool {
        self.file_type.is_file()
    }

    /// The file's kind, for a message ([`file_kind`]).
    pub fn kind(&self) -> &'static str {
        file_kind(self.file_type)
    }
}

/// A human name for a file type: `directory`, `regular file`,
/// `symbolic link`, `character device`, `block device`, `FIFO` or `socket`.
pub(crate) fn file_kind(ft: FileType) -> &'static str {
    if ft.is_dir() {
        "directory"
    } else if ft.is_file() {
        "regular file"
    } else if ft.is_symlink() {
        "symbolic link"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_socket() {
        "socket"
    } else {
        "file of unknown type"
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_final_symlink_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open_nofollow(&link, 0).unwrap_err();
        assert!(is_final_symlink(&e), "{e}");
        // O_PATH opens the link itself.
        let f = open_nofollow(&link, libc::O_PATH).unwrap();
        assert_eq!(FileFacts::fstat(&f).unwrap().kind(), "symbolic link");
        let missing = open_nofollow(&dir.path().join("absent"), 0).unwrap_err();
        assert!(!is_final_symlink(&missing));
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn fstat_reads_kind_owner_mode_links_and_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"12345").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o4640)).unwrap();
        std::fs::hard_link(&p, dir.path().join("g")).unwrap();
        let f = open_nofollow(&p, libc::O_NONBLOCK | libc::O_NOCTTY).unwrap();
        let facts = FileFacts::fstat(&f).unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        assert!(facts.is_regular());
        assert_eq!(facts.kind(), "regular file");
        assert_eq!(facts.owner_uid, meta.uid());
        assert_eq!(facts.group_gid, meta.gid());
        assert_eq!(facts.mode, 0o4640);
        assert_eq!(facts.nlink, 2);
        assert_eq!(facts.len, 5);
        assert_eq!(FileFacts::of(&meta), facts);
    }

    #[test]
    fn kinds_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let kind = |p: &Path| file_kind(std::fs::symlink_metadata(p).unwrap().file_type());
        assert_eq!(kind(dir.path()), "directory");
        assert_eq!(kind(Path::new("/dev/null")), "character device");
        let fifo = dir.path().join("fifo");
        let ok = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success();
        assert!(ok);
        assert_eq!(kind(&fifo), "FIFO");
        let sock = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert_eq!(kind(&sock), "socket");
    }
}
