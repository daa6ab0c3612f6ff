//! Compiles every `.proto` under `proto/proto/` (protoc is needed anyway by etcd-client).
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from("proto");
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
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&files, &[root])?;
    Ok(())
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
