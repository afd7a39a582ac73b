//! Suites: `orca` (the ORCA paper's Table 2 and Figure 10 side by side with the peers),
//! `scale` (1..128 closed-loop clients on YCSB A and B), `geo` (five nodes in three
//! emulated sites; see [`crate::geo`]), `keyspaces` (Keel with one keyspace against
//! several, the same clients spread over them).
//!
//! Each suite prints its records as they complete, then writes
//! `<out>/<suite>-<unix time>.jsonl` and `.md` (the table plus ratios).

use crate::cli::{execute, Plan, SuiteArgs};
use crate::report::{markdown_header, markdown_row, RunRecord};
use crate::systems::System;
use crate::workload::WorkloadName;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Clients in the orca suite (the paper's 10).
pub const ORCA_CLIENTS: usize = 10;
/// Client counts of the scale suite.
pub const SCALE_CLIENTS: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
/// Clients of the keyspaces suite (with 3 keyspaces, 10 in each).
pub const KEYSPACES_CLIENTS: usize = 30;
/// The keyspace counts the keyspaces suite compares.
pub const KEYSPACE_COUNTS: [u32; 2] = [1, 3];

fn plan(
    system: System,
    config: &str,
    all: bool,
    workload: WorkloadName,
    clients: &[usize],
) -> Plan {
    Plan {
        system,
        config: config.into(),
        reads_everywhere: all,
        workload,
        clients: clients.to_vec(),
        target_ops_s: None,
        keyspaces: 1,
    }
}

/// The keyspaces suite's plans: per workload, `cad` and `immediate` with leader reads on
/// one keyspace and on three, [`KEYSPACES_CLIENTS`] clients spread over the keyspaces.
pub fn keyspaces_plans(workloads: &[WorkloadName]) -> Vec<Plan> {
    let mut plans = Vec::new();
    for &workload in workloads {
        for config in ["cad", "immediate"] {
            for keyspaces in KEYSPACE_COUNTS {
                let clients = [KEYSPACES_CLIENTS];
                plans.push(Plan {
                    keyspaces,
                    ..plan(System::Keel, config, false, workload, &clients)
                });
            }
        }
    }
    plans
}

/// The keyspaces suite's ratios, per workload: config → throughput with three keyspaces
/// over throughput with one.
pub fn keyspaces_ratios(records: &[RunRecord]) -> BTreeMap<String, BTreeMap<String, f64>> {
    let mut table: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for one in records.iter().filter(|r| r.keyspaces.is_none()) {
        let several = records.iter().find(|r| {
            r.keyspaces.is_some()
                && (r.config.as_str(), r.reads.as_str(), r.workload.as_str(), r.clients)
                    == (one.config.as_str(), one.reads.as_str(), one.workload.as_str(), one.clients)
        });
        let Some(several) = several.filter(|_| one.throughput_ops_s > 0.0) else { continue };
        let name = format!(
            "keel {} ({} reads): {} keyspaces / 1",
            one.config,
            one.reads,
            several.keyspaces.unwrap_or(1)
        );
        let ratio = (several.throughput_ops_s / one.throughput_ops_s * 100.0).round() / 100.0;
        table.entry(one.workload.clone()).or_default().insert(name, ratio);
    }
    table
}

/// The orca suite's plans: Table 2 (leader reads) and Figure 10 (reads at all nodes).
pub fn orca_plans(systems: &[System], workloads: &[WorkloadName]) -> Vec<Plan> {
    let clients = [ORCA_CLIENTS];
    let configs: [(System, &str, bool); 11] = [
        (System::Keel, "immediate", false),
        (System::Keel, "eventual", false),
        (System::Keel, "cad", false),
        (System::Keel, "weak", true),
        (System::Keel, "cad", true),
        (System::Redis, "immediate", false),
        (System::Redis, "eventual", false),
        (System::Redis, "eventual", true),
        (System::Etcd, "linearizable", false),
        (System::Etcd, "serializable", true),
        (System::Zookeeper, "strong-zk", false),
    ];
    let mut plans = Vec::new();
    for &workload in workloads {
        for (system, config, all) in configs {
            if systems.contains(&system) {
                plans.push(plan(system, config, all, workload, &clients));
            }
        }
        if systems.contains(&System::Zookeeper) {
            plans.push(plan(System::Zookeeper, "weak-zk", true, workload, &clients));
        }
    }
    plans
}

/// The scale suite's plans.
pub fn scale_plans(systems: &[System], workloads: &[WorkloadName]) -> Vec<Plan> {
    let configs: [(System, &str, bool); 5] = [
        (System::Keel, "strong", false),
        (System::Keel, "cad", true),
        (System::Redis, "eventual", false),
        (System::Etcd, "linearizable", false),
        (System::Zookeeper, "strong-zk", false),
    ];
    let mut plans = Vec::new();
    for &workload in workloads {
        for (system, config, all) in configs {
            if systems.contains(&system) {
                plans.push(plan(system, config, all, workload, &SCALE_CLIENTS));
            }
        }
    }
    plans
}

/// The throughput of the record matching `(system, config, reads, workload, clients)`.
fn throughput(records: &[RunRecord], key: (&str, &str, &str, &str, usize)) -> Option<f64> {
    records
        .iter()
        .find(|r| {
            (r.system.as_str(), r.config.as_str(), r.reads.as_str(), r.workload.as_str(), r.clients)
                == key
        })
        .map(|r| r.throughput_ops_s)
}

/// `(system, config, reads)` of one row.
type RunKey = (&'static str, &'static str, &'static str);

/// The ratios the orca suite reports, per workload: name → value.
pub fn orca_ratios(records: &[RunRecord]) -> BTreeMap<String, BTreeMap<String, f64>> {
    let pairs: [(&str, RunKey, RunKey); 8] = [
        (
            "keel cad / keel immediate (leader reads)",
            ("keel", "cad", "leader"),
            ("keel", "immediate", "leader"),
        ),
        (
            "keel eventual / keel immediate (leader reads)",
            ("keel", "eventual", "leader"),
            ("keel", "immediate", "leader"),
        ),
        (
            "keel cad / keel eventual (leader reads)",
            ("keel", "cad", "leader"),
            ("keel", "eventual", "leader"),
        ),
        ("keel cad (all) / keel weak (all)", ("keel", "cad", "all"), ("keel", "weak", "all")),
        (
            "keel immediate / etcd linearizable",
            ("keel", "immediate", "leader"),
            ("etcd", "linearizable", "leader"),
        ),
        (
            "keel cad (all) / redis eventual (all)",
            ("keel", "cad", "all"),
            ("redis", "eventual", "all"),
        ),
        ("keel cad (all) / weak-zk (all)", ("keel", "cad", "all"), ("zookeeper", "weak-zk", "all")),
        (
            "keel strong / strong-zk (leader)",
            ("keel", "immediate", "leader"),
            ("zookeeper", "strong-zk", "leader"),
        ),
    ];
    let mut table = BTreeMap::new();
    let workloads: std::collections::BTreeSet<&str> =
        records.iter().map(|r| r.workload.as_str()).collect();
    for workload in workloads {
        let mut row = BTreeMap::new();
        for (name, (s1, c1, r1), (s2, c2, r2)) in pairs {
            let top = throughput(records, (s1, c1, r1, workload, ORCA_CLIENTS));
            let bottom = throughput(records, (s2, c2, r2, workload, ORCA_CLIENTS));
            if let (Some(top), Some(bottom)) = (top, bottom) {
                if bottom > 0.0 {
                    row.insert(name.to_string(), (top / bottom * 100.0).round() / 100.0);
                }
            }
        }
        table.insert(workload.to_string(), row);
    }
    table
}

fn markdown(name: &str, command: &str, records: &[RunRecord]) -> String {
    let mut out = format!("# keel bench suite {name}\n\nCommand: `{command}`\n\n");
    let _ = writeln!(out, "{}", markdown_header());
    for record in records {
        let _ = writeln!(out, "{}", markdown_row(record));
    }
    let ratios = match name {
        "orca" => Some((orca_ratios(records), ORCA_CLIENTS)),
        "keyspaces" => Some((keyspaces_ratios(records), KEYSPACES_CLIENTS)),
        _ => None,
    };
    if let Some((ratios, clients)) = ratios {
        let _ = writeln!(out, "\n## Throughput ratios ({clients} clients)\n\n| workload | ratio | value |\n|---|---|---:|");
        for (workload, row) in ratios {
            for (ratio, value) in row {
                let _ = writeln!(out, "| {workload} | {ratio} | {value:.2}x |");
            }
        }
    }
    out
}

/// Color names of [`crate::plot::PALETTE`], for the legends.
const COLOR_NAMES: [&str; crate::plot::SERIES_MAX] = [
    "blue",
    "orange",
    "green",
    "red",
    "purple",
    "brown",
    "pink",
    "grey",
    "olive",
    "cyan",
    "black",
    "light green",
];

/// Series named by `names`, in order.
fn named(names: &[String], points: Vec<Vec<(f64, f64)>>) -> Vec<crate::plot::Series> {
    names
        .iter()
        .zip(points)
        .map(|(n, p)| crate::plot::Series { name: n.clone(), points: p })
        .collect()
}

/// Per workload: a percentile plot (every run) and, for several client counts, a p99 vs
/// throughput plot (one curve per configuration). Returns `(file name, PNG, legend)`.
pub fn plots(records: &[RunRecord]) -> Vec<(String, Vec<u8>, Vec<String>)> {
    let mut out = Vec::new();
    let workloads: std::collections::BTreeSet<&str> =
        records.iter().map(|r| r.workload.as_str()).collect();
    for workload in workloads {
        let runs: Vec<&RunRecord> = records.iter().filter(|r| r.workload == workload).collect();
        let mut configs: Vec<(String, Vec<&RunRecord>)> = Vec::new();
        for run in &runs {
            let keyspaces = run.keyspaces.map_or(String::new(), |k| format!(", {k} keyspaces"));
            let name = format!("{} {} ({} reads{keyspaces})", run.system, run.config, run.reads);
            match configs.iter_mut().find(|(n, _)| *n == name) {
                Some((_, list)) => list.push(run),
                None => configs.push((name, vec![run])),
            }
        }
        configs.truncate(crate::plot::SERIES_MAX);
        let legend = |names: Vec<String>| -> Vec<String> {
            names.into_iter().zip(COLOR_NAMES).map(|(n, c)| format!("{c}: {n}")).collect()
        };
        let percentile_series: Vec<Vec<(f64, f64)>> = configs
            .iter()
            .map(|(_, list)| {
                let r = list.last().expect("a configuration has a run");
                [r.p50_us, r.p90_us, r.p99_us, r.p999_us, r.max_us]
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (i as f64, *v as f64))
                    .collect()
            })
            .collect();
        let labels = ["50", "90", "99", "99.9", "100"];
        let names: Vec<String> = configs
            .iter()
            .map(|(n, list)| format!("{n}, {} clients", list.last().map_or(0, |r| r.clients)))
            .collect();
        let canvas = crate::plot::Plot {
            title: format!("YCSB {}: latency percentiles", workload.to_uppercase()),
            x_title: "percentile".into(),
            y_title: "latency (µs)".into(),
            log_y: true,
            x_labels: Some(labels.map(String::from).to_vec()),
            series: named(&names, percentile_series),
        };
        out.push((format!("latency-percentiles-{workload}.png"), canvas.to_png(), legend(names)));
        if configs.iter().any(|(_, list)| list.len() > 1) {
            let curves: Vec<Vec<(f64, f64)>> = configs
                .iter()
                .map(|(_, list)| {
                    list.iter().map(|r| (r.throughput_ops_s, r.p99_us as f64)).collect()
                })
                .collect();
            let names: Vec<String> = configs.iter().map(|(n, _)| n.clone()).collect();
            let canvas = crate::plot::Plot {
                title: format!("YCSB {}: p99 latency against throughput", workload.to_uppercase()),
                x_title: "throughput (ops/s)".into(),
                y_title: "p99 latency (µs)".into(),
                log_y: true,
                x_labels: None,
                series: named(&names, curves),
            };
            out.push((format!("p99-vs-throughput-{workload}.png"), canvas.to_png(), legend(names)));
        }
    }
    out
}

/// `keel bench report FILE.jsonl`: the Markdown table, ratios and plots of saved records,
/// written beside the file as `FILE.md` and `FILE-*.png`.
pub fn report(file: &Path) -> Result<(), String> {
    if file.file_name().is_some_and(|n| n.to_string_lossy().starts_with("geo-")) {
        return crate::geo::report(file);
    }
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let records: Vec<RunRecord> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{}: {e}", file.display())))
        .collect::<Result<_, _>>()?;
    let stem = file.file_stem().map_or("results".into(), |s| s.to_string_lossy().into_owned());
    let name = stem.split('-').next().unwrap_or("orca").to_string();
    let dir = file.parent().unwrap_or(Path::new("."));
    let command = recorded_command(dir, &stem);
    write_files(dir, &stem, &name, &command, &records)
}

/// The command an earlier `<dir>/<stem>.md` names as having produced its records (so a
/// redrawn report keeps it), or else this process's command line.
pub(crate) fn recorded_command(dir: &Path, stem: &str) -> String {
    let previous = std::fs::read_to_string(dir.join(format!("{stem}.md"))).unwrap_or_default();
    previous
        .lines()
        .find_map(|l| l.strip_prefix("Command: `")?.strip_suffix('`').map(str::to_string))
        .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" "))
}

fn write_files(
    out: &Path,
    stem: &str,
    name: &str,
    command: &str,
    records: &[RunRecord],
) -> Result<(), String> {
    let mut md = markdown(name, command, records);
    let _ = writeln!(md, "\n## Plots\n\nY axes are logarithmic latency in microseconds.");
    for (file, png, legend) in plots(records) {
        let file = format!("{stem}-{file}");
        std::fs::write(out.join(&file), png).map_err(|e| e.to_string())?;
        let _ = writeln!(md, "\n![{file}]({file})\n\n{}", legend.join("; "));
    }
    std::fs::write(out.join(format!("{stem}.md")), md).map_err(|e| e.to_string())?;
    eprintln!("keel bench: wrote {}", out.join(format!("{stem}.md")).display());
    Ok(())
}

fn write_results(out: &Path, name: &str, records: &[RunRecord]) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let jsonl: String = records.iter().map(|r| r.to_json_line() + "\n").collect();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let base = out.join(format!("{name}-{stamp}"));
    std::fs::write(base.with_extension("jsonl"), jsonl).map_err(|e| e.to_string())?;
    write_files(out, &format!("{name}-{stamp}"), name, &command, records)?;
    eprintln!("keel bench: wrote {}.jsonl and .md", base.display());
    Ok(())
}

/// Runs `keel bench suite`.
pub fn run(args: &SuiteArgs, exe: &Path) -> Result<Vec<RunRecord>, String> {
    let systems: Vec<System> = args.systems.split(',').map(str::parse).collect::<Result<_, _>>()?;
    let default_workloads = match args.name.as_str() {
        "orca" => "a,b,d,f",
        "scale" | "keyspaces" => "a,b",
        "geo" => return crate::geo::run(args, exe).map(|()| Vec::new()),
        "correctables" => return crate::correctables::run(args, exe).map(|()| Vec::new()),
        "kite" => return crate::kite::run(args, exe).map(|()| Vec::new()),
        "unistore" => return crate::unistore::run(args, exe).map(|()| Vec::new()),
        "rubis" => return crate::rubis::run(args, exe).map(|()| Vec::new()),
        other => {
            return Err(format!(
            "unknown suite {other:?}: expected orca, geo, scale, keyspaces, correctables, kite, unistore or rubis"
        ))
        }
    };
    let workloads: Vec<WorkloadName> = args
        .workloads
        .as_deref()
        .unwrap_or(default_workloads)
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let mut plans = match args.name.as_str() {
        "orca" => orca_plans(&systems, &workloads),
        "keyspaces" => keyspaces_plans(&workloads),
        _ => scale_plans(&systems, &workloads),
    };
    if args.name != "keyspaces" {
        plans.iter_mut().for_each(|p| p.keyspaces = args.common.keyspaces);
    }
    let mut records = Vec::new();
    execute(&plans, &args.common, exe, Some(&mut records))?;
    if !args.common.json && (args.name == "orca" || args.name == "keyspaces") {
        println!(
            "{}",
            markdown(&args.name, "", &records)
                .split("## Throughput")
                .nth(1)
                .map_or(String::new(), |s| format!("## Throughput{s}"))
        );
    }
    write_results(&args.common.out, &args.name, &records)?;
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(system: &str, config: &str, reads: &str, workload: &str, tput: f64) -> RunRecord {
        RunRecord {
            system: system.into(),
            config: config.into(),
            reads: reads.into(),
            workload: workload.into(),
            clients: ORCA_CLIENTS,
            target_ops_s: None,
            records: 1000,
            duration_s: 10.0,
            ops: 0,
            errors: 0,
            throughput_ops_s: tput,
            mean_us: 0.0,
            p50_us: 0,
            p90_us: 0,
            p99_us: 0,
            p999_us: 0,
            max_us: 0,
            reads_with_durability_round_pct: None,
            server_rss_kib_max: None,
            emulated_fsync_us: None,
            flush_interval_ms: None,
            keyspaces: None,
            seed: 1,
        }
    }

    #[test]
    fn orca_plans_cover_table2_and_figure10() {
        let plans = orca_plans(&[System::Keel], &[WorkloadName::A, WorkloadName::B]);
        assert_eq!(plans.len(), 10);
        assert!(plans.iter().any(|p| p.config == "cad" && p.reads_everywhere));
        assert!(plans.iter().all(|p| p.clients == vec![ORCA_CLIENTS]));
        assert!(scale_plans(&[System::Redis], &[WorkloadName::A])[0].clients.contains(&128));
    }

    #[test]
    fn ratios_divide_the_matching_throughputs() {
        let records = vec![
            record("keel", "cad", "leader", "a", 300.0),
            record("keel", "immediate", "leader", "a", 100.0),
            record("keel", "eventual", "leader", "a", 310.0),
        ];
        let ratios = orca_ratios(&records);
        assert_eq!(ratios["a"]["keel cad / keel immediate (leader reads)"], 3.0);
        assert_eq!(ratios["a"]["keel cad / keel eventual (leader reads)"], 0.97);
        assert!(!ratios["a"].contains_key("keel immediate / etcd linearizable"));
        let md = markdown("orca", "keel bench suite orca", &records);
        assert!(md.contains("| a | keel cad / keel immediate (leader reads) | 3.00x |"));
    }

    #[test]
    fn the_keyspaces_suite_compares_three_keyspaces_with_one() {
        let plans = keyspaces_plans(&[WorkloadName::A]);
        assert_eq!(plans.len(), 4);
        assert!(plans.iter().all(|p| p.clients == vec![KEYSPACES_CLIENTS] && !p.reads_everywhere));
        let mut one = record("keel", "cad", "leader", "a", 100.0);
        one.clients = KEYSPACES_CLIENTS;
        let mut three = record("keel", "cad", "leader", "a", 150.0);
        three.clients = KEYSPACES_CLIENTS;
        three.keyspaces = Some(3);
        let ratios = keyspaces_ratios(&[one.clone(), three.clone()]);
        assert_eq!(ratios["a"]["keel cad (leader reads): 3 keyspaces / 1"], 1.5);
        let md = markdown("keyspaces", "keel bench suite keyspaces", &[one, three]);
        assert!(md.contains("| keel (3 keyspaces) | cad |"), "{md}");
        assert!(md.contains("3 keyspaces / 1 | 1.50x |"), "{md}");
    }

    #[test]
    fn plots_per_workload_and_curves_only_with_several_client_counts() {
        let mut records = vec![record("keel", "cad", "all", "a", 100.0)];
        assert_eq!(plots(&records).len(), 1);
        let mut more = record("keel", "cad", "all", "a", 200.0);
        more.clients = 64;
        records.push(more);
        records.push(record("etcd", "linearizable", "leader", "b", 50.0));
        let files: Vec<String> = plots(&records).into_iter().map(|(f, _, _)| f).collect();
        assert_eq!(
            files,
            ["latency-percentiles-a.png", "p99-vs-throughput-a.png", "latency-percentiles-b.png"]
        );
    }
}
