//! Landlock: measuring the kernel's ABI and applying saphan's write boundary.
//!
//! Two facts drive everything here:
//! * [`FLOOR`] — below ABI 3 the kernel does not cover truncation, so a
//!   "confined" agent could still empty any file it can open. Below the floor
//!   the answer is a refusal, never a weaker boundary.
//! * [`HIGHEST_KNOWN`] — the highest ABI whose filesystem rights this code
//!   handles and whose behaviour the test suite has measured. A kernel that
//!   reports more is still confined with exactly these rights (each newer ABI
//!   keeps every older right), and the engine does not believe a *recorded*
//!   level above it (`landlock-level-unknown`).
//!
//! From ABI 6 the domain is also *scoped*: a process inside can neither
//! signal a process outside it nor connect to an abstract unix socket
//! created outside it (see [`apply_domain`]).
#![forbid(unsafe_code)]

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ::landlock::{
    Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use crate::file_facts;
use crate::grant::{self, GrantError};
use crate::refusal::RefusalClass;
use crate::sys;

/// The lowest ABI with scoping (`LANDLOCK_SCOPE_SIGNAL`,
/// `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`).
pub const SCOPES_FROM: u32 = 6;

/// The lowest ABI saphan will confine with: ABI 3 added `LANDLOCK_ACCESS_FS_TRUNCATE`.
pub const FLOOR: u32 = 3;

/// The highest ABI whose rights this build handles and has tested (the kernel
/// of the build machine reports 7; ABIs 8-10 exist in the `landlock` crate but
/// have not been measured here).
pub const HIGHEST_KNOWN: u32 = 7;

/// A Landlock ABI version as reported by the kernel (always >= 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Abi(u32);

impl Abi {
    /// Wraps a measured level; `None` for 0 (0 means "no Landlock").
    pub fn new(level: u32) -> Option<Self> {
        (level >= 1).then_some(Abi(level))
    }

    pub fn level(self) -> u32 {
        self.0
    }
}

/// What the kernel answered to the version query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbiProbe {
    /// Landlock is available at this ABI.
    Supported(Abi),
    /// ENOSYS: the kernel was built without Landlock.
    NotImplemented,
    /// EOPNOTSUPP: Landlock is built in but not enabled (boot `lsm=` list).
    Disabled,
    /// Any other errno (e.g. EPERM from a seccomp filter in a container).
    Failed(i32),
}

impl AbiProbe {
    /// Measures the running kernel with the raw
    /// `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`.
    pub fn detect() -> Self {
        Self::from_raw(sys::landlock_abi_version())
    }

    /// Interprets a raw answer (a version or an errno). Pure; used by tests.
    pub fn from_raw(raw: Result<i64, i32>) -> Self {
        match raw {
            Ok(v) => match u32::try_from(v).ok().and_then(Abi::new) {
                Some(abi) => AbiProbe::Supported(abi),
                // 0 or out of range is not a level the kernel documents.
                None => AbiProbe::Failed(0),
            },
            Err(e) if e == libc::ENOSYS => AbiProbe::NotImplemented,
            Err(e) if e == libc::EOPNOTSUPP => AbiProbe::Disabled,
            Err(e) => AbiProbe::Failed(e),
        }
    }

    /// The level to record: the ABI, or 0 when Landlock is unusable.
    pub fn level(self) -> u32 {
        match self {
            AbiProbe::Supported(abi) => abi.level(),
            _ => 0,
        }
    }

    /// A stable machine-readable reason: `supported`, `enosys`, `eopnotsupp`,
    /// or `errno-N` for any other errno the kernel answered with.
    pub fn reason(self) -> String {
        match self {
            AbiProbe::Supported(_) => "supported".to_owned(),
            AbiProbe::NotImplemented => "enosys".to_owned(),
            AbiProbe::Disabled => "eopnotsupp".to_owned(),
            AbiProbe::Failed(e) => format!("errno-{e}"),
        }
    }

    /// What an operator can do about an unusable probe, in the style of a hint.
    pub fn remediation(self) -> String {
        match self {
            AbiProbe::Supported(abi) if abi.level() < FLOOR => format!(
                "upgrade this machine's kernel to Linux 6.2 or later (Landlock ABI {FLOOR}, \
                 which covers truncation); it measures ABI {}",
                abi.level()
            ),
            AbiProbe::Supported(_) => "nothing to do".to_owned(),
            AbiProbe::NotImplemented => "this kernel is built without Landlock \
                (CONFIG_SECURITY_LANDLOCK=y is needed); use a kernel that has it"
                .to_owned(),
            AbiProbe::Disabled => "Landlock is built in but not enabled: add `landlock` to the \
                kernel's `lsm=` boot parameter (see /sys/kernel/security/lsm) and reboot"
                .to_owned(),
            AbiProbe::Failed(e) => format!(
                "the Landlock syscall was refused with errno {e} (a seccomp filter, e.g. a \
                 container runtime's default profile?); allow landlock_create_ruleset, \
                 landlock_add_rule and landlock_restrict_self"
            ),
        }
    }
}

/// Why a Landlock domain was not applied. Every variant is a refusal: there
/// is no best-effort outcome.
#[derive(Debug)]
pub enum LandlockError {
    /// The kernel offers no usable Landlock (probe answered 0 / an errno).
    Incapable(AbiProbe),
    /// The kernel's ABI is below [`FLOOR`].
    BelowFloor { measured: u32 },
    /// A writable path could not be opened to build its rule.
    PathOpen { path: PathBuf, source: io::Error },
    /// A writable directory fails the grant rule (`grant::check_grant_dir`):
    /// a symbolic link, a non-directory or a missing component on its path.
    Grant(GrantError),
    /// A writable path is not the real path of what it names (a symlink on
    /// the way): rules are built on real paths only.
    NotCanonical { path: PathBuf, resolved: PathBuf },
    /// The `landlock` crate or the kernel refused a step.
    Ruleset(String),
    /// The kernel applied less than what was requested.
    NotFullyEnforced { status: String },
    /// `PR_SET_NO_NEW_PRIVS` was not set.
    NoNewPrivs,
}

impl LandlockError {
    /// The refusal class from the closed table (SPEC.md §4).
    pub fn refusal_class(&self) -> RefusalClass {
        match self {
            LandlockError::Incapable(_) => RefusalClass::LandlockIncapable,
            LandlockError::BelowFloor { .. } => RefusalClass::LandlockBelowFloor,
            LandlockError::Grant(e) => e.refusal_class(),
            LandlockError::PathOpen { .. } | LandlockError::NotCanonical { .. } => {
                RefusalClass::PolicyInvalid
            }
            LandlockError::Ruleset(_)
            | LandlockError::NotFullyEnforced { .. }
            | LandlockError::NoNewPrivs => RefusalClass::ConfinementUnavailable,
        }
    }

    pub fn remediation(&self) -> String {
        match self {
            LandlockError::Incapable(probe) => probe.remediation(),
            LandlockError::BelowFloor { measured } => {
                AbiProbe::Supported(Abi(*measured)).remediation()
            }
            LandlockError::PathOpen { path, .. } => format!(
                "create {} on this machine before the run, or leave it out of `writable`",
                path.display()
            ),
            LandlockError::Grant(e) => e.describe().1,
            LandlockError::NotCanonical { resolved, .. } => format!(
                "name the real path {} in `writable` (the engine resolves symbolic links \
                 before building a policy)",
                resolved.display()
            ),
            LandlockError::Ruleset(_)
            | LandlockError::NotFullyEnforced { .. }
            | LandlockError::NoNewPrivs => "re-probe this machine (saphan machine \
                probe-confinement) and report the kernel release with this message"
                .to_owned(),
        }
    }
}

impl fmt::Display for LandlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LandlockError::Incapable(probe) => write!(
                f,
                "this kernel measures landlock abi=0 ({}); Landlock is required",
                probe.reason()
            ),
            LandlockError::BelowFloor { measured } => write!(
                f,
                "this kernel measures landlock abi={measured}, the floor is {FLOOR}"
            ),
            LandlockError::Grant(e) => e.fmt(f),
            LandlockError::PathOpen { path, source } => {
                write!(
                    f,
                    "writable path {} cannot be opened: {source}",
                    path.display()
                )
            }
            LandlockError::NotCanonical { path, resolved } => write!(
                f,
                "writable path {} resolves to {}; rules are built on real paths only",
                path.display(),
                resolved.display()
            ),
            LandlockError::Ruleset(msg) => write!(f, "landlock ruleset refused: {msg}"),
            LandlockError::NotFullyEnforced { status } => write!(
                f,
                "the kernel enforced the ruleset only as {status}; saphan refuses \
                 anything but fully enforced"
            ),
            LandlockError::NoNewPrivs => f.write_str("no_new_privs could not be set"),
        }
    }
}

impl std::error::Error for LandlockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LandlockError::PathOpen { source, .. } => Some(source),
            LandlockError::Grant(e) => Some(e),
            _ => None,
        }
    }
}

impl From<::landlock::RulesetError> for LandlockError {
    fn from(e: ::landlock::RulesetError) -> Self {
        LandlockError::Ruleset(e.to_string())
    }
}

/// The `landlock` crate's ABI value for a level this build handles.
fn crate_abi(level: u32) -> Option<ABI> {
    match level {
        1 => Some(ABI::V1),
        2 => Some(ABI::V2),
        3 => Some(ABI::V3),
        4 => Some(ABI::V4),
        5 => Some(ABI::V5),
        6 => Some(ABI::V6),
        7 => Some(ABI::V7),
        _ => None,
    }
}

/// The rights saphan's boundary uses at one ABI level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rights {
    /// Every filesystem right of the ABI: what the ruleset handles (denies
    /// unless a rule grants it), and what a writable directory is granted.
    pub handled: BitFlags<AccessFs>,
    /// Read and execute (`Execute | ReadFile | ReadDir`): what `/` is granted.
    pub read: BitFlags<AccessFs>,
    /// The subset of `handled` that applies to a non-directory: what a
    /// writable file (e.g. `/dev/null`) is granted.
    pub file: BitFlags<AccessFs>,
}

impl Rights {
    /// The rights at `level`; `None` outside `1..=HIGHEST_KNOWN`.
    pub fn at(level: u32) -> Option<Self> {
        let abi = crate_abi(level)?;
        Some(Rights {
            handled: AccessFs::from_all(abi),
            read: AccessFs::from_read(abi),
            file: AccessFs::from_file(abi),
        })
    }
}

/// The outcome of a successfully applied domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enforced {
    /// The ABI whose every filesystem right is handled: min(live, HIGHEST_KNOWN).
    pub abi: u32,
    /// What the live kernel measured.
    pub live: u32,
    /// The writable paths, in policy order.
    pub writable: Vec<PathBuf>,
    /// The scopes the kernel applied, in the order of [`SCOPE_NAMES`]
    /// (empty below ABI [`SCOPES_FROM`]).
    pub scopes: Vec<&'static str>,
}

/// The scopes saphan requests, with the names the confirmation line uses.
pub const SCOPE_NAMES: [(Scope, &str); 2] = [
    (Scope::Signal, "signal"),
    (Scope::AbstractUnixSocket, "abstract-unix-socket"),
];

/// The scopes to request at a handled level: both from ABI
/// [`SCOPES_FROM`], none below (where the kernel has no scoping at all).
pub fn scopes_at(level: u32) -> Vec<(Scope, &'static str)> {
    if level >= SCOPES_FROM {
        SCOPE_NAMES.to_vec()
    } else {
        Vec::new()
    }
}

/// Decides which ABI to handle for a live probe, or refuses. Pure.
///
/// Below the floor and "no Landlock" are refusals with the measured level;
/// above [`HIGHEST_KNOWN`] the known rights are handled (each later ABI keeps
/// every earlier right, so the write boundary is the same one we tested).
pub fn level_to_handle(probe: AbiProbe) -> Result<u32, LandlockError> {
    match probe {
        AbiProbe::Supported(abi) if abi.level() < FLOOR => Err(LandlockError::BelowFloor {
            measured: abi.level(),
        }),
        AbiProbe::Supported(abi) => Ok(abi.level().min(HIGHEST_KNOWN)),
        other => Err(LandlockError::Incapable(other)),
    }
}

/// Opens one writable path for its rule and decides the rights it gets.
///
/// The path is first opened `O_PATH | O_NOFOLLOW`, which tells a directory
/// from a file without following a final link:
/// * a regular or device file (e.g. `/dev/null`) gets the file subset, and
///   must be its own real path (`canonicalize` covers the components before
///   it);
/// * everything else — a directory, a symbolic link, a FIFO or socket, a
///   missing or unreachable path — goes through the grant rule
///   ([`grant::open_grant_dir`]): walked from `/` with no link anywhere, and
///   the rule is built on the descriptor that walk ends on, so the rule
///   names the directory that was checked (and the refusal is the one
///   `check_grant_dir` gives the other lane, word for word).
fn open_writable(
    path: &Path,
    rights: &Rights,
) -> Result<(File, BitFlags<AccessFs>), LandlockError> {
    let first = file_facts::open_nofollow(path, libc::O_PATH)
        .and_then(|fd| fd.metadata().map(|meta| (fd, meta.file_type())));
    match first {
        Ok((fd, ft)) if ft.is_file() || ft.is_char_device() || ft.is_block_device() => {
            let resolved =
                std::fs::canonicalize(path).map_err(|source| LandlockError::PathOpen {
                    path: path.to_owned(),
                    source,
                })?;
            if resolved != path {
                return Err(LandlockError::NotCanonical {
                    path: path.to_owned(),
                    resolved,
                });
            }
            Ok((fd, rights.file))
        }
        _ => {
            let fd = grant::open_grant_dir(path).map_err(LandlockError::Grant)?;
            Ok((File::from(fd), rights.handled))
        }
    }
}

/// Applies saphan's write boundary to the calling thread (and everything it
/// executes afterwards) — the caller must be single-threaded, as a launcher
/// about to `exec` is.
///
/// Order of the rules, and why it is safe: the ruleset *handles* every
/// filesystem right of the ABI (so each is denied unless granted); `/` is
/// granted read+execute only; each writable path is granted every right (a
/// file gets the file subset); a writable directory is granted only when
/// its path passes the grant rule (no symbolic link anywhere on it). Landlock grants are a union over the path's
/// ancestors, so no rule can take a right away — which is why reads cannot be
/// carved out and why nothing but the writable list can widen writes.
///
/// Fail-closed: the live ABI is re-measured here (a stale or edited record
/// cannot weaken the boundary), the ruleset is built as a
/// `CompatLevel::HardRequirement` (any right the kernel lacks is an error, not
/// a silent downgrade), and anything but `RulesetStatus::FullyEnforced` with
/// no_new_privs set is an error. The caller must then not run the agent.
///
/// Scoping: at a handled level of [`SCOPES_FROM`] or above the ruleset also
/// scopes signals and abstract unix sockets (as a hard requirement, like
/// the rest), so a process in the domain can signal only processes in the
/// same domain or one nested in it, and connect only to abstract sockets
/// created there. A launcher that applies the domain to itself before it
/// forks keeps the right to signal (and kill) everything its command starts.
/// [`Enforced::scopes`] lists what was applied.
pub fn apply_domain(writable: &[PathBuf]) -> Result<Enforced, LandlockError> {
    let probe = AbiProbe::detect();
    let level = level_to_handle(probe)?;
    let rights = Rights::at(level)
        .ok_or_else(|| LandlockError::Ruleset(format!("no rights table for ABI {level}")))?;

    // Open every rule target before creating the ruleset, so a bad path is a
    // policy error rather than a half-built domain.
    let mut rules = Vec::with_capacity(writable.len());
    for path in writable {
        rules.push(open_writable(path, &rights)?);
    }
    let root = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open("/")
        .map_err(|source| LandlockError::PathOpen {
            path: PathBuf::from("/"),
            source,
        })?;

    let scopes = scopes_at(level);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(rights.handled)?;
    for (scope, _) in &scopes {
        ruleset = ruleset.scope(*scope)?;
    }
    let mut created = ruleset
        .create()?
        .no_new_privs(true)
        .add_rule(PathBeneath::new(root, rights.read))?;
    for (fd, access) in rules {
        created = created.add_rule(PathBeneath::new(fd, access))?;
    }
    let status = created.restrict_self()?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(LandlockError::NotFullyEnforced {
            status: format!("{:?}", status.ruleset),
        });
    }
    if !status.no_new_privs {
        return Err(LandlockError::NoNewPrivs);
    }
    Ok(Enforced {
        abi: level,
        live: probe.level(),
        writable: writable.to_vec(),
        scopes: scopes.iter().map(|(_, name)| *name).collect(),
    })
}

/// A scope-only ruleset (no filesystem right handled) with the scopes of
/// `enforced`, for the command a supervisor starts inside its own domain;
/// `None` when no scope was applied (ABI < [`SCOPES_FROM`]).
///
/// Why a second, nested domain: Landlock scoping lets a process signal the
/// processes of its own domain and of domains nested in it. A supervisor
/// that shares its domain with its command could be stopped or killed by
/// that command (and could then no longer kill what the command left
/// behind). With the command one level down, the supervisor can still
/// signal and kill everything the command starts, and the command cannot
/// signal the supervisor — nor anything else outside.
pub fn nested_scope_ruleset(enforced: &Enforced) -> Result<Option<OwnedFd>, LandlockError> {
    let scopes: Vec<Scope> = SCOPE_NAMES
        .iter()
        .filter(|(_, name)| enforced.scopes.contains(name))
        .map(|(scope, _)| *scope)
        .collect();
    if scopes.is_empty() {
        return Ok(None);
    }
    let mut ruleset = Ruleset::default().set_compatibility(CompatLevel::HardRequirement);
    for scope in scopes {
        ruleset = ruleset.scope(scope)?;
    }
    let fd: Option<OwnedFd> = ruleset.create()?.into();
    fd.map(Some).ok_or_else(|| {
        LandlockError::Ruleset("the scope-only ruleset has no descriptor".to_owned())
    })
}

/// A signal-scope-only ruleset for the command `reap` supervises (no
/// filesystem rule: `reap` confines nothing), when the live kernel scopes
/// signals (ABI >= [`SCOPES_FROM`]); `None` below. In that domain the
/// command can neither signal nor ptrace (every Landlock domain restricts
/// ptrace to itself and below) a process outside it: not the supervisor
/// (stopping or killing it would leave the run unreaped), not the jail's
/// process 1 (whose status channel a `pidfd_getfd` could forge).
pub fn signal_scope_ruleset() -> Result<Option<OwnedFd>, LandlockError> {
    if AbiProbe::detect().level() < SCOPES_FROM {
        return Ok(None);
    }
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .scope(Scope::Signal)?;
    let fd: Option<OwnedFd> = ruleset.create()?.into();
    fd.map(Some).ok_or_else(|| {
        LandlockError::Ruleset("the signal-scope ruleset has no descriptor".to_owned())
    })
}

/// The one confirmation line the launcher prints after applying the domain:
/// `saphan-launcher: landlock abi=N enforced writable=[a,b] scopes=[…]`.
pub fn confirmation_line(enforced: &Enforced) -> String {
    let list: Vec<String> = enforced
        .writable
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    format!(
        "saphan-launcher: landlock abi={} enforced writable=[{}] scopes=[{}]",
        enforced.abi,
        list.join(","),
        enforced.scopes.join(",")
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_signal_scope_ruleset_exactly_where_the_kernel_scopes() {
        let got = signal_scope_ruleset().unwrap();
        assert_eq!(got.is_some(), AbiProbe::detect().level() >= SCOPES_FROM);
    }
    use std::os::unix::fs::MetadataExt;
    use std::process::Command;

    #[test]
    fn probe_interprets_raw_answers() {
        assert_eq!(
            AbiProbe::from_raw(Ok(7)),
            AbiProbe::Supported(Abi::new(7).unwrap())
        );
        assert_eq!(
            AbiProbe::from_raw(Err(libc::ENOSYS)),
            AbiProbe::NotImplemented
        );
        assert_eq!(
            AbiProbe::from_raw(Err(libc::EOPNOTSUPP)),
            AbiProbe::Disabled
        );
        assert_eq!(
            AbiProbe::from_raw(Err(libc::EPERM)),
            AbiProbe::Failed(libc::EPERM)
        );
        assert_eq!(AbiProbe::from_raw(Ok(0)), AbiProbe::Failed(0));
        assert_eq!(AbiProbe::from_raw(Ok(-5)), AbiProbe::Failed(0));
    }

    #[test]
    fn probe_reasons_and_levels_are_stable() {
        let cases = [
            (AbiProbe::Supported(Abi(5)), 5, "supported"),
            (AbiProbe::NotImplemented, 0, "enosys"),
            (AbiProbe::Disabled, 0, "eopnotsupp"),
            (AbiProbe::Failed(1), 0, "errno-1"),
        ];
        for (probe, level, reason) in cases {
            assert_eq!(probe.level(), level);
            assert_eq!(probe.reason(), reason);
        }
    }

    #[test]
    fn live_probe_matches_this_machine() {
        // The build machine runs a kernel with Landlock; the probe must say so.
        let probe = AbiProbe::detect();
        assert!(
            matches!(probe, AbiProbe::Supported(_)),
            "expected Landlock on the test machine, got {probe:?}"
        );
        assert!(probe.level() >= FLOOR);
    }

    #[test]
    fn level_selection_refuses_below_floor_and_caps_above_known() {
        for level in 1..FLOOR {
            let err = level_to_handle(AbiProbe::Supported(Abi(level))).unwrap_err();
            assert_eq!(err.refusal_class(), RefusalClass::LandlockBelowFloor);
            assert_eq!(
                err.to_string(),
                format!("this kernel measures landlock abi={level}, the floor is 3")
            );
        }
        for level in FLOOR..=HIGHEST_KNOWN {
            assert_eq!(
                level_to_handle(AbiProbe::Supported(Abi(level))).unwrap(),
                level
            );
        }
        assert_eq!(
            level_to_handle(AbiProbe::Supported(Abi(HIGHEST_KNOWN + 3))).unwrap(),
            HIGHEST_KNOWN
        );
        for probe in [
            AbiProbe::NotImplemented,
            AbiProbe::Disabled,
            AbiProbe::Failed(1),
        ] {
            let err = level_to_handle(probe).unwrap_err();
            assert_eq!(err.refusal_class(), RefusalClass::LandlockIncapable);
            assert!(err.to_string().contains("abi=0"));
        }
    }

    #[test]
    fn rights_tables_cover_every_known_level() {
        assert!(Rights::at(0).is_none());
        assert!(Rights::at(HIGHEST_KNOWN + 1).is_none());
        let mut previous = BitFlags::<AccessFs>::EMPTY;
        for level in 1..=HIGHEST_KNOWN {
            let r = Rights::at(level).unwrap();
            assert!(r.handled.contains(previous), "ABI {level} lost a right");
            assert!(r.handled.contains(r.read));
            assert!(r.handled.contains(r.file));
            assert_eq!(
                r.read,
                AccessFs::Execute | AccessFs::ReadFile | AccessFs::ReadDir
            );
            previous = r.handled;
        }
        let floor = Rights::at(FLOOR).unwrap();
        assert!(floor.handled.contains(AccessFs::Truncate));
        assert!(floor.file.contains(AccessFs::Truncate));
        assert!(!Rights::at(FLOOR - 1)
            .unwrap()
            .handled
            .contains(AccessFs::Truncate));
    }

    #[test]
    fn confirmation_line_format() {
        let e = Enforced {
            abi: 7,
            live: 7,
            writable: vec![PathBuf::from("/a"), PathBuf::from("/b")],
            scopes: scopes_at(7).iter().map(|(_, n)| *n).collect(),
        };
        assert_eq!(
            confirmation_line(&e),
            "saphan-launcher: landlock abi=7 enforced writable=[/a,/b] \
             scopes=[signal,abstract-unix-socket]"
        );
        let e = Enforced {
            abi: 5,
            live: 5,
            writable: vec![PathBuf::from("/a")],
            scopes: scopes_at(5).iter().map(|(_, n)| *n).collect(),
        };
        assert_eq!(
            confirmation_line(&e),
            "saphan-launcher: landlock abi=5 enforced writable=[/a] scopes=[]"
        );
    }

    // ---- a real domain, applied in a child process ---------------------
    //
    // Landlock cannot be lifted once applied, so the domain is applied in a
    // re-executed copy of this test binary running only `domain_child`.

    const CHILD_ENV: &str = "SAPHAN_CORE_TEST_LANDLOCK_CHILD";

    fn errno_of(r: io::Result<()>) -> String {
        match r {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("errno={}", e.raw_os_error().unwrap_or(-1)),
        }
    }

    /// Runs only when re-executed by `domain_refuses_outside_writes`.
    #[test]
    fn domain_child() {
        let Ok(base) = std::env::var(CHILD_ENV) else {
            return;
        };
        let base = PathBuf::from(base);
        let inside = base.join("inside");
        let outside = base.join("outside");
        let enforced = apply_domain(std::slice::from_ref(&inside)).unwrap();
        println!("\n@@ ENFORCED {}", confirmation_line(&enforced));

        let write_inside = std::fs::write(inside.join("new.txt"), b"inside");
        println!("@@ write_inside {}", errno_of(write_inside));
        let write_outside = std::fs::write(outside.join("new.txt"), b"outside");
        println!("@@ write_outside {}", errno_of(write_outside));
        let trunc_outside = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(outside.join("keep.txt"))
            .map(|_| ());
        println!("@@ truncate_outside {}", errno_of(trunc_outside));
        let append_outside = OpenOptions::new()
            .append(true)
            .open(outside.join("keep.txt"))
            .and_then(|mut f| f.write_all(b"x"));
        println!("@@ append_outside {}", errno_of(append_outside));
        let read_outside = std::fs::read(outside.join("keep.txt")).map(|_| ());
        println!("@@ read_outside {}", errno_of(read_outside));
        // The test runner that started this child is outside the domain.
        let parent = std::os::unix::process::parent_id();
        let signal_outside = sys::send_signal(i32::try_from(parent).unwrap(), 0);
        println!("@@ signal_outside {}", errno_of(signal_outside));
        let me = i32::try_from(std::process::id()).unwrap();
        println!("@@ signal_self {}", errno_of(sys::send_signal(me, 0)));
    }

    #[test]
    fn domain_refuses_outside_writes() {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        std::fs::create_dir(base.join("inside")).unwrap();
        std::fs::create_dir(base.join("outside")).unwrap();
        std::fs::write(base.join("outside/keep.txt"), b"precious\n").unwrap();
        let before = std::fs::metadata(base.join("outside/keep.txt")).unwrap();

        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "landlock::tests::domain_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &base)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );

        let eacces = format!("errno={}", libc::EACCES);
        let line = |key: &str| -> String {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("@@ {key} ")))
                .unwrap_or_else(|| panic!("no `{key}` line in child output: {stdout}"))
                .to_owned()
        };
        assert!(line("ENFORCED").starts_with("saphan-launcher: landlock abi="));
        assert_eq!(line("write_inside"), "ok");
        assert_eq!(line("write_outside"), eacces);
        assert_eq!(line("truncate_outside"), eacces);
        assert_eq!(line("append_outside"), eacces);
        assert_eq!(line("read_outside"), "ok");
        assert_eq!(line("signal_self"), "ok");
        if AbiProbe::detect().level() >= SCOPES_FROM {
            assert_eq!(line("signal_outside"), format!("errno={}", libc::EPERM));
            assert!(line("ENFORCED").ends_with(" scopes=[signal,abstract-unix-socket]"));
        } else {
            assert_eq!(line("signal_outside"), "ok");
            assert!(line("ENFORCED").ends_with(" scopes=[]"));
        }

        assert_eq!(
            std::fs::read(base.join("inside/new.txt")).unwrap(),
            b"inside"
        );
        assert!(!base.join("outside/new.txt").exists());
        assert_eq!(
            std::fs::read(base.join("outside/keep.txt")).unwrap(),
            b"precious\n"
        );
        let after = std::fs::metadata(base.join("outside/keep.txt")).unwrap();
        assert_eq!(before.size(), after.size());
        assert_eq!(before.mtime(), after.mtime());
    }

    #[test]
    fn open_writable_applies_the_grant_rule_to_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        let rights = Rights::at(FLOOR).unwrap();
        std::fs::create_dir(base.join("real")).unwrap();
        std::os::unix::fs::symlink(base.join("real"), base.join("link")).unwrap();

        // A link as the last component: named, with its target.
        let err = open_writable(&base.join("link"), &rights).unwrap_err();
        match &err {
            LandlockError::Grant(GrantError::Symlink { component, .. }) => {
                assert_eq!(component, &base.join("link"));
            }
            other => panic!("expected a grant error, got {other:?}"),
        }
        assert_eq!(err.refusal_class(), RefusalClass::WorkdirUnsafe);
        assert_eq!(
            err.to_string(),
            grant::check_grant_dir(&base.join("link"))
                .unwrap_err()
                .to_string()
        );

        // A link in the middle, to a real directory.
        std::fs::create_dir(base.join("real/sub")).unwrap();
        let err = open_writable(&base.join("link/sub"), &rights).unwrap_err();
        assert!(
            matches!(err, LandlockError::Grant(GrantError::Symlink { .. })),
            "{err}"
        );
        // A relative link in the middle that points back up.
        std::fs::create_dir_all(base.join("repo/.git")).unwrap();
        std::os::unix::fs::symlink("../..", base.join("repo/.git/refs")).unwrap();
        let err = open_writable(&base.join("repo/.git/refs/heads"), &rights).unwrap_err();
        assert!(err.to_string().contains("(-> ../..)"), "{err}");

        let err = open_writable(&base.join("missing"), &rights).unwrap_err();
        assert!(
            matches!(err, LandlockError::Grant(GrantError::Missing { .. })),
            "{err}"
        );
        assert_eq!(err.refusal_class(), RefusalClass::PolicyInvalid);

        let (fd, access) = open_writable(&base.join("real"), &rights).unwrap();
        assert_eq!(access, rights.handled);
        assert!(fd.metadata().unwrap().is_dir());

        // Files keep the canonical check and get the file subset.
        std::fs::write(base.join("real/f"), b"").unwrap();
        let (_, access) = open_writable(&base.join("real/f"), &rights).unwrap();
        assert_eq!(access, rights.file);
        let err = open_writable(&base.join("link/f"), &rights).unwrap_err();
        assert!(matches!(err, LandlockError::NotCanonical { .. }), "{err}");
        let (_, access) = open_writable(Path::new("/dev/null"), &rights).unwrap();
        assert_eq!(access, rights.file);
        // A FIFO: the grant rule's refusal, word for word.
        let fifo = base.join("fifo");
        assert!(Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let err = open_writable(&fifo, &rights).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "the writable directory {0} cannot be granted: {0} is a FIFO, not a directory",
                fifo.display()
            )
        );
        // A file in the middle of a directory path.
        let err = open_writable(&base.join("real/f/below"), &rights).unwrap_err();
        assert!(
            matches!(err, LandlockError::Grant(GrantError::NotDirectory { .. })),
            "{err}"
        );
    }

    #[test]
    fn scopes_start_at_abi_6() {
        for level in 1..SCOPES_FROM {
            assert!(scopes_at(level).is_empty(), "{level}");
        }
        for level in SCOPES_FROM..=HIGHEST_KNOWN {
            let names: Vec<&str> = scopes_at(level).iter().map(|(_, n)| *n).collect();
            assert_eq!(names, ["signal", "abstract-unix-socket"]);
        }
    }
}
