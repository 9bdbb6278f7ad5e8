//! The Image Factory stand-in of the test bed (`scripts/testbed/factory-upstream.sh`): serves
//! files under `/image/...` always as `200` with the whole body (Range ignored, as the factory
//! does), with an access log the bed sums.

use std::path::{Path, PathBuf};

use crate::paths::harness_script;
use crate::proc::{self, cmd, need};
use crate::registry::free_port;

/// A running factory stand-in, stopped when dropped.
pub struct Factory {
    dir: PathBuf,
    pub port: u16,
}

impl Factory {
    /// Start it with its files under `dir/www`.
    pub fn start(dir: &Path) -> Factory {
        need(&["python3", "curl"]);
        let script = harness_script("factory-upstream.sh");
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port();
            let out = proc::output(&mut cmd(&script, ["start".as_ref(), dir.as_os_str(), port.to_string().as_ref()]));
            if out.status.success() {
                return Factory { dir: dir.to_path_buf(), port };
            }
            last = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            let _ = proc::output(&mut cmd(&script, ["stop".as_ref(), dir.as_os_str()]));
        }
        panic!("the factory stand-in did not start in {}:\n{last}", dir.display());
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Serve `bytes` at `path` (`/image/<schematic>/<version>/<asset>`).
    pub fn put(&self, path: &str, bytes: &[u8]) {
        let file = self.dir.join("www").join(path.trim_start_matches('/'));
        std::fs::create_dir_all(file.parent().expect("a path under www")).expect("creating the asset's directory");
        std::fs::write(&file, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
    }

    /// How many GETs the stand-in answered (its `stats` line, `gets=`).
    pub fn gets(&self) -> u64 {
        let out = proc::run(&mut cmd(harness_script("factory-upstream.sh"), ["stats".as_ref(), self.dir.as_os_str()]));
        out.split_whitespace()
            .find_map(|kv| kv.strip_prefix("gets="))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no gets= in the factory's stats: {out}"))
    }
}

impl Drop for Factory {
    fn drop(&mut self) {
        let _ = proc::output(&mut cmd(harness_script("factory-upstream.sh"), ["stop".as_ref(), self.dir.as_os_str()]));
    }
}
