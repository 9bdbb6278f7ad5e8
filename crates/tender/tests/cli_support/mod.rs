//! Running the real `tender` binary from a test: arguments, standard input, the output.
#![allow(dead_code, reason = "each test binary uses a part")]
#![allow(clippy::unwrap_used, reason = "tests")]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `tender args…` with `stdin` on its standard input. A command that refuses its arguments
/// exits without reading its input; the write then meets a closed pipe, which is no error here.
pub fn tender(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tender"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    match input.write_all(stdin.unwrap_or("").as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("writing tender's input: {e}"),
        _ => {}
    }
    drop(input);
    child.wait_with_output().unwrap()
}

/// Write `text` to `dir/name`; its path.
pub fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}
