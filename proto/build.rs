//! Compiles every `.proto` under `proto/proto/` (protoc is needed anyway by etcd-client).
//!
//! The Multigres files in `proto/multigres/` are upstream's, verbatim: they import each other
//! by bare file name (`import "clustermetadata.proto"`), so their directory (a portable copy
//! of it, see [`portable_copies`]) is their include root, as `proto/` is in Multigres. The operator's own files are rooted at `proto/`.
use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from("proto");
    let multigres = root.join("multigres");
    let mut files = Vec::new();
    collect(&root, &mut files)?;
    files.sort();
    // The directories too, so a newly added .proto is compiled without a clean build.
    println!("cargo:rerun-if-changed={}", root.display());
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        if let Some(dir) = f.parent() {
            println!("cargo:rerun-if-changed={}", dir.display());
        }
    }
    let (upstream, own): (Vec<&Path>, Vec<&Path>) = files
        .iter()
        .map(PathBuf::as_path)
        .partition(|f| f.starts_with(&multigres));
    // The operator serves none of Multigres' services; tests stand in for one RPC of them, and
    // every other method answers UNIMPLEMENTED, as a server without it does.
    let portable = portable_copies(&upstream)?;
    let portable: Vec<&Path> = portable.iter().map(PathBuf::as_path).collect();
    let include = portable[0].parent().expect("a directory").to_path_buf();
    compile(&portable, &include, true)?;
    compile(&own, &root, false)?;
    Ok(())
}

/// `[debug_redact = true]`, the one field option upstream uses, marks SCRAM keys for Go's
/// debug printing only (the wire format is the same without it); protoc before 3.22, such as
/// Debian 12's 3.21, does not know it. The files are compiled from copies without it, in
/// `OUT_DIR`; the checked-in files stay upstream's, byte for byte.
fn portable_copies(files: &[&Path]) -> std::io::Result<Vec<PathBuf>> {
    let dir =
        PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("multigres");
    std::fs::create_dir_all(&dir)?;
    files
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(file)?.replace(" [debug_redact = true]", "");
            let copy = dir.join(file.file_name().expect("a file"));
            std::fs::write(&copy, text)?;
            Ok(copy)
        })
        .collect()
}

fn compile(files: &[&Path], include: &Path, default_stubs: bool) -> std::io::Result<()> {
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(default_stubs)
        .compile_protos(files, &[include])
}

fn collect(dir: &PathBuf, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}
