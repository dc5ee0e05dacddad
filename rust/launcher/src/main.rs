//! saphan-launcher: the engine's boundary on a remote runner.
//!
//! `exec` applies a Landlock domain to itself (read+execute everywhere, full
//! rights on the policy's writable list, signals and abstract unix sockets
//! scoped at ABI >= 6), enters the working directory, creates the scratch
//! directory there and runs the agent under its supervision: signals are
//! forwarded, and when the agent exits every process it left behind is
//! killed. `reap` is the same supervisor without a domain (inside a jail
//! that is already built). `probe` reports the kernel's Landlock ABI for
//! the machine's signed row; `sha256` and `custody` report identity facts.
//!
//! Custody (SPEC.md §7) is the run condition of every verb but `reap`: it is
//! checked on `/proc/self/exe` at process entry, before the arguments are
//! parsed (for `exec` the refusal is emitted after the status descriptor is
//! adopted, so it reaches the engine on that descriptor too). `reap` runs
//! inside a jail's user namespace, where ownership cannot be measured; the
//! engine checks its custody outside before composing (commands::launch).
//!
//! Identity: the engine hashes the launcher's file by path, then runs that
//! path, and the file can be swapped in between. With `--expect-sha256 HEX`
//! `exec` and `reap` prove what they are before they act: they hash
//! `/proc/self/exe` (the inode actually running) and refuse
//! `digest-mismatch` unless it is HEX, then print
//! `saphan-launcher: self sha256=HEX` (on the status descriptor too).
//!
//! Secrets: with `--stdin-frame` `exec` and `reap` read the command's
//! environment and stdin from a frame on fd 0, after those checks and
//! before the policy (see `frame` and `commands::launch`); the rest of fd 0
//! is the run's lifeline (`stop` → SIGHUP to the command).
//!
//! Egress: with `--bridge 127.0.0.1:PORT=SOCKET` `reap` also serves that
//! loopback port, carrying each connection to the unix socket (the door of
//! a run whose jail has only loopback; see `bridge`).
#![forbid(unsafe_code)]

mod bridge;
mod cli;
mod commands;
mod frame;
mod refusal;
mod supervise;

use std::process::ExitCode;

use cli::{Command, USAGE};

/// Usage errors exit 2; refusals exit 3 (see `refusal::EXIT_REFUSED`).
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let custody = commands::self_custody();
    let command = cli::parse(std::env::args_os().skip(1).collect());

    // The custody verb reports the facts either way; every other verb is
    // refused when custody fails, before it does anything else (`exec` and
    // `reap` refuse it themselves, once their status descriptor is adopted).
    if let Ok(Command::Custody) = command {
        return commands::custody(&custody);
    }
    let custody_refusal = custody.as_ref().map(|_| ()).map_err(|f| &f.refusal);
    let launches = matches!(command, Ok(Command::Exec(_) | Command::Reap(_)));
    if let (Err(refusal), false) = (custody_refusal, launches) {
        return commands::refuse(refusal);
    }

    match command {
        Err(e) => {
            eprintln!("saphan-launcher: {}\n{USAGE}", e.0);
            ExitCode::from(EXIT_USAGE)
        }
        Ok(Command::Help) => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Ok(Command::Version) => {
            println!("saphan-launcher {}", saphan_core::VERSION);
            ExitCode::SUCCESS
        }
        Ok(Command::Probe) => commands::probe(),
        Ok(Command::Sha256 { file }) => commands::sha256(file.as_ref()),
        Ok(Command::Custody) => commands::custody(&custody),
        Ok(Command::Exec(launch)) => commands::launch(custody_refusal, launch, true),
        Ok(Command::Reap(launch)) => commands::launch(custody_refusal, launch, false),
    }
}
