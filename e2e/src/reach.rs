//! What a pod can reach, asked from a real pod: a probe pod opens one TCP connection to each
//! target and reports how it ended. NetworkPolicies act on a pod's own traffic, so only a pod
//! can show them (the test process runs as root on the node, which every policy admits).
//!
//! The probe is Node.js from the multiadmin-web image, the one image with a scripting runtime.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, LogParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::harness::eventually;
use crate::real::{MULTIADMIN_WEB_IMAGE_PREFIX, image};

/// How a connection attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reach {
    /// The handshake completed: something listens and the path is open.
    Open,
    /// Reset at once: the path is open but nothing listens on that address.
    Refused,
    /// No answer within the probe's timeout: dropped on the way, as a NetworkPolicy drops it.
    Filtered,
    /// Anything else, with Node's error code.
    Other(String),
}

/// How long a probe waits for a handshake before calling the target filtered. Open paths
/// between pods of one sandbox answer in milliseconds.
const CONNECT_TIMEOUT_MS: u64 = 3000;
/// Before the first connection: a pod's address reaches the policy enforcer through the API
/// server (the kubelet publishes it once the sandbox is up), and until then its packets are
/// from a stranger.
const SETTLE_MS: u64 = 3000;

/// One line per target, `<host:port> open|refused|filtered|error:<code>`, then exit 0.
const SCRIPT: &str = r#"
const net = require('net');
const targets = process.argv.slice(1);
let left = targets.length;
setTimeout(() => {
  for (const target of targets) {
    const colon = target.lastIndexOf(':');
    const socket = net.connect({host: target.slice(0, colon), port: Number(target.slice(colon + 1))});
    let reported = false;
    const report = (how) => {
      if (reported) return;
      reported = true;
      socket.destroy();
      console.log(target + ' ' + how);
      if (--left === 0) process.exit(0);
    };
    socket.setTimeout(TIMEOUT, () => report('filtered'));
    socket.on('connect', () => report('open'));
    socket.on('error', (e) => report(e.code === 'ECONNREFUSED' ? 'refused' : 'error:' + e.code));
  }
}, SETTLE);
"#;

/// Runs a probe pod `name` in `namespace` with `labels`, connecting to every target once, and
/// returns how each attempt ended. The pod is deleted afterwards.
pub async fn probe(
    client: &Client,
    namespace: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
    targets: &[SocketAddr],
) -> Result<BTreeMap<SocketAddr, Reach>, String> {
    let script = SCRIPT
        .replace("TIMEOUT", &CONNECT_TIMEOUT_MS.to_string())
        .replace("SETTLE", &SETTLE_MS.to_string());
    let mut command = vec!["node".to_owned(), "-e".to_owned(), script];
    command.extend(targets.iter().map(SocketAddr::to_string));
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "probe",
                "image": image(MULTIADMIN_WEB_IMAGE_PREFIX),
                "imagePullPolicy": "Never",
                "command": command,
            }],
        },
    }))
    .map_err(|e| e.to_string())?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(|e| format!("creating probe pod {namespace}/{name}: {e}"))?;
    let budget = Duration::from_millis(SETTLE_MS + CONNECT_TIMEOUT_MS) + Duration::from_secs(90);
    let what = format!("probe pod {namespace}/{name} finished");
    eventually(&what, budget, || async {
        let phase = pods
            .get(name)
            .await
            .map_err(|e| e.to_string())?
            .status
            .and_then(|s| s.phase)
            .unwrap_or_default();
        match phase.as_str() {
            "Succeeded" | "Failed" => Ok(()),
            other => Err(format!("phase {other:?}")),
        }
    })
    .await;
    let log = pods
        .logs(name, &LogParams::default())
        .await
        .map_err(|e| format!("reading the probe's log: {e}"))?;
    pods.delete(name, &DeleteParams::default())
        .await
        .map_err(|e| format!("deleting the probe pod: {e}"))?;
    parse(&log, targets)
}

fn parse(log: &str, targets: &[SocketAddr]) -> Result<BTreeMap<SocketAddr, Reach>, String> {
    let mut found = BTreeMap::new();
    for line in log.lines() {
        let Some((target, how)) = line.split_once(' ') else {
            continue;
        };
        let Ok(target) = target.parse::<SocketAddr>() else {
            continue;
        };
        let reach = match how {
            "open" => Reach::Open,
            "refused" => Reach::Refused,
            "filtered" => Reach::Filtered,
            other => Reach::Other(other.to_owned()),
        };
        found.insert(target, reach);
    }
    match targets.iter().find(|t| !found.contains_key(t)) {
        Some(missing) => Err(format!(
            "the probe did not report {missing}; its log: {log}"
        )),
        None => Ok(found),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_must_be_reported() {
        let a: SocketAddr = "10.0.0.1:2379".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:15470".parse().unwrap();
        let log = "10.0.0.1:2379 filtered\nnoise\n10.0.0.2:15470 error:EHOSTUNREACH\n";
        let found = parse(log, &[a, b]).unwrap();
        assert_eq!(found[&a], Reach::Filtered);
        assert_eq!(found[&b], Reach::Other("error:EHOSTUNREACH".into()));
        assert!(parse("10.0.0.1:2379 open\n", &[a, b]).is_err());
    }
}
