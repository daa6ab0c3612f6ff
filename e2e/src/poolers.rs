//! Pooler records for pool pods on fake nodes.
//!
//! kwok stands in for the kubelet: it marks pods Ready, but no container runs. So no
//! multipooler registers in the topology, no multiorch elects a primary, the data-handler finds
//! no roles to publish, and no Shard would ever be `Available` (which waits for a primary).
//! [`StandInPoolers`] stands in for multipooler the way kwok stands in for the kubelet: for each
//! Ready pool pod it writes the pooler record multipooler registers, at the key and in the
//! protobuf multipooler uses, read from the pod's own multipooler flags; the real data-handler
//! then derives `Shard.status.podRoles` from them as it does from real records.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use etcd_client::{Client as Etcd, ConnectOptions};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use multigres_proto::topo::{
    Cell as CellRecord, Id, Multipooler, RoutingRole, RoutingState, ShardKey, id,
};
use prost::Message;
use tokio::task::JoinHandle;

/// Selects the pool pods (the label the resource-handler gives them).
const POOL_PODS: &str = "app.kubernetes.io/component=shard-pool";
/// How often the pods are looked at (from the watch's cache: no request).
const PERIOD: Duration = Duration::from_millis(250);
/// Bound for connecting to and each request of a topology server (it may be down on purpose).
const ETCD_TIMEOUT: Duration = Duration::from_secs(2);

/// Writes the pooler records of the Ready pool pods of one namespace into their cells'
/// topology, as each pod's multipooler would (see the module documentation), until dropped.
///
/// Roles stand in for multiorch's election: one primary per shard, the first pod of ordinal 0
/// seen Ready (the first by name among those Ready at once), which stays the primary for as
/// long as this runs, as an elected primary does; every other pod is a replica. A record is
/// written once per pod and role: a restarted pod keeps its name, hence its record.
///
/// It dials the topology the way multipooler does: the global topology server and root from
/// the pod's `--topo-global-*` flags, there the cell's record for the cell's own server and
/// root. Pods whose topology it cannot reach (or whose cell is not registered yet) are tried
/// again every 250 ms.
pub struct StandInPoolers {
    task: JoinHandle<()>,
}

impl StandInPoolers {
    /// Starts writing the records of `namespace`'s pool pods.
    pub fn start(client: Client, namespace: &str) -> StandInPoolers {
        let api: Api<Pod> = Api::namespaced(client, namespace);
        let (store, writer) = reflector::store();
        let watch = watcher(api, watcher::Config::default().labels(POOL_PODS))
            .default_backoff()
            .reflect(writer)
            .for_each(|_| std::future::ready(()));
        let task = tokio::spawn(async move {
            tokio::select! {
                () = watch => {}
                () = publish(store) => {}
            }
        });
        StandInPoolers { task }
    }
}

impl Drop for StandInPoolers {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a pool pod's multipooler knows from its flags.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pooler {
    /// `--topo-global-server-addresses`.
    global_addresses: Vec<String>,
    /// `--topo-global-root`.
    global_root: String,
    cell: String,
    database: String,
    table_group: String,
    shard: String,
    /// `--service-id`, the pod name.
    service_id: String,
    /// `--hostname`, the pod's DNS name.
    hostname: String,
}

impl Pooler {
    /// The multipooler flags of `pod`, with `$(POD_NAME)` expanded as the kubelet does.
    fn of(pod: &Pod) -> Option<Pooler> {
        let name = pod.name_any();
        let args = pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .find(|c| c.name == "multipooler")?
            .args
            .as_ref()?;
        let flag = |flag: &str| {
            let prefix = format!("--{flag}=");
            args.iter()
                .find_map(|a| a.strip_prefix(&prefix))
                .map(|v| v.replace("$(POD_NAME)", &name))
        };
        Some(Pooler {
            global_addresses: flag("topo-global-server-addresses")?
                .split(',')
                .map(str::to_owned)
                .collect(),
            global_root: flag("topo-global-root")?,
            cell: flag("cell")?,
            database: flag("database")?,
            table_group: flag("table-group")?,
            shard: flag("shard")?,
            service_id: flag("service-id")?,
            hostname: flag("hostname")?,
        })
    }

    /// The shard in the topology: global root, database, table group, shard.
    fn shard_key(&self) -> (String, String, String, String) {
        (
            self.global_root.clone(),
            self.database.clone(),
            self.table_group.clone(),
            self.shard.clone(),
        )
    }

    /// The record multipooler registers, with `role`.
    fn record(&self, role: RoutingRole) -> Vec<u8> {
        Multipooler {
            id: Some(Id {
                component: id::ComponentType::Multipooler as i32,
                cell: self.cell.clone(),
                name: self.service_id.clone(),
            }),
            shard_key: Some(ShardKey {
                database: self.database.clone(),
                table_group: self.table_group.clone(),
                shard: self.shard.clone(),
            }),
            hostname: self.hostname.clone(),
            routing_state: Some(RoutingState {
                role: role as i32,
                rule: None,
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }
}

fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn ordinal_zero(pod: &str) -> bool {
    pod.rsplit('-').next() == Some("0")
}

/// Topology clients by server addresses.
#[derive(Default)]
struct Clients(HashMap<Vec<String>, Etcd>);

impl Clients {
    async fn get(&mut self, addresses: &[String]) -> Result<Etcd, etcd_client::Error> {
        if let Some(client) = self.0.get(addresses) {
            return Ok(client.clone());
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(ETCD_TIMEOUT)
            .with_timeout(ETCD_TIMEOUT);
        let client = Etcd::connect(addresses, Some(options)).await?;
        self.0.insert(addresses.to_vec(), client.clone());
        Ok(client)
    }

    /// Writes `pooler`'s record with `role` where its multipooler would.
    async fn register(&mut self, pooler: &Pooler, role: RoutingRole) -> Result<(), String> {
        let mut global = self
            .get(&pooler.global_addresses)
            .await
            .map_err(|e| e.to_string())?;
        let root = pooler.global_root.trim_end_matches('/');
        let key = format!("{root}/cells/{}/Cell", pooler.cell);
        let got = global.get(key.as_str(), None).await.map_err(|e| {
            self.0.remove(&pooler.global_addresses);
            e.to_string()
        })?;
        let kv = got.kvs().first().ok_or(format!("no Cell record {key}"))?;
        let cell = CellRecord::decode(kv.value()).map_err(|e| e.to_string())?;
        let mut local = self
            .get(&cell.server_addresses)
            .await
            .map_err(|e| e.to_string())?;
        let key = format!(
            "{}/poolers/multipooler-{}-{}/Pooler",
            cell.root.trim_end_matches('/'),
            pooler.cell,
            pooler.service_id
        );
        local
            .put(key, pooler.record(role), None)
            .await
            .map_err(|e| {
                self.0.remove(&cell.server_addresses);
                e.to_string()
            })?;
        Ok(())
    }
}

/// Every [`PERIOD`], writes the records of Ready pods that have none with their current role.
async fn publish(pods: Store<Pod>) {
    let mut clients = Clients::default();
    let mut primaries: BTreeMap<(String, String, String, String), String> = BTreeMap::new();
    let mut written: BTreeMap<String, RoutingRole> = BTreeMap::new();
    loop {
        tokio::time::sleep(PERIOD).await;
        let mut ready: Vec<(String, Pooler)> = pods
            .state()
            .iter()
            .filter(|p| is_ready(p))
            .filter_map(|p| Some((p.name_any(), Pooler::of(p)?)))
            .collect();
        ready.sort_by(|a, b| a.0.cmp(&b.0));
        for (pod, pooler) in &ready {
            if ordinal_zero(pod) {
                primaries
                    .entry(pooler.shard_key())
                    .or_insert_with(|| pod.clone());
            }
        }
        for (pod, pooler) in &ready {
            let role = if primaries.get(&pooler.shard_key()) == Some(pod) {
                RoutingRole::Primary
            } else {
                RoutingRole::Replica
            };
            if written.get(pod) == Some(&role) {
                continue;
            }
            match clients.register(pooler, role).await {
                Ok(()) => {
                    written.insert(pod.clone(), role);
                }
                Err(error) => tracing::debug!(%pod, %error, "pooler record not written yet"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_multipooler_flags_name_its_record() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s-pool-main-zone-a-0"},
            "spec": {"containers": [{"name": "multipooler", "args": [
                "--topo-global-server-addresses=127.0.0.1:2379,127.0.0.1:2380",
                "--topo-global-root=/multigres/global",
                "--cell=zone-a", "--database=postgres", "--table-group=default",
                "--shard=0-inf", "--service-id=$(POD_NAME)",
                "--hostname=$(POD_NAME).s-pool-main-zone-a.ns.svc",
            ]}]},
        }))
        .unwrap();
        let pooler = Pooler::of(&pod).unwrap();
        assert_eq!(
            pooler.global_addresses,
            ["127.0.0.1:2379", "127.0.0.1:2380"]
        );
        assert_eq!(pooler.service_id, "s-pool-main-zone-a-0");
        assert_eq!(
            pooler.hostname,
            "s-pool-main-zone-a-0.s-pool-main-zone-a.ns.svc"
        );
        let record = Multipooler::decode(pooler.record(RoutingRole::Primary).as_slice()).unwrap();
        assert_eq!(record.id.unwrap().name, "s-pool-main-zone-a-0");
        assert_eq!(record.routing_state.unwrap().role(), RoutingRole::Primary);
        assert!(ordinal_zero("s-pool-main-zone-a-0"));
        assert!(!ordinal_zero("s-pool-main-zone-a-10"));
    }
}
