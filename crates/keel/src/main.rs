//! The `keel` binary. Thin: each subcommand parses its flags and calls into a library crate.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Keel: a replicated key-value store where every operation chooses its consistency.
#[derive(Parser)]
#[command(name = "keel", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check recorded histories for linearizability or cross-client monotonic reads.
    Check(keel_check::cli::CheckArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => keel_check::cli::run(&args),
    }
}
