//! What every command that talks to a running tender shares: the client options (trust,
//! client certificate, credentials) as one clap `Args` struct, the HTTP client they build, and
//! image references as people write them (`alpine`, `ghcr.io/siderolabs/kubelet:v1.35.0`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, RequestBuilder};
pub use tender_oci::ImageRef;
use url::Url;

use crate::exit::{Failure, Result};

/// How to reach a tender: TLS trust, client certificate, credentials.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientArgs {
    /// Extra CA bundle (PEM) to trust for the server's certificate
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS
    #[arg(long, value_name = "FILE", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// Private key (PEM) of --client-cert
    #[arg(long, value_name = "FILE", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
    /// User name for HTTP Basic authentication
    #[arg(long, value_name = "USER", requires = "password_file", conflicts_with = "token_file")]
    pub username: Option<String>,
    /// File holding the password for --username (a trailing newline is ignored)
    #[arg(long, value_name = "FILE", requires = "username")]
    pub password_file: Option<PathBuf>,
    /// File holding a bearer token sent as `Authorization: Bearer <token>` [env:
    /// TENDER_TOKEN_FILE, or TENDER_ADMIN_TOKEN_FILE for gc, fsck and catalog sync]
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Do not verify the server's certificate (testing only: anyone on the path can read and
    /// change the traffic)
    #[arg(long, conflicts_with = "ca")]
    pub insecure: bool,
}

/// The server commands talk to when given neither `--server` nor a data directory.
pub const SERVER_ENV: &str = "TENDER_SERVER";
/// The pull token file of commands that read through a server (`prefetch`, `stats`).
pub const TOKEN_ENV: &str = "TENDER_TOKEN_FILE";
/// The admin token file of commands that change a server (`gc`, `fsck`, `catalog sync`).
pub const ADMIN_TOKEN_ENV: &str = "TENDER_ADMIN_TOKEN_FILE";

/// `--server`, else `TENDER_SERVER` unless the command was pointed at local data (`--data`,
/// `--config`): a flag always wins over the environment.
pub fn server_or_env(server: &Option<String>, local: bool) -> Option<String> {
    server.clone().or_else(|| {
        if local {
            return None;
        }
        std::env::var(SERVER_ENV).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
    })
}

#[derive(Clone)]
enum Auth {
    None,
    Basic { user: String, password: String },
    Bearer(String),
}

/// An HTTP client for one tender, with the credentials of [`ClientArgs`] applied to every request.
#[derive(Clone)]
pub struct TenderClient {
    http: reqwest::Client,
    auth: Auth,
}

/// Knobs a command chooses for its client.
pub struct ClientOptions<'a> {
    pub user_agent: &'a str,
    /// Sent on every request.
    pub headers: &'a [(&'static str, &'static str)],
    pub connect_timeout: Duration,
    /// Longest silence while waiting for headers or between body chunks.
    pub read_timeout: Option<Duration>,
    /// The command changes the server (admin token): without `--token-file` (and `--username`)
    /// the token file comes from `TENDER_ADMIN_TOKEN_FILE`, else from `TENDER_TOKEN_FILE`.
    pub admin: bool,
}

fn read_file(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Failure::usage(format!("cannot read {what} {}: {e}", path.display())))
}

impl ClientArgs {
    /// Whether any option was given (they mean nothing to a command working on a data directory).
    pub fn is_set(&self) -> bool {
        self.ca.is_some()
            || self.client_cert.is_some()
            || self.client_key.is_some()
            || self.username.is_some()
            || self.password_file.is_some()
            || self.token_file.is_some()
            || self.insecure
    }

    /// Who the requests authenticate as, without any secret: `none`, `basic <user>` or `bearer`.
    pub fn identity(&self) -> String {
        match (&self.username, &self.token_file) {
            (Some(u), _) => format!("basic {u}"),
            (None, Some(_)) => "bearer".to_string(),
            (None, None) => "none".to_string(),
        }
    }

    /// Build the client. Unreadable files and bad PEM are usage errors (exit 2).
    pub fn client(&self, opts: &ClientOptions<'_>) -> Result<TenderClient> {
        let mut headers = HeaderMap::new();
        for (k, v) in opts.headers {
            headers.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(opts.user_agent)
            .default_headers(headers)
            .connect_timeout(opts.connect_timeout);
        if let Some(t) = opts.read_timeout {
            builder = builder.read_timeout(t);
        }
        if self.insecure {
            builder = builder.danger_accept_invalid_certs(true);
        }
        builder = with_tls_files(
            builder,
            self.ca.as_deref(),
            self.client_cert.as_deref().zip(self.client_key.as_deref()),
            "",
        )?;
        let env = if opts.admin { ADMIN_TOKEN_ENV } else { TOKEN_ENV };
        let (token_file, token_flag) = match (&self.token_file, &self.username) {
            (Some(t), _) => (Some(t.clone()), "--token-file"),
            (None, None) => (std::env::var_os(env).filter(|v| !v.is_empty()).map(PathBuf::from), env),
            (None, Some(_)) => (None, "--token-file"),
        };
        let auth = match (&self.username, &self.password_file, &token_file) {
            (Some(user), Some(pf), _) => {
                let raw = read_file(pf, "--password-file")?;
                let password = String::from_utf8(raw)
                    .map_err(|_| Failure::usage(format!("--password-file {} is not UTF-8", pf.display())))?;
                Auth::Basic { user: user.clone(), password: password.trim_end_matches(['\r', '\n']).to_string() }
            }
            (None, _, Some(tf)) => {
                let raw = read_file(tf, token_flag)?;
                let token = String::from_utf8(raw)
                    .map_err(|_| Failure::usage(format!("{token_flag} {} is not UTF-8", tf.display())))?;
                let token = token.trim().to_string();
                if token.is_empty() {
                    return Err(Failure::usage(format!("{token_flag} {} is empty", tf.display())));
                }
                Auth::Bearer(token)
            }
            _ => Auth::None,
        };
        let http = builder.build().map_err(|e| Failure::usage(format!("cannot build the HTTP client: {e}")))?;
        Ok(TenderClient { http, auth })
    }
}

/// Trust `ca` (a PEM bundle) and present `identity` (PEM certificate and key). `flag_prefix` names
/// the options in errors (`""` for `--ca`, `"parent-"` for `--parent-ca`).
pub fn with_tls_files(
    mut builder: reqwest::ClientBuilder,
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
    flag_prefix: &str,
) -> Result<reqwest::ClientBuilder> {
    if let Some(ca) = ca {
        let flag = format!("--{flag_prefix}ca");
        let pem = read_file(ca, &flag)?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| Failure::usage(format!("{flag} {}: not a PEM certificate bundle: {e}", ca.display())))?;
        if certs.is_empty() {
            return Err(Failure::usage(format!("{flag} {}: no certificate in the file", ca.display())));
        }
        for c in certs {
            builder = builder.add_root_certificate(c);
        }
    }
    if let Some((cert, key)) = identity {
        let (cf, kf) = (format!("--{flag_prefix}client-cert"), format!("--{flag_prefix}client-key"));
        let mut pem = read_file(cert, &cf)?;
        pem.push(b'\n');
        pem.extend_from_slice(&read_file(key, &kf)?);
        let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
            Failure::usage(format!(
                "{cf} {} / {kf} {}: not a PEM certificate and key: {e}",
                cert.display(),
                key.display()
            ))
        })?;
        builder = builder.identity(id);
    }
    Ok(builder)
}

impl TenderClient {
    /// A request with the credentials applied.
    pub fn request(&self, method: Method, url: Url) -> RequestBuilder {
        let rb = self.http.request(method, url);
        match &self.auth {
            Auth::None => rb,
            Auth::Basic { user, password } => rb.basic_auth(user, Some(password)),
            Auth::Bearer(token) => rb.bearer_auth(token),
        }
    }
}

/// A server's base URL: `http(s)://host[:port][/prefix]`, normalised without a trailing slash.
pub fn parse_base_url(raw: &str) -> Result<Url> {
    let url = Url::parse(raw.trim())
        .map_err(|e| Failure::usage(format!("{raw:?} is not a URL ({e}); expected e.g. http://tender.example:5000")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(Failure::usage(format!("{raw:?}: only http:// and https:// URLs are supported")));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(Failure::usage(format!("{raw:?} names no host")));
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() || url.password().is_some() {
        return Err(Failure::usage(format!(
            "{raw:?}: a base URL carries no query, fragment or credentials (use --username / --token-file)"
        )));
    }
    let mut url = url;
    let path = url.path().trim_end_matches('/').to_string();
    url.set_path(&path);
    Ok(url)
}

/// `base` joined with an absolute `path` (which may carry a query).
pub fn join(base: &Url, path_and_query: &str) -> Url {
    let mut url = base.clone();
    let (path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    };
    url.set_path(&format!("{}{}", base.path().trim_end_matches('/'), path));
    url.set_query(query);
    url
}

/// The message in a tender's error answer: `{"error": …}` (the admin endpoints), the OCI
/// `{"errors": [{"message": …}]}` (the registry and auth), else the body itself (cut at 500
/// characters), or `None` when the body says nothing.
pub fn server_message(body: &str) -> Option<String> {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(body) {
        if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
            return Some(e.to_string());
        }
        let messages: Vec<&str> = v
            .get("errors")
            .and_then(|e| e.as_array())
            .into_iter()
            .flatten()
            .filter_map(|e| e.get("message").and_then(|m| m.as_str()))
            .collect();
        if !messages.is_empty() {
            return Some(messages.join("; "));
        }
    }
    let text = body.trim();
    if text.is_empty() {
        return None;
    }
    Some(match text.char_indices().nth(500) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    })
}

/// A failed answer of an admin endpoint, with the server's message and what to do: 401, 403,
/// 404 and 413 are usage errors (exit 2: the token, the address or a setting is wrong; trying
/// again changes nothing), 5xx transient (exit 3), anything else (422: the request was refused)
/// a problem (exit 1).
pub fn admin_failure(url: &Url, status: reqwest::StatusCode, body: &str) -> Failure {
    let said = server_message(body);
    let message = |hint: &str| match (&said, hint) {
        (Some(m), "") => format!("{url}: {status}: {m}"),
        (Some(m), h) => format!("{url}: {status}: {m}; {h}"),
        (None, "") => format!("{url}: {status}"),
        (None, h) => format!("{url}: {status}: {h}"),
    };
    match status.as_u16() {
        401 => Failure::usage(message("pass the admin token with --token-file (or TENDER_ADMIN_TOKEN_FILE)")),
        403 => Failure::usage(message("this identity may not use the admin endpoints")),
        404 if said.is_none() || body.contains("NAME_UNKNOWN") || body.contains("NOT_FOUND") => {
            Failure::usage(message(
                "this tender has no admin endpoints: start it with --admin-token-file (admin.tokenFile), and with \
                 --admin-listen point --server at that address",
            ))
        }
        404 => Failure::usage(message("")),
        413 => Failure::usage(message("raise admin.maxImportSize on the server, or split the bundle")),
        s if s >= 500 => Failure::transient(message("")),
        _ => Failure::problem(message("")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn should_print_the_servers_message_and_classify_admin_answers() {
        let url = Url::parse("http://h:5000/api/v1/admin/import").unwrap();
        let cases: &[(u16, &str, crate::exit::Class, &str)] = &[
            (
                401,
                r#"{"errors":[{"code":"UNAUTHORIZED","message":"this endpoint needs the admin token (Bearer)"}]}"#,
                crate::exit::Class::Usage,
                "401 Unauthorized: this endpoint needs the admin token (Bearer); pass the admin token",
            ),
            (404, "", crate::exit::Class::Usage, "404 Not Found: this tender has no admin endpoints"),
            (
                413,
                r#"{"error":"the bundle is larger"}"#,
                crate::exit::Class::Usage,
                "413 Payload Too Large: the bundle is larger; raise",
            ),
            (
                422,
                r#"{"error":"bundle refused: x"}"#,
                crate::exit::Class::Problem,
                "422 Unprocessable Entity: bundle refused: x",
            ),
            (503, "overloaded\n", crate::exit::Class::Transient, "503 Service Unavailable: overloaded"),
            (500, "", crate::exit::Class::Transient, "500 Internal Server Error"),
        ];
        for (status, body, class, says) in cases {
            let f = admin_failure(&url, reqwest::StatusCode::from_u16(*status).unwrap(), body);
            assert_eq!(f.class, *class, "{status}: {}", f.message);
            assert!(f.message.contains(says), "{status}: {}", f.message);
        }
    }

    #[test]
    fn should_join_paths_under_a_base_with_or_without_prefix() {
        let b = parse_base_url("http://h:5000/").unwrap();
        assert_eq!(join(&b, "/v2/").as_str(), "http://h:5000/v2/");
        assert_eq!(join(&b, "/v2/a/manifests/t?ns=ghcr.io").as_str(), "http://h:5000/v2/a/manifests/t?ns=ghcr.io");
        let b = parse_base_url("https://h/mirror/").unwrap();
        assert_eq!(join(&b, "/v2/").as_str(), "https://h/mirror/v2/");
        assert!(parse_base_url("ftp://h").is_err());
        assert!(parse_base_url("http://u:p@h").is_err());
        assert!(parse_base_url("h:5000").is_err());
    }
}
