//! `/metrics` of running nodes, read as a scraper reads it: the page is well-formed
//! OpenMetrics text (each family declared once, every sample inside a declared family with
//! the suffixes its type allows, histograms cumulative with `+Inf` equal to `_count`,
//! `# EOF` last), and its families are exactly those `docs/operations.md` lists, with the
//! kinds and labels it gives them.

mod common;

use keel_client::{Client, ClientConfig};
use keel_types::{Durability, ReadLevel};
use std::collections::{BTreeMap, BTreeSet};

/// One sample line.
#[derive(Debug)]
struct Sample {
    /// The family's name plus the suffix (`_total`, `_bucket`, ...), if any.
    suffix: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// One family as declared by `# TYPE` and the samples under it.
#[derive(Debug, Default)]
struct Family {
    kind: String,
    samples: Vec<Sample>,
}

/// The suffixes a sample of a family of `kind` may carry.
fn suffixes(kind: &str) -> &'static [&'static str] {
    match kind {
        "counter" => &["_total", "_created"],
        "gauge" => &[""],
        "histogram" => &["_bucket", "_sum", "_count", "_created"],
        _ => &[],
    }
}

/// `{k="v",...}` at the start of `text` (escapes `\\`, `\"`, `\n`), and what follows.
fn labels(text: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut out = BTreeMap::new();
    let Some(mut rest) = text.strip_prefix('{') else { return Ok((out, text)) };
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((out, after));
        }
        let (name, after) = rest.split_once("=\"").ok_or(format!("no label value in {text:?}"))?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    other => return Err(format!("bad escape {other:?} in {text:?}")),
                },
                Some((_, c)) => value.push(c),
                None => return Err(format!("unterminated label value in {text:?}")),
            }
        };
        if out.insert(name.to_string(), value).is_some() {
            return Err(format!("label {name} twice in {text:?}"));
        }
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

/// Reads a page into its families, or says what is malformed.
fn parse(page: &str) -> Result<BTreeMap<String, Family>, String> {
    let body = page.strip_suffix("# EOF\n").ok_or("the page does not end with # EOF")?;
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in body.lines() {
        if let Some(meta) = line.strip_prefix("# ") {
            let mut words = meta.splitn(3, ' ');
            let (keyword, name) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            match keyword {
                "HELP" | "UNIT" => {}
                "TYPE" => {
                    let kind = words.next().unwrap_or("").to_string();
                    if suffixes(&kind).is_empty() {
                        return Err(format!("{name}: unknown type {kind:?}"));
                    }
                    if families.contains_key(name) {
                        return Err(format!("{name} declared twice"));
                    }
                    families.insert(name.to_string(), Family { kind, samples: Vec::new() });
                    current = Some(name.to_string());
                }
                _ => return Err(format!("unknown line {line:?}")),
            }
            continue;
        }
        let family_name = current.as_ref().ok_or(format!("a sample before any TYPE: {line:?}"))?;
        let family = families.get_mut(family_name).expect("declared above");
        let name_end = line.find(['{', ' ']).ok_or(format!("no value in {line:?}"))?;
        let suffix = line[..name_end]
            .strip_prefix(family_name.as_str())
            .filter(|s| suffixes(&family.kind).contains(s))
            .ok_or(format!("{line:?} is not a sample of {} {family_name}", family.kind))?;
        let (labels, rest) = labels(&line[name_end..])?;
        let value = rest.trim().parse().map_err(|_| format!("bad value in {line:?}"))?;
        family.samples.push(Sample { suffix: suffix.to_string(), labels, value });
    }
    for (name, family) in &families {
        if family.kind == "histogram" {
            histogram_holds(name, family)?;
        }
    }
    Ok(families)
}

/// One histogram series: its buckets (`le`, cumulative count) and its `_count`.
type Series = (Vec<(f64, f64)>, Option<f64>);

/// Per label set: buckets in increasing `le`, never decreasing, ending at `+Inf` with the
/// count; a sum beside them.
fn histogram_holds(name: &str, family: &Family) -> Result<(), String> {
    let mut series: BTreeMap<Vec<(String, String)>, Series> = BTreeMap::new();
    for sample in &family.samples {
        let mut labels = sample.labels.clone();
        let le = labels.remove("le");
        let entry = series.entry(labels.into_iter().collect()).or_default();
        match (sample.suffix.as_str(), le) {
            ("_bucket", Some(le)) => {
                let bound =
                    if le == "+Inf" { f64::INFINITY } else { le.parse().map_err(|_| le)? };
                entry.0.push((bound, sample.value));
            }
            ("_count", None) => entry.1 = Some(sample.value),
            ("_sum" | "_created", None) => {}
            _ => return Err(format!("{name}{}: misplaced le label", sample.suffix)),
        }
    }
    for (labels, (buckets, count)) in series {
        let ordered = buckets.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1);
        let last = buckets.last().filter(|(bound, _)| bound.is_infinite());
        if !ordered || last.map(|(_, n)| *n) != count || count.is_none() {
            return Err(format!("{name}{labels:?}: buckets {buckets:?}, count {count:?}"));
        }
    }
    Ok(())
}

/// The families `docs/operations.md`'s metrics table lists: name (as on the page: a
/// counter without its `_total`), kind, and the labels it names.
fn documented() -> BTreeMap<String, (String, BTreeSet<String>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/operations.md");
    let text = std::fs::read_to_string(path).expect("docs/operations.md");
    let mut out = BTreeMap::new();
    for row in text.lines().filter(|l| l.starts_with("| `keel_")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (names, kind_cell) = (cells[1], cells[2]);
        let mut first = "";
        for name in names.split(", ").map(|n| n.trim_matches('`')) {
            // `_received_total` after `keel_peer_messages_sent_total`: the first's stem.
            let name = if name.starts_with('_') {
                let stem = first.rsplit_once('_').map_or("", |(s, _)| s).rsplit_once('_');
                format!("{}{name}", stem.map_or("", |(s, _)| s))
            } else {
                first = name;
                name.to_string()
            };
            let (bare, labels) = match name.split_once('{') {
                Some((bare, labels)) => (
                    bare.to_string(),
                    labels.trim_end_matches('}').split(',').map(String::from).collect(),
                ),
                None => (name.clone(), BTreeSet::new()),
            };
            let (family, kind) = match bare.strip_suffix("_total") {
                Some(stem) => (stem.to_string(), "counter"),
                None if kind_cell.starts_with("histogram") => (bare, "histogram"),
                None => (bare, "gauge"),
            };
            out.insert(family, (kind.to_string(), labels));
        }
    }
    out
}

#[test]
fn the_checker_refuses_malformed_pages() {
    let ok = "# TYPE a counter\na_total 1\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\n\
              h_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n# EOF\n";
    assert!(parse(ok).is_ok(), "{:?}", parse(ok));
    let bad = [
        ok.trim_end_matches("# EOF\n").to_string(),
        ok.replace("a_total", "b_total"),
        ok.replace("h_count 2", "h_count 3"),
        ok.replace("h_bucket{le=\"1\"} 1", "h_bucket{le=\"1\"} 5"),
        ok.replace("# TYPE h", "# TYPE a"),
        ok.replace("a_total 1", "a_total{x=\"y} 1"),
    ];
    for page in bad {
        assert!(parse(&page).is_err(), "accepted:\n{page}");
    }
}

/// The leader's `/metrics` response (head and body) after a durable write and a read at
/// each level there.
fn leader_page_after_requests() -> String {
    let (cluster, leader) = common::cluster("metrics-page", |_| {});
    let addrs = cluster.client_addrs();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = Client::new(ClientConfig::new(vec![addrs[leader]]));
        let mut session = client.session();
        session.put(b"k", b"v", Some(Durability::Durable)).await.expect("a durable write");
        for level in [ReadLevel::Any, ReadLevel::Monotonic, ReadLevel::Linearizable] {
            session.get(b"k", Some(level)).await.expect("a read");
        }
    });
    let http = cluster.configs[leader].http_addr.expect("local clusters serve HTTP");
    let response = common::scrape(http);
    common::finish(cluster);
    response
}

/// The families on the page are those the docs list, of the kinds and with the labels
/// the docs give.
fn families_match_the_docs(families: &BTreeMap<String, Family>) {
    let docs = documented();
    assert!(docs.len() >= 30, "the docs' table was not read: {docs:?}");
    let on_page: BTreeSet<&String> = families.keys().collect();
    let in_docs: BTreeSet<&String> = docs.keys().collect();
    let undocumented: Vec<_> = on_page.difference(&in_docs).collect();
    let missing: Vec<_> = in_docs.difference(&on_page).collect();
    assert!(undocumented.is_empty(), "on the page, not in docs/operations.md: {undocumented:?}");
    assert!(missing.is_empty(), "in docs/operations.md, not on the page: {missing:?}");
    for (name, (kind, labels)) in &docs {
        let family = &families[name];
        assert_eq!(&family.kind, kind, "{name}");
        for sample in &family.samples {
            let missing: Vec<_> =
                labels.iter().filter(|l| !sample.labels.contains_key(*l)).collect();
            assert!(missing.is_empty(), "{name}{}: no {missing:?}", sample.suffix);
        }
    }
}

#[test]
fn a_running_node_exposes_every_documented_family_well_formed() {
    let response = leader_page_after_requests();
    let (head, page) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains("application/openmetrics-text"), "{head}");
    let families = parse(page).unwrap_or_else(|e| panic!("{e}\n{page}"));
    families_match_the_docs(&families);
    // What the requests must have left.
    let value = |family: &str, suffix: &str, want: &[(&str, &str)]| -> f64 {
        families[family]
            .samples
            .iter()
            .filter(|s| s.suffix == suffix)
            .filter(|s| want.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
            .map(|s| s.value)
            .sum()
    };
    let ok_get = [("keyspace", "0"), ("op", "get"), ("outcome", "ok")];
    assert!(value("keel_requests", "_total", &ok_get) >= 3.0);
    assert!(value("keel_requests", "_total", &[("op", "put"), ("class", "durable")]) >= 1.0);
    assert!(value("keel_request_duration_seconds", "_count", &[("op", "get")]) >= 3.0);
    assert!(value("keel_fsync_duration_seconds", "_count", &[("keyspace", "0")]) >= 1.0);
    assert_eq!(value("keel_role", "", &[("role", "leader")]), 1.0);
    assert!(value("keel_epoch", "", &[("keyspace", "0")]) >= 1.0);
    assert!(value("keel_peer_messages_sent", "_total", &[]) >= 1.0);
}
