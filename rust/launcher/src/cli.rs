//! Argument parsing: argv → [`Command`]. Pure, so every shape is unit-tested.
#![forbid(unsafe_code)]

use std::ffi::OsString;

pub const USAGE: &str = "\
usage: saphan-launcher --version
       saphan-launcher probe
       saphan-launcher sha256 FILE
       saphan-launcher custody
       saphan-launcher exec --policy JSON -- CMD [ARGS...]

exit codes: 0 ok, 1 I/O error, 2 usage error, 3 refusal, 127 the command could not be executed";

#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Version,
    Help,
    Probe,
    Sha256 {
        file: OsString,
    },
    Custody,
    Exec {
        policy: String,
        cmd: OsString,
        args: Vec<OsString>,
    },
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
        "exec" => parse_exec(rest),
        other => Err(UsageError(format!("unknown subcommand `{other}`"))),
    }
}

fn parse_exec(rest: Vec<OsString>) -> Result<Command, UsageError> {
    let mut policy: Option<String> = None;
    let mut it = rest.into_iter();
    loop {
        let Some(arg) = it.next() else {
            return Err(UsageError(
                "`exec` needs `-- CMD [ARGS...]` after the policy".to_owned(),
            ));
        };
        if arg == "--" {
            break;
        }
        let arg = utf8(arg, "an `exec` option")?;
        let value = if arg == "--policy" {
            match it.next() {
                Some(v) => utf8(v, "the policy")?,
                None => return Err(UsageError("`--policy` needs a JSON value".to_owned())),
            }
        } else if let Some(v) = arg.strip_prefix("--policy=") {
            v.to_owned()
        } else {
            return Err(UsageError(format!(
                "unknown `exec` option `{arg}` (the command goes after `--`)"
            )));
        };
        if policy.replace(value).is_some() {
            return Err(UsageError("`--policy` given twice".to_owned()));
        }
    }
    let Some(policy) = policy else {
        return Err(UsageError("`exec` needs `--policy JSON`".to_owned()));
    };
    let Some(cmd) = it.next() else {
        return Err(UsageError("`exec` needs a command after `--`".to_owned()));
    };
    if cmd.is_empty() {
        return Err(UsageError("the command after `--` is empty".to_owned()));
    }
    Ok(Command::Exec {
        policy,
        cmd,
        args: it.collect(),
    })
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
            Ok(Command::Exec {
                policy: "{\"a\":1}".to_owned(),
                cmd: "/bin/sh".into(),
                args: vec!["-c".into(), "echo --".into(), "--".into()],
            })
        );
        assert_eq!(
            p(&["exec", "--policy={}", "--", "claude", "-p"]),
            Ok(Command::Exec {
                policy: "{}".to_owned(),
                cmd: "claude".into(),
                args: vec!["-p".into()],
            })
        );
    }
}
