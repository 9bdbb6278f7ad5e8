//! TLS serving: the certificate, key and optional client CA from PEM files, reloaded when a file
//! changes. Every new connection takes the current configuration; connections already open keep
//! theirs, so a renewal never drops anyone.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// The PEM files of a TLS listener.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates signed by this CA bundle (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// A problem with one of the files; `flag` names the option to fix.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {path}: {message}")]
pub struct TlsError {
    pub flag: &'static str,
    pub path: String,
    pub message: String,
}

fn tls_err(flag: &'static str, path: &Path, message: impl Into<String>) -> TlsError {
    TlsError { flag, path: path.display().to_string(), message: message.into() }
}

type Stamp = Vec<Option<(SystemTime, u64)>>;

/// The current TLS configuration and what it was built from.
pub struct TlsReloader {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
    stamp: Mutex<Stamp>,
}

fn stamp(files: &TlsFiles) -> Stamp {
    [Some(&files.cert), Some(&files.key), files.client_ca.as_ref()]
        .into_iter()
        .flatten()
        .map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len()))))
        .collect()
}

fn certs(flag: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_err(flag, path, format!("cannot read: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_err(flag, path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(tls_err(flag, path, "holds no certificate (want PEM: -----BEGIN CERTIFICATE-----)"));
    }
    Ok(certs)
}

/// Build a server configuration: HTTP/2 and HTTP/1.1 by ALPN, TLS 1.2 and 1.3.
pub fn build(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
    let chain = certs("--tls-cert", &files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| tls_err("--tls-key", &files.key, format!("no PEM private key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err("--tls-cert", &files.cert, e.to_string()))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in certs("--tls-client-ca", ca)? {
                roots.add(c).map_err(|e| tls_err("--tls-client-ca", ca, format!("unusable CA certificate: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| tls_err("--tls-client-ca", ca, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| tls_err("--tls-key", &files.key, format!("does not fit --tls-cert: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

impl TlsReloader {
    pub fn load(files: TlsFiles) -> Result<Arc<TlsReloader>, TlsError> {
        let st = stamp(&files);
        let config = build(&files)?;
        Ok(Arc::new(TlsReloader { files, current: RwLock::new(Arc::new(config)), stamp: Mutex::new(st) }))
    }

    /// Whether clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.files.client_ca.is_some()
    }

    pub fn current(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Rebuild when a file changed since the last load. A broken new file keeps the old
    /// configuration (and is reported) so a half-written renewal never takes the listener down.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = stamp(&self.files);
        let mut last = self.stamp.lock().unwrap_or_else(|p| p.into_inner());
        if *last == now {
            return Ok(false);
        }
        let config = build(&self.files)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        *last = now;
        Ok(true)
    }

    /// Check the files every `every`.
    pub fn spawn_watch(self: &Arc<Self>, every: Duration) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            let mut reported = false;
            loop {
                tick.tick().await;
                let r = {
                    let me = me.clone();
                    tokio::task::spawn_blocking(move || me.reload_if_changed()).await
                };
                match r {
                    Ok(Ok(true)) => {
                        reported = false;
                        tracing::info!(cert = %me.files.cert.display(), "TLS certificate reloaded")
                    }
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) if !reported => {
                        reported = true;
                        tracing::error!(error = %e, "TLS files changed but cannot be used; keeping the old certificate")
                    }
                    Ok(Err(_)) => {}
                    Err(e) => tracing::warn!(error = %e, "TLS reload task failed"),
                }
            }
        });
    }
}
