//! `cargo run --release -p keel-sim --example sim -- run --seeds 100`: the `keel sim`
//! command without building the whole `keel` binary.

use clap::Parser;

/// Keel's simulator.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: keel_sim::cli::SimArgs,
}

fn main() -> std::process::ExitCode {
    keel_sim::cli::run(&Cli::parse().args)
}
