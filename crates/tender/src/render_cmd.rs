//! `tender render`: the CLI around `tender-render`. Reads files, calls the pure renderers and
//! writes their bytes; every decision about the output lives in the library.
//!
//! Exit codes: 2 for usage (bad flags, unreadable or malformed files, `osImage.builtin` without
//! `--cluster-state`, an input of `check cozystack` over its size or nesting cap), 1 for a rule
//! that refuses the input.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use tender_catalog::size::{human, parse_bytes};
use tender_render::catalog::parse_config;
use tender_render::containerd::{config_dropin, hosts_files, ContainerdVersion, OutputFile};
use tender_render::golden::render_catalog;
use tender_render::k8s::{render_pool, PoolFormat};
use tender_render::registries::RegistriesRequest;
use tender_render::state::ClusterState;
use tender_render::talos::{TalosVersion, DEFAULT_TALOS_VERSION};
use tender_render::verification::{guard, render_talos, ImageVerification};

use crate::exit::Failure;

#[derive(Debug, Args)]
pub struct RenderArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// Route registries through a mirror: Talos documents, or containerd hosts.toml files
    Registries(RegistriesArgs),
    /// A worker pool: KubevirtMachineTemplate, MachineDeployment, MachineHealthCheck, TalosConfigTemplate
    Pool(PoolArgs),
    /// The golden DataVolumes of the catalog, for cozy-public
    Catalog(CatalogArgs),
    /// Patches and values for Cozystack's own charts: registry mirrors, osImage, kubernetesWorkerImage
    Cozystack(CozystackArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OsImageArg {
    /// osImage.builtin: clone a golden of tender's catalog (CSI clone; --cozystack golden-catalog)
    Builtin,
    /// the disk streamed from the mirror: talos.imageFactoryURL (osImage.factory on golden-catalog)
    Factory,
}

/// Which Cozystack the output is for (issue 33): the flags shared by `render cozystack` and
/// `check cozystack`. The names are a contract.
#[derive(Debug, Args)]
struct TargetArgs {
    /// The target chart's values schema: its values.schema.json, or the ApplicationDefinition as
    /// `kubectl get applicationdefinitions kubernetes -o yaml` prints it
    #[arg(long, value_name = "FILE", conflicts_with = "cozystack")]
    values_schema: Option<PathBuf>,
    /// A Cozystack whose schema tender carries: v1.6.0, v1.6.1, v1.6.2, main (3c780acd4), golden-catalog
    /// [default: main, the newest with talos.registryMirrors]
    #[arg(long, value_name = "VERSION")]
    cozystack: Option<String>,
}

impl TargetArgs {
    fn target(&self) -> anyhow::Result<tender_render::target::Target> {
        use tender_render::target::{Target, DEFAULT_VERSION};
        match (&self.values_schema, &self.cozystack) {
            (Some(path), _) => {
                let text = read_input("--values-schema", path)?;
                Ok(Target::from_schema_file(&path.display().to_string(), &text).map_err(classify)?)
            }
            (None, v) => Ok(Target::embedded(v.as_deref().unwrap_or(DEFAULT_VERSION)).map_err(classify)?),
        }
    }
}

#[derive(Debug, Args)]
struct CozystackArgs {
    /// tender's config file: its upstreams are mirrored, its catalog becomes kubernetesWorkerImage
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// tender's URL as the tenant workers reach it, e.g. http://tender.cozy-tender.svc:5000;
    /// repeat it for a tree (the rack's tender first, then its parent): registry mirrors are
    /// tried in that order, the disk and the installer come from the first
    #[arg(long = "mirror", value_name = "URL", required = true)]
    mirrors: Vec<String>,
    /// The Kubernetes application (its metadata.name, e.g. test for kubernetes-test)
    #[arg(long, value_name = "NAME", requires = "namespace")]
    cluster: Option<String>,
    /// The tenant namespace the Kubernetes application lives in
    #[arg(long, value_name = "NS", requires = "cluster")]
    namespace: Option<String>,
    /// A KubernetesNodes pool to patch (<cluster>-<pool>); repeat it for several
    #[arg(long = "pool", value_name = "NAME")]
    pools: Vec<String>,
    /// Also point the worker disk at tender: of the --pool pools, else of the cluster's own node
    /// groups; a new disk re-images them (P-6)
    #[arg(long, value_enum, requires = "cluster")]
    os_image: Option<OsImageArg>,
    /// The catalog entry's schematic, when the catalog has several
    #[arg(long, value_name = "ID")]
    schematic: Option<String>,
    /// The catalog entry's Talos version, when the catalog has several
    #[arg(long, value_name = "VERSION")]
    version: Option<String>,
    /// Write one file per document into DIR (for kubectl patch --patch-file) instead of standard output
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    #[command(flatten)]
    target: TargetArgs,
    /// Write what the target can express, and list the rest on standard error, exit 0
    #[arg(long)]
    allow_partial: bool,
    /// `kubectl get storageclasses,datavolumes,persistentvolumeclaims -A -o yaml`: refuse a Package
    /// patch that would re-point goldens built from another source URL (G-9) ('-' for standard input)
    #[arg(long, value_name = "FILE")]
    cluster_state: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(subcommand)]
    what: CheckWhat,
}

#[derive(Debug, Subcommand)]
enum CheckWhat {
    /// Check a Kubernetes / KubernetesNodes resource or values file against the seed rules, before it is applied
    Cozystack(CheckCozystackArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum CheckOutput {
    Text,
    Json,
}

#[derive(Debug, Args)]
struct CheckCozystackArgs {
    /// A Kubernetes or KubernetesNodes resource, or its values ('-' for standard input)
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: PathBuf,
    /// The platform Package (or its kubernetesWorkerImage values): checks G-7 to G-9 too
    #[arg(long, value_name = "FILE")]
    catalog_values: Option<PathBuf>,
    /// `kubectl get storageclasses,datavolumes,persistentvolumeclaims -A -o yaml` ('-' for standard input)
    #[arg(long, value_name = "FILE")]
    cluster_state: Option<PathBuf>,
    /// For a values file: the resource's name (Kubernetes app, or KubernetesNodes <cluster>-<pool>)
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// For a values file (or a resource without one): the tenant namespace
    #[arg(long, value_name = "NS")]
    namespace: Option<String>,
    #[arg(long, value_enum, default_value_t = CheckOutput::Text)]
    output: CheckOutput,
    /// Refuse an input (-f, --catalog-values, --cluster-state) larger than this, unparsed
    #[arg(long, value_name = "SIZE", default_value = "4Mi")]
    max_input_size: String,
    #[command(flatten)]
    target: TargetArgs,
    /// Keys the target's chart does not have are noted on standard error instead of refused
    #[arg(long)]
    allow_partial: bool,
}

/// How deeply an input of `check cozystack` may nest (found before it is parsed). Cozystack's
/// values nest a few levels, and the deepest Kubernetes document in `testdata/` (a CRD's
/// schema) 37; serde_norway's own limit is 128, reached only after it read the whole document,
/// in time that grows with the square of the depth of flow collections (`{a: {a: …`).
const MAX_NESTING: usize = 64;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum RegistriesFormat {
    /// Talos machine-config documents, in the form --talos-version accepts
    Talos,
    /// containerd hosts.toml files under --out (containerd's config_path)
    Containerd,
}

#[derive(Debug, Args)]
struct RegistriesArgs {
    /// The mirror (tender) URL, e.g. http://tender.kube-system.svc:5000; repeat it for a tree
    /// (the node's rack tender first, then its parent): the nodes try them in that order
    #[arg(long = "mirror", value_name = "URL", required = true)]
    mirrors: Vec<String>,
    /// A registry to route through the mirror (repeat it); '*' routes every registry
    #[arg(long = "registry", value_name = "HOST", required = true)]
    registries: Vec<String>,
    /// Do not fall back to the upstream registry when the mirror fails
    #[arg(long)]
    skip_fallback: bool,
    /// PEM CA certificate that signed the mirror's certificate
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS with the mirror
    #[arg(long, value_name = "FILE", requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert
    #[arg(long, value_name = "FILE", requires = "client_cert")]
    client_key: Option<PathBuf>,
    /// Do not verify the mirror's TLS certificate (not recommended)
    #[arg(long)]
    insecure_skip_verify: bool,
    /// User name for the mirror
    #[arg(long, requires = "password_file")]
    username: Option<String>,
    /// File holding the mirror password (one trailing newline is stripped)
    #[arg(long, value_name = "FILE", requires = "username")]
    password_file: Option<PathBuf>,
    /// The Talos release the nodes run; decides the form of the Talos output
    #[arg(long, value_name = "VERSION", default_value = DEFAULT_TALOS_VERSION)]
    talos_version: String,
    #[arg(long, value_enum, default_value_t = RegistriesFormat::Talos)]
    format: RegistriesFormat,
    /// Output directory for --format containerd (containerd's config_path, e.g. /etc/containerd/certs.d)
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// --format containerd: the containerd release on the nodes (e.g. 1.7, 2.1); also writes
    /// DIR/tender-containerd.toml, the config.toml drop-in that release needs
    #[arg(long, value_name = "VERSION")]
    containerd_version: Option<String>,
    /// tender's config (or a Talos ImageVerificationConfig document): the registries its
    /// imageVerification refuses images of do not fall back, and Talos 1.13+ gets the policy
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// With --config: leave out the ImageVerificationConfig document (nodes that cannot reach
    /// Sigstore's TUF repository cannot check keyless rules); the fallback stays off
    #[arg(long, requires = "config")]
    no_node_policy: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum PoolOutput {
    /// The pool's Kubernetes objects
    Manifests,
    /// Only the Talos patch documents
    Patch,
}

#[derive(Debug, Args)]
struct PoolArgs {
    /// The pool file ('-' for standard input)
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: PathBuf,
    /// `kubectl get storageclasses,datavolumes,persistentvolumeclaims -A -o yaml` ('-' for standard input)
    #[arg(long, value_name = "FILE")]
    cluster_state: Option<PathBuf>,
    /// Render osImage.builtin without --cluster-state, skipping rules
    #[arg(long)]
    skip_cluster_checks: bool,
    #[arg(long, value_enum, default_value_t = PoolOutput::Manifests)]
    format: PoolOutput,
}

#[derive(Debug, Args)]
struct CatalogArgs {
    /// tender's config file, with the catalog section
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Where the goldens import from (a tender); default: the config's imageFactory, else the public factory
    #[arg(long, value_name = "URL")]
    source_url: Option<String>,
    /// Cluster state, to refuse editing a golden that already exists (G-9) ('-' for standard input)
    #[arg(long, value_name = "FILE")]
    cluster_state: Option<PathBuf>,
}

pub fn run(args: RenderArgs) -> anyhow::Result<ExitCode> {
    match args.what {
        What::Registries(a) => registries(a),
        What::Pool(a) => pool(a),
        What::Catalog(a) => catalog(a),
        What::Cozystack(a) => cozystack(a),
    }
}

pub fn run_check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    match args.what {
        CheckWhat::Cozystack(a) => check_cozystack(a),
    }
}

/// Read a file, or standard input for `-`. Unreadable input is a usage error.
fn read_input(flag: &str, path: &Path) -> anyhow::Result<String> {
    let mut text = String::new();
    let result = if path.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        fs::read_to_string(path).map(|t| text = t)
    };
    result.map_err(|e| Failure::usage(format!("{flag} {}: cannot read it: {e}", path.display())))?;
    Ok(text)
}

/// Read one input of `check cozystack` with the caps that keep parsing it cheap: at most
/// `max_size` bytes (read no further), nested at most [`MAX_NESTING`] levels deep (a linear scan
/// of the text, `tender_render::nesting`). Both are usage errors naming the cap.
fn read_capped(flag: &str, path: &Path, max_size: u64) -> anyhow::Result<String> {
    let cannot = |e: std::io::Error| Failure::usage(format!("{flag} {}: cannot read it: {e}", path.display()));
    let mut bytes = Vec::new();
    let limit = max_size.saturating_add(1);
    if path.as_os_str() == "-" {
        std::io::stdin().lock().take(limit).read_to_end(&mut bytes).map_err(cannot)?;
    } else {
        fs::File::open(path).and_then(|f| f.take(limit).read_to_end(&mut bytes)).map_err(cannot)?;
    }
    if bytes.len() as u64 > max_size {
        return Err(Failure::usage(format!(
            "{flag} {}: is larger than the input size cap of {} ({max_size} bytes), so it is not parsed; pass --max-input-size to raise the cap",
            path.display(),
            human(max_size)
        )).into());
    }
    let text = String::from_utf8(bytes)
        .map_err(|e| cannot(std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error())))?;
    if tender_render::nesting::depth(&text, MAX_NESTING) > MAX_NESTING {
        return Err(Failure::usage(format!(
            "{flag} {}: nests deeper than the nesting cap of {MAX_NESTING} levels (collections within collections), so it is not parsed; Cozystack values and kubectl output nest far less",
            path.display()
        )).into());
    }
    Ok(text)
}

fn check_one_stdin(paths: &[Option<&Path>]) -> anyhow::Result<()> {
    if paths.iter().flatten().filter(|p| p.as_os_str() == "-").count() > 1 {
        return Err(Failure::usage("only one input can be read from standard input ('-')").into());
    }
    Ok(())
}

/// Map a library error onto the exit-code convention.
fn classify(err: tender_render::Error) -> Failure {
    use tender_render::Error as E;
    match err {
        E::Malformed { .. } | E::IncompleteState { .. } => Failure::usage(err.to_string()),
        E::MissingClusterState => Failure::usage(format!(
            "{err}: pass --cluster-state with the output of `kubectl get storageclasses,datavolumes,persistentvolumeclaims -A -o yaml`, or --skip-cluster-checks to take that risk"
        )),
        E::Refused(_) | E::Serialise { .. } => Failure::problem(err.to_string()),
    }
}

fn print(text: &str) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).context("writing to standard output")?;
    out.flush().context("writing to standard output")?;
    Ok(ExitCode::SUCCESS)
}

fn registries(a: RegistriesArgs) -> anyhow::Result<ExitCode> {
    let read = |flag: &str, p: &Option<PathBuf>| -> anyhow::Result<Option<String>> {
        p.as_ref().map(|p| read_input(flag, p)).transpose()
    };
    let password = read("--password-file", &a.password_file)?.map(|p| {
        let p = p.strip_suffix('\n').unwrap_or(&p);
        p.strip_suffix('\r').unwrap_or(p).to_string()
    });
    let (first_mirror, more_mirrors) = a.mirrors.split_first().ok_or_else(|| Failure::usage("--mirror is missing"))?;
    let request = RegistriesRequest {
        mirror: first_mirror.clone(),
        more_mirrors: more_mirrors.to_vec(),
        registries: a.registries.clone(),
        skip_fallback: a.skip_fallback,
        ca: read("--ca", &a.ca)?,
        client_cert: read("--client-cert", &a.client_cert)?,
        client_key: read("--client-key", &a.client_key)?,
        insecure_skip_verify: a.insecure_skip_verify,
        username: a.username.clone(),
        password,
    };
    let mut plan = request.validate().map_err(|r| Failure::usage(r.to_string()))?;
    // Issue 34: no fallback around a refusal of tender's signature policy.
    let policy = match &a.config {
        Some(path) => {
            let what = format!("--config {}", path.display());
            let policy = ImageVerification::read(&what, &read_input("--config", path)?).map_err(classify)?;
            if policy.as_ref().is_none_or(ImageVerification::is_empty) {
                eprintln!("tender: note: {what} has no imageVerification rules: every registry keeps its fallback");
            }
            policy
        }
        None => None,
    };
    let mut notes = policy.as_ref().map(|p| guard(&mut plan, p)).unwrap_or_default();
    match a.format {
        RegistriesFormat::Talos => {
            if a.out.is_some() {
                return Err(
                    Failure::usage("--out is for --format containerd; Talos documents go to standard output").into()
                );
            }
            if a.containerd_version.is_some() {
                return Err(Failure::usage(
                    "--containerd-version is for --format containerd; Talos runs its own containerd",
                )
                .into());
            }
            let version =
                TalosVersion::parse("--talos-version", &a.talos_version).map_err(|r| Failure::usage(r.to_string()))?;
            let out = render_talos(&plan, version, policy.as_ref(), !a.no_node_policy).map_err(classify)?;
            notes.extend(out.notes);
            notes.iter().for_each(|n| eprintln!("tender: note: {n}"));
            print(&out.text)
        }
        RegistriesFormat::Containerd => {
            let Some(dir) = a.out else {
                return Err(Failure::usage(
                    "--format containerd writes <DIR>/<host>/hosts.toml: pass --out DIR (containerd's config_path, e.g. /etc/containerd/certs.d)",
                ).into());
            };
            if a.no_node_policy {
                return Err(Failure::usage(
                    "--no-node-policy is for --format talos: containerd nodes get no ImageVerificationConfig",
                )
                .into());
            }
            notes.iter().for_each(|n| eprintln!("tender: note: {n}"));
            let mut files = hosts_files(&plan).map_err(classify)?;
            if let Some(v) = &a.containerd_version {
                let version =
                    ContainerdVersion::parse("--containerd-version", v).map_err(|r| Failure::usage(r.to_string()))?;
                let config_path =
                    std::path::absolute(&dir).with_context(|| format!("making {} an absolute path", dir.display()))?;
                let config_path = config_path.to_str().ok_or_else(|| {
                    Failure::usage(format!(
                        "--out {} is not UTF-8: containerd's config_path cannot name it",
                        dir.display()
                    ))
                })?;
                files.push(OutputFile {
                    path: "tender-containerd.toml".to_string(),
                    contents: config_dropin(version, config_path).into_bytes(),
                    secret: false,
                });
            }
            for f in &files {
                write_file(&dir, f)?;
                println!("{}", dir.join(&f.path).display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Write one output file atomically: a temporary file in the same directory, then rename.
/// Credentials and keys are readable by the owner only.
fn write_file(root: &Path, f: &OutputFile) -> anyhow::Result<()> {
    let path = root.join(&f.path);
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_else(|| root.to_path_buf());
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tender-tmp"));
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if f.secret { 0o600 } else { 0o644 });
    }
    let mut file = options.open(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
    file.write_all(&f.contents).with_context(|| format!("writing {}", tmp.display()))?;
    file.sync_all().with_context(|| format!("writing {}", tmp.display()))?;
    drop(file);
    fs::rename(&tmp, &path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

fn cluster_state(path: Option<&PathBuf>) -> anyhow::Result<Option<ClusterState>> {
    path.map(|p| {
        let text = read_input("--cluster-state", p)?;
        Ok(ClusterState::from_yaml(&text).map_err(classify)?)
    })
    .transpose()
}

fn pool(a: PoolArgs) -> anyhow::Result<ExitCode> {
    check_one_stdin(&[Some(a.file.as_path()), a.cluster_state.as_deref()])?;
    let text = read_input("-f", &a.file)?;
    let file = tender_render::pool::parse(&text).map_err(classify)?;
    let pool = file.validate().map_err(|r| classify(r.into()))?;
    let state = cluster_state(a.cluster_state.as_ref())?;
    let format = match a.format {
        PoolOutput::Manifests => PoolFormat::Manifests,
        PoolOutput::Patch => PoolFormat::Patch,
    };
    let rendered = render_pool(&pool, state.as_ref(), a.skip_cluster_checks, format).map_err(classify)?;
    for w in &rendered.warnings {
        eprintln!("tender: warning: {w}");
    }
    print(&rendered.text)
}

fn catalog(a: CatalogArgs) -> anyhow::Result<ExitCode> {
    check_one_stdin(&[Some(a.config.as_path()), a.cluster_state.as_deref()])?;
    let config = parse_config(&read_input("--config", &a.config)?).map_err(classify)?;
    let state = cluster_state(a.cluster_state.as_ref())?;
    let text = render_catalog(&config, a.source_url.as_deref(), state.as_ref()).map_err(classify)?;
    if state.is_none() {
        eprintln!(
            "tender: warning: G-9 not checked (no --cluster-state): an edit to a golden that already exists would be refused only at apply time; pass the output of `kubectl get datavolumes -n cozy-public -o yaml`"
        );
    }
    print(&text)
}

fn cozystack(a: CozystackArgs) -> anyhow::Result<ExitCode> {
    check_one_stdin(&[Some(a.config.as_path()), a.cluster_state.as_deref()])?;
    let config = parse_config(&read_input("--config", &a.config)?).map_err(classify)?;
    let target = a.target.target()?;
    let (first_mirror, more_mirrors) = a.mirrors.split_first().ok_or_else(|| Failure::usage("--mirror is missing"))?;
    let request = tender_render::cozystack::RenderRequest {
        mirror: first_mirror.clone(),
        more_mirrors: more_mirrors.to_vec(),
        cluster: a.cluster,
        namespace: a.namespace,
        pools: a.pools,
        os_image: a.os_image.map(|o| match o {
            OsImageArg::Builtin => tender_render::cozystack::OsImage::Builtin,
            OsImageArg::Factory => tender_render::cozystack::OsImage::Factory,
        }),
        schematic: a.schematic,
        version: a.version,
        target: Some(target),
        state: cluster_state(a.cluster_state.as_ref())?,
        config_name: Some(a.config.display().to_string()),
    };
    // Every refusal here is about the flags or the config (exit 2), but for G-9: the cluster
    // holds goldens the Package patch would re-point (exit 1, with the safe sequence).
    let rendered = tender_render::cozystack::render(&config, &request).map_err(|e| match e {
        tender_render::Error::Refused(r) if r.rule == Some(tender_render::Rule::G9) => Failure::problem(r.to_string()),
        tender_render::Error::Refused(r) => Failure::usage(r.to_string()),
        other => classify(other),
    })?;
    for w in &rendered.warnings {
        eprintln!("tender: note: {w}");
    }
    if !rendered.unexpressed.is_empty() {
        let how = if a.allow_partial { "left out (--allow-partial)" } else { "refused" };
        eprintln!(
            "tender: {} cannot express {} of what was asked ({how}):",
            rendered.target,
            rendered.unexpressed.len()
        );
        for u in &rendered.unexpressed {
            eprintln!("tender:   {u}");
        }
        if !a.allow_partial {
            return Err(Failure::problem(format!(
                "{} cannot express everything asked; nothing was written: pass --allow-partial to write the rest, or --cozystack/--values-schema for the Cozystack the cluster runs",
                rendered.target
            ))
            .into());
        }
    }
    match a.out {
        None => print(&rendered.text()),
        Some(dir) => {
            for d in &rendered.documents {
                let one = tender_render::cozystack::Rendered { documents: vec![d.clone()], ..Default::default() };
                write_file(
                    &dir,
                    &OutputFile { path: d.file_name.clone(), contents: one.text().into_bytes(), secret: false },
                )?;
                println!("{}", dir.join(&d.file_name).display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn check_cozystack(a: CheckCozystackArgs) -> anyhow::Result<ExitCode> {
    let json = matches!(a.output, CheckOutput::Json);
    match check_cozystack_report(&a) {
        Ok((out, ok)) => {
            print(&out)?;
            Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        // CI reading --output json gets an object for a usage error too (issue 33, item 6).
        Err(e) if json => {
            let code = crate::exit::code_for(&e);
            let class = e.chain().find_map(|c| c.downcast_ref::<Failure>().map(|f| f.class.code())).unwrap_or(1);
            let j = serde_json::json!({"ok": false, "exitCode": class, "error": format!("{e:#}")});
            print(&format!("{}\n", serde_json::to_string_pretty(&j).context("serialising the error")?))?;
            eprintln!("tender: {e:#}");
            Ok(code)
        }
        Err(e) => Err(e),
    }
}

/// The report of `check cozystack` as text or JSON, and whether everything passed.
fn check_cozystack_report(a: &CheckCozystackArgs) -> anyhow::Result<(String, bool)> {
    check_one_stdin(&[Some(a.file.as_path()), a.catalog_values.as_deref(), a.cluster_state.as_deref()])?;
    let Some(state_path) = a.cluster_state.as_ref() else {
        return Err(Failure::usage(
            "--cluster-state is required: the rules R-1 to R-4, D-1 to D-6, N-1 to N-4, A-1 and G-9 read the cluster; pass the output of `kubectl get storageclasses,datavolumes,persistentvolumeclaims -A -o yaml`",
        ).into());
    };
    let max = parse_bytes(&a.max_input_size).ok_or_else(|| {
        Failure::usage(format!("--max-input-size {:?} is not a size; write it like 4Mi or 4194304", a.max_input_size))
    })?;
    let target = a.target.target()?;
    let text = read_capped("-f", &a.file, max)?;
    let catalog_text = a.catalog_values.as_ref().map(|p| read_capped("--catalog-values", p, max)).transpose()?;
    let state_text = read_capped("--cluster-state", state_path, max)?;
    // The schema, the chart's own `fail`s and the API's name rules first: what Cozystack refuses.
    let schema = tender_render::cozystack::schema_findings(&text, a.name.as_deref(), a.namespace.as_deref(), &target)
        .map_err(classify)?;
    let catalog =
        catalog_text.map(|t| tender_render::cozystack::read_catalog_values(&t).map_err(classify)).transpose()?;
    let state = ClusterState::from_yaml(&state_text).map_err(classify)?;
    let mut schema_refusals = schema.invalid;
    for u in schema.undeclared {
        if a.allow_partial {
            eprintln!("tender: note: {}: {} {}", u.pool, u.field, u.problem);
        } else {
            schema_refusals.push(u);
        }
    }
    let report = if schema_refusals.is_empty() {
        let pools =
            tender_render::cozystack::read_checked_input(&text, a.name.as_deref(), a.namespace.as_deref(), &target)
                .map_err(classify)?;
        tender_render::cozystack::check(&pools, catalog.as_ref(), &state).map_err(classify)?
    } else {
        // The target's chart would not take the values as they are: that comes first.
        tender_render::cozystack::Report { ok: false, findings: schema_refusals, ..Default::default() }
    };
    let out = match a.output {
        CheckOutput::Text => report.text(),
        CheckOutput::Json => {
            let mut j = serde_json::to_string_pretty(&report).context("serialising the report")?;
            j.push('\n');
            j
        }
    };
    Ok((out, report.ok))
}
