//! `keel up`: a local cluster in the foreground until Ctrl-C.

use keel_server::acl::Category;
use keel_server::config::KeyspaceSettings;
use keel_server::local::LocalCluster;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// How long `keel up` waits for a leader before reporting the cluster unhealthy.
pub const LEADER_WAIT: Duration = Duration::from_secs(30);

/// Flags of `keel up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Number of nodes: 3, 5 or 7; with `--voters`, 3 to 9; with keyspaces placed on
    /// replica groups (`--replicas` below the node count, or `--sharded`), up to 32.
    #[arg(long, default_value_t = 3)]
    pub nodes: u32,
    /// Replicas of each ORCA keyspace (3, 5 or 7): below `--nodes`, each keyspace is
    /// placed on a group of this many, the groups taking turns over the nodes and their
    /// leaders spread. Default: every node when `--nodes` is 3, 5 or 7, else 3.
    #[arg(long, conflicts_with_all = ["geo", "voters"])]
    pub replicas: Option<u32>,
    /// A sharded cluster speaking the Redis Cluster protocol (`redis-cli -c`, redis-py's
    /// `RedisCluster`): the 16,384 hash slots split over the keyspaces, each on its own
    /// replica group (`--keyspaces` of them; default `--nodes` / `--replicas`, rounded up).
    #[arg(long, conflicts_with_all = ["geo", "voters", "kite"])]
    pub sharded: bool,
    /// The first this many nodes vote (3, 5 or 7); the others start outside the
    /// membership of every keyspace (a Kite one's too), for `keel node add`
    /// (docs/operations.md, "Membership"). Default: all.
    #[arg(long, conflicts_with = "geo")]
    pub voters: Option<u32>,
    /// Data directory (kept); default: a fresh temporary directory, removed on exit.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Client ports are BASE.., peer ports BASE+100.., HTTP ports BASE+200...
    #[arg(long, default_value_t = 7379)]
    pub base_port: u16,
    /// Number of ORCA keyspaces (0 to N-1; `SELECT n` or `redis-cli -n n` picks one),
    /// their leaders spread over the nodes. Default: 1; placed on groups (`--replicas`
    /// below `--nodes`, or `--sharded`), `--nodes` / `--replicas` rounded up.
    #[arg(long)]
    pub keyspaces: Option<u32>,
    /// Also host a Kite keyspace (release consistency, leaderless) with the next id
    /// (`redis-cli -n <id>`; `GET k ACQUIRE`, `SET k v RELEASE`, `KEEL.FAA`, `KEEL.CAS`).
    #[arg(long)]
    pub kite: bool,
    /// A geo deployment instead: `--dcs` data centers of `--per-dc` nodes each, one geo
    /// keyspace 0 (causal transactions: `KEEL.TX.BEGIN` ... `KEEL.TX.COMMIT`,
    /// `KEEL.BARRIER`, `KEEL.ATTACH`), peer messages delayed as across a wide-area
    /// network (1 ms one way inside a data center, 17 ms across).
    #[arg(long, conflicts_with_all = ["nodes", "keyspaces", "kite"])]
    pub geo: bool,
    /// Data centers of `--geo`: 3 (tolerating one failed data center) or 5 (two).
    #[arg(long, default_value_t = 3, requires = "geo")]
    pub dcs: u32,
    /// Nodes per data center of `--geo` (each holds one partition of the keyspace).
    #[arg(long, default_value_t = 2, requires = "geo")]
    pub per_dc: u32,
    /// Clients authenticate as `admin` (password in <dir>/admin.password) and may connect
    /// over TLS (ports BASE+300..; authority <dir>/tls/ca.pem); `/metrics` and `/status`
    /// over HTTPS with the token in <dir>/http.token. Made on first start, kept with --dir.
    #[arg(long)]
    pub secure: bool,
}

/// How far above a node's client port its TLS port is (`keel up --secure`).
pub const TLS_PORT_OFFSET: u16 = 300;

/// The cluster `keel up`'s flags ask for: its size, each keyspace's replicas, how many
/// keyspaces, and whether they are placed on groups (the last with `--replicas` below
/// `--nodes`, or `--sharded`).
struct Layout {
    nodes: u32,
    replicas: u32,
    keyspaces: u32,
    placed: bool,
}

impl Layout {
    /// The layout of `args`, or why the flags make none (for standard error).
    fn of(args: &UpArgs) -> Result<Layout, String> {
        if args.geo
            && (!matches!(args.dcs, 3 | 5) || args.per_dc == 0 || args.dcs * args.per_dc > 7)
        {
            return Err(
                "keel up --geo: --dcs must be 3 or 5, and --dcs × --per-dc at most 7".into()
            );
        }
        let nodes = if args.geo { args.dcs * args.per_dc } else { args.nodes };
        let whole = matches!(args.nodes, 3 | 5 | 7);
        let replicas = args.replicas.unwrap_or(if whole { args.nodes } else { 3 });
        let placed = !args.geo && (replicas < args.nodes || args.sharded);
        let most = keel_server::config::CLUSTER_MEMBERS_MAX as u32;
        if placed && (!matches!(replicas, 3 | 5 | 7) || replicas > args.nodes || args.nodes > most)
        {
            return Err(format!(
                "keel up: --replicas must be 3, 5 or 7, at most --nodes, which is at most {most}"
            ));
        }
        let keyspaces = match args.keyspaces {
            Some(k) => k,
            None if placed => args.nodes.div_ceil(replicas),
            None => 1,
        };
        if placed && keyspaces * replicas < args.nodes {
            return Err(format!(
                "keel up: {keyspaces} keyspaces of {replicas} replicas leave some of the {} nodes hosting nothing: --keyspaces at least {}",
                args.nodes,
                args.nodes.div_ceil(replicas)
            ));
        }
        match args.voters {
            _ if args.geo || placed => {}
            None if !whole => {
                return Err(
                    "keel up: --nodes must be 3, 5 or 7 (or more with --replicas or --sharded)"
                        .into(),
                )
            }
            Some(v) if !matches!(v, 3 | 5 | 7) || v > args.nodes || args.nodes > 9 => {
                return Err(
                    "keel up: --voters must be 3, 5 or 7, at most --nodes, which is at most 9"
                        .into(),
                )
            }
            _ => {}
        }
        if keyspaces == 0 || keyspaces as usize > keel_server::config::KEYSPACES_MAX {
            let max = keel_server::config::KEYSPACES_MAX;
            return Err(format!("keel up: --keyspaces must be in 1..={max}"));
        }
        Ok(Layout { nodes, replicas, keyspaces, placed })
    }
}

/// Runs `keel up`.
pub fn run(args: &UpArgs) -> ExitCode {
    let Layout { nodes, replicas, keyspaces, placed } = match Layout::of(args) {
        Ok(layout) => layout,
        Err(why) => {
            eprintln!("{why}");
            return ExitCode::from(2);
        }
    };
    let (dir, temporary) = match &args.dir {
        Some(dir) => (dir.clone(), false),
        None => (std::env::temp_dir().join(format!("keel-up-{}", std::process::id())), true),
    };
    let exe = std::env::current_exe().expect("the running binary has a path");
    let secure = match args.secure.then(|| crate::secure::prepare(&dir)).transpose() {
        Ok(secure) => secure,
        Err(e) => {
            eprintln!("keel up: --secure: {e}");
            return ExitCode::from(1);
        }
    };
    let admin = secure.as_ref().map(|s| {
        let hash = keel_server::acl::hash_password(
            s.password.as_bytes(),
            keel_server::acl::ITERATIONS_DEFAULT,
        );
        keel_server::acl::UserSettings {
            name: "admin".into(),
            password_hash: hash,
            permissions: vec![Category::Read, Category::Write, Category::Admin],
            keyspaces: None,
        }
    });
    let (kite, sharded) = (args.kite, args.sharded);
    let geo = args.geo.then_some((args.dcs, args.per_dc));
    let files = secure.clone();
    let voters = args.voters.filter(|v| *v < nodes);
    let tweak = move |config: &mut keel_server::ServerConfig| {
        config.voters = voters.map(|v| (1..=v).collect());
        if let Some((dcs, per_dc)) = geo {
            keel_server::local::geo_layout(config, dcs, per_dc);
        } else if placed {
            config.keyspaces =
                keel_server::local::placed_keyspaces(nodes, keyspaces, replicas, sharded);
        } else if keyspaces > 1 || kite {
            config.keyspaces = (0..keyspaces).map(KeyspaceSettings::orca).collect();
        }
        if kite {
            config.keyspaces.push(KeyspaceSettings::kite(keyspaces));
        }
        if let (Some(secure), Some(admin)) = (&files, &admin) {
            let client = config.client_addr;
            let tls = std::net::SocketAddr::new(client.ip(), client.port() + TLS_PORT_OFFSET);
            config.users = vec![admin.clone()];
            config.client_tls_addr = Some(tls);
            config.tls_cert_file = Some(secure.cert.clone());
            config.tls_key_file = Some(secure.key.clone());
            config.http_tls = true;
            config.http_token_file = Some(secure.token_file.clone());
        }
    };
    let mut cluster = match LocalCluster::start(&exe, nodes, &dir, Some(args.base_port), tweak) {
        Ok(cluster) => cluster,
        Err(e) => {
            eprintln!("keel up: cannot start the cluster: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(secure) = &secure {
        cluster.credentials = Some(("admin".into(), secure.password.clone()));
    }
    let code = serve(&mut cluster, secure.as_ref());
    cluster.stop();
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    code
}

/// One line on keyspace `id` once it serves: its leader (or that it is leaderless), its
/// replicas when it is placed, and how `redis-cli` reaches it.
fn print_keyspace(cluster: &LocalCluster, id: u32) {
    if cluster.is_leaderless(id) {
        let kind = cluster.engine_of(id);
        match cluster.wait_for_replicas(id, LEADER_WAIT) {
            true => println!("  keyspace {id}: {kind}, leaderless   (redis-cli -n {id})"),
            false => println!("  keyspace {id}: {kind}, still starting; see the node logs"),
        }
        return;
    }
    let settings = cluster.configs[0].keyspace_settings();
    let ks = settings.iter().find(|k| k.id == id).expect("a configured keyspace");
    let on = match &ks.replicas {
        Some(_) => {
            let hosts: Vec<String> =
                cluster.hosting(id).iter().map(|i| format!("n{}", i + 1)).collect();
            format!(" on {}", hosts.join(" "))
        }
        None => String::new(),
    };
    match cluster.wait_for_leader_in(id, LEADER_WAIT) {
        Some(leader) => {
            let port = cluster.configs[leader].client_addr.port();
            let reach = match (&ks.slots, ks.replicas.is_some()) {
                (Some(slots), _) => format!("slots {slots}; redis-cli -c -p {port}"),
                (None, true) => format!("redis-cli -p {port} -n {id}"),
                (None, false) => format!("redis-cli -n {id}"),
            };
            println!("  keyspace {id}{on}: leader n{}   ({reach})", leader + 1)
        }
        None => println!("  keyspace {id}{on}: no leader yet; see the node logs"),
    }
}

fn serve(cluster: &mut LocalCluster, secure: Option<&crate::secure::Secure>) -> ExitCode {
    let ids = cluster.keyspace_ids();
    if ids.len() == 1 && !cluster.is_leaderless(ids[0]) {
        match cluster.wait_for_leader(LEADER_WAIT) {
            Some(leader) => println!("keel: cluster up, leader n{}", leader + 1),
            None => println!("keel: no leader yet; see the node logs"),
        }
    } else {
        println!("keel: cluster up with {} keyspaces", ids.len());
        for id in ids {
            print_keyspace(cluster, id);
        }
    }
    for (i, config) in cluster.configs.iter().enumerate() {
        let log = cluster.log_path(i);
        match (secure, config.client_tls_addr) {
            (Some(secure), Some(tls)) => {
                let http = config.http_addr.map_or(String::new(), |a| {
                    format!(
                        "\n      curl --cacert {} -H \"Authorization: Bearer $(cat {})\" https://{a}/status",
                        secure.ca.display(),
                        secure.token_file.display()
                    )
                });
                println!(
                    "  n{}: redis-cli --tls --cacert {} -p {} --user admin --pass $(cat {})   log: {}{http}",
                    i + 1,
                    secure.ca.display(),
                    tls.port(),
                    secure.password_file.display(),
                    log.display()
                );
            }
            _ => {
                let http =
                    config.http_addr.map_or(String::new(), |a| format!("  http://{a}/status"));
                let me = config.members.iter().find(|m| m.id == config.node_id);
                let dc =
                    me.and_then(|m| m.dc.as_ref()).map_or(String::new(), |d| format!(" ({d})"));
                println!(
                    "  n{}{dc}: redis-cli -p {}{http}   log: {}",
                    i + 1,
                    config.client_addr.port(),
                    log.display()
                );
            }
        }
    }
    if let (Some(secure), Some(tls)) =
        (secure, cluster.configs.first().and_then(|c| c.client_tls_addr))
    {
        println!(
            "  keel's own commands: KEEL_PASSWORD=$(cat {}) keel status --user admin --tls-ca {} --node localhost:{}",
            secure.password_file.display(),
            secure.ca.display(),
            tls.port()
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
