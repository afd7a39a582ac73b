//! The `keel` binary. Thin: each subcommand parses its flags and calls into a library crate.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod client_cmds;
mod demo;
mod example;
mod example_ads;
mod example_bank;
mod example_kite;
mod repair;
mod secure;
mod slots_cmd;
mod torture;
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
    /// Check recorded histories: linearizability, monotonic reads, views, transactions,
    /// release consistency (`--model rc`), causal consistency (`--model causal`).
    Check(keel_check::cli::CheckArgs),
    /// Run the deterministic simulator: seeds of scenarios, the ORCA paper's tables.
    Sim(keel_sim::cli::SimArgs),
    /// Run one Keel node (see docs/operations.md).
    Server(keel_server::cli::ServerArgs),
    /// Run a local cluster in the foreground until Ctrl-C.
    Up(up::UpArgs),
    /// Start a local cluster, run a checked workload with a crash, print what each level did.
    Demo(demo::DemoArgs),
    /// Run one of the Correctables paper's applications (`example tickets`, `example ads`).
    Example(example::ExampleArgs),
    /// Read a key.
    Get(client_cmds::GetArgs),
    /// Write a key.
    Set(client_cmds::SetArgs),
    /// Delete a key.
    Del(client_cmds::DelArgs),
    /// Compare-and-set a key.
    Cas(client_cmds::CasArgs),
    /// Fetch-and-add: add to a key's integer, print the value before.
    Faa(client_cmds::FaaArgs),
    /// Show each node's role, epoch and indexes.
    Status(client_cmds::StatusArgs),
    /// Change a keyspace's membership by one node, or move its leadership
    /// (docs/operations.md, "Membership").
    Node(client_cmds::NodeArgs),
    /// Move hash slots between the keyspaces of a sharded cluster while both serve, or
    /// show a keyspace's slot states (docs/operations.md, "Moving slots").
    Slots(slots_cmd::SlotsArgs),
    /// Run YCSB workloads against Keel, Redis or etcd clusters; `bench suite orca|scale`.
    Bench(keel_bench::cli::BenchArgs),
    /// Hash a password (read from standard input) for a `[[users]]` entry.
    Passwd(PasswdArgs),
    /// Rebuild a keyspace's damaged hard-state file, as a node that refuses to start for it
    /// says (docs/operations.md, "Damaged hard state").
    RepairHardState(repair::RepairHardStateArgs),
    /// Fault schedules on a cluster of containers (kills, pauses, partitions, restarts),
    /// each run's history checked (docs/testing.md).
    Torture(torture::TortureArgs),
}

/// `keel passwd`.
#[derive(clap::Args)]
struct PasswdArgs {
    /// PBKDF2 iterations (each AUTH costs them).
    #[arg(long, default_value_t = keel_server::acl::ITERATIONS_DEFAULT)]
    iterations: u32,
}

fn passwd(args: &PasswdArgs) -> ExitCode {
    use keel_server::acl::{hash_password, ITERATIONS_MAX, ITERATIONS_MIN};
    if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&args.iterations) {
        eprintln!("keel passwd: --iterations must be in {ITERATIONS_MIN}..={ITERATIONS_MAX}");
        return ExitCode::from(2);
    }
    let mut line = String::new();
    if std::io::stdin().read_line(&mut line).is_err()
        || line.trim_end_matches(['\r', '\n']).is_empty()
    {
        eprintln!("keel passwd: give the password on standard input (one line)");
        return ExitCode::from(2);
    }
    let password = line.trim_end_matches(['\r', '\n']);
    println!("{}", hash_password(password.as_bytes(), args.iterations));
    ExitCode::SUCCESS
}

/// Whether `command` runs servers in this process (a node, a local cluster, a benchmark's
/// or a torture run's): those keep the runtime's `SIGPIPE` ignored, so that a socket or a
/// child's pipe closed under a write is an error to handle, never a signal that stops
/// every node. The other commands print and exit, and a closed standard output
/// (`keel status | head`) stops them quietly as it stops any Unix tool, instead of a
/// panic on the failed print.
fn hosts_servers(command: &Command) -> bool {
    matches!(
        command,
        Command::Server(_)
            | Command::Up(_)
            | Command::Demo(_)
            | Command::Example(_)
            | Command::Bench(_)
            | Command::Torture(_)
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !hosts_servers(&cli.command) {
        sigpipe::reset();
    }
    match cli.command {
        Command::Check(args) => keel_check::cli::run(&args),
        Command::Sim(args) => keel_sim::cli::run(&args),
        Command::Server(args) => {
            let _ = tikv_jemalloc_ctl::background_thread::write(true);
            keel_server::cli::main(&args)
        }
        Command::Up(args) => up::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Example(args) => example::run(&args),
        Command::Get(args) => client_cmds::get(&args),
        Command::Set(args) => client_cmds::set(&args),
        Command::Del(args) => client_cmds::del(&args),
        Command::Cas(args) => client_cmds::cas(&args),
        Command::Faa(args) => client_cmds::faa(&args),
        Command::Status(args) => client_cmds::status(&args),
        Command::Node(args) => client_cmds::node(&args),
        Command::Slots(args) => slots_cmd::slots(&args),
        Command::Bench(args) => keel_bench::cli::run(&args),
        Command::Passwd(args) => passwd(&args),
        Command::Torture(args) => torture::run(&args),
        Command::RepairHardState(args) => repair::run(&args),
    }
}
