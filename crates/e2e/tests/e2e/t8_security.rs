//! Real pull clients against a hardened tender: skopeo and containerd over TLS with a CA made
//! in the test, with and without client certificates (mutual TLS), with htpasswd credentials
//! given through their own options, and refused without.

use std::path::Path;
use std::process::Command;

use tender_e2e::containerd::{Containerd, UNREACHABLE};
use tender_e2e::proc;
use tender_e2e::registry::Sizes;
use tender_e2e::tender::Tender;

use crate::Bed;

const IMAGE: &str = "siderolabs/kubelet:v1.33.1";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA, a server certificate for 127.0.0.1 and a client CA with one client certificate.
fn make_pki(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    for ca in ["ca", "client-ca"] {
        openssl(
            dir,
            &[
                &["req", "-x509"][..],
                &ec,
                &["-keyout", &format!("{ca}.key"), "-out", &format!("{ca}.pem")],
                &["-days", "2", "-subj", &format!("/CN=tender e2e {ca}")],
            ]
            .concat(),
        );
    }
    std::fs::write(dir.join("server.ext"), "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n").unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    for (who, ca) in [("server", "ca"), ("client", "client-ca")] {
        openssl(
            dir,
            &[
                &["req"][..],
                &ec,
                &["-keyout", &format!("{who}.key"), "-out", &format!("{who}.csr"), "-subj", &format!("/CN={who}")],
            ]
            .concat(),
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{who}.csr"),
                "-CA",
                &format!("{ca}.pem"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &format!("{who}.pem"),
                "-extfile",
                &format!("{who}.ext"),
            ],
        );
    }
    // skopeo's --src-cert-dir layout: *.crt are CAs, NAME.cert + NAME.key a client pair.
    let certs = dir.join("skopeo-ca");
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::copy(dir.join("ca.pem"), certs.join("ca.crt")).unwrap();
    let mtls = dir.join("skopeo-mtls");
    std::fs::create_dir_all(&mtls).unwrap();
    std::fs::copy(dir.join("ca.pem"), mtls.join("ca.crt")).unwrap();
    std::fs::copy(dir.join("client.pem"), mtls.join("client.cert")).unwrap();
    std::fs::copy(dir.join("client.key"), mtls.join("client.key")).unwrap();
}

fn skopeo_inspect(t: &Tender, cert_dir: &Path, creds: Option<&str>) -> std::process::Output {
    let mut c = Command::new("skopeo");
    c.args(["inspect", "--raw", "--cert-dir"]).arg(cert_dir);
    c.arg(format!("docker://{}/ghcr.io/{IMAGE}", t.hostport()));
    if let Some(cr) = creds {
        c.args(["--creds", cr]);
    }
    proc::output(&mut c)
}

fn skopeo_copy(t: &Tender, cert_dir: &Path, creds: Option<&str>, dest: &Path) -> std::process::Output {
    let mut c = Command::new("skopeo");
    c.args(["copy", "-q", "--all", "--preserve-digests", "--src-cert-dir"]).arg(cert_dir);
    if let Some(cr) = creds {
        c.args(["--src-creds", cr]);
    }
    c.arg(format!("docker://{}/ghcr.io/{IMAGE}", t.hostport())).arg(format!("oci:{}", dest.display()));
    proc::output(&mut c)
}

/// hosts.toml for ghcr.io naming only tender over https, with its CA and (optionally) a client pair.
fn hosts_tls(ctrd_dir: &Path, tender: &Tender, pki: &Path, client: bool) -> std::path::PathBuf {
    let certs = ctrd_dir.join(if client { "certs-mtls.d" } else { "certs.d" });
    std::fs::create_dir_all(certs.join("ghcr.io")).unwrap();
    let mut toml = format!(
        "server = \"{UNREACHABLE}\"\n\n[host.\"https://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"{}\"\n",
        tender.hostport(),
        pki.join("ca.pem").display()
    );
    if client {
        toml.push_str(&format!(
            "  client = [[\"{}\", \"{}\"]]\n",
            pki.join("client.pem").display(),
            pki.join("client.key").display()
        ));
    }
    std::fs::write(certs.join("ghcr.io").join("hosts.toml"), toml).unwrap();
    certs
}

fn ctr_pull(ctrd: &Containerd, hosts: &Path, user: Option<&str>) -> std::process::Output {
    let mut args = vec!["-n", "e2e", "images", "pull", "--hosts-dir", hosts.to_str().unwrap()];
    if let Some(u) = user {
        args.extend(["--user", u]);
    }
    let image = format!("ghcr.io/{IMAGE}");
    args.extend(["--platform", "linux/amd64", "--snapshotter", "native", &image]);
    ctrd.ctr(&args)
}

fn text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn should_pull_over_tls_with_htpasswd_credentials_and_refuse_without() {
    proc::need(&["openssl", "skopeo", "htpasswd"]);
    let bed = Bed::new("security-auth", Sizes::SMALL);
    let pki = bed.path("pki");
    make_pki(&pki);
    let htpasswd = bed.path("htpasswd");
    proc::run(Command::new("htpasswd").args(["-B", "-b", "-c"]).arg(&htpasswd).args(["worker", "s3cret-pass"]));
    let (cert, key) = (pki.join("server.pem"), pki.join("server.key"));
    let t = Tender::start_with(
        &bed.path("tender.yaml"),
        &bed.path("data"),
        &bed.path("tender.log"),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--auth-htpasswd",
            htpasswd.to_str().unwrap(),
        ],
    );
    let cas = pki.join("skopeo-ca");

    // Refused without credentials, and with wrong ones.
    let anon = skopeo_inspect(&t, &cas, None);
    assert!(!anon.status.success(), "skopeo without credentials must fail:\n{}", text(&anon));
    assert!(text(&anon).contains("401") || text(&anon).to_lowercase().contains("unauthorized"), "{}", text(&anon));
    let wrong = skopeo_inspect(&t, &cas, Some("worker:wrong"));
    assert!(!wrong.status.success(), "wrong password must fail:\n{}", text(&wrong));

    // skopeo with its own credential option, over TLS trusting only the test CA.
    let dest = bed.path("skopeo-oci");
    let ok = skopeo_copy(&t, &cas, Some("worker:s3cret-pass"), &dest);
    assert!(ok.status.success(), "skopeo with credentials:\n{}", text(&ok));
    let index = bed.images.var("KUBELET_INDEX");
    let layout = std::fs::read_to_string(dest.join("index.json")).unwrap();
    assert!(layout.contains(index), "skopeo copied the upstream index {index}: {layout}");

    // containerd: hosts.toml trusts the CA; ctr passes the user like Talos' registryConfig.auth.
    let ctrd = Containerd::start(&bed.path("containerd"));
    let hosts = hosts_tls(&bed.path("containerd"), &t, &pki, false);
    let refused = ctr_pull(&ctrd, &hosts, None);
    assert!(!refused.status.success(), "ctr without --user must fail:\n{}", text(&refused));
    let pulled = ctr_pull(&ctrd, &hosts, Some("worker:s3cret-pass"));
    assert!(pulled.status.success(), "ctr with --user:\n{}", text(&pulled));
    let ls = text(&ctrd.ctr(&["-n", "e2e", "images", "ls"]));
    assert!(ls.contains(index), "containerd holds the upstream index {index}:\n{ls}");
}

#[test]
fn should_pull_with_a_client_certificate_and_refuse_without() {
    proc::need(&["openssl", "skopeo"]);
    let bed = Bed::new("security-mtls", Sizes::SMALL);
    let pki = bed.path("pki");
    make_pki(&pki);
    let p = |n: &str| pki.join(n).to_str().unwrap().to_string();
    let t = Tender::start_with(
        &bed.path("tender.yaml"),
        &bed.path("data"),
        &bed.path("tender.log"),
        &["--tls-cert", &p("server.pem"), "--tls-key", &p("server.key"), "--tls-client-ca", &p("client-ca.pem")],
    );
    let without = skopeo_inspect(&t, &pki.join("skopeo-ca"), None);
    assert!(!without.status.success(), "no client certificate must fail:\n{}", text(&without));
    let dest = bed.path("skopeo-oci");
    let with = skopeo_copy(&t, &pki.join("skopeo-mtls"), None, &dest);
    assert!(with.status.success(), "skopeo with a client certificate:\n{}", text(&with));

    let ctrd = Containerd::start(&bed.path("containerd"));
    let no_cert = ctr_pull(&ctrd, &hosts_tls(&bed.path("containerd"), &t, &pki, false), None);
    assert!(!no_cert.status.success(), "containerd without a client certificate must fail:\n{}", text(&no_cert));
    let cert = ctr_pull(&ctrd, &hosts_tls(&bed.path("containerd"), &t, &pki, true), None);
    assert!(cert.status.success(), "containerd with client = [[cert, key]]:\n{}", text(&cert));
    let index = bed.images.var("KUBELET_INDEX");
    let ls = text(&ctrd.ctr(&["-n", "e2e", "images", "ls"]));
    assert!(ls.contains(index), "containerd holds the upstream index {index}:\n{ls}");
}
