//! The `keel` commands that print and exit stop quietly when their standard output is
//! closed (`keel status | head`), as a Unix tool does, instead of panicking on the failed
//! print.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

#[test]
fn a_closed_standard_output_stops_a_printing_command_without_a_panic() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["sim", "run", "--seeds", "400", "--seed", "1", "--threads", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("keel starts");
    let mut first = String::new();
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    out.read_line(&mut first).expect("a first line");
    assert!(first.contains("seed"), "{first}");
    drop(out); // the reader goes away, as `head -1` does
    let mut stderr = String::new();
    child.stderr.take().expect("piped").read_to_string(&mut stderr).expect("stderr");
    let status = child.wait().expect("keel ends");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(status.signal(), Some(13), "stopped by SIGPIPE: {status:?}");
}
