//! Child processes: a guard that kills on drop, signals, bounded waits, and commands that must
//! succeed.

use std::ffi::OsStr;
use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

/// A child process that is SIGKILLed and reaped when dropped, unless it already exited.
pub struct Guard {
    name: String,
    child: Option<Child>,
}

impl Guard {
    pub fn spawn(name: &str, cmd: &mut Command) -> Guard {
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Guard { name: name.to_string(), child: Some(child) }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).expect("child present until dropped")
    }

    /// The exit status if the process has ended (reaping it), else `None`.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut().expect("child present until dropped");
        child.try_wait().unwrap_or_else(|e| panic!("waiting for {}: {e}", self.name))
    }

    /// Wait at most `limit` for the process to end.
    pub fn wait_for_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(s) = self.try_wait() {
                return Some(s);
            }
            if start.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Send a signal by name (`TERM`, `HUP`, `INT`, `KILL`).
    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    /// [`Guard::signal`] that reports failure instead of panicking (for drop paths).
    pub fn try_signal(&self, sig: &str) -> bool {
        self.child.as_ref().is_some_and(|c| try_signal(c.id(), sig))
    }

    /// `kill -9` and reap.
    pub fn kill9(&mut self) -> ExitStatus {
        let name = self.name.clone();
        let child = self.child.as_mut().expect("child present until dropped");
        if let Ok(Some(s)) = child.try_wait() {
            return s;
        }
        child.kill().unwrap_or_else(|e| panic!("SIGKILL {name}: {e}"));
        child.wait().unwrap_or_else(|e| panic!("reaping {name}: {e}"))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Send signal `sig` (a name such as `TERM`) to `pid`, with the shell's `kill` builtin (always
/// present where bash is; the workspace forbids `unsafe`, so no `libc::kill`).
pub fn signal(pid: u32, sig: &str) {
    assert!(try_signal(pid, sig), "kill -s {sig} {pid} failed");
}

/// [`signal`] that reports failure (no such process) instead of panicking.
pub fn try_signal(pid: u32, sig: &str) -> bool {
    Command::new("bash")
        .args(["-c", "kill -s \"$1\" \"$2\" 2>/dev/null", "kill", sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// Run a command to completion and return its output, whatever the exit status.
pub fn output(cmd: &mut Command) -> Output {
    cmd.stdin(std::process::Stdio::null());
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Run a command with at most `limit` to finish; a command still running then is killed and
/// the test fails. For commands whose hanging would be the bug (a second server that should
/// refuse to start).
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    use std::io::Read;
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut g = Guard::spawn(&format!("{cmd:?}"), cmd);
    let child = g.child.as_mut().expect("child present until dropped");
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let t_out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        b
    });
    let t_err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        b
    });
    let Some(status) = g.wait_for_exit(limit) else {
        drop(g);
        panic!("{cmd:?} did not finish within {limit:?}");
    };
    Output { status, stdout: t_out.join().unwrap_or_default(), stderr: t_err.join().unwrap_or_default() }
}

/// Run a command that must succeed; panic with its output when it does not. Returns stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A command with arguments, for brevity.
pub fn cmd<I, S>(program: impl AsRef<OsStr>, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut c = Command::new(program);
    c.args(args);
    c
}

/// Whether a command is on PATH.
pub fn have(program: &str) -> bool {
    Command::new("bash")
        .args(["-c", "command -v \"$1\" >/dev/null", "have", program])
        .status()
        .is_ok_and(|s| s.success())
}

/// Panic with a hint naming the packages when a needed command is missing.
pub fn need(programs: &[&str]) {
    let missing: Vec<&str> = programs.iter().copied().filter(|p| !have(p)).collect();
    assert!(
        missing.is_empty(),
        "missing commands {missing:?}: install the peers (scripts/test.sh does: docker-registry skopeo containerd curl jq openssl)"
    );
}
