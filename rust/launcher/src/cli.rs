//! Argument parsing: argv → [`Command`]. Pure, so every shape is unit-tested.
//!
//! The two verbs that run a command share one shape: options, then `--`,
//! then the command and its arguments (never interpreted):
//!
//! ```text
//! saphan-launcher exec [--status-fd N] [--lifeline-fd N] [--expect-sha256 HEX] [--stdin-frame]
//!                      --policy JSON -- CMD [ARGS...]
//! saphan-launcher reap [--status-fd N] [--lifeline-fd N] [--expect-sha256 HEX] [--stdin-frame]
//!                      [--bridge 127.0.0.1:PORT=SOCKET] -- CMD [ARGS...]
//! ```
//!
//! Options may come in any order before `--`, each at most once, as
//! `--opt VALUE` or `--opt=VALUE`. `--status-fd` and `--lifeline-fd` are
//! descriptor numbers of 3 or more, not the same one; `--expect-sha256` is exactly 64 lowercase hex digits (the digest
//! the launcher must find on `/proc/self/exe`, see `commands::launch`).
//! `--stdin-frame` is a flag and takes no value (`--stdin-frame=X` is a
//! usage error): the launcher reads a frame from fd 0 (the command's
//! environment and stdin, see `frame`), and the rest of fd 0 is the run's
//! lifeline. `--bridge` (`reap` only) is `127.0.0.1:PORT=SOCKET`: the
//! launcher serves TCP on that loopback port and carries every connection
//! to the unix socket SOCKET (see `bridge`). The address is exactly
//! `127.0.0.1` (the bridge must never listen beyond the jail's loopback),
//! PORT is 1-65535 without leading zeros, SOCKET an absolute path of at most
//! 107 bytes (what a `sockaddr_un` holds); the path may be any bytes, so
//! this one option is parsed before the UTF-8 check of the others.
#![forbid(unsafe_code)]

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

pub const USAGE: &str = "\
usage: saphan-launcher --version
       saphan-launcher probe
       saphan-launcher sha256 FILE
       saphan-launcher custody
       saphan-launcher exec [--status-fd N] [--lifeline-fd N] [--expect-sha256 HEX]
                            [--stdin-frame] --policy JSON -- CMD [ARGS...]
       saphan-launcher reap [--status-fd N] [--lifeline-fd N] [--expect-sha256 HEX]
                            [--stdin-frame] [--bridge 127.0.0.1:PORT=SOCKET] -- CMD [ARGS...]

exec confines itself with Landlock, then supervises CMD; reap supervises CMD
without a domain. Either way, when CMD exits every process it left behind is
killed, and the launcher exits with CMD's status (128+signal when killed).
--status-fd N: an inherited descriptor that receives every control line.
--lifeline-fd N: an inherited descriptor, the read end of a pipe whose write
  end only the launcher's caller holds. Readable before the command starts
  (a line, or end of input): the command is not started (exit 129). While it
  runs, a line `signal TERM`, `signal INT` or `signal HUP` passes that signal
  to the command, `signal KILL` kills it; end of input (the caller is gone,
  or ended the run) kills it. Either way what it left is killed as always.
--expect-sha256 HEX: the launcher hashes the file it runs from (/proc/self/exe)
  first and refuses (digest-mismatch, exit 3) unless it is HEX (64 lowercase
  hex digits); on a match it reports `saphan-launcher: self sha256=HEX`.
--stdin-frame: after those checks pass (and before the policy is applied) the
  launcher reads a frame from fd 0, exactly up to its `end` line:
    saphan-frame 1
    keep NAME             the command gets NAME with the launcher's value
    env NAME LEN          then LEN bytes: the command gets NAME=those bytes
    stdin LEN             then LEN bytes: the command's stdin (at most once)
    end
  NAME is [A-Za-z_][A-Za-z0-9_]* (at most 255 bytes, once, never TMPDIR), LEN
  decimal digits; an env value is at most 1 MiB, stdin at most 16 MiB. The
  command's environment is only that (plus TMPDIR under exec), its stdin
  /dev/null without a stdin item. A bad frame is refused (policy-invalid,
  exit 3). The rest of fd 0 is the lifeline: a line `stop` sends the command
  SIGHUP; end of input stops nothing.
--bridge 127.0.0.1:PORT=SOCKET (reap only): before CMD starts the launcher
  listens on 127.0.0.1:PORT and connects once to the unix socket SOCKET (an
  absolute path); either failing is refused (egress-uncuttable, exit 3) and
  CMD never runs. Once CMD runs, every TCP connection to the port is carried
  to a new connection to SOCKET, both ways, until CMD's run ends.

exit codes: 0 ok, 1 I/O error, 2 usage error, 3 refusal, 127 the command could not be
executed; otherwise the command's own status";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Version,
    Help,
    Probe,
    Sha256 {
        file: OsString,
    },
    Custody,
    /// Apply the Landlock domain of `launch.policy`, then supervise.
    Exec(Launch),
    /// Supervise without a domain (`launch.policy` is `None`).
    Reap(Launch),
}

/// What `exec` and `reap` run, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The policy JSON (`exec` only).
    pub policy: Option<String>,
    /// The inherited descriptor that receives the control lines.
    pub status_fd: Option<i32>,
    /// The inherited read end of the caller's lifeline pipe.
    pub lifeline_fd: Option<i32>,
    /// The SHA-256 the running launcher must have (64 lowercase hex digits).
    pub expect_sha256: Option<String>,
    /// `--stdin-frame`: read the command's environment and stdin from fd 0.
    pub stdin_frame: bool,
    /// `--bridge` (`reap` only): a loopback port carried to a unix socket.
    pub bridge: Option<BridgeSpec>,
    pub cmd: OsString,
    pub args: Vec<OsString>,
}

/// `--bridge 127.0.0.1:PORT=SOCKET`: the port listened on (always on
/// 127.0.0.1) and the unix socket every connection is carried to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BridgeSpec {
    pub port: u16,
    pub socket: PathBuf,
}

/// A usage error: the message is printed with [`USAGE`], exit 2.
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

fn utf8(arg: OsString, what: &str) -> Result<String, UsageError> {
    arg.into_string()
        .map_err(|_| UsageError(format!("{what} is not valid UTF-8")))
}

/// Parses the arguments after argv[0].
pub fn parse(args: Vec<OsString>) -> Result<Command, UsageError> {
    let mut it = args.into_iter();
    let Some(verb) = it.next() else {
        return Err(UsageError("no subcommand given".to_owned()));
    };
    let verb = utf8(verb, "the subcommand")?;
    let rest: Vec<OsString> = it.collect();
    let no_more = |cmd: Command, rest: &[OsString]| {
        if rest.is_empty() {
            Ok(cmd)
        } else {
            Err(UsageError(format!(
                "`{verb}` takes no arguments, got {:?}",
                rest
            )))
        }
    };
    match verb.as_str() {
        "--version" | "-V" => no_more(Command::Version, &rest),
        "--help" | "-h" | "help" => no_more(Command::Help, &rest),
        "probe" => no_more(Command::Probe, &rest),
        "custody" => no_more(Command::Custody, &rest),
        "sha256" => {
            let mut rest = rest.into_iter();
            match (rest.next(), rest.next()) {
                (Some(file), None) => Ok(Command::Sha256 { file }),
                (None, _) => Err(UsageError("`sha256` needs exactly one FILE".to_owned())),
                (Some(_), Some(_)) => Err(UsageError("`sha256` takes exactly one FILE".to_owned())),
            }
        }
        "exec" => parse_launch("exec", rest).map(Command::Exec),
        "reap" => parse_launch("reap", rest).map(Command::Reap),
        other => Err(UsageError(format!("unknown subcommand `{other}`"))),
    }
}

/// The options of `exec` (`--policy`, `--status-fd`, `--expect-sha256`,
/// `--stdin-frame`) and `reap` (the same but `--policy`), then `--`, then
/// the command.
fn parse_launch(verb: &str, rest: Vec<OsString>) -> Result<Launch, UsageError> {
    let wants_policy = verb == "exec";
    let mut policy: Option<String> = None;
    let mut status_fd: Option<i32> = None;
    let mut lifeline_fd: Option<i32> = None;
    let mut expect_sha256: Option<String> = None;
    let mut stdin_frame = false;
    let mut bridge: Option<BridgeSpec> = None;
    let mut it = rest.into_iter();
    loop {
        let Some(arg) = it.next() else {
            return Err(UsageError(format!(
                "`{verb}` needs `-- CMD [ARGS...]` after its options"
            )));
        };
        if arg == "--" {
            break;
        }
        if let Some(inline) = bridge_option(&arg) {
            if wants_policy {
                return Err(UsageError(format!(
                    "`--bridge` is a `reap` option, `{verb}` does not take it"
                )));
            }
            let value = match inline {
                Some(v) => v,
                None => it
                    .next()
                    .ok_or_else(|| UsageError("`--bridge` needs a value".to_owned()))?,
            };
            if bridge.replace(parse_bridge(&value)?).is_some() {
                return Err(UsageError("`--bridge` given twice".to_owned()));
            }
            continue;
        }
        let arg = utf8(arg, &format!("an `{verb}` option"))?;
        if arg == "--stdin-frame" {
            if stdin_frame {
                return Err(UsageError("`--stdin-frame` given twice".to_owned()));
            }
            stdin_frame = true;
            continue;
        }
        if arg.starts_with("--stdin-frame=") {
            return Err(UsageError("`--stdin-frame` takes no value".to_owned()));
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let known = name == "--status-fd"
            || name == "--lifeline-fd"
            || name == "--expect-sha256"
            || (wants_policy && name == "--policy");
        if !known {
            return Err(UsageError(format!(
                "unknown `{verb}` option `{arg}` (the command goes after `--`)"
            )));
        }
        let value = match inline {
            Some(v) => v,
            None => match it.next() {
                Some(v) => utf8(v, &format!("the value of `{name}`"))?,
                None => return Err(UsageError(format!("`{name}` needs a value"))),
            },
        };
        let twice = match name.as_str() {
            "--policy" => policy.replace(value).is_some(),
            "--expect-sha256" => expect_sha256.replace(parse_sha256(&value)?).is_some(),
            "--lifeline-fd" => lifeline_fd.replace(parse_fd(&name, &value)?).is_some(),
            _ => status_fd.replace(parse_fd(&name, &value)?).is_some(),
        };
        if twice {
            return Err(UsageError(format!("`{name}` given twice")));
        }
    }
    if status_fd.is_some() && status_fd == lifeline_fd {
        return Err(UsageError(
            "`--status-fd` and `--lifeline-fd` name the same descriptor".to_owned(),
        ));
    }
    if wants_policy && policy.is_none() {
        return Err(UsageError(format!("`{verb}` needs `--policy JSON`")));
    }
    let Some(cmd) = it.next() else {
        return Err(UsageError(format!("`{verb}` needs a command after `--`")));
    };
    if cmd.is_empty() {
        return Err(UsageError("the command after `--` is empty".to_owned()));
    }
    Ok(Launch {
        policy,
        status_fd,
        lifeline_fd,
        expect_sha256,
        stdin_frame,
        bridge,
        cmd,
        args: it.collect(),
    })
}

/// `--bridge` → `Some(None)`, `--bridge=V` → `Some(Some(V))`, anything else
/// `None`. On bytes: the value may hold a path that is not UTF-8.
fn bridge_option(arg: &OsStr) -> Option<Option<OsString>> {
    let bytes = arg.as_bytes();
    if bytes == b"--bridge" {
        return Some(None);
    }
    let value = bytes.strip_prefix(b"--bridge=")?;
    Some(Some(OsString::from_vec(value.to_vec())))
}

/// The longest path a `sockaddr_un` holds (108 bytes with its NUL).
const SOCKET_PATH_MAX: usize = 107;

/// `127.0.0.1:PORT=SOCKET`. The address is spelled exactly `127.0.0.1`:
/// `0.0.0.0`, `::1` or a name would let the bridge listen somewhere the
/// engine did not choose (or outside the jail, were it ever run without
/// its own network namespace). Split at the first `=` (the address holds
/// none, the path may).
fn parse_bridge(value: &OsStr) -> Result<BridgeSpec, UsageError> {
    let bytes = value.as_bytes();
    let Some(eq) = bytes.iter().position(|&b| b == b'=') else {
        return Err(UsageError(format!(
            "`--bridge` needs 127.0.0.1:PORT=SOCKET, got {value:?}"
        )));
    };
    let (addr, socket) = (&bytes[..eq], &bytes[eq + 1..]);
    let port = match addr.strip_prefix(b"127.0.0.1:") {
        Some(port) => parse_port(port)?,
        None => {
            return Err(UsageError(format!(
                "`--bridge` listens only on 127.0.0.1 (IPv4 loopback) and needs                  127.0.0.1:PORT, got {:?}",
                OsStr::from_bytes(addr)
            )))
        }
    };
    Ok(BridgeSpec {
        port,
        socket: parse_socket_path(socket)?,
    })
}

/// 1 to 65535, decimal digits only, without a leading zero (one spelling
/// per port).
fn parse_port(port: &[u8]) -> Result<u16, UsageError> {
    let digits = !port.is_empty() && port.iter().all(u8::is_ascii_digit) && port[0] != b'0';
    let parsed = std::str::from_utf8(port)
        .ok()
        .and_then(|p| p.parse::<u16>().ok());
    match parsed {
        Some(n) if digits => Ok(n),
        _ => Err(UsageError(format!(
            "`--bridge` needs a port of 1 to 65535 after 127.0.0.1:, got {:?}",
            OsStr::from_bytes(port)
        ))),
    }
}

/// An absolute path that fits a `sockaddr_un` (a longer one could never be
/// connected to: refused here rather than at the first connection).
fn parse_socket_path(socket: &[u8]) -> Result<PathBuf, UsageError> {
    let shown = OsStr::from_bytes(socket);
    if socket.first() != Some(&b'/') {
        return Err(UsageError(format!(
            "`--bridge` needs an absolute unix socket path after `=`, got {shown:?}"
        )));
    }
    if socket.len() > SOCKET_PATH_MAX {
        return Err(UsageError(format!(
            "`--bridge` socket path {shown:?} is {} bytes, a unix socket path holds at most \
             {SOCKET_PATH_MAX}",
            socket.len()
        )));
    }
    Ok(PathBuf::from(shown))
}

/// A status or lifeline descriptor (`name`): a decimal number of 3 or more
/// (0-2 are the command's own stdio).
fn parse_fd(name: &str, value: &str) -> Result<i32, UsageError> {
    match value.parse::<i32>() {
        Ok(fd) if fd >= 3 && value.bytes().all(|b| b.is_ascii_digit()) => Ok(fd),
        _ => Err(UsageError(format!(
            "`{name}` needs a descriptor number of 3 or more, got {value:?}"
        ))),
    }
}

/// An expected digest: exactly 64 lowercase hex digits, as saphan writes
/// them (an uppercase spelling is refused rather than folded, so the value
/// compared is the value sent).
fn parse_sha256(value: &str) -> Result<String, UsageError> {
    if saphan_core::digest::is_sha256_hex(value) {
        Ok(value.to_owned())
    } else {
        Err(UsageError(format!(
            "`--expect-sha256` needs 64 lowercase hex digits, got {value:?}"
        )))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(OsString::from).collect())
    }

    #[test]
    fn simple_verbs() {
        assert_eq!(p(&["--version"]), Ok(Command::Version));
        assert_eq!(p(&["probe"]), Ok(Command::Probe));
        assert_eq!(p(&["custody"]), Ok(Command::Custody));
        assert_eq!(p(&["--help"]), Ok(Command::Help));
        assert_eq!(
            p(&["sha256", "/bin/sh"]),
            Ok(Command::Sha256 {
                file: "/bin/sh".into()
            })
        );
    }

    #[test]
    fn usage_errors() {
        for bad in [
            &[][..],
            &["frobnicate"],
            &["probe", "x"],
            &["custody", "--json"],
            &["sha256"],
            &["sha256", "a", "b"],
            &["exec"],
            &["exec", "--policy", "{}"],
            &["exec", "--policy", "{}", "--"],
            &["exec", "--policy", "{}", "--", ""],
            &["exec", "--", "/bin/true"],
            &["exec", "--policy"],
            &[
                "exec",
                "--policy",
                "{}",
                "--policy",
                "{}",
                "--",
                "/bin/true",
            ],
            &["exec", "--pol", "{}", "--", "/bin/true"],
            &["exec", "/bin/true"],
            &[
                "exec",
                "--policy",
                "{}",
                "--status-fd",
                "2",
                "--",
                "/bin/true",
            ],
            &[
                "exec",
                "--policy",
                "{}",
                "--status-fd",
                "x",
                "--",
                "/bin/true",
            ],
            &[
                "exec",
                "--policy",
                "{}",
                "--status-fd",
                "+5",
                "--",
                "/bin/true",
            ],
            &[
                "exec",
                "--policy",
                "{}",
                "--status-fd",
                "-3",
                "--",
                "/bin/true",
            ],
            &["exec", "--policy", "{}", "--status-fd"],
            &[
                "exec",
                "--status-fd=4",
                "--policy",
                "{}",
                "--status-fd=5",
                "--",
                "/bin/true",
            ],
            &["reap"],
            &["reap", "--"],
            &["reap", "/bin/true"],
            &["reap", "--policy", "{}", "--", "/bin/true"],
            &["reap", "--status-fd", "--", "/bin/true"],
            &["reap", "--status-fd=1", "--", "/bin/true"],
            &["reap", "--status", "4", "--", "/bin/true"],
        ] {
            assert!(p(bad).is_err(), "{bad:?} should be a usage error");
        }
    }

    #[test]
    fn exec_splits_at_the_first_double_dash() {
        assert_eq!(
            p(&[
                "exec",
                "--policy",
                "{\"a\":1}",
                "--",
                "/bin/sh",
                "-c",
                "echo --",
                "--"
            ]),
            Ok(Command::Exec(Launch {
                policy: Some("{\"a\":1}".to_owned()),
                status_fd: None,
                lifeline_fd: None,
                expect_sha256: None,
                stdin_frame: false,
                bridge: None,
                cmd: "/bin/sh".into(),
                args: vec!["-c".into(), "echo --".into(), "--".into()],
            }))
        );
        assert_eq!(
            p(&["exec", "--policy={}", "--", "claude", "-p"]),
            Ok(Command::Exec(Launch {
                policy: Some("{}".to_owned()),
                status_fd: None,
                lifeline_fd: None,
                expect_sha256: None,
                stdin_frame: false,
                bridge: None,
                cmd: "claude".into(),
                args: vec!["-p".into()],
            }))
        );
    }

    #[test]
    fn exec_takes_the_status_fd_before_or_after_the_policy() {
        let expected = Command::Exec(Launch {
            policy: Some("{\"a\":1}".to_owned()),
            status_fd: Some(7),
            lifeline_fd: None,
            expect_sha256: None,
            stdin_frame: false,
            bridge: None,
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), "exit 3".into()],
        });
        for args in [
            &["exec", "--status-fd", "7", "--policy", "{\"a\":1}", "--"][..],
            &["exec", "--policy", "{\"a\":1}", "--status-fd", "7", "--"],
            &["exec", "--status-fd=7", "--policy={\"a\":1}", "--"],
        ] {
            let mut args = args.to_vec();
            args.extend(["/bin/sh", "-c", "exit 3"]);
            assert_eq!(p(&args), Ok(expected.clone()), "{args:?}");
        }
    }

    #[test]
    fn reap_takes_only_the_status_fd() {
        assert_eq!(
            p(&["reap", "--", "sh", "-c", "--status-fd"]),
            Ok(Command::Reap(Launch {
                policy: None,
                status_fd: None,
                lifeline_fd: None,
                expect_sha256: None,
                stdin_frame: false,
                bridge: None,
                cmd: "sh".into(),
                args: vec!["-c".into(), "--status-fd".into()],
            }))
        );
        assert_eq!(
            p(&["reap", "--status-fd", "9", "--", "true"]),
            Ok(Command::Reap(Launch {
                policy: None,
                status_fd: Some(9),
                lifeline_fd: None,
                expect_sha256: None,
                stdin_frame: false,
                bridge: None,
                cmd: "true".into(),
                args: vec![],
            }))
        );
        assert_eq!(
            p(&["reap", "--status-fd=3", "--", "true"]),
            Ok(Command::Reap(Launch {
                policy: None,
                status_fd: Some(3),
                lifeline_fd: None,
                expect_sha256: None,
                stdin_frame: false,
                bridge: None,
                cmd: "true".into(),
                args: vec![],
            }))
        );
    }

    #[test]
    fn both_verbs_take_a_lifeline_fd_apart_from_the_status_fd() {
        for verb in ["exec", "reap"] {
            let mut args = vec![verb, "--status-fd", "3", "--lifeline-fd=4"];
            if verb == "exec" {
                args.extend(["--policy", "{}"]);
            }
            args.extend(["--", "true"]);
            let launch = match p(&args) {
                Ok(Command::Exec(l)) | Ok(Command::Reap(l)) => l,
                other => panic!("{args:?}: {other:?}"),
            };
            assert_eq!((launch.status_fd, launch.lifeline_fd), (Some(3), Some(4)));
        }
        for bad in [
            &[
                "reap",
                "--status-fd",
                "4",
                "--lifeline-fd",
                "4",
                "--",
                "true",
            ][..],
            &["reap", "--lifeline-fd", "2", "--", "true"],
            &[
                "reap",
                "--lifeline-fd",
                "4",
                "--lifeline-fd",
                "5",
                "--",
                "true",
            ],
            &["reap", "--lifeline-fd", "--", "true"],
        ] {
            let err = p(bad).unwrap_err().0;
            assert!(
                err.contains("lifeline") || err.contains("needs"),
                "{bad:?}: {err}"
            );
        }
    }

    const DIGEST: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn launch_of(command: Result<Command, UsageError>) -> Launch {
        match command {
            Ok(Command::Exec(l) | Command::Reap(l)) => l,
            other => panic!("not a launch: {other:?}"),
        }
    }

    #[test]
    fn both_verbs_take_an_expected_digest_in_either_spelling_and_any_order() {
        for verb in ["exec", "reap"] {
            let policy: &[&str] = if verb == "exec" {
                &["--policy", "{}"]
            } else {
                &[]
            };
            let spellings: [&[&str]; 2] = [&["--expect-sha256", DIGEST], &[]];
            let inline = format!("--expect-sha256={DIGEST}");
            let orders: Vec<Vec<&str>> = vec![
                [&[verb][..], spellings[0], policy, &["--status-fd", "4"]].concat(),
                [&[verb][..], &["--status-fd=4"], policy, spellings[0]].concat(),
                [
                    &[verb][..],
                    policy,
                    &[inline.as_str()],
                    &["--status-fd", "4"],
                ]
                .concat(),
            ];
            for mut args in orders {
                args.extend(["--", "/bin/true", "--expect-sha256=x"]);
                let l = launch_of(p(&args));
                assert_eq!(l.expect_sha256.as_deref(), Some(DIGEST), "{args:?}");
                assert_eq!(l.status_fd, Some(4), "{args:?}");
                assert_eq!(l.args, vec![OsString::from("--expect-sha256=x")]);
                assert_eq!(l.policy.is_some(), verb == "exec");
            }
            let args = [&[verb][..], spellings[1], policy, &["--", "/bin/true"]].concat();
            assert_eq!(launch_of(p(&args)).expect_sha256, None, "{args:?}");
        }
        assert_eq!(
            p(&["reap", "--expect-sha256", DIGEST, "--", "true"]),
            Ok(Command::Reap(Launch {
                policy: None,
                status_fd: None,
                lifeline_fd: None,
                expect_sha256: Some(DIGEST.to_owned()),
                stdin_frame: false,
                bridge: None,
                cmd: "true".into(),
                args: vec![],
            }))
        );
    }

    #[test]
    fn an_expected_digest_must_be_64_lowercase_hex_digits_given_once() {
        let upper = DIGEST.to_uppercase();
        let long = format!("{DIGEST}0");
        let twice_inline = format!("--expect-sha256={DIGEST}");
        for verb in ["exec", "reap"] {
            let policy: &[&str] = if verb == "exec" {
                &["--policy", "{}"]
            } else {
                &[]
            };
            let bad_values = [
                "",
                &DIGEST[..63],
                long.as_str(),
                upper.as_str(),
                "g3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b78",
            ];
            for bad in bad_values {
                for spelled in [
                    vec!["--expect-sha256".to_owned(), bad.to_owned()],
                    vec![format!("--expect-sha256={bad}")],
                ] {
                    let mut args: Vec<&str> = vec![verb];
                    args.extend(policy);
                    args.extend(spelled.iter().map(String::as_str));
                    args.extend(["--", "/bin/true"]);
                    let err = p(&args).unwrap_err();
                    assert!(
                        err.0
                            .starts_with("`--expect-sha256` needs 64 lowercase hex digits"),
                        "{args:?}: {err:?}"
                    );
                }
            }
            for args in [
                [
                    &[verb][..],
                    &["--expect-sha256", DIGEST],
                    policy,
                    &[twice_inline.as_str()],
                    &["--", "/bin/true"],
                ]
                .concat(),
                [
                    &[verb][..],
                    &["--expect-sha256", DIGEST, "--expect-sha256", DIGEST],
                    policy,
                    &["--", "/bin/true"],
                ]
                .concat(),
            ] {
                assert_eq!(
                    p(&args),
                    Err(UsageError("`--expect-sha256` given twice".to_owned())),
                    "{args:?}"
                );
            }
            // A missing value, and the option after `--` is the command's.
            let args = [&[verb][..], policy, &["--expect-sha256"]].concat();
            assert!(p(&args).is_err(), "{args:?}");
            let args = [&[verb][..], policy, &["--expect-sha256", "--", "x"]].concat();
            assert!(p(&args).is_err(), "{args:?}");
            let args = [&[verb][..], policy, &["--expect-sha", DIGEST, "--", "x"]].concat();
            assert!(p(&args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn both_verbs_take_the_stdin_frame_flag_anywhere_before_the_double_dash() {
        for verb in ["exec", "reap"] {
            let policy: &[&str] = if verb == "exec" {
                &["--policy", "{}"]
            } else {
                &[]
            };
            for args in [
                [
                    &[verb][..],
                    &["--stdin-frame"],
                    policy,
                    &["--status-fd", "4"],
                ]
                .concat(),
                [&[verb][..], policy, &["--stdin-frame"]].concat(),
                [
                    &[verb][..],
                    &["--expect-sha256", DIGEST],
                    &["--stdin-frame"],
                    policy,
                ]
                .concat(),
            ] {
                let mut args = args.clone();
                args.extend(["--", "/bin/sh", "--stdin-frame"]);
                let l = launch_of(p(&args));
                assert!(l.stdin_frame, "{args:?}");
                assert_eq!(l.cmd, OsString::from("/bin/sh"));
                assert_eq!(l.args, vec![OsString::from("--stdin-frame")]);
                assert_eq!(l.policy.is_some(), verb == "exec");
            }
            // Off unless given; after `--` it is the command's.
            let args = [&[verb][..], policy, &["--", "/bin/true", "--stdin-frame"]].concat();
            assert!(!launch_of(p(&args)).stdin_frame, "{args:?}");
        }
        assert_eq!(
            p(&["reap", "--stdin-frame", "--", "true"]),
            Ok(Command::Reap(Launch {
                policy: None,
                status_fd: None,
                lifeline_fd: None,
                expect_sha256: None,
                stdin_frame: true,
                bridge: None,
                cmd: "true".into(),
                args: vec![],
            }))
        );
    }

    #[test]
    fn the_stdin_frame_flag_takes_no_value_and_comes_once() {
        for verb in ["exec", "reap"] {
            let policy: &[&str] = if verb == "exec" {
                &["--policy", "{}"]
            } else {
                &[]
            };
            for (flags, want) in [
                (
                    &["--stdin-frame", "--stdin-frame"][..],
                    "`--stdin-frame` given twice",
                ),
                (&["--stdin-frame=1"], "`--stdin-frame` takes no value"),
                (&["--stdin-frame="], "`--stdin-frame` takes no value"),
            ] {
                let args = [&[verb][..], policy, flags, &["--", "/bin/true"]].concat();
                assert_eq!(p(&args), Err(UsageError(want.to_owned())), "{args:?}");
            }
            // A value after the flag is not taken as its value.
            let args = [&[verb][..], policy, &["--stdin-frame", "1", "--", "x"]].concat();
            assert!(p(&args).is_err(), "{args:?}");
            let args = [&[verb][..], policy, &["--stdin", "--", "x"]].concat();
            assert!(p(&args).is_err(), "{args:?}");
        }
    }

    fn bridge(port: u16, socket: &str) -> Option<BridgeSpec> {
        Some(BridgeSpec {
            port,
            socket: socket.into(),
        })
    }

    #[test]
    fn reap_takes_a_bridge_in_either_spelling_anywhere_before_the_double_dash() {
        for args in [
            &["reap", "--bridge", "127.0.0.1:3128=/run/door.sock"][..],
            &["reap", "--bridge=127.0.0.1:3128=/run/door.sock"],
            &[
                "reap",
                "--status-fd",
                "4",
                "--bridge",
                "127.0.0.1:3128=/run/door.sock",
                "--stdin-frame",
            ],
            &[
                "reap",
                "--stdin-frame",
                "--expect-sha256",
                DIGEST,
                "--bridge=127.0.0.1:3128=/run/door.sock",
            ],
        ] {
            let mut args = args.to_vec();
            args.extend(["--", "/bin/sh", "--bridge=127.0.0.1:1=/x"]);
            let l = launch_of(p(&args));
            assert_eq!(l.bridge, bridge(3128, "/run/door.sock"), "{args:?}");
            assert_eq!(l.cmd, OsString::from("/bin/sh"));
            assert_eq!(l.args, vec![OsString::from("--bridge=127.0.0.1:1=/x")]);
        }
        assert_eq!(
            p(&[
                "reap",
                "--bridge",
                "127.0.0.1:65535=/a=b/c.sock",
                "--",
                "true"
            ]),
            Ok(Command::Reap(Launch {
                policy: None,
                status_fd: None,
                lifeline_fd: None,
                expect_sha256: None,
                stdin_frame: false,
                bridge: bridge(65535, "/a=b/c.sock"),
                cmd: "true".into(),
                args: vec![],
            }))
        );
        assert_eq!(
            launch_of(p(&["reap", "--bridge=127.0.0.1:1=/s", "--", "true"])).bridge,
            bridge(1, "/s")
        );
        // Off unless given; after `--` it is the command's.
        let l = launch_of(p(&["reap", "--", "true", "--bridge", "127.0.0.1:1=/s"]));
        assert_eq!(l.bridge, None);
    }

    #[test]
    fn a_bridge_socket_path_may_be_any_bytes() {
        use std::os::unix::ffi::OsStringExt;
        let path = OsString::from_vec(b"/run/\xff\xfe.sock".to_vec());
        let inline = [
            b"--bridge=127.0.0.1:3128=".to_vec(),
            path.clone().into_vec(),
        ]
        .concat();
        let separate = [b"127.0.0.1:3128=".to_vec(), path.clone().into_vec()].concat();
        for args in [
            vec![OsString::from_vec(inline)],
            vec!["--bridge".into(), OsString::from_vec(separate)],
        ] {
            let mut argv: Vec<OsString> = vec!["reap".into()];
            argv.extend(args);
            argv.extend(["--".into(), "true".into()]);
            let l = launch_of(parse(argv));
            assert_eq!(
                l.bridge,
                Some(BridgeSpec {
                    port: 3128,
                    socket: path.clone().into()
                })
            );
        }
    }

    #[test]
    fn a_bridge_listens_only_on_127_0_0_1_with_a_real_port_and_an_absolute_socket() {
        let long = format!("127.0.0.1:3128=/{}", "s".repeat(107));
        let longest = format!("127.0.0.1:3128=/{}", "s".repeat(106));
        assert_eq!(
            launch_of(p(&["reap", "--bridge", &longest, "--", "true"]))
                .bridge
                .map(|b| b.socket.as_os_str().len()),
            Some(107)
        );
        for (value, want) in [
            ("0.0.0.0:3128=/run/door.sock", "listens only on 127.0.0.1"),
            ("[::1]:3128=/run/door.sock", "listens only on 127.0.0.1"),
            ("::1:3128=/run/door.sock", "listens only on 127.0.0.1"),
            ("localhost:3128=/run/door.sock", "listens only on 127.0.0.1"),
            ("127.0.0.2:3128=/run/door.sock", "listens only on 127.0.0.1"),
            ("127.1:3128=/run/door.sock", "listens only on 127.0.0.1"),
            (
                " 127.0.0.1:3128=/run/door.sock",
                "listens only on 127.0.0.1",
            ),
            ("127.0.0.1=/run/door.sock", "listens only on 127.0.0.1"),
            ("3128=/run/door.sock", "listens only on 127.0.0.1"),
            ("127.0.0.1:=/run/door.sock", "a port of 1 to 65535"),
            ("127.0.0.1:0=/run/door.sock", "a port of 1 to 65535"),
            ("127.0.0.1:03128=/run/door.sock", "a port of 1 to 65535"),
            ("127.0.0.1:65536=/run/door.sock", "a port of 1 to 65535"),
            ("127.0.0.1:+80=/run/door.sock", "a port of 1 to 65535"),
            ("127.0.0.1:-1=/run/door.sock", "a port of 1 to 65535"),
            ("127.0.0.1:80 =/run/door.sock", "a port of 1 to 65535"),
            ("127.0.0.1:http=/run/door.sock", "a port of 1 to 65535"),
            ("127.0.0.1:3128=", "an absolute unix socket path"),
            ("127.0.0.1:3128=door.sock", "an absolute unix socket path"),
            ("127.0.0.1:3128=./door.sock", "an absolute unix socket path"),
            ("127.0.0.1:3128", "needs 127.0.0.1:PORT=SOCKET"),
            ("/run/door.sock", "needs 127.0.0.1:PORT=SOCKET"),
            ("", "needs 127.0.0.1:PORT=SOCKET"),
            (long.as_str(), "at most 107"),
        ] {
            let inline = format!("--bridge={value}");
            for args in [
                vec!["reap", "--bridge", value, "--", "true"],
                vec!["reap", inline.as_str(), "--", "true"],
            ] {
                let err = p(&args).unwrap_err();
                assert!(
                    err.0.starts_with("`--bridge` ") && err.0.contains(want),
                    "{args:?}: {err:?}"
                );
            }
        }
    }

    #[test]
    fn a_bridge_comes_once_with_a_value_and_only_on_reap() {
        let one = "127.0.0.1:3128=/run/door.sock";
        let inline = format!("--bridge={one}");
        for args in [
            vec!["reap", "--bridge", one, "--bridge", one, "--", "true"],
            vec!["reap", inline.as_str(), "--bridge", one, "--", "true"],
            vec!["reap", "--bridge", one, "--status-fd=4", &inline, "--", "x"],
        ] {
            assert_eq!(
                p(&args),
                Err(UsageError("`--bridge` given twice".to_owned())),
                "{args:?}"
            );
        }
        assert_eq!(
            p(&["reap", "--bridge"]),
            Err(UsageError("`--bridge` needs a value".to_owned()))
        );
        // The value is taken as given: `--` there is a bad value, not the end.
        assert!(p(&["reap", "--bridge", "--", "true"]).is_err());
        assert!(p(&["reap", "--bridge", one]).is_err());
        assert!(p(&["reap", "--bridg", one, "--", "true"]).is_err());
        assert!(p(&["reap", "--bridge-x=1", "--", "true"]).is_err());
        for args in [
            vec!["exec", "--policy", "{}", "--bridge", one, "--", "true"],
            vec!["exec", inline.as_str(), "--policy", "{}", "--", "true"],
            vec!["exec", "--bridge", "--policy", "{}", "--", "true"],
        ] {
            assert_eq!(
                p(&args),
                Err(UsageError(
                    "`--bridge` is a `reap` option, `exec` does not take it".to_owned()
                )),
                "{args:?}"
            );
        }
    }
}
