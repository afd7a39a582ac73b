//! `keel up`: a local cluster in the foreground until Ctrl-C.

use keel_server::local::LocalCluster;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// How long `keel up` waits for a leader before reporting the cluster unhealthy.
pub const LEADER_WAIT: Duration = Duration::from_secs(30);

/// Flags of `keel up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Number of nodes: 3, 5 or 7.
    #[arg(long, default_value_t = 3)]
    pub nodes: u32,
    /// Data directory (kept); default: a fresh temporary directory, removed on exit.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Client ports are BASE.., peer ports BASE+100.., HTTP ports BASE+200...
    #[arg(long, default_value_t = 7379)]
    pub base_port: u16,
}

/// Runs `keel up`.
pub fn run(args: &UpArgs) -> ExitCode {
    if !matches!(args.nodes, 3 | 5 | 7) {
        eprintln!("keel up: --nodes must be 3, 5 or 7");
        return ExitCode::from(2);
    }
    let (dir, temporary) = match &args.dir {
        Some(dir) => (dir.clone(), false),
        None => (std::env::temp_dir().join(format!("keel-up-{}", std::process::id())), true),
    };
    let exe = std::env::current_exe().expect("the running binary has a path");
    let mut cluster =
        match LocalCluster::start(&exe, args.nodes, &dir, Some(args.base_port), |_| {}) {
            Ok(cluster) => cluster,
            Err(e) => {
                eprintln!("keel up: cannot start the cluster: {e}");
                return ExitCode::from(1);
            }
        };
    let code = serve(&mut cluster);
    cluster.stop();
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    code
}

fn serve(cluster: &mut LocalCluster) -> ExitCode {
    match cluster.wait_for_leader(LEADER_WAIT) {
        Some(leader) => println!("keel: cluster up, leader n{}", leader + 1),
        None => println!("keel: no leader yet; see the node logs"),
    }
    for (i, config) in cluster.configs.iter().enumerate() {
        let http = config.http_addr.map_or(String::new(), |a| format!("  http://{a}/status"));
        println!(
            "  n{}: redis-cli -p {}{http}   log: {}",
            i + 1,
            config.client_addr.port(),
            cluster.log_path(i).display()
        );
    }
    println!("Ctrl-C stops the cluster.");
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        loop {
            tokio::select! {
                _ = &mut ctrl_c => {
                    println!("\nkeel: stopping");
                    return ExitCode::SUCCESS;
                }
                _ = tick.tick() => {
                    if let Some((i, status)) = cluster.exited() {
                        eprintln!("keel: n{} exited ({status}); see {}", i + 1, cluster.log_path(i).display());
                        return ExitCode::from(1);
                    }
                }
            }
        }
    })
}
