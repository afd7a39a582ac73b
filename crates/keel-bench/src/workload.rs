//! YCSB's core workloads A–F (as its `workloads/workloada`..`f` files set them) and W
//! (write-only, as the ORCA paper uses it), and the per-client operation stream.
//!
//! Layout: [`WorkloadName`] names a workload; [`WorkloadSpec`] holds its properties (the
//! YCSB property names are in the field docs); [`ClientStream`] draws one client's
//! operations from a seed; the insert counter is shared by every client of a run.
//!
//! Keys are YCSB's: `"user"` followed by the decimal [`fnv_hash64`] of the key number
//! (`insertorder=hashed`). A record is `fieldcount` fields of `fieldlength` bytes stored
//! as one value. An update writes the whole record (a key-value store has no fields).

use crate::generator::{
    fnv_hash64, AcknowledgedCounter, Hotspot, ScrambledZipfian, SkewedLatest, UniformLong,
    WindowFull,
};
use crate::rng::Rng;
use std::sync::{Arc, Mutex};

/// Most draws of a key number before giving up on one beyond the acknowledged inserts
/// (YCSB loops without bound; the chance of needing more than a few is negligible).
pub const KEY_DRAWS_MAX: u32 = 10_000;
/// Largest record a run may ask for, in bytes.
pub const RECORD_BYTES_MAX: u64 = 1 << 20;

/// A YCSB core workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkloadName {
    /// Update heavy: 50% reads, 50% updates, zipfian.
    A,
    /// Read mostly: 95% reads, 5% updates, zipfian.
    B,
    /// Read only, zipfian.
    C,
    /// Read latest: 95% reads, 5% inserts, latest.
    D,
    /// Short ranges: 95% scans (1..=100 items), 5% inserts, zipfian.
    E,
    /// Read-modify-write: 50% reads, 50% read-modify-writes, zipfian.
    F,
    /// Write only: 100% updates, zipfian (the ORCA paper's W).
    W,
}

impl WorkloadName {
    /// Every workload, in order.
    pub const ALL: [WorkloadName; 7] = [
        WorkloadName::A,
        WorkloadName::B,
        WorkloadName::C,
        WorkloadName::D,
        WorkloadName::E,
        WorkloadName::F,
        WorkloadName::W,
    ];

    /// The lower-case letter used on the command line and in reports.
    pub fn letter(self) -> &'static str {
        match self {
            WorkloadName::A => "a",
            WorkloadName::B => "b",
            WorkloadName::C => "c",
            WorkloadName::D => "d",
            WorkloadName::E => "e",
            WorkloadName::F => "f",
            WorkloadName::W => "w",
        }
    }
}

impl std::str::FromStr for WorkloadName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase();
        let s = s.strip_prefix("workload").unwrap_or(&s);
        WorkloadName::ALL
            .into_iter()
            .find(|w| w.letter() == s)
            .ok_or_else(|| format!("unknown workload {s:?}: expected one of a, b, c, d, e, f, w"))
    }
}

/// How requests pick keys (`requestdistribution`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestDistribution {
    /// `uniform`.
    Uniform,
    /// `zipfian`: scrambled zipfian over the loaded and expected new keys.
    Zipfian,
    /// `latest`: skewed towards the newest acknowledged insert.
    Latest,
    /// `hotspot`: 20% of the keys take 80% of the requests.
    Hotspot,
}

/// The properties of a run of one workload.
#[derive(Clone, Debug)]
pub struct WorkloadSpec {
    /// Which workload.
    pub name: WorkloadName,
    /// `recordcount`: records loaded.
    pub record_count: u64,
    /// `operationcount`: used, as in YCSB, only to size the key chooser for inserts.
    pub operation_count: u64,
    /// `fieldcount`.
    pub field_count: u64,
    /// `fieldlength`.
    pub field_length: u64,
    /// `readproportion`.
    pub read: f64,
    /// `updateproportion`.
    pub update: f64,
    /// `insertproportion`.
    pub insert: f64,
    /// `scanproportion`.
    pub scan: f64,
    /// `readmodifywriteproportion`.
    pub read_modify_write: f64,
    /// `requestdistribution`.
    pub distribution: RequestDistribution,
    /// `maxscanlength` (scan lengths are uniform in `1..=max`).
    pub scan_length_max: u64,
}

impl WorkloadSpec {
    /// The workload as YCSB's file sets it, over `record_count` records of 10 × 100 bytes.
    pub fn core(name: WorkloadName, record_count: u64, operation_count: u64) -> WorkloadSpec {
        assert!(record_count >= 1, "a workload needs at least one record");
        let (read, update, insert, scan, rmw, distribution) = match name {
            WorkloadName::A => (0.5, 0.5, 0.0, 0.0, 0.0, RequestDistribution::Zipfian),
            WorkloadName::B => (0.95, 0.05, 0.0, 0.0, 0.0, RequestDistribution::Zipfian),
            WorkloadName::C => (1.0, 0.0, 0.0, 0.0, 0.0, RequestDistribution::Zipfian),
            WorkloadName::D => (0.95, 0.0, 0.05, 0.0, 0.0, RequestDistribution::Latest),
            WorkloadName::E => (0.0, 0.0, 0.05, 0.95, 0.0, RequestDistribution::Zipfian),
            WorkloadName::F => (0.5, 0.0, 0.0, 0.0, 0.5, RequestDistribution::Zipfian),
            WorkloadName::W => (0.0, 1.0, 0.0, 0.0, 0.0, RequestDistribution::Zipfian),
        };
        WorkloadSpec {
            name,
            record_count,
            operation_count,
            field_count: 10,
            field_length: 100,
            read,
            update,
            insert,
            scan,
            read_modify_write: rmw,
            distribution,
            scan_length_max: 100,
        }
    }

    /// Bytes of one record value.
    pub fn record_bytes(&self) -> u64 {
        let bytes = self.field_count * self.field_length;
        assert!(bytes > 0 && bytes <= RECORD_BYTES_MAX, "record of {bytes} bytes");
        bytes
    }

    /// Whether the workload scans (E); systems without range reads skip it.
    pub fn scans(&self) -> bool {
        self.scan > 0.0
    }
}

/// The key of key number `keynum`: `user<fnv_hash64(keynum)>`.
pub fn key_name(keynum: u64) -> String {
    format!("user{}", fnv_hash64(keynum))
}

/// One operation of the run phase, or an insert of the load phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Read one record.
    Read {
        /// The key.
        key: String,
    },
    /// Overwrite one record.
    Update {
        /// The key.
        key: String,
        /// The new record.
        value: Vec<u8>,
    },
    /// Write a new record; acknowledge `keynum` once it completes.
    Insert {
        /// The key number (acknowledge it to the stream's counter after the write).
        keynum: u64,
        /// The key.
        key: String,
        /// The record.
        value: Vec<u8>,
    },
    /// Read up to `count` records from `start` on, in key order.
    Scan {
        /// The first key.
        start: String,
        /// Most records.
        count: u64,
    },
    /// Read a record, then overwrite it.
    ReadModifyWrite {
        /// The key.
        key: String,
        /// The new record.
        value: Vec<u8>,
    },
}

impl Operation {
    /// The name used in per-operation reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Operation::Read { .. } => "read",
            Operation::Update { .. } => "update",
            Operation::Insert { .. } => "insert",
            Operation::Scan { .. } => "scan",
            Operation::ReadModifyWrite { .. } => "rmw",
        }
    }
}

#[derive(Clone, Debug)]
enum KeyChooser {
    Uniform(UniformLong),
    Zipfian(ScrambledZipfian),
    Latest(SkewedLatest),
    Hotspot(Hotspot),
}

/// The insert counter every client of a run shares.
pub type SharedCounter = Arc<Mutex<AcknowledgedCounter>>;

/// A fresh run-phase insert counter for `spec` (inserts continue after the loaded keys).
pub fn insert_counter(spec: &WorkloadSpec) -> SharedCounter {
    Arc::new(Mutex::new(AcknowledgedCounter::new(spec.record_count)))
}

/// One client's stream of operations, fixed by its seed (the insert key numbers also
/// depend on how the clients interleave, as in YCSB).
#[derive(Debug)]
pub struct ClientStream {
    spec: Arc<WorkloadSpec>,
    rng: Rng,
    chooser: KeyChooser,
    scan_length: UniformLong,
    inserts: SharedCounter,
}

impl ClientStream {
    /// The stream of client `client` of a run seeded `seed`.
    pub fn new(spec: Arc<WorkloadSpec>, seed: u64, client: u64, inserts: SharedCounter) -> Self {
        let n = spec.record_count;
        // YCSB's fudge factor: room for twice the expected inserts in the key chooser.
        let expected_new = (spec.operation_count as f64 * spec.insert * 2.0) as u64;
        let chooser = match spec.distribution {
            RequestDistribution::Uniform => KeyChooser::Uniform(UniformLong::new(0, n - 1)),
            RequestDistribution::Zipfian => {
                KeyChooser::Zipfian(ScrambledZipfian::new(0, n - 1 + expected_new))
            }
            RequestDistribution::Latest => KeyChooser::Latest(SkewedLatest::new(n.max(2) - 1)),
            RequestDistribution::Hotspot => KeyChooser::Hotspot(Hotspot::new(0, n - 1, 0.2, 0.8)),
        };
        let rng = Rng::new(seed ^ client.wrapping_mul(0xA076_1D64_78BD_642F));
        let scan_length = UniformLong::new(1, spec.scan_length_max.max(1));
        ClientStream { spec, rng, chooser, scan_length, inserts }
    }

    fn last_acknowledged(&self) -> u64 {
        self.inserts.lock().expect("insert counter lock").last()
    }

    /// The next key number to read or update: never beyond the acknowledged inserts.
    fn next_keynum(&mut self) -> u64 {
        let last = self.last_acknowledged();
        for _ in 0..KEY_DRAWS_MAX {
            let keynum = match &mut self.chooser {
                KeyChooser::Uniform(g) => g.next(&mut self.rng),
                KeyChooser::Zipfian(g) => g.next(&mut self.rng),
                KeyChooser::Latest(g) => g.next(&mut self.rng, last),
                KeyChooser::Hotspot(g) => g.next(&mut self.rng),
            };
            if keynum <= last {
                return keynum;
            }
        }
        last
    }

    /// A fresh record value.
    pub fn value(&mut self) -> Vec<u8> {
        let mut value = vec![0u8; self.spec.record_bytes() as usize];
        self.rng.fill_printable(&mut value);
        value
    }

    /// The next operation. `Err(WindowFull)`: too many inserts outstanding; retry later.
    pub fn next_operation(&mut self) -> Result<Operation, WindowFull> {
        let s = &self.spec;
        let total = s.read + s.update + s.insert + s.scan + s.read_modify_write;
        assert!(total > 0.0, "a workload with no operations");
        // YCSB's discrete generator: proportions in order read, update, insert, scan, rmw.
        let mut u = self.rng.next_f64() * total;
        let weights = [s.read, s.update, s.insert, s.scan, s.read_modify_write];
        let mut pick = weights.iter().rposition(|w| *w > 0.0).expect("a positive weight");
        for (i, w) in weights.iter().enumerate() {
            if u < *w {
                pick = i;
                break;
            }
            u -= w;
        }
        Ok(match pick {
            0 => Operation::Read { key: key_name(self.next_keynum()) },
            1 => {
                let key = key_name(self.next_keynum());
                Operation::Update { key, value: self.value() }
            }
            2 => {
                let keynum = self.inserts.lock().expect("insert counter lock").hand_out()?;
                Operation::Insert { keynum, key: key_name(keynum), value: self.value() }
            }
            3 => {
                let start = key_name(self.next_keynum());
                Operation::Scan { start, count: self.scan_length.next(&mut self.rng) }
            }
            _ => {
                let key = key_name(self.next_keynum());
                Operation::ReadModifyWrite { key, value: self.value() }
            }
        })
    }

    /// Reports a run-phase insert complete.
    pub fn acknowledge(&self, keynum: u64) {
        self.inserts.lock().expect("insert counter lock").acknowledge(keynum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(name: WorkloadName, seed: u64) -> ClientStream {
        let spec = Arc::new(WorkloadSpec::core(name, 1000, 1000));
        let counter = insert_counter(&spec);
        ClientStream::new(spec, seed, 0, counter)
    }

    fn mix(name: WorkloadName, draws: usize) -> std::collections::BTreeMap<&'static str, usize> {
        let mut s = stream(name, 1);
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..draws {
            let op = s.next_operation().unwrap();
            if let Operation::Insert { keynum, .. } = &op {
                s.acknowledge(*keynum);
            }
            *counts.entry(op.kind()).or_insert(0) += 1;
        }
        counts
    }

    #[test]
    fn workload_mixes_match_the_ycsb_files() {
        let a = mix(WorkloadName::A, 20_000);
        assert!((9_500..10_500).contains(&a["read"]) && (9_500..10_500).contains(&a["update"]));
        let b = mix(WorkloadName::B, 20_000);
        assert!((18_700..19_300).contains(&b["read"]), "{b:?}");
        let c = mix(WorkloadName::C, 1_000);
        assert_eq!(c.get("read"), Some(&1_000));
        let d = mix(WorkloadName::D, 20_000);
        assert!((700..1_300).contains(&d["insert"]), "{d:?}");
        let e = mix(WorkloadName::E, 20_000);
        assert!((18_700..19_300).contains(&e["scan"]) && !e.contains_key("read"));
        let f = mix(WorkloadName::F, 20_000);
        assert!((9_500..10_500).contains(&f["rmw"]));
        let w = mix(WorkloadName::W, 1_000);
        assert_eq!(w.get("update"), Some(&1_000));
    }

    #[test]
    fn same_seed_same_operations() {
        let (mut x, mut y, mut z) =
            (stream(WorkloadName::A, 7), stream(WorkloadName::A, 7), stream(WorkloadName::A, 8));
        let xs: Vec<Operation> = (0..100).map(|_| x.next_operation().unwrap()).collect();
        let ys: Vec<Operation> = (0..100).map(|_| y.next_operation().unwrap()).collect();
        let zs: Vec<Operation> = (0..100).map(|_| z.next_operation().unwrap()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
    }

    #[test]
    fn reads_only_touch_acknowledged_keys() {
        let loaded: std::collections::BTreeSet<String> = (0..1000).map(key_name).collect();
        let mut s = stream(WorkloadName::D, 3);
        let mut inserted = std::collections::BTreeSet::new();
        for _ in 0..5_000 {
            match s.next_operation().unwrap() {
                Operation::Read { key } => {
                    assert!(loaded.contains(&key) || inserted.contains(&key), "read of {key}")
                }
                Operation::Insert { keynum, key, value } => {
                    assert_eq!(value.len(), 1000);
                    assert!(keynum >= 1000);
                    inserted.insert(key);
                    s.acknowledge(keynum);
                }
                op => panic!("workload D does not {}", op.kind()),
            }
        }
        assert!(!inserted.is_empty());
    }

    #[test]
    fn scan_lengths_are_within_bounds_and_keys_are_ycsb_keys() {
        let mut s = stream(WorkloadName::E, 4);
        for _ in 0..1_000 {
            if let Operation::Scan { start, count } = s.next_operation().unwrap() {
                assert!((1..=100).contains(&count));
                assert!(start.starts_with("user"));
            }
        }
        assert_eq!(key_name(0), format!("user{}", fnv_hash64(0)));
        assert_eq!("workloadb".parse::<WorkloadName>(), Ok(WorkloadName::B));
        assert!("z".parse::<WorkloadName>().is_err());
    }
}
