//! An S3 server for backups on real nodes: Versity's S3 gateway (`versitygw`) over a POSIX
//! directory, built by `e2e/toolchain/build.sh`.
//!
//! It listens on the control plane's address, which pods reach as they reach the API server,
//! serves S3 over TLS (pgBackRest speaks only HTTPS to S3) with SigV4 for its one (root)
//! account (a request without its keys is refused), and serves one bucket. Its POSIX backend
//! keeps each object as a file under `<root>/<bucket>/<key>`, so the tests read what landed in
//! the bucket, and write what another cluster would, as files, with no S3 client of their own.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use serde_json::{Value, json};

use crate::nodes::CONTROL_PLANE_IP;
use crate::process::Supervised;
use crate::real::real_cluster;
use crate::toolchain;

/// The Secret with the S3 keys that [`S3Server::backup_spec`]'s `credentialsSecret` names.
pub const CREDENTIALS: &str = "backup-credentials";

/// Creates the Secret [`CREDENTIALS`] with the S3 keys in `namespace`.
pub async fn create_credentials(client: &kube::Client, namespace: &str) {
    let secrets: kube::Api<Secret> = kube::Api::namespaced(client.clone(), namespace);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": CREDENTIALS},
        "stringData": {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        },
    }))
    .expect("a Secret literal");
    secrets
        .create(&kube::api::PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("creating the Secret {CREDENTIALS}: {e}"));
}

/// The bucket created at startup.
pub const BUCKET: &str = "multigres-backups";
/// The region the clients sign for (the gateway's `--region`).
pub const REGION: &str = "us-east-1";
/// The one identity's access key id.
pub const ACCESS_KEY_ID: &str = "multigres-e2e";
/// The one identity's secret key.
pub const SECRET_ACCESS_KEY: &str = "multigres-e2e-backup-secret";

/// The gateway's port. It stays below the range `crate::ports` hands out (20000-30000) and the
/// ephemeral range, so nothing the harness starts later can collide with it on the control
/// plane's address.
const S3_PORT: u16 = 8333;
/// How long startup may take on 2 shared cores.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// Where the POSIX backend keeps an upload until it is whole (multipart parts), inside the
/// bucket's directory; not an object.
const UPLOADS_IN_PROGRESS: &str = ".sgwtmp";

/// The running server.
#[derive(Debug)]
pub struct S3Server {
    /// Held, not read: the gateway stops when this is dropped, or with the test process
    /// (`PR_SET_PDEATHSIG`).
    _process: Supervised,
    /// The bucket's directory: one file per object.
    bucket: PathBuf,
}

/// An object in the bucket: its key and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// Key within the bucket (no leading slash).
    pub key: String,
    /// Size in bytes.
    pub size: u64,
}

/// The S3 server for this test process, started on first use (after the real-node control
/// plane, whose address it listens on) and stopped when the process exits.
pub async fn server() -> &'static S3Server {
    static SERVER: tokio::sync::OnceCell<S3Server> = tokio::sync::OnceCell::const_new();
    SERVER
        .get_or_init(|| async {
            let cluster = real_cluster().await;
            S3Server::start(cluster.dir(), cluster.pki())
                .await
                .unwrap_or_else(|e| panic!("starting the S3 server: {e}"))
        })
        .await
}

impl S3Server {
    /// Starts the gateway with its objects under `<state>/s3` and its log under `<state>/logs`,
    /// serving S3 with a certificate for the control plane's address issued by the cluster's
    /// CA; returns once it accepts connections. The bucket is a directory made before it
    /// starts: the backend serves every directory at its root as a bucket.
    async fn start(state: &Path, pki: &crate::pki::Pki) -> Result<S3Server, String> {
        let root = state.join("s3");
        let bucket = root.join(BUCKET);
        let logs = state.join("logs");
        for d in [&bucket, &logs] {
            std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        }
        let (cert, key) = pki
            .serving("s3", CONTROL_PLANE_IP)
            .map_err(|e| e.to_string())?;
        let path = |p: &Path| p.display().to_string();
        let args: Vec<String> = vec![
            format!("--port={CONTROL_PLANE_IP}:{S3_PORT}"),
            format!("--region={REGION}"),
            format!("--cert={}", path(&cert)),
            format!("--key={}", path(&key)),
            "posix".into(),
            path(&root),
        ];
        let program = toolchain::binary("versitygw").map_err(|e| e.to_string())?;
        // The account's keys go in its environment, not on a command line every process of the
        // sandbox can read.
        let keys = [
            ("ROOT_ACCESS_KEY_ID", ACCESS_KEY_ID),
            ("ROOT_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY),
        ];
        let process = Supervised::spawn(
            "versitygw",
            &program,
            &args,
            &keys,
            &logs.join("versitygw.log"),
        )
        .map_err(|e| e.to_string())?;
        let started = Instant::now();
        loop {
            let error = match tokio::net::TcpStream::connect((CONTROL_PLANE_IP, S3_PORT)).await {
                Ok(_) => break,
                Err(e) => e,
            };
            if !process.is_running() || started.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "it does not accept connections ({error}); versitygw log:\n{}",
                    process.log_tail(40)
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        tracing::info!(took = ?started.elapsed(), "S3 server ready");
        Ok(S3Server {
            _process: process,
            bucket,
        })
    }

    /// The endpoint a client is given (`repo1-s3-endpoint`): host and port, no scheme, since
    /// pgBackRest always speaks HTTPS to S3.
    pub fn endpoint(&self) -> String {
        format!("{CONTROL_PLANE_IP}:{S3_PORT}")
    }

    /// A MultigresCluster's `spec.backup` for this server's bucket under the key prefix
    /// `prefix`, with the keys of the Secret [`create_credentials`] makes.
    pub fn backup_spec(&self, prefix: &str) -> Value {
        json!({"type": "s3", "s3": {
            "bucket": BUCKET,
            "region": REGION,
            "endpoint": self.endpoint(),
            "keyPrefix": prefix,
            "credentialsSecret": CREDENTIALS,
        }})
    }

    /// Every object whose key starts with `prefix/` (a directory of the bucket), sorted by key;
    /// an empty list while nothing is there.
    pub async fn objects(&self, prefix: &str) -> Result<Vec<Object>, String> {
        let mut directories = vec![self.bucket.join(prefix.trim_matches('/'))];
        let mut objects = Vec::new();
        while let Some(directory) = directories.pop() {
            let entries = match std::fs::read_dir(&directory) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("listing {}: {e}", directory.display())),
            };
            for entry in entries {
                let entry = entry.map_err(|e| format!("listing {}: {e}", directory.display()))?;
                let name = entry.file_name();
                if name.to_string_lossy().contains(UPLOADS_IN_PROGRESS) {
                    continue;
                }
                let full = entry.path();
                // A file removed between the listing and this look is no longer an object.
                let Ok(meta) = entry.metadata() else { continue };
                if meta.is_dir() {
                    directories.push(full);
                } else if meta.is_file() {
                    let key = full
                        .strip_prefix(&self.bucket)
                        .map_err(|e| format!("{}: {e}", full.display()))?;
                    objects.push(Object {
                        key: key.to_string_lossy().into_owned(),
                        size: meta.len(),
                    });
                }
            }
        }
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    /// The content of object `key` of the bucket, `None` when there is none.
    pub async fn object(&self, key: &str) -> Result<Option<String>, String> {
        match std::fs::read(self.object_path(key)) {
            Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("reading {key}: {e}")),
        }
    }

    /// Writes object `key` of the bucket with `content`, as another client of the bucket would:
    /// whole or not at all (a file renamed into place).
    pub async fn put_object(&self, key: &str, content: &str) -> Result<(), String> {
        let path = self.object_path(key);
        let parent = path.parent().ok_or_else(|| format!("{key}: no parent"))?;
        std::fs::create_dir_all(parent).map_err(|e| format!("PUT {key}: {e}"))?;
        let partial = parent.join(format!(".{UPLOADS_IN_PROGRESS}.put"));
        std::fs::write(&partial, content).map_err(|e| format!("PUT {key}: {e}"))?;
        std::fs::rename(&partial, &path).map_err(|e| format!("PUT {key}: {e}"))
    }

    /// Deletes object `key` of the bucket, with the directories it leaves empty, as the
    /// gateway's own DELETE does.
    pub async fn delete_object(&self, key: &str) -> Result<(), String> {
        let path = self.object_path(key);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(format!("DELETE {key}: {e}")),
        }
        let mut directory = path.parent();
        while let Some(d) = directory.filter(|d| *d != self.bucket) {
            // Not empty (or gone): the keys above it stay as they are.
            if std::fs::remove_dir(d).is_err() {
                break;
            }
            directory = d.parent();
        }
        Ok(())
    }

    /// The file of object `key` of the bucket.
    fn object_path(&self, key: &str) -> PathBuf {
        self.bucket.join(key.trim_start_matches('/'))
    }
}
