//! `tender stats`: what workers pulled, per repository, from a running server or a data
//! directory.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tender_server::served::RepoServed;

use crate::exit::{Failure, Result};
use crate::http::{self, ClientArgs, ClientOptions};

#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// A running tender, e.g. http://127.0.0.1:5000 [env: TENDER_SERVER, without --data]
    #[arg(long, value_name = "URL", conflicts_with = "data")]
    pub server: Option<String>,
    /// A data directory (stopped or running server) [default: ./tender-data]
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Only this repository (`<upstream>/<name>`, e.g. ghcr.io/siderolabs/kubelet)
    #[arg(long, value_name = "REPOSITORY")]
    pub repository: Option<String>,
    /// table or json
    #[arg(long, value_name = "FORMAT", default_value = "table")]
    pub output: String,
    /// With --server: TLS trust and credentials (a pull token: --token-file or TENDER_TOKEN_FILE)
    #[command(flatten)]
    pub client: ClientArgs,
}

pub fn run(args: StatsArgs) -> Result<ExitCode> {
    if !matches!(args.output.as_str(), "table" | "json") {
        return Err(Failure::usage(format!("--output {:?}: use table or json", args.output)));
    }
    let all: BTreeMap<String, RepoServed> = match &http::server_or_env(&args.server, args.data.is_some()) {
        Some(server) => {
            let url = http::join(&http::parse_base_url(server)?, "/api/v1/served");
            let c = args.client.client(&ClientOptions {
                user_agent: concat!("tender/", env!("CARGO_PKG_VERSION")),
                headers: &[],
                connect_timeout: Duration::from_secs(10),
                read_timeout: Some(Duration::from_secs(30)),
                admin: false,
            })?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async {
                let resp = c
                    .request(reqwest::Method::GET, url.clone())
                    .send()
                    .await
                    .map_err(|e| Failure::transient(format!("{url}: {e}")))?;
                let status = resp.status();
                if !status.is_success() {
                    let said = http::server_message(&resp.text().await.unwrap_or_default())
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default();
                    return Err(match status.as_u16() {
                        401 => Failure::usage(format!(
                            "{url}: {status}{said}; this tender needs credentials: pass --token-file (or \
                             TENDER_TOKEN_FILE) or --username/--password-file"
                        )),
                        s if s >= 500 => Failure::transient(format!("{url}: {status}{said}")),
                        _ => Failure::problem(format!("{url}: {status}{said}")),
                    });
                }
                resp.json().await.map_err(|e| Failure::problem(format!("{url}: not served statistics: {e}")))
            })?
        }
        None => {
            if args.client.is_set() {
                return Err(Failure::usage("client options (--ca, --token-file, ...) need --server"));
            }
            let dir = args.data.clone().unwrap_or_else(|| PathBuf::from("./tender-data"));
            if !dir.join("tender-data.json").exists() {
                return Err(Failure::usage(format!("{} is not a tender data directory; check --data", dir.display())));
            }
            crate::datadir::require_owner(&dir)?;
            let served = tender_server::served::Served::default();
            served.load(&dir.join(crate::datadir::SERVED_FILE)).map_err(|e| Failure::problem(e.to_string()))?;
            served.snapshot()
        }
    };
    let rows: Vec<(&String, &RepoServed)> =
        all.iter().filter(|(k, _)| args.repository.as_ref().is_none_or(|r| *k == r)).collect();
    if args.output == "json" {
        let map: BTreeMap<&String, &RepoServed> = rows.iter().copied().collect();
        println!("{}", serde_json::to_string_pretty(&map)?);
    } else {
        println!(
            "{:<50} {:>10} {:>10} {:>14} {:>8} {:>8}  LAST SERVED",
            "REPOSITORY", "MANIFESTS", "BLOBS", "BYTES", "HITS", "MISSES"
        );
        for (k, r) in &rows {
            let last = httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(r.last_served));
            println!(
                "{:<50} {:>10} {:>10} {:>14} {:>8} {:>8}  {last}",
                k, r.manifest_requests, r.blob_requests, r.bytes, r.hits, r.misses
            );
        }
    }
    if args.repository.is_some() && rows.is_empty() {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
