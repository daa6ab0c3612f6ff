//! The cohort step of the Shard controller: the pooler records of the shard's cells, read from
//! the topology. Every cell is read even when one fails: a cell that cannot be read is `None`
//! (its pods keep their published roles), and the first failure is reported. A record an
//! earlier pod of the same name left behind ([`roles::stale`]) is marked shut down, as its
//! pooler would have done had the topology server still answered when it stopped.

use std::collections::{BTreeMap, BTreeSet};

use kube::runtime::reflector::Store;
use multigres_api::names;
use multigres_api::v1alpha1::{Cell, Shard};

use crate::roles;
use crate::target::{CellTopo, ConnectError, Connections, TargetError};
use crate::topo::{CellTls, PoolerRecord, TopoError, TopoStore};
use crate::watch::{Guarded, valid};

/// What the step reads besides the topology.
pub struct Sources<'a> {
    /// Cells, for the settings of a cell's own topology server.
    pub cells: &'a Store<Guarded<Cell>>,
    /// Open topology connections.
    pub connections: &'a Connections,
}

/// Why a cell's pooler records could not be read.
#[derive(Debug)]
pub enum CellError {
    /// The cell's own topology settings cannot be used.
    Target { cell: String, source: TargetError },
    /// The cell's own topology connection could not be prepared (its TLS Secrets).
    Connect { cell: String, source: ConnectError },
    /// The cell's pooler records could not be read.
    Poolers { cell: String, source: TopoError },
}

/// The pooler records of the shard's cells.
pub struct Cohort {
    /// Records by cell; `None` for a cell that could not be read.
    pub poolers: BTreeMap<String, Option<Vec<PoolerRecord>>>,
    /// The first cell that could not be read.
    pub failure: Option<CellError>,
    /// The pods whose stale record this pass marked shut down.
    pub retired: Vec<String>,
}

/// Reads the pooler records of every cell of `shard`'s pools (`key` in the topology) from
/// `store`, the topology of cluster `cluster` in `namespace`, and retires the stale ones of the
/// pool pods `created` (pod name to creation time, in seconds).
pub async fn read(
    sources: &Sources<'_>,
    store: &TopoStore,
    (shard, key): (&Shard, roles::ShardKey<'_>),
    (namespace, cluster): (&str, &str),
    created: &BTreeMap<String, i64>,
) -> Cohort {
    let cells: BTreeSet<&str> = shard
        .spec
        .pools
        .values()
        .flat_map(|p| p.cells.iter().map(|c| c.as_str()))
        .collect();
    let mut cohort = Cohort {
        poolers: BTreeMap::new(),
        failure: None,
        retired: Vec::new(),
    };
    for cell in cells {
        let records = match cell_tls(sources, namespace, cluster, cell).await {
            Ok(tls) => match list(store, cell, &tls).await {
                Ok(Some(mut records)) => {
                    let marked = retire(store, cell, &tls, key, created, &mut records).await;
                    cohort.retired.extend(marked);
                    Ok(Some(records))
                }
                other => other,
            },
            Err(error) => Err(error),
        };
        let records = records.unwrap_or_else(|error| {
            cohort.failure.get_or_insert(error);
            None
        });
        cohort.poolers.insert(cell.to_owned(), records);
    }
    cohort
}

/// Why a stale record is marked shut down (its `lifecycle_status.reason`).
const STALE: &str = "operator: written before its pod was created, by an earlier pod of that name";

/// Marks the stale records among `records` of `cell` shut down, in the topology and in
/// `records`; the pods of those marked. A record its pooler rewrote meanwhile is left, and a
/// failed write is tried again on the next pass.
async fn retire(
    store: &TopoStore,
    cell: &str,
    tls: &CellTls,
    key: roles::ShardKey<'_>,
    created: &BTreeMap<String, i64>,
    records: &mut [PoolerRecord],
) -> Vec<String> {
    let stale: Vec<(usize, String)> = roles::stale(key, created, records)
        .into_iter()
        .filter_map(|(record, pod)| {
            let index = records.iter().position(|r| r.key == record.key)?;
            Some((index, pod.to_owned()))
        })
        .collect();
    let mut retired = Vec::new();
    for (index, pod) in stale {
        let record = &mut records[index];
        match store.mark_shut_down(cell, tls, record, STALE).await {
            Ok(Some(written)) => {
                tracing::info!(%cell, %pod, record = %record.key, "marked a stale pooler record shut down");
                record.pooler = written;
                retired.push(pod);
            }
            Ok(None) => {
                tracing::debug!(%cell, %pod, record = %record.key, "stale pooler record rewritten meanwhile")
            }
            Err(error) => {
                tracing::warn!(%cell, %pod, record = %record.key, error = %multigres_common::telemetry::ErrorChain(&error), "cannot mark a stale pooler record shut down; trying again")
            }
        }
    }
    retired
}

/// The pooler records of `cell`: `None` when it could not be read (with the reason).
async fn list(
    store: &TopoStore,
    cell: &str,
    tls: &CellTls,
) -> Result<Option<Vec<PoolerRecord>>, CellError> {
    match store.list_poolers(cell, tls).await {
        Ok(records) => Ok(Some(records)),
        // No Cell record yet: no pooler can have registered in it either.
        Err(TopoError::CellNotRegistered { .. }) => Ok(Some(Vec::new())),
        Err(source) => Err(CellError::Poolers {
            cell: cell.to_owned(),
            source,
        }),
    }
}

/// How to reach the topology of `cell` of cluster `cluster`: its own etcd's settings when its
/// Cell has one, else the global topology's (also while the Cell is not in the cache yet: its
/// record, where the addresses come from, is written from that Cell).
async fn cell_tls(
    sources: &Sources<'_>,
    namespace: &str,
    cluster: &str,
    cell: &str,
) -> Result<CellTls, CellError> {
    let topo = match valid(sources.cells, namespace, &names::cell(cluster, cell)) {
        Some(resource) => CellTopo::of(&resource.spec, cluster, namespace).map_err(|source| {
            CellError::Target {
                cell: cell.to_owned(),
                source,
            }
        })?,
        None => CellTopo::Global,
    };
    sources
        .connections
        .cell_tls(namespace, &topo)
        .await
        .map_err(|source| CellError::Connect {
            cell: cell.to_owned(),
            source,
        })
}
