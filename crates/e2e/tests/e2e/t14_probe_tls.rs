//! `tender probe` over TLS against a peer that is not tender: `openssl s_server` with a
//! certificate from a private CA, requiring a client certificate.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tender_e2e::{proc, tender};

/// What `tender probe` printed and its exit code.
#[derive(Debug)]
struct Out {
    line: String,
    code: i32,
    stderr: String,
}

fn probe(args: &[&str]) -> Out {
    let out = tender::run(std::iter::once("probe").chain(args.iter().copied()));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(stdout.lines().count() <= 1, "probe prints one line, got {stdout:?}");
    Out {
        line: stdout.trim_end().to_string(),
        code: out.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

fn assert_outcome(out: &Out, prefix: &str, code: i32) {
    assert!(
        out.line.starts_with(prefix) && out.code == code,
        "expected {prefix:?} with exit {code}, got {:?} exit {} (stderr: {})",
        out.line,
        out.code,
        out.stderr
    );
}

/// `openssl s_server` with a certificate from a private CA, requiring a client certificate;
/// it answers any request with an HTML status page. Killed when dropped.
struct TlsServer {
    child: Child,
    url: String,
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// ca.pem, srv.pem/srv.key (for IP 127.0.0.1), cli.pem/cli.key, all signed by the CA.
fn make_pki(dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(
        dir,
        &[
            &["req", "-x509"][..],
            &ec,
            &["-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=probe-test-ca"],
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("srv.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    std::fs::write(dir.join("cli.ext"), "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n").unwrap();
    for who in ["srv", "cli"] {
        let (key, csr, pem, ext) =
            (format!("{who}.key"), format!("{who}.csr"), format!("{who}.pem"), format!("{who}.ext"));
        openssl(dir, &[&["req"][..], &ec, &["-keyout", &key, "-out", &csr, "-subj", &format!("/CN={who}")]].concat());
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "1",
                "-extfile",
                &ext,
            ],
        );
    }
}

fn start_tls_server(dir: &Path) -> TlsServer {
    for _ in 0..3 {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = Command::new("openssl")
            .args([
                "s_server", "-quiet", "-www", "-Verify", "1", "-CAfile", "ca.pem", "-cert", "srv.pem", "-key",
                "srv.key",
            ])
            .args(["-accept", &format!("127.0.0.1:{port}")])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return TlsServer { child, url: format!("https://127.0.0.1:{port}") };
            }
            if let Ok(Some(_)) = child.try_wait() {
                break; // lost the port race: try another
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("openssl s_server did not start");
}

#[test]
fn should_trust_a_private_ca_and_present_a_client_certificate() {
    proc::need(&["openssl"]);
    let dir = tempfile::tempdir().unwrap();
    make_pki(dir.path());
    let server = start_tls_server(dir.path());
    let f = |name: &str| dir.path().join(name).to_str().unwrap().to_string();

    // an untrusted certificate is a definite no
    assert_outcome(&probe(&[&server.url]), "no (tls)", 1);
    // trusted, but the server wants a client certificate
    assert_outcome(&probe(&[&server.url, "--ca", &f("ca.pem")]), "no (tls)", 1);
    // trusted and presenting one: TLS passes, and s_server is no registry
    let out =
        probe(&[&server.url, "--ca", &f("ca.pem"), "--client-cert", &f("cli.pem"), "--client-key", &f("cli.key")]);
    assert_outcome(&out, "no (not a registry)", 1);

    // a --ca that is not PEM is a usage error
    let out = probe(&[&server.url, "--ca", &f("srv.ext")]);
    assert_eq!(out.code, 2, "{out:?}", out = out.stderr);
}
