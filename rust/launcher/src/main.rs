//! saphan-launcher: the engine's boundary on a remote runner.
//!
//! `exec` applies a Landlock domain to itself (read+execute everywhere, full
//! rights on the policy's writable list), enters the working directory,
//! creates the scratch directory there and execs the agent. `probe` reports
//! the kernel's Landlock ABI for the machine's signed row; `sha256` and
//! `custody` report identity facts.
//!
//! Custody (SPEC.md §7) is the run condition of every verb: it is checked on
//! `/proc/self/exe` at process entry, before the arguments are parsed.
#![forbid(unsafe_code)]

mod cli;
mod commands;
mod refusal;

use std::process::ExitCode;

use cli::{Command, USAGE};

/// Usage errors exit 2; refusals exit 3 (see `refusal::EXIT_REFUSED`).
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let custody = commands::self_custody();
    let command = cli::parse(std::env::args_os().skip(1).collect());

    // The custody verb reports the facts either way; every other verb is
    // refused when custody fails, before it does anything else.
    if let Ok(Command::Custody) = command {
        return commands::custody(&custody);
    }
    if let Err(failure) = &custody {
        return commands::refuse(&failure.refusal);
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
        Ok(Command::Exec { policy, cmd, args }) => commands::exec(&policy, cmd, args),
    }
}
