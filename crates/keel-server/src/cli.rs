//! `keel server`: flags, logging set-up, the runtime, signals and the exit code.

use crate::config::{Member, ServerConfig};
use crate::node::NodeError;
use keel_types::{Durability, ReadLevel};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use tokio::sync::watch;

/// Flags of `keel server`. Flags override the config file field of the same name.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// A TOML configuration file (see docs/operations.md).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// This node's id.
    #[arg(long)]
    pub node_id: Option<u32>,
    /// Directory of the log, hard state and snapshots.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Client (RESP) listen address.
    #[arg(long)]
    pub client_addr: Option<SocketAddr>,
    /// HTTP (/metrics, /status) listen address.
    #[arg(long)]
    pub http_addr: Option<SocketAddr>,
    /// A member as ID=PEER_ADDR, with `,CLIENT_ADDR` where its clients connect (a
    /// sharded cluster's redirects name it) and `@DC` its data center's label (geo
    /// keyspaces): ID=PEER_ADDR[,CLIENT_ADDR][@DC], repeated for each (this node
    /// included); replaces the file's members.
    #[arg(long = "member", value_parser = parse_member)]
    pub members: Vec<Member>,
    /// Durability of writes that name none.
    #[arg(long)]
    pub durability_default: Option<Durability>,
    /// Level of reads that name none.
    #[arg(long)]
    pub read_level_default: Option<ReadLevel>,
    /// Stop when standard input closes (how `keel up` and `keel demo` make sure no node
    /// outlives them).
    #[arg(long)]
    pub exit_with_stdin: bool,
    /// Check the configuration (as `keel server` would at start, files it names not read)
    /// and exit: 0 when valid, 1 with the reason when not.
    #[arg(long)]
    pub check: bool,
}

fn parse_member(text: &str) -> Result<Member, String> {
    let (id, rest) = text.split_once('=').ok_or("expected ID=PEER_ADDR[,CLIENT_ADDR][@DC]")?;
    let id = id.parse().map_err(|e| format!("member id: {e}"))?;
    let (addrs, dc) = match rest.rsplit_once('@') {
        Some((addrs, dc)) => (addrs, Some(dc.to_string())),
        None => (rest, None),
    };
    let (addr, client) = match addrs.split_once(',') {
        Some((addr, client)) => (addr, Some(client)),
        None => (addrs, None),
    };
    let peer_addr = addr.parse().map_err(|e: String| format!("member address: {e}"))?;
    let client_addr = client
        .map(|c| c.parse().map_err(|e: String| format!("member client address: {e}")))
        .transpose()?;
    Ok(Member { id, peer_addr, dc, client_addr })
}

impl ServerArgs {
    /// The configuration: the file (if any) with the flags applied over it.
    pub fn to_config(&self) -> Result<ServerConfig, crate::config::ConfigError> {
        let missing = |field: &str| crate::config::ConfigError::Invalid {
            field: field.to_string(),
            reason: "required (in --config or as a flag)".into(),
        };
        let mut config = match &self.config {
            Some(path) => ServerConfig::from_file(path)?,
            None => {
                let node_id = self.node_id.ok_or_else(|| missing("node_id"))?;
                let data_dir = self.data_dir.clone().ok_or_else(|| missing("data_dir"))?;
                let client_addr = self.client_addr.ok_or_else(|| missing("client_addr"))?;
                let mut config = ServerConfig::local(3, 1, 7379, &data_dir);
                config.node_id = node_id;
                config.data_dir = data_dir;
                config.client_addr = client_addr;
                config.http_addr = None;
                config.members.clear();
                config
            }
        };
        self.apply(&mut config);
        if config.members.is_empty() {
            return Err(missing("members"));
        }
        config.validate()?;
        Ok(config)
    }

    fn apply(&self, config: &mut ServerConfig) {
        if let Some(v) = self.node_id {
            config.node_id = v;
        }
        if let Some(v) = &self.data_dir {
            config.data_dir = v.clone();
        }
        if let Some(v) = self.client_addr {
            config.client_addr = v;
        }
        if self.http_addr.is_some() {
            config.http_addr = self.http_addr;
        }
        if !self.members.is_empty() {
            config.members = self.members.clone();
        }
        if self.durability_default.is_some() {
            config.engine.durability_default = self.durability_default;
        }
        if self.read_level_default.is_some() {
            config.engine.read_level_default = self.read_level_default;
        }
    }
}

/// Sets up `tracing` from `KEEL_LOG` (default `info`), to standard error.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KEEL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs `keel server`: 0 after a clean stop (Ctrl-C, SIGTERM, stdin closed), 1 on a
/// bad configuration, 3 when it cannot start, 4 after a storage failure.
pub fn main(args: &ServerArgs) -> ExitCode {
    init_logging();
    let config = match args.to_config() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("keel server: {e}");
            return ExitCode::from(1);
        }
    };
    if args.check {
        return ExitCode::SUCCESS;
    }
    // Each keyspace's engine loop is a task: as many workers as cores unless configured,
    // so that several keyspaces use several cores. Loops, peer links and connections
    // share the runtime (see `node`).
    let workers = crate::config::runtime_threads(config.worker_threads) as usize;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("keel-worker")
        .enable_all()
        .build()
        .expect("the tokio runtime starts");
    let exit_with_stdin = args.exit_with_stdin;
    let result = runtime.block_on(async move {
        let (stop_tx, stop_rx) = watch::channel(false);
        spawn_stop_signals(stop_tx, exit_with_stdin);
        crate::node::run(config, stop_rx).await
    });
    // Connections and peer links may still be parked: do not wait for them.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("keel server: {e}");
            ExitCode::from(NodeError::exit_code(&e))
        }
    }
}

fn spawn_stop_signals(stop: watch::Sender<bool>, exit_with_stdin: bool) {
    let stop = std::sync::Arc::new(stop);
    if exit_with_stdin {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sink = [0u8; 256];
            // Read until end of file or an error: the parent is gone.
            while matches!(std::io::Read::read(&mut std::io::stdin(), &mut sink), Ok(n) if n > 0) {}
            let _ = stop.send(true);
        });
    }
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler installs");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = stop.send(true);
    });
}

#[cfg(test)]
mod tests {
    use super::parse_member;

    #[test]
    fn a_member_flag_names_its_addresses_and_data_center() {
        let m = parse_member("4=10.0.0.4:7479").unwrap();
        assert_eq!(
            (m.id, m.peer_addr.to_string(), m.client_addr, m.dc),
            (4, "10.0.0.4:7479".into(), None, None)
        );
        let m = parse_member("4=10.0.0.4:7479,10.0.0.4:7379@east").unwrap();
        assert_eq!(m.client_addr.map(|a| a.to_string()).as_deref(), Some("10.0.0.4:7379"));
        assert_eq!(m.dc.as_deref(), Some("east"));
        let m = parse_member("4=keel-3.keel:7479,keel-3.keel:7379").unwrap();
        assert_eq!(m.client_addr.map(|a| a.to_string()).as_deref(), Some("keel-3.keel:7379"));
        assert!(parse_member("4=10.0.0.4:7479,nonsense").is_err());
        assert!(parse_member("x=10.0.0.4:7479").is_err());
    }
}
