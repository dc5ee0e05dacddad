//! Binary custody: who can replace the binary that is running.
//!
//! The check is four clauses about identity (SPEC.md §7), evaluated by a
//! pure function over stat facts so the whole table can be tested without
//! creating accounts:
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
//!
//! Every refusal is `custody-binary-unsafe`; [`BinaryCustodyError::describe`]
//! gives its message and remediation.
#![forbid(unsafe_code)]

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::file_facts::FileFacts;
use crate::refusal::RefusalClass;
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
    /// `(message, remediation)`. The message names the clause and why it
    /// failed, then everything measured: the path, owner:group and mode in
    /// octal, the same for the parent, and the caller's euid and groups. The
    /// remediation says what to change so the clause holds.
    pub fn describe(&self) -> (String, String) {
        let f = &self.facts;
        let c = &self.caller;
        let path = f.path.display();
        let parent = f.parent.display();
        let (why, fix) = match self.clause {
            Clause::Custodian => (
                format!(
                    "{path} is owned by uid {}, which is neither root nor the caller (euid {})",
                    f.owner_uid, c.euid
                ),
                format!(
                    "chown root:root {path} (and chmod 0755), or install a copy owned by the \
                     account that runs it (uid {})",
                    c.euid
                ),
            ),
            Clause::Writers => (
                format!(
                    "{path} has mode {:04o}, so {} can write it",
                    f.mode,
                    who_writes(f.mode)
                ),
                format!("chmod go-w {path} (installers write 0755)"),
            ),
            Clause::Reach => (
                format!(
                    "the caller (euid {}) is not the owner (uid {}) and reaches {path} through \
                     its group (gid {}, which the caller holds): mode {:04o} gives others no \
                     execute bit",
                    c.euid, f.owner_uid, f.group_gid, f.mode
                ),
                format!(
                    "chmod 0755 {path} so non-owners execute through others' bit, or run it as \
                     its owner (uid {})",
                    f.owner_uid
                ),
            ),
            Clause::Parent => (
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
                },
                format!(
                    "make {parent} owned by root or uid {} and chmod go-w {parent}, or install \
                     the binary into a directory only its owner can write",
                    f.owner_uid
                ),
            ),
        };
        let via = match &f.symlink_from {
            Some(link) => format!(" (reached through the symbolic link {})", link.display()),
            None => String::new(),
        };
        let message = format!(
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
        );
        (message, fix)
    }
}

impl fmt::Display for CustodyViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe().0)
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
    let file = FileFacts::of(&std::fs::metadata(&real)?);
    let parent = real
        .parent()
        .map_or_else(|| real.clone(), Path::to_path_buf);
    let dir = FileFacts::of(&std::fs::metadata(&parent)?);
    Ok(StatFacts {
        path: real,
        symlink_from,
        owner_uid: file.owner_uid,
        group_gid: file.group_gid,
        mode: file.mode,
        parent,
        parent_owner_uid: dir.owner_uid,
        parent_group_gid: dir.group_gid,
        parent_mode: dir.mode,
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

impl BinaryCustodyError {
    /// Every binary custody error is `custody-binary-unsafe`.
    pub fn refusal_class(&self) -> RefusalClass {
        RefusalClass::CustodyBinaryUnsafe
    }

    /// `(message, remediation)`: the failed clause's
    /// ([`CustodyViolation::describe`]), or what could not be measured. (The
    /// PyO3 module raises an unmeasurable binary as `OSError`; the launcher,
    /// measuring itself, prints this remediation.)
    pub fn describe(&self) -> (String, String) {
        match self {
            BinaryCustodyError::Unsafe(v) => v.describe(),
            BinaryCustodyError::Unmeasurable { path, source } => (
                format!(
                    "the custody of {} cannot be measured: {source}",
                    path.display()
                ),
                "run the launcher from an installed file this process can stat (and its parent \
                 directory)"
                    .to_owned(),
            ),
        }
    }
}

impl fmt::Display for BinaryCustodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe().0)
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
        let (m, fix) = v.describe();
        assert!(m.starts_with("clause 3: "), "{m}");
        for needle in [
            "/opt/saphan/bin/saphan-launcher 0:0 mode 0550",
            "parent /opt/saphan/bin 0:0 mode 0755",
            "caller euid 4242 groups [0,7]",
        ] {
            assert!(m.contains(needle), "missing {needle:?} in {m}");
        }
        assert!(fix.contains("chmod 0755"));
        assert!(!fix.contains("must not hold"));

        let mut f = facts(BOB, 50, 0o775);
        f.symlink_from = Some(PathBuf::from("/usr/local/bin/saphan-launcher"));
        let v = evaluate(&f, &Caller::new(ALICE, [ALICE])).unwrap_err();
        assert_eq!(v.clause, Clause::Custodian);
        let (m, _) = v.describe();
        assert!(m.contains("1001:50 mode 0775"), "{m}");
        assert!(m.contains("symbolic link /usr/local/bin/saphan-launcher"));
        assert!(v.to_string() == m);

        let mut f = facts(ROOT, ROOT, 0o755);
        f.parent_mode = 0o777;
        let v = evaluate(&f, &Caller::new(ALICE, [ALICE])).unwrap_err();
        let (m, _) = v.describe();
        assert!(
            m.contains("mode 0777, so its group and others can replace"),
            "{m}"
        );
    }

    /// Each clause's message and remediation, word for word (the launcher
    /// prints them and the Python side shows them).
    #[test]
    fn describe_each_clause() {
        let alice = Caller::new(ALICE, [ALICE, 7]);
        let tail = |f: &StatFacts| {
            format!(
                "; measured: /opt/saphan/bin/saphan-launcher {}:{} mode {:04o}, parent \
                 /opt/saphan/bin {}:0 mode {:04o}, caller euid 1000 groups [7,1000]",
                f.owner_uid, f.group_gid, f.mode, f.parent_owner_uid, f.parent_mode
            )
        };
        let cases = [
            (
                facts(BOB, BOB, 0o755),
                Clause::Custodian,
                "/opt/saphan/bin/saphan-launcher is owned by uid 1001, which is neither root \
                 nor the caller (euid 1000)",
                "chown root:root /opt/saphan/bin/saphan-launcher (and chmod 0755), or install \
                 a copy owned by the account that runs it (uid 1000)",
            ),
            (
                facts(ROOT, ROOT, 0o757),
                Clause::Writers,
                "/opt/saphan/bin/saphan-launcher has mode 0757, so others can write it",
                "chmod go-w /opt/saphan/bin/saphan-launcher (installers write 0755)",
            ),
            (
                facts(ROOT, 7, 0o750),
                Clause::Reach,
                "the caller (euid 1000) is not the owner (uid 0) and reaches \
                 /opt/saphan/bin/saphan-launcher through its group (gid 7, which the caller \
                 holds): mode 0750 gives others no execute bit",
                "chmod 0755 /opt/saphan/bin/saphan-launcher so non-owners execute through \
                 others' bit, or run it as its owner (uid 0)",
            ),
            (
                StatFacts {
                    parent_owner_uid: BOB,
                    ..facts(ROOT, ROOT, 0o755)
                },
                Clause::Parent,
                "the parent directory /opt/saphan/bin is owned by uid 1001, which is neither \
                 root nor the file's owner (uid 0)",
                "make /opt/saphan/bin owned by root or uid 0 and chmod go-w /opt/saphan/bin, \
                 or install the binary into a directory only its owner can write",
            ),
            (
                StatFacts {
                    parent_mode: 0o775,
                    ..facts(ROOT, ROOT, 0o755)
                },
                Clause::Parent,
                "the parent directory /opt/saphan/bin has mode 0775, so its group can replace \
                 the file",
                "make /opt/saphan/bin owned by root or uid 0 and chmod go-w /opt/saphan/bin, \
                 or install the binary into a directory only its owner can write",
            ),
        ];
        for (f, expected_clause, why, fix) in cases {
            let v = evaluate(&f, &alice).unwrap_err();
            assert_eq!(v.clause, expected_clause);
            let n = expected_clause.number();
            let expected = (format!("clause {n}: {why}{}", tail(&f)), fix.to_owned());
            assert_eq!(v.describe(), expected);
            assert_eq!(v.to_string(), expected.0);
            let e = BinaryCustodyError::Unsafe(v);
            assert_eq!(e.describe(), expected);
            assert_eq!(e.to_string(), expected.0);
            assert_eq!(e.refusal_class(), RefusalClass::CustodyBinaryUnsafe);
        }
    }

    #[test]
    fn describe_unmeasurable() {
        let e = BinaryCustodyError::Unmeasurable {
            path: PathBuf::from("/gone/saphan-launcher"),
            source: io::Error::from_raw_os_error(libc::ENOENT),
        };
        let (message, fix) = e.describe();
        assert!(
            message.starts_with("the custody of /gone/saphan-launcher cannot be measured: "),
            "{message}"
        );
        assert!(message.contains("No such file or directory"), "{message}");
        assert_eq!(
            fix,
            "run the launcher from an installed file this process can stat (and its parent \
             directory)"
        );
        assert_eq!(e.to_string(), message);
        assert_eq!(e.refusal_class(), RefusalClass::CustodyBinaryUnsafe);
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
}
