//! The binary under test: `tender serve` as a guarded child with a JSON log, and its other
//! commands.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::paths::tender_bin;
use crate::proc::{self, Guard};

/// Longest a tender may take to log its listening address.
const START_LIMIT: Duration = Duration::from_secs(20);

/// Write a config file naming only the given (loopback) upstreams, plus any extra YAML
/// (`fetch:` settings and the like). Never leave tender on its embedded default: that names
/// the real registries.
pub fn write_config(path: &Path, upstreams: &[(&str, &str)], extra: &str) {
    let mut y = String::from("# written by tender-e2e: loopback upstreams only\nupstreams:\n");
    for (name, url) in upstreams {
        assert!(url.starts_with("http://127.0.0.1:"), "e2e upstreams must be on loopback, not {url}");
        y.push_str(&format!("  - name: {name}\n    url: {url}\n"));
    }
    if upstreams.is_empty() {
        y = "# written by tender-e2e: no upstreams\nupstreams: []\n".into();
    }
    y.push_str(extra);
    std::fs::write(path, y).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// A `tender` command line (not started).
pub fn command<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut c = Command::new(tender_bin());
    c.args(args).env_remove("TENDER_LOG").stdin(Stdio::null());
    c
}

/// Longest a one-shot tender command (`fsck`, a refused `serve`) may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(60);

/// Run a tender command to completion (`fsck`, `gc`, a `serve` expected to fail), at most a
/// minute: a command that hangs fails the test.
pub fn run<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    proc::output_within(&mut command(args), COMMAND_LIMIT)
}

/// The path of [`Tender::access`]'s marker requests (answered 404).
const SYNC_PATH: &str = "/e2e-log-sync/";
static SYNC_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One access-log line.
#[derive(Debug, Clone)]
pub struct Access {
    pub method: String,
    pub path: String,
    pub ns: String,
    pub upstream: String,
    pub status: u64,
    pub bytes: u64,
    pub cache: String,
    pub digest: String,
    pub complete: bool,
}

impl Access {
    fn from_json(v: &Value) -> Option<Access> {
        if v.get("target")?.as_str()? != "access" {
            return None;
        }
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let n = |k: &str| v.get(k).and_then(|x| x.as_u64().or_else(|| x.as_str()?.parse().ok())).unwrap_or(0);
        Some(Access {
            method: s("method"),
            path: s("path"),
            ns: s("ns"),
            upstream: s("upstream"),
            status: n("status"),
            bytes: n("bytes"),
            cache: s("cache"),
            digest: s("digest"),
            complete: v.get("complete").and_then(Value::as_bool).unwrap_or(false),
        })
    }

    pub fn is_blob(&self) -> bool {
        self.path.contains("/blobs/")
    }
}

/// A running `tender serve`.
pub struct Tender {
    guard: Guard,
    pub addr: SocketAddr,
    pub log: PathBuf,
    pub data: PathBuf,
    pub config: PathBuf,
}

impl Tender {
    /// Start `tender serve` on a free loopback port (it binds port 0 and logs the address it
    /// got) and wait until it answers `/healthz`. The JSON log goes to `log` (truncated).
    pub fn start(config: &Path, data: &Path, log: &Path) -> Tender {
        Tender::start_with(config, data, log, &[])
    }

    /// Like [`Tender::start`] with more `serve` arguments. With `--tls-cert` it waits for the
    /// port to accept connections instead of a plain-HTTP `/healthz`.
    pub fn start_with(config: &Path, data: &Path, log: &Path, extra: &[&str]) -> Tender {
        Tender::start_cmd(Command::new(tender_bin()), config, data, log, "127.0.0.1:0", extra)
    }

    /// Like [`Tender::start_with`] on a given address (a parent restarted where its children
    /// look for it).
    pub fn start_on(config: &Path, data: &Path, log: &Path, listen: SocketAddr, extra: &[&str]) -> Tender {
        Tender::start_cmd(Command::new(tender_bin()), config, data, log, &listen.to_string(), extra)
    }

    /// Like [`Tender::start`], with the process allowed on the CPUs of `cpus` only (a
    /// `taskset -c` list, such as `0`), so it sees that many CPUs from its start.
    pub fn start_pinned(config: &Path, data: &Path, log: &Path, cpus: &str) -> Tender {
        proc::need(&["taskset"]);
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", cpus]).arg(tender_bin());
        Tender::start_cmd(cmd, config, data, log, "127.0.0.1:0", &[])
    }

    /// Start `program` (tender, or a wrapper that execs it with the arguments that follow)
    /// with `serve` and its arguments.
    fn start_cmd(mut cmd: Command, config: &Path, data: &Path, log: &Path, listen: &str, extra: &[&str]) -> Tender {
        let file = File::create(log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        cmd.args([
            "serve".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
            "--data".as_ref(),
            data.as_os_str(),
            "--listen".as_ref(),
            listen.as_ref(),
            "--log-format".as_ref(),
            "json".as_ref(),
        ] as [&std::ffi::OsStr; 9]);
        cmd.env_remove("TENDER_LOG").stdin(Stdio::null()).args(extra);
        cmd.stdout(Stdio::null()).stderr(file);
        let mut guard = Guard::spawn("tender serve", &mut cmd);
        let addr = crate::poll_until("tender to log its listening address", START_LIMIT, || {
            if let Some(status) = guard.try_wait() {
                panic!("tender serve exited ({status}) before listening:\n{}", read_text(log));
            }
            json_lines(log).iter().find_map(|v| v.get("listen")?.as_str()?.parse::<SocketAddr>().ok())
        });
        let t = Tender { guard, addr, log: log.to_path_buf(), data: data.to_path_buf(), config: config.to_path_buf() };
        if extra.contains(&"--tls-cert") {
            crate::poll_until("tender to accept connections", START_LIMIT, || {
                std::net::TcpStream::connect(t.addr).ok()
            });
        } else {
            crate::poll_until("tender /healthz", START_LIMIT, || {
                crate::http::get(t.addr, "/healthz").ok().filter(|r| r.status() == 200)
            });
        }
        t
    }

    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// `127.0.0.1:PORT`, for clients that want a registry host.
    pub fn hostport(&self) -> String {
        self.addr.to_string()
    }

    /// Every JSON line tender logged so far.
    pub fn log_json(&self) -> Vec<Value> {
        json_lines(&self.log)
    }

    /// Every access-log line of the requests answered so far. tender batches access lines (a
    /// few milliseconds): a marker request whose own line is awaited (bounded) orders every
    /// earlier line into the log first. The marker lines are left out.
    pub fn access(&self) -> Vec<Access> {
        let n = SYNC_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let marker = format!("{SYNC_PATH}{}-{n}", std::process::id());
        // A TLS listener answers no plain request: then the log is read as it is.
        if crate::http::get(self.addr, &marker).is_ok() {
            crate::poll_until("the access log to reach the marker request", Duration::from_secs(10), || {
                json_lines(&self.log)
                    .iter()
                    .any(|v| {
                        v.get("target").and_then(Value::as_str) == Some("access")
                            && v.get("path").and_then(Value::as_str) == Some(marker.as_str())
                    })
                    .then_some(())
            });
        }
        self.log_json().iter().filter_map(Access::from_json).filter(|a| !a.path.starts_with(SYNC_PATH)).collect()
    }

    pub fn signal(&self, sig: &str) {
        self.guard.signal(sig);
    }

    /// The exit status if tender has ended.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.guard.try_wait()
    }

    /// SIGTERM, and wait at most `limit` for the exit; panics when tender does not end.
    pub fn terminate(mut self, limit: Duration) -> ExitStatus {
        self.signal("TERM");
        match self.guard.wait_for_exit(limit) {
            Some(s) => s,
            None => panic!("tender did not exit within {limit:?} of SIGTERM:\n{}", tail(&self.log, 30)),
        }
    }

    /// `kill -9`.
    pub fn kill9(&mut self) -> ExitStatus {
        self.guard.kill9()
    }
}

impl Drop for Tender {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- last lines of {}:\n{}", self.log.display(), tail(&self.log, 40));
        }
    }
}

fn read_text(p: &Path) -> String {
    std::fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// The last `n` lines of a text file.
pub fn tail(p: &Path, n: usize) -> String {
    let text = read_text(p);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The lines of a file that parse as JSON objects.
pub fn json_lines(p: &Path) -> Vec<Value> {
    read_text(p).lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(Value::is_object).collect()
}
