//! The images every real node holds. Importing them is most of what starting a node costs:
//! `ctr images import` streams about 1 GB per node through containerd, which hashes and writes it
//! (containerd and ctr took 500 s of CPU in one e2e run, the most after the API servers). So the
//! images of one image list are imported once, into a template containerd root kept beside the
//! list, and each node's root starts as a copy of the template: the content blobs hard-linked
//! (content-addressed files that containerd never writes in place), the bolt databases copied.
//! The template is made and linked under a file lock, so test binaries starting at once (the two
//! lanes of `e2e/run-e2e.sh`, the demo) neither import twice nor see half a template; templates
//! of other image lists are removed then, so the cache holds one.

use std::collections::BTreeMap;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::nodes::{IMAGES_ENV, NodesError, io, run, system_program, wait_until};
use crate::process::Supervised;

const TEMPLATE_PREFIX: &str = "containerd-template-";

/// Makes `root` (not yet existing) a containerd root holding every image of `images`.
pub fn prepare_root(
    images: &BTreeMap<String, PathBuf>,
    root: &Path,
    logs: &Path,
) -> Result<(), NodesError> {
    let list = std::env::var_os(IMAGES_ENV).ok_or(NodesError::NoImages)?;
    let cache = Path::new(&list)
        .parent()
        .ok_or(NodesError::NoImages)?
        .to_path_buf();
    let template = cache.join(format!("{TEMPLATE_PREFIX}{:016x}", list_key(images)?));
    let lock_path = cache.join("containerd-template.lock");
    let lock = File::create(&lock_path).map_err(io(format!("creating {}", lock_path.display())))?;
    lock.lock()
        .map_err(io(format!("locking {}", lock_path.display())))?;
    if !template.join("ready").exists() {
        remove_other_templates(&cache, &template)?;
        build_template(images, &template, logs)?;
    }
    link_tree(&template.join("root"), root)
}

/// A key for the list: every reference with its archive's path, size and modification time
/// (a rebuilt archive is a new file).
fn list_key(images: &BTreeMap<String, PathBuf>) -> Result<u64, NodesError> {
    let mut hasher = std::hash::DefaultHasher::new();
    for (reference, archive) in images {
        let meta =
            std::fs::metadata(archive).map_err(io(format!("reading {}", archive.display())))?;
        let modified = meta
            .modified()
            .map_err(io(format!("reading {}", archive.display())))?;
        (reference, archive, meta.len(), modified).hash(&mut hasher);
    }
    Ok(hasher.finish())
}

fn remove_other_templates(cache: &Path, keep: &Path) -> Result<(), NodesError> {
    let entries = std::fs::read_dir(cache).map_err(io(format!("listing {}", cache.display())))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let is_template = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.starts_with(TEMPLATE_PREFIX));
        if is_template && path != keep {
            std::fs::remove_dir_all(&path).map_err(io(format!("removing {}", path.display())))?;
        }
    }
    Ok(())
}

/// Imports every image into a containerd of its own (no CRI: nothing runs there) whose root
/// becomes `template/root`, then marks the template ready.
fn build_template(
    images: &BTreeMap<String, PathBuf>,
    template: &Path,
    logs: &Path,
) -> Result<(), NodesError> {
    let partial = template.with_extension("partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io(format!("removing {}", partial.display())))?;
    }
    let root = partial.join("root");
    std::fs::create_dir_all(&root).map_err(io(format!("creating {}", root.display())))?;
    // State and socket in a short temporary path: a socket's path has at most 107 bytes.
    let state = tempfile::tempdir().map_err(io("creating containerd's state directory"))?;
    let socket = state.path().join("containerd.sock");
    let config = format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{socket}"
"#,
        root = root.display(),
        state = state.path().join("state").display(),
        socket = socket.display(),
    );
    let config_path = state.path().join("containerd.toml");
    std::fs::write(&config_path, config)
        .map_err(io(format!("writing {}", config_path.display())))?;
    let containerd = Supervised::spawn(
        "containerd-image-template",
        &system_program("containerd")?,
        &[format!("--config={}", config_path.display())],
        &[],
        &logs.join("containerd-image-template.log"),
    )?;
    wait_until(
        &format!("{} to exist", socket.display()),
        Duration::from_secs(30),
        || socket.exists(),
    )?;
    import(images, &socket, "the image template")?;
    containerd.stop(Duration::from_secs(10));
    std::fs::rename(&partial, template).map_err(io(format!(
        "renaming {} to {}",
        partial.display(),
        template.display()
    )))?;
    let ready = template.join("ready");
    std::fs::write(&ready, "").map_err(io(format!("writing {}", ready.display())))
}

/// `ctr images import` of every archive into the containerd at `socket`, once; a reference
/// whose archive is already imported under another (a second tag of one build) is tagged.
fn import(
    images: &BTreeMap<String, PathBuf>,
    socket: &Path,
    holder: &str,
) -> Result<(), NodesError> {
    let ctr = system_program("ctr")?;
    let socket = socket.to_string_lossy();
    let ctr_run = |args: &[&str]| {
        run(
            &ctr,
            &[&["--address", &socket, "--namespace", "k8s.io"], args].concat(),
        )
    };
    let mut imported: BTreeMap<&PathBuf, &String> = BTreeMap::new();
    for (reference, archive) in images {
        if let Some(first) = imported.get(archive) {
            ctr_run(&["images", "tag", first, reference])?;
        } else {
            ctr_run(&[
                "images",
                "import",
                "--no-unpack",
                &archive.to_string_lossy(),
            ])?;
            imported.insert(archive, reference);
        }
    }
    check_listed(images, &socket, holder)
}

/// Checks that the containerd at `socket` lists every image under its reference: the CRI looks
/// images up by name.
pub fn check_listed(
    images: &BTreeMap<String, PathBuf>,
    socket: &str,
    holder: &str,
) -> Result<(), NodesError> {
    let ctr = system_program("ctr")?;
    let args = [
        "--address",
        socket,
        "--namespace",
        "k8s.io",
        "images",
        "ls",
        "-q",
    ];
    let listed = run(&ctr, &args)?;
    match images
        .keys()
        .find(|reference| !listed.lines().any(|line| line == *reference))
    {
        Some(missing) => Err(NodesError::MissingImage(format!(
            "{missing} in containerd of {holder} (it holds: {})",
            listed.split_whitespace().collect::<Vec<_>>().join(", ")
        ))),
        None => Ok(()),
    }
}

/// Recreates the tree `from` at `to`: directories made, bolt databases (`*.db`, written in place
/// by containerd) copied, every other file hard-linked (copied where `to` is on another
/// filesystem).
fn link_tree(from: &Path, to: &Path) -> Result<(), NodesError> {
    std::fs::create_dir_all(to).map_err(io(format!("creating {}", to.display())))?;
    let entries = std::fs::read_dir(from).map_err(io(format!("listing {}", from.display())))?;
    for entry in entries {
        let entry = entry.map_err(io(format!("listing {}", from.display())))?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let kind = entry
            .file_type()
            .map_err(io(format!("reading {}", source.display())))?;
        let copied = if kind.is_dir() {
            link_tree(&source, &target)?;
            continue;
        } else if source.extension().is_some_and(|ext| ext == "db") {
            std::fs::copy(&source, &target).map(drop)
        } else {
            std::fs::hard_link(&source, &target)
                .or_else(|_| std::fs::copy(&source, &target).map(drop))
        };
        copied.map_err(io(format!(
            "copying {} to {}",
            source.display(),
            target.display()
        )))?;
    }
    Ok(())
}
