//! An S3 server for backups on real nodes: SeaweedFS's `weed mini` (master, volume server,
//! filer and S3 gateway in one process), built by `e2e/toolchain/build.sh`.
//!
//! It listens on the control plane's address, which pods reach as they reach the API server,
//! serves S3 over TLS (pgBackRest speaks only HTTPS to S3) with SigV4 for one identity (a
//! request without its keys is refused), and pre-creates one bucket. The tests read what landed
//! in the bucket, and write what another cluster would, through the filer's HTTP interface,
//! which needs no S3 client.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use serde_json::{Value, json};

use crate::http::{get, request};
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
/// The region the clients sign for (SeaweedFS accepts any).
pub const REGION: &str = "us-east-1";
/// The one identity's access key id.
pub const ACCESS_KEY_ID: &str = "multigres-e2e";
/// The one identity's secret key.
pub const SECRET_ACCESS_KEY: &str = "multigres-e2e-backup-secret";

/// SeaweedFS's default HTTP ports. They stay below the range `crate::ports` hands out
/// (20000-30000) and the ephemeral range, so nothing the harness starts later can collide with
/// them on the control plane's address.
const S3_PORT: u16 = 8333;
const FILER_PORT: u16 = 8888;
const MASTER_PORT: u16 = 9333;
const VOLUME_PORT: u16 = 9340;
/// `weed mini` starts its admin server even without its UI.
const ADMIN_PORT: u16 = 12535;
/// Where the gRPC ports of [`GRPC_SERVICES`] are taken from, one run of them at a time; also
/// below the harness's range.
const GRPC_PORTS: std::ops::Range<u16> = 13_000..18_000;
/// `weed mini` also serves each gRPC port on a unix socket at a path fixed by the port in
/// `/tmp`, which every sandbox shares (upstream `weed/command/mini.go`, no flag moves them).
const GRPC_SERVICES: [&str; 5] = ["master", "volume", "filer", "s3", "admin"];
/// One gRPC port per service in [`GRPC_SERVICES`], in that order.
type GrpcPorts = [u16; GRPC_SERVICES.len()];
/// How long startup (the filer's store, the bucket) may take on 2 shared cores.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// The running server.
#[derive(Debug)]
pub struct S3Server {
    process: Supervised,
    grpc_ports: GrpcPorts,
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
#[allow(unsafe_code)] // libc calls, each under a SAFETY comment
pub async fn server() -> &'static S3Server {
    static SERVER: tokio::sync::OnceCell<S3Server> = tokio::sync::OnceCell::const_new();
    extern "C" fn stop() {
        if let Some(server) = SERVER.get() {
            server.stop();
        }
    }
    SERVER
        .get_or_init(|| async {
            let cluster = real_cluster().await;
            let server = S3Server::start(cluster.dir(), cluster.pki())
                .await
                .unwrap_or_else(|e| panic!("starting the S3 server: {e}"));
            // SAFETY: registers a plain `extern "C" fn()` with the C runtime; it only touches
            // a static that is initialised by then.
            unsafe {
                libc::atexit(stop);
            }
            server
        })
        .await
}

/// Where `weed mini` puts the unix socket of a service's gRPC port.
fn grpc_socket(service: &str, port: u16) -> String {
    format!("/tmp/seaweedfs-{service}-grpc-{port}.sock")
}

/// The gRPC ports of [`GRPC_SERVICES`] for this sandbox: a run of them whose sockets no other
/// server has in `/tmp` and that are free on the control plane's address. Two sandboxes running
/// beside each other (e2e/run-e2e.sh's lanes) start their search at places their ids set apart,
/// since the same ports would make each remove the other's sockets.
fn grpc_ports() -> Result<GrpcPorts, String> {
    let sandbox = std::env::var(crate::nodes::SANDBOX_ID_ENV)
        .ok()
        .and_then(|id| id.parse::<u32>().ok())
        .unwrap_or_else(std::process::id);
    let width = GRPC_SERVICES.len() as u16;
    let slots = u32::from((GRPC_PORTS.end - GRPC_PORTS.start) / width);
    for step in 0..slots {
        let slot = u16::try_from((sandbox + step) % slots).expect("fewer slots than ports");
        let ports: GrpcPorts = std::array::from_fn(|k| GRPC_PORTS.start + slot * width + k as u16);
        let taken = GRPC_SERVICES.iter().zip(ports).any(|(service, port)| {
            Path::new(&grpc_socket(service, port)).exists()
                || std::net::TcpListener::bind((CONTROL_PLANE_IP, port)).is_err()
        });
        if !taken {
            return Ok(ports);
        }
    }
    Err(format!(
        "no {width} free gRPC ports in a row in {GRPC_PORTS:?}"
    ))
}

impl S3Server {
    /// Stops the server and removes its sockets from the shared `/tmp`.
    fn stop(&self) {
        self.process.stop(Duration::from_secs(10));
        for (service, port) in GRPC_SERVICES.iter().zip(self.grpc_ports) {
            let _ = std::fs::remove_file(grpc_socket(service, port));
        }
    }

    /// Starts `weed mini` with its data under `<state>/s3` and its logs under `<state>/logs`,
    /// serving S3 with a certificate for the control plane's address issued by the cluster's
    /// CA; returns once the bucket exists.
    async fn start(state: &Path, pki: &crate::pki::Pki) -> Result<S3Server, String> {
        let dir = state.join("s3");
        let logs = state.join("logs");
        for d in [&dir, &logs] {
            std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        }
        let (cert, key) = pki
            .serving("s3", CONTROL_PLANE_IP)
            .map_err(|e| e.to_string())?;
        let identities = json!({"identities": [{
            "name": "backups",
            "credentials": [{"accessKey": ACCESS_KEY_ID, "secretKey": SECRET_ACCESS_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }]});
        let config = dir.join("s3.json");
        std::fs::write(&config, identities.to_string())
            .map_err(|e| format!("writing {}: {e}", config.display()))?;
        let path = |p: &Path| p.display().to_string();
        let grpc_ports = grpc_ports()?;
        let mut args: Vec<String> = vec![
            // glog's files go with the other logs, not to /tmp.
            format!("-logdir={}", path(&logs)),
            "mini".into(),
            format!("-dir={}", path(&dir.join("data"))),
            format!("-ip={CONTROL_PLANE_IP}"),
            format!("-ip.bind={CONTROL_PLANE_IP}"),
            format!("-master.port={MASTER_PORT}"),
            format!("-volume.port={VOLUME_PORT}"),
            format!("-filer.port={FILER_PORT}"),
            format!("-s3.port={S3_PORT}"),
            format!("-admin.port={ADMIN_PORT}"),
            "-admin.port.legacy=0".into(),
            "-admin.ui=false".into(),
            "-webdav=false".into(),
            "-s3.port.iceberg=0".into(),
            "-s3.port.lance=0".into(),
            "-master.telemetry=false".into(),
            format!("-s3.config={}", path(&config)),
            format!("-s3.cert.file={}", path(&cert)),
            format!("-s3.key.file={}", path(&key)),
            format!("-bucket={BUCKET}"),
            // Unix sockets default to /tmp, shared with anything else running there.
            format!("-filer.localSocket={}", path(&dir.join("filer.sock"))),
            format!("-s3.localSocket={}", path(&dir.join("s3.sock"))),
        ];
        args.extend(
            GRPC_SERVICES
                .iter()
                .zip(grpc_ports)
                .map(|(service, port)| format!("-{service}.port.grpc={port}")),
        );
        let program = toolchain::binary("weed").map_err(|e| e.to_string())?;
        let process = Supervised::spawn("weed", &program, &args, &[], &logs.join("weed.log"))
            .map_err(|e| e.to_string())?;
        let server = S3Server {
            process,
            grpc_ports,
        };
        let started = Instant::now();
        let bucket = format!("/buckets/{BUCKET}/");
        loop {
            // The filer answers 404 until the bucket exists.
            let error = match get(CONTROL_PLANE_IP, FILER_PORT, &bucket).await {
                Ok((200, _)) => break,
                Ok((status, body)) => format!("HTTP {status}: {body}"),
                Err(e) => e,
            };
            match error {
                e if !server.process.is_running() || started.elapsed() > START_TIMEOUT => {
                    return Err(format!(
                        "the bucket is not listed ({e}); weed log:\n{}",
                        server.process.log_tail(40)
                    ));
                }
                _ => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
        tracing::info!(took = ?started.elapsed(), "S3 server ready");
        Ok(server)
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

    /// Every object whose key starts with `prefix/` (a directory of the bucket), found by
    /// walking the filer's directories; an empty list while nothing is there.
    pub async fn objects(&self, prefix: &str) -> Result<Vec<Object>, String> {
        let root = format!("/buckets/{BUCKET}/");
        let mut directories = vec![format!("{root}{}", prefix.trim_matches('/'))];
        let mut objects = Vec::new();
        while let Some(directory) = directories.pop() {
            let mut after: Option<String> = None;
            loop {
                let page = self
                    .list(&format!("{directory}/"), after.as_deref())
                    .await?;
                for entry in page["Entries"].as_array().into_iter().flatten() {
                    let full = entry["FullPath"]
                        .as_str()
                        .ok_or("an entry without FullPath")?;
                    // Go's os.ModeDir, the top bit of the mode.
                    if entry["Mode"].as_u64().unwrap_or(0) & (1 << 31) != 0 {
                        directories.push(full.to_owned());
                    } else {
                        objects.push(Object {
                            key: full.trim_start_matches(&root).to_owned(),
                            size: entry["FileSize"].as_u64().unwrap_or(0),
                        });
                    }
                }
                match (
                    page["ShouldDisplayLoadMore"].as_bool(),
                    page["LastFileName"].as_str(),
                ) {
                    (Some(true), Some(last)) => after = Some(last.to_owned()),
                    _ => break,
                }
            }
        }
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    /// The content of object `key` of the bucket, `None` when there is none.
    pub async fn object(&self, key: &str) -> Result<Option<String>, String> {
        let (status, body) = get(CONTROL_PLANE_IP, FILER_PORT, &self.object_path(key)).await?;
        match status {
            200 => Ok(Some(body)),
            404 => Ok(None),
            _ => Err(format!("{key}: HTTP {status}: {body}")),
        }
    }

    /// Writes object `key` of the bucket with `content`, as another client of the bucket would.
    pub async fn put_object(&self, key: &str, content: &str) -> Result<(), String> {
        let path = self.object_path(key);
        let (status, body) = request("PUT", CONTROL_PLANE_IP, FILER_PORT, &path, content).await?;
        match status {
            200 | 201 => Ok(()),
            _ => Err(format!("PUT {key}: HTTP {status}: {body}")),
        }
    }

    /// Deletes object `key` of the bucket.
    pub async fn delete_object(&self, key: &str) -> Result<(), String> {
        let path = self.object_path(key);
        let (status, body) = request("DELETE", CONTROL_PLANE_IP, FILER_PORT, &path, "").await?;
        match status {
            200 | 202 | 204 | 404 => Ok(()),
            _ => Err(format!("DELETE {key}: HTTP {status}: {body}")),
        }
    }

    /// The filer's path of object `key` of the bucket.
    fn object_path(&self, key: &str) -> String {
        format!("/buckets/{BUCKET}/{}", key.trim_start_matches('/'))
    }

    /// One page of the filer's JSON listing of `directory` (ending in `/`), the entries after
    /// `after`; a missing directory lists as empty.
    async fn list(&self, directory: &str, after: Option<&str>) -> Result<Value, String> {
        let query = after.map_or_else(String::new, |name| format!("?lastFileName={name}"));
        let (status, body) =
            get(CONTROL_PLANE_IP, FILER_PORT, &format!("{directory}{query}")).await?;
        match status {
            200 => serde_json::from_str(&body).map_err(|e| format!("{directory}: {e}: {body}")),
            404 => Ok(json!({})),
            _ => Err(format!("{directory}: HTTP {status}: {body}")),
        }
    }
}
