//! `tender export --talos-image-cache DIR`: the exported images as Talos' own image cache, the
//! layout `talosctl images cache-create` writes (`tender_bundle::talos_cache` holds the format;
//! `docs/talos-image-cache.md` the rules and where they come from). What goes in is what
//! export warmed: each image's tag (or the tag written beside its digest) naming its top
//! manifest, an index byte for byte, every manifest by digest, and the requested platforms'
//! configs and layers. OS images are not part of Talos' image cache and are left out, said so.

use std::fs::File;
use std::path::Path;

use indicatif::HumanBytes;
use tender_bundle::talos_cache::{CacheLayout, TalosCacheWriter};
use tender_oci::{ImageRef, Reference};

use crate::exit::{Context as _, Failure, Result};
use crate::prefetch::{Blob, Done, Failed, Item, Mode, Progress, Run};
use crate::progress::{Show, Totals};

/// Write the warmed `outcomes` (only the ones that succeeded) to `dest` in `layout`.
pub(crate) fn export(
    run: &Run,
    outcomes: &[(Item, std::result::Result<Done, Failed>)],
    dest: &Path,
    layout: CacheLayout,
    quiet: bool,
) -> Result<()> {
    let platforms: Vec<String> = run.platforms.iter().map(ToString::to_string).collect();
    let progress = Progress::new(None, "talos image cache".into(), Show::choose(quiet), Totals::new("export", None));
    let mut writer = TalosCacheWriter::create(dest, layout, &platforms)
        .with_context(|| format!("creating the Talos image cache {}", dest.display()))?;
    let (mut images, mut left_out) = (0usize, Vec::new());
    for (item, outcome) in outcomes {
        let Ok(done) = outcome else { continue };
        let img = match item {
            Item::Image(img) => img,
            Item::OsImage(asset) => {
                left_out.push(asset.path());
                continue;
            }
        };
        let graph = done.graph.as_ref().ok_or_else(|| Failure::problem(format!("{img}: nothing walked")))?;
        let tag = match &img.reference {
            Reference::Tag(t) => Some(t.to_string()),
            Reference::Digest(_) => img.tag_hint.as_ref().map(ToString::to_string),
        };
        let repo = img.repository.to_string();
        let what = |d: &dyn std::fmt::Display| format!("{img}: writing {d} to the Talos image cache");
        writer
            .add_manifest(&img.registry, &repo, tag.as_deref(), &graph.top.digest, &graph.top.bytes)
            .with_context(|| what(&graph.top.digest))?;
        for m in &graph.children {
            writer.add_manifest(&img.registry, &repo, None, &m.digest, &m.bytes).with_context(|| what(&m.digest))?;
        }
        for b in &graph.blobs {
            if writer.wants_blob(&b.digest) {
                copy_blob(run, &mut writer, img, b, &progress)?;
            }
        }
        images += 1;
    }
    let written = writer.finish().with_context(|| format!("finishing the Talos image cache {}", dest.display()))?;
    println!(
        "talos image cache: wrote {} ({layout} layout): {images} image(s), {} tag(s), {} manifest(s); {} blob(s), {}",
        dest.display(),
        written.tags,
        written.manifests,
        written.blobs,
        HumanBytes(written.bytes)
    );
    for path in &left_out {
        println!("talos image cache: left out {path}: an OS image is not part of Talos' image cache");
    }
    if let Some(image) = written.image {
        println!("talos image cache: image {image} (give the directory to imager as --image-cache)");
    }
    Ok(())
}

/// One blob into the cache: from the store (verified when committed, hashed again on the way
/// in), or through the server.
fn copy_blob(run: &Run, writer: &mut TalosCacheWriter, img: &ImageRef, blob: &Blob, progress: &Progress) -> Result<()> {
    let what = format!("{img}: blob {}", blob.digest);
    let failure = Failed::into_failure;
    match &run.backend.mode {
        Mode::Local(local) => {
            run.runtime.block_on(run.backend.blob(img, blob, progress)).map_err(failure)?;
            let mut f =
                File::open(local.store.object_path(&blob.digest)).with_context(|| format!("{what}: opening"))?;
            writer.add_blob(&blob.digest, blob.size, &mut f).with_context(|| format!("{what}: copying"))?;
        }
        Mode::Server(server) => {
            let mut sync = server.blob_reader(&run.runtime, img, &blob.digest, &what).map_err(failure)?;
            writer.add_blob(&blob.digest, blob.size, &mut sync).with_context(|| format!("{what}: writing"))?;
        }
    }
    Ok(())
}
