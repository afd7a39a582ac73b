//! The `keel` binary. Thin: each subcommand parses its flags and calls into a library crate.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod client_cmds;
mod demo;
mod up;

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
    /// Run the deterministic simulator: seeds of scenarios, the ORCA paper's tables.
    Sim(keel_sim::cli::SimArgs),
    /// Run one Keel node (see docs/operations.md).
    Server(keel_server::cli::ServerArgs),
    /// Run a local cluster in the foreground until Ctrl-C.
    Up(up::UpArgs),
    /// Start a local cluster, run a checked workload with a crash, print what each level did.
    Demo(demo::DemoArgs),
    /// Read a key.
    Get(client_cmds::GetArgs),
    /// Write a key.
    Set(client_cmds::SetArgs),
    /// Delete a key.
    Del(client_cmds::DelArgs),
    /// Compare-and-set a key.
    Cas(client_cmds::CasArgs),
    /// Show each node's role, epoch and indexes.
    Status(client_cmds::StatusArgs),
    /// Run YCSB workloads against Keel, Redis or etcd clusters; `bench suite orca|scale`.
    Bench(keel_bench::cli::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => keel_check::cli::run(&args),
        Command::Sim(args) => keel_sim::cli::run(&args),
        Command::Server(args) => keel_server::cli::main(&args),
        Command::Up(args) => up::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Get(args) => client_cmds::get(&args),
        Command::Set(args) => client_cmds::set(&args),
        Command::Del(args) => client_cmds::del(&args),
        Command::Cas(args) => client_cmds::cas(&args),
        Command::Status(args) => client_cmds::status(&args),
        Command::Bench(args) => keel_bench::cli::run(&args),
    }
}
