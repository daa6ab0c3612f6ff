//! The Multigres protos in `proto/multigres/` describe Multigres' wire API and topology records,
//! so they must be upstream's files, unchanged. `proto/multigres/UPSTREAM` names the snapshot
//! they come from and each file's sha256: the files must hash to exactly those values (checked
//! everywhere), and, when the snapshot tarball is on the machine, equal its files byte for byte,
//! with the tarball being the named commit.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use multigres_proto::multipooler::multipoolermanager::multipooler_manager_server::SERVICE_NAME;
use sha2::{Digest, Sha256};

/// Where the snapshot's tarball is looked for when `MULTIGRES_VENDOR_SRC` is unset, relative to
/// the workspace root: the machines keep source snapshots beside the checkout.
const DEFAULT_VENDOR_SRC: &str = "../shared/vendor-src";
/// Directory of the protos inside the snapshot tarball (`git archive --prefix=multigres/`).
const TARBALL_PROTO_DIR: &str = "multigres/proto";
/// The multipooler's gRPC server code in the snapshot, generated from the same protos.
const TARBALL_MANAGER_GRPC: &str =
    "multigres/go/pb/multipoolermanager/multipoolermanagerservice_grpc.pb.go";
/// The path a `ReloadConfig` call takes.
const RELOAD_PATH: &str = "/multipoolermanager.MultipoolerManager/ReloadConfig";

struct Manifest {
    commit: String,
    snapshot: String,
    snapshot_sha256: String,
    /// File name → sha256 (lowercase hex).
    files: BTreeMap<String, String>,
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/multigres")
}

fn manifest() -> Manifest {
    let text = std::fs::read_to_string(dir().join("UPSTREAM")).expect("proto/multigres/UPSTREAM");
    let mut commit = None;
    let mut snapshot = None;
    let mut files = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["repository", _] => {}
            ["commit", id] => commit = Some((*id).to_owned()),
            ["snapshot", name, "sha256", sum] => {
                snapshot = Some(((*name).to_owned(), (*sum).to_owned()));
            }
            ["file", name, "sha256", sum] => {
                assert!(
                    files
                        .insert((*name).to_owned(), (*sum).to_owned())
                        .is_none(),
                    "{name} listed twice"
                );
            }
            _ => panic!("UPSTREAM: unreadable line {line:?}"),
        }
    }
    let (snapshot, snapshot_sha256) = snapshot.expect("UPSTREAM names no snapshot");
    Manifest {
        commit: commit.expect("UPSTREAM names no commit"),
        snapshot,
        snapshot_sha256,
        files,
    }
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn the_vendored_protos_are_exactly_the_listed_upstream_files() {
    let manifest = manifest();
    assert_eq!(manifest.commit.len(), 40, "a full commit id");
    let mut present = BTreeMap::new();
    for entry in std::fs::read_dir(dir()).expect("proto/multigres") {
        let path = entry.expect("directory entry").path();
        if path.extension().is_some_and(|e| e == "proto") {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = std::fs::read(&path).expect("readable proto");
            present.insert(name, sha256(&bytes));
        }
    }
    assert_eq!(
        present, manifest.files,
        "the .proto files in proto/multigres must be the upstream files listed in UPSTREAM, \
         unchanged (left: their sha256 now, right: upstream's)"
    );
}

/// The snapshot tarball: `$MULTIGRES_VENDOR_SRC` (the tarball, or the directory holding it) when
/// set, which must then exist; otherwise the machine's shared copy, if there is one.
fn tarball(name: &str) -> Option<PathBuf> {
    match std::env::var_os("MULTIGRES_VENDOR_SRC") {
        Some(given) => {
            let given = PathBuf::from(given);
            let path = if given.is_dir() {
                given.join(name)
            } else {
                given
            };
            assert!(
                path.is_file(),
                "MULTIGRES_VENDOR_SRC: no {}",
                path.display()
            );
            Some(path)
        }
        None => {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(DEFAULT_VENDOR_SRC)
                .join(name);
            path.is_file().then_some(path)
        }
    }
}

/// The commit `git archive` recorded in the tarball's pax global header (`comment=<id>`).
fn archived_commit(tarball: &Path) -> String {
    let mut gzip = Command::new("gzip")
        .arg("-dc")
        .arg(tarball)
        .stdout(Stdio::piped())
        .spawn()
        .expect("gzip");
    let mut head = [0u8; 1024];
    gzip.stdout
        .take()
        .unwrap()
        .read_exact(&mut head)
        .expect("two tar blocks");
    // Only the head was wanted; gzip ends on the closed pipe.
    gzip.wait().expect("gzip");
    assert_eq!(head[156], b'g', "the first entry is a pax global header");
    let records = String::from_utf8_lossy(&head[512..]);
    records
        .split('\n')
        .find_map(|r| r.split_once(" comment=").map(|(_, id)| id.to_owned()))
        .expect("a comment record with the commit id")
}

fn upstream_file(tarball: &Path, name: &str) -> Vec<u8> {
    let out = Command::new("tar")
        .arg("-xzOf")
        .arg(tarball)
        .arg(name)
        .output()
        .expect("tar");
    assert!(
        out.status.success(),
        "tar cannot read {name} from {}: {}",
        tarball.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn the_vendored_protos_equal_the_snapshot() {
    let manifest = manifest();
    let Some(tarball) = tarball(&manifest.snapshot) else {
        eprintln!(
            "{} not found (set MULTIGRES_VENDOR_SRC): the protos were checked against their \
             recorded sha256 only",
            manifest.snapshot
        );
        return;
    };
    let bytes = std::fs::read(&tarball).expect("readable tarball");
    assert_eq!(
        sha256(&bytes),
        manifest.snapshot_sha256,
        "{} is not the recorded snapshot",
        tarball.display()
    );
    assert_eq!(archived_commit(&tarball), manifest.commit);
    for (name, sum) in &manifest.files {
        let upstream = upstream_file(&tarball, &format!("{TARBALL_PROTO_DIR}/{name}"));
        assert_eq!(&sha256(&upstream), sum, "UPSTREAM's sha256 of {name}");
        let ours = std::fs::read(dir().join(name)).expect("vendored file");
        assert!(ours == upstream, "{name} differs from the snapshot's");
    }
}

/// The path the data-handler calls is the one the real multipooler serves (it was not, when the
/// service was spelled `MultiPoolerManager` here).
#[test]
fn reload_config_takes_the_multipoolers_path() {
    assert_eq!(format!("/{SERVICE_NAME}/ReloadConfig"), RELOAD_PATH);
    let manifest = manifest();
    let Some(tarball) = tarball(&manifest.snapshot) else {
        return;
    };
    let server = String::from_utf8(upstream_file(&tarball, TARBALL_MANAGER_GRPC)).unwrap();
    assert!(
        server.contains(&format!("\"{RELOAD_PATH}\"")),
        "{TARBALL_MANAGER_GRPC} serves no {RELOAD_PATH}"
    );
}
