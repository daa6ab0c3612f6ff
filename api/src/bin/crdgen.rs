//! Writes every CRD of the API to `deploy/crds/<plural>.multigres.com.yaml` (or to the directory
//! given as the first argument), removing stale files, so the committed YAML always matches the
//! Rust types.

use std::{fs, path::PathBuf, process::ExitCode};

use multigres_api::crd;

fn main() -> ExitCode {
    let dir = std::env::args_os().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds"),
        PathBuf::from,
    );
    match write_all(&dir) {
        Ok(count) => {
            println!("wrote {count} CRDs to {}", dir.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("crdgen: {error}");
            ExitCode::FAILURE
        }
    }
}

fn write_all(dir: &PathBuf) -> Result<usize, Box<dyn std::error::Error>> {
    fs::create_dir_all(dir)?;
    let crds = crd::all_crds();
    let names: Vec<String> = crds.iter().map(crd::file_name).collect();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default();
        if file.ends_with(".multigres.com.yaml") && !names.iter().any(|n| n == file) {
            fs::remove_file(&path)?;
        }
    }
    for (crd, name) in crds.iter().zip(&names) {
        fs::write(dir.join(name), crd::to_yaml(crd)?)?;
    }
    Ok(crds.len())
}
