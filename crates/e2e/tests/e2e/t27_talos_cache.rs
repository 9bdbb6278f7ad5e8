//! Issue 35 item 5: `tender export --talos-image-cache DIR` writes Talos' own image cache, read
//! back here with the rules a Talos node applies (`docs/talos-image-cache.md`, from Talos'
//! `internal/app/machined/pkg/system/services/registry` and `pkg/imager`): the flat tree the
//! node's image cache registry serves from, and cache-create's OCI layout that `imager
//! --image-cache` unpacks onto the boot media (its linux/<arch> entry, the layer untarred).
//! The export comes from docker-registry through tender, once in-process (`--data`) and once
//! through a running tender (`--server`, beside a bundle); both trees are the same files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use tender_e2e::digest::{hex_of, sha256};
use tender_e2e::factory::Factory;
use tender_e2e::proc;
use tender_e2e::registry::Sizes;
use tender_e2e::tender::{self, write_config};

use crate::t11_prefetch::xz;
use crate::t15_protocol::{push_manifest, OCI_INDEX};
use crate::Bed;

const KUBELET: &str = "ghcr.io/siderolabs/kubelet:v1.35.0";
const INSTALLER: &str = "ghcr.io/siderolabs/installer:v1.10.5";
const OS_IMAGE: &str =
    "/image/ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515/v1.12.0/metal-amd64.raw.xz";

/// A Talos image cache as the node's registry reads it: its roots, tried in order for every
/// file (`MultiPathFS`).
struct TalosCache {
    roots: Vec<PathBuf>,
}

/// What the node's registry answers a manifest request with.
#[derive(Debug)]
struct Served {
    digest: String,
    media_type: String,
    bytes: Vec<u8>,
}

impl TalosCache {
    fn open(&self, rel: &str) -> Option<Vec<u8>> {
        self.roots.iter().find_map(|r| std::fs::read(r.join(rel)).ok())
    }

    fn exists(&self, rel: &str) -> bool {
        self.roots.iter().any(|r| r.join(rel).exists())
    }

    /// The repository directory for `registry` and `name`: Docker Hub's `library/` for a
    /// one-component name (the reference's normal form), a port's colon as `_port_`.
    fn repo_dir(registry: &str, name: &str) -> String {
        let name = if registry == "docker.io" && !name.contains('/') { format!("library/{name}") } else { name.into() };
        let registry = match registry.rfind(':') {
            Some(i) if i > 0 => format!("{}_{}_", &registry[..i], &registry[i + 1..]),
            _ => registry.to_string(),
        };
        format!("manifests/{registry}/{name}")
    }

    /// Without `?ns=`: the first directory under `manifests/` (`a_b_` read back as `a:b`) in
    /// which the name has a `reference/` directory.
    /// Only the first root that has `manifests/` is listed (the directory is opened as any
    /// file is, through the first root that has it), in name order.
    fn find_registry(&self, name: &str) -> Option<String> {
        let listing = self.roots.iter().find_map(|r| std::fs::read_dir(r.join("manifests")).ok())?;
        let mut dirs: Vec<String> = listing.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        dirs.sort();
        dirs.into_iter()
            .map(|d| match d.splitn(3, '_').collect::<Vec<_>>()[..] {
                [host, port, rest] => format!("{host}:{port}{rest}"),
                _ => d,
            })
            .find(|registry| self.exists(&format!("{}/reference", Self::repo_dir(registry, name))))
    }

    /// `GET /v2/<name>/manifests/<reference>[?ns=<registry>]`: the answer, or the status.
    fn manifest(&self, ns: Option<&str>, name: &str, reference: &str) -> Result<Served, u16> {
        let registry = match ns {
            Some(r) => r.to_string(),
            None => self.find_registry(name).ok_or(400u16)?,
        };
        let repo = Self::repo_dir(&registry, name);
        let digest = if reference.starts_with("sha256:") {
            reference.to_string()
        } else {
            // A tag: the digest is the sha256 of the file the tag names, and the same bytes
            // must be there by that digest.
            let tagged = self.open(&format!("{repo}/reference/{reference}")).ok_or(404u16)?;
            let digest = sha256(&tagged);
            let by_digest = self.open(&format!("{repo}/digest/{}", digest.replacen(':', "-", 1))).ok_or(500u16)?;
            if sha256(&by_digest) != digest {
                return Err(500);
            }
            digest
        };
        let bytes = self.open(&format!("{repo}/digest/{}", digest.replacen(':', "-", 1))).ok_or(404u16)?;
        let doc: Value = serde_json::from_slice(&bytes).map_err(|_| 500u16)?;
        let media_type = match doc["mediaType"].as_str() {
            Some(m) if !m.is_empty() => m.to_string(),
            _ if doc.get("manifests").is_some() => OCI_INDEX.to_string(),
            _ if doc.get("layers").is_some() || doc.get("config").is_some() => {
                "application/vnd.oci.image.manifest.v1+json".to_string()
            }
            _ => return Err(500),
        };
        Ok(Served { digest, media_type, bytes })
    }

    /// `GET /v2/<name>/blobs/<digest>`: `blob/sha256-<hex>`, whatever the name.
    fn blob(&self, digest: &str) -> Result<Vec<u8>, u16> {
        self.open(&format!("blob/{}", digest.replacen(':', "-", 1))).ok_or(404)
    }

    /// Pull `name:reference` for `platform` as containerd would through the node's registry:
    /// resolve, follow an index to the platform's manifest, fetch the config and every layer
    /// and check each against its descriptor. Answers the image manifest's digest.
    fn pull(&self, registry: &str, name: &str, reference: &str, platform: (&str, &str)) -> String {
        let top = self.manifest(Some(registry), name, reference).unwrap_or_else(|s| panic!("{name}:{reference}: {s}"));
        let mut manifest = top;
        if manifest.media_type == OCI_INDEX {
            let index: Value = serde_json::from_slice(&manifest.bytes).unwrap();
            let entry = index["manifests"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["platform"]["os"] == platform.0 && m["platform"]["architecture"] == platform.1)
                .unwrap_or_else(|| panic!("{name}: no {platform:?} in {index}"));
            let child = entry["digest"].as_str().unwrap();
            manifest = self.manifest(Some(registry), name, child).unwrap_or_else(|s| panic!("{child}: {s}"));
            assert_eq!(manifest.bytes.len() as u64, entry["size"].as_u64().unwrap(), "{child}: size");
        }
        assert_eq!(sha256(&manifest.bytes), manifest.digest, "{name}: the manifest is its digest");
        let doc: Value = serde_json::from_slice(&manifest.bytes).unwrap();
        let mut descriptors = vec![doc["config"].clone()];
        descriptors.extend(doc["layers"].as_array().unwrap().iter().cloned());
        for d in descriptors {
            let digest = d["digest"].as_str().unwrap();
            let bytes = self.blob(digest).unwrap_or_else(|s| panic!("{name}: blob {digest}: {s}"));
            assert_eq!(sha256(&bytes), digest, "{name}: blob {digest}");
            assert_eq!(bytes.len() as u64, d["size"].as_u64().unwrap(), "{name}: blob {digest}: size");
        }
        manifest.digest
    }
}

/// What `imager --image-cache DIR` puts on the boot media from cache-create's OCI layout: the
/// `index.json` entry for linux/`arch`, its image's layers untarred in order into `dest`.
fn unpack_as_imager(layout: &Path, arch: &str, dest: &Path) {
    let index: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let entry = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["platform"]["os"] == "linux" && m["platform"]["architecture"] == arch)
        .unwrap_or_else(|| panic!("no linux/{arch} image in {index}"));
    let blob = |d: &str| layout.join("blobs/sha256").join(hex_of(d));
    let manifest_path = blob(entry["digest"].as_str().unwrap());
    let manifest_bytes = std::fs::read(&manifest_path).unwrap();
    assert_eq!(sha256(&manifest_bytes), entry["digest"].as_str().unwrap());
    let manifest: Value = serde_json::from_slice(&manifest_bytes).unwrap();
    let config = std::fs::read(blob(manifest["config"]["digest"].as_str().unwrap())).unwrap();
    let config: Value = serde_json::from_slice(&config).unwrap();
    std::fs::create_dir_all(dest).unwrap();
    for (i, layer) in manifest["layers"].as_array().unwrap().iter().enumerate() {
        let digest = layer["digest"].as_str().unwrap();
        let bytes = std::fs::read(blob(digest)).unwrap();
        assert_eq!(sha256(&bytes), digest, "layer {digest}");
        assert_eq!(config["rootfs"]["diff_ids"][i], digest, "an uncompressed layer is its own diff_id");
        proc::run(Command::new("tar").args(["-xf", blob(digest).to_str().unwrap(), "-C", dest.to_str().unwrap()]));
    }
}

/// Every file under `root` by relative path, with its bytes' digest.
fn tree(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, sha256(&std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn tender_ok(args: &[&str]) -> String {
    let out = tender::run(args.iter().copied());
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "tender {args:?}:\n{text}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn should_write_a_talos_image_cache_that_resolves_by_talos_rules() {
    let bed = Bed::new("talos-cache", Sizes::SMALL);
    // The kubelet's index under the tag the release names, too.
    let (index, amd64, arm64) =
        (bed.images.var("KUBELET_INDEX"), bed.images.var("KUBELET_AMD64"), bed.images.var("KUBELET_ARM64"));
    let index_bytes = std::fs::read(bed.images.blob_path(index)).unwrap();
    let work = bed.path("push");
    std::fs::create_dir_all(&work).unwrap();
    let index_text = String::from_utf8(index_bytes).unwrap();
    push_manifest(&bed.registry.hostport(), "siderolabs/kubelet", "v1.35.0", OCI_INDEX, &index_text, &work);
    proc::need(&["xz", "tar"]);
    let factory = Factory::start(&bed.path("factory"));
    factory.put(OS_IMAGE, &xz(b"not part of Talos' image cache"));
    let config = bed.path("talos-cache.yaml");
    write_config(&config, &[("ghcr.io", &bed.registry.url())], &format!("imageFactory: {}\n", factory.url()));

    // In-process on a data directory: the flat layout only, no bundle.
    let flat = bed.path("cache-flat");
    let data = bed.path("data-in-process");
    let (data_s, config_s, flat_s) = (data.to_str().unwrap(), config.to_str().unwrap(), flat.to_str().unwrap());
    let source = ["--data", data_s, "--config", config_s, "--quiet", "--os-image", OS_IMAGE, KUBELET, INSTALLER];
    let mut args = vec!["export", "--talos-image-cache", flat_s, "--talos-image-cache-layout", "flat"];
    args.extend_from_slice(&source);
    let out = tender_ok(&args);
    assert!(out.contains("(flat layout): 2 image(s), 2 tag(s), 3 manifest(s)"), "{out}");
    assert!(out.contains(&format!("left out {OS_IMAGE}")), "the OS image is said to be left out: {out}");
    assert!(!flat.join("index.json").exists(), "a flat cache is no OCI layout");

    let node = TalosCache { roots: vec![flat.clone()] };
    let kubelet = "siderolabs/kubelet";
    // Tags and digests, with and without `ns`; the platform not exported is not there.
    let by_tag = node.manifest(Some("ghcr.io"), kubelet, "v1.35.0").unwrap();
    assert_eq!((by_tag.digest.as_str(), by_tag.media_type.as_str()), (index, OCI_INDEX));
    assert_eq!(by_tag.bytes, std::fs::read(bed.images.blob_path(index)).unwrap(), "the index byte for byte");
    assert_eq!(node.manifest(None, kubelet, "v1.35.0").unwrap().digest, index, "found without ns");
    assert_eq!(node.manifest(Some("ghcr.io"), kubelet, index).unwrap().digest, index);
    assert_eq!(node.manifest(Some("ghcr.io"), kubelet, amd64).unwrap().digest, amd64);
    assert_eq!(node.manifest(Some("ghcr.io"), kubelet, arm64).unwrap_err(), 404, "arm64 was not exported");
    assert_eq!(node.manifest(Some("ghcr.io"), kubelet, "v1.33.1").unwrap_err(), 404, "a tag not exported");
    assert_eq!(node.manifest(Some("docker.io"), kubelet, "v1.35.0").unwrap_err(), 404, "another registry");
    // Pulled as containerd pulls through the node's registry: every blob there, right digest
    // and size.
    assert_eq!(node.pull("ghcr.io", kubelet, "v1.35.0", ("linux", "amd64")), amd64);
    let installer = bed.images.var("INSTALLER_MANIFEST");
    assert_eq!(node.pull("ghcr.io", "siderolabs/installer", "v1.10.5", ("linux", "amd64")), installer);
    assert_eq!(node.pull("ghcr.io", "siderolabs/installer", installer, ("linux", "amd64")), installer);

    // Through a running tender, beside a bundle: cache-create's OCI layout, which imager
    // unpacks onto the media; the tree is the same files.
    let served = bed.start_tender("tender.log");
    let url = format!("http://{}", served.hostport());
    let oci = bed.path("cache-oci");
    let bundle = bed.path("bundle");
    let mut args = vec!["export", "--out", bundle.to_str().unwrap(), "--talos-image-cache", oci.to_str().unwrap()];
    args.extend_from_slice(&["--server", &url, "--quiet", "--platform", "linux/amd64", KUBELET, INSTALLER]);
    let out = tender_ok(&args);
    assert!(out.contains("(oci layout): 2 image(s)"), "{out}");
    assert!(out.contains("export: wrote") && out.contains("index: sha256:"), "the bundle too: {out}");
    let layout: Value = serde_json::from_slice(&std::fs::read(oci.join("oci-layout")).unwrap()).unwrap();
    assert_eq!(layout["imageLayoutVersion"], "1.0.0");
    let unpacked = bed.path("imagecache-partition");
    unpack_as_imager(&oci, "amd64", &unpacked);
    assert_eq!(tree(&unpacked), tree(&flat), "the OCI layout carries the flat tree");
    let media = TalosCache { roots: vec![bed.path("no-iso-here"), unpacked] };
    assert_eq!(media.pull("ghcr.io", kubelet, "v1.35.0", ("linux", "amd64")), amd64);

    // A cache directory that exists is refused before anything is fetched.
    let mut args = vec!["export", "--talos-image-cache", flat_s];
    args.extend_from_slice(&source);
    let out = tender::run(args.iter().copied());
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists; name a new path"));
}
