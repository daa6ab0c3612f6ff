//! The topology store: reads and writes the global and cell topology records in etcd.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::proto::PbTxnOpResponse;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, Identity,
    KeyValue, TlsOptions, Txn, TxnOp, TxnResponse,
};
use multigres_proto::topo::{Cell, Database, Multipooler, PoolerLifecycle, PoolerLifecycleStatus};
use prost::Message;

use super::config::{CellTls, TlsPem, TopoConfig};
use super::error::{RecordError, TopoError};
use super::paths::{GlobalPaths, RecordKind, RecordRef, pooler_id_of, poolers_prefix};
use super::pooler::PoolerRecord;
use super::records::{CellSpec, DatabaseSpec, Merge, merge_cell, merge_database, validate_name};

/// How many read-merge-write rounds a registration tries before reporting a `Conflict`.
const MAX_CAS_ATTEMPTS: u32 = 5;
/// Pause between compare-and-swap rounds, multiplied by the attempt number.
const CAS_BACKOFF: Duration = Duration::from_millis(20);
/// HTTP/2 keep-alive, so a silently dead etcd connection is noticed between requests.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a registration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// The record did not exist and was created.
    Created,
    /// The record existed and its managed fields were rewritten.
    Updated,
    /// The record already matched; nothing was written.
    Unchanged,
}

/// The state a write expects the key to be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// The key must not exist (create).
    Absent,
    /// The key must still be at this modification revision (compare-and-swap).
    ModRevision(i64),
}

/// A write computed from what was read; applying it fails with `Conflict` if the key changed since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WritePlan {
    /// The record's key.
    pub key: String,
    /// The key state the write is conditional on.
    pub expected: Expected,
    /// The encoded record to store.
    pub value: Vec<u8>,
}

/// What registering a spec would do right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The stored record already matches the spec.
    Unchanged,
    /// The stored record must be written.
    Write(WritePlan),
}

/// Client of the Multigres topology: the global records the operator owns (Cell, Database) and
/// the cell-local pooler records it reads.
pub struct TopoStore {
    client: Client,
    config: TopoConfig,
    paths: GlobalPaths,
    /// Clients for cells whose topology lives on other etcd endpoints, keyed by those endpoints
    /// and the digest of the TLS material (none for plaintext) they were made with.
    cell_clients: Mutex<HashMap<CellClientKey, Client>>,
}

impl std::fmt::Debug for TopoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopoStore")
            .field("config", &self.config)
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

/// What a cell topology client was made for: normalized endpoints, TLS digest.
type CellClientKey = (Vec<String>, Option<u64>);

/// A client of one etcd cluster (endpoints, TLS material, timeouts), whatever the root. Clones
/// share one connection, so the stores of many roots on the same etcd need only one: each
/// connection keeps its own HTTP/2 buffers and background tasks.
#[derive(Clone)]
pub struct EtcdConnection(Client);

impl EtcdConnection {
    /// Prepares a client for `config`'s endpoints (its root is not used). Connections are made
    /// lazily, so this succeeds while etcd is down; it fails only on bad settings such as
    /// unusable TLS material.
    pub async fn open(config: &TopoConfig) -> Result<Self, TopoError> {
        connect_client(config, &config.endpoints).await.map(Self)
    }
}

impl TopoStore {
    /// Prepares a client for the global topology. Connections are made lazily, so this succeeds
    /// while etcd is down (each later call then fails with a transient error); it fails only on
    /// bad settings such as unusable TLS material.
    pub async fn connect(config: TopoConfig) -> Result<Self, TopoError> {
        let connection = EtcdConnection::open(&config).await?;
        Ok(Self::over(&connection, config))
    }

    /// The global topology under `config`'s root, reached through `connection`, which must have
    /// been opened with the same endpoints, TLS material and timeouts.
    pub fn over(connection: &EtcdConnection, config: TopoConfig) -> Self {
        Self {
            client: connection.0.clone(),
            paths: GlobalPaths::new(&config.global_root),
            config,
            cell_clients: Mutex::new(HashMap::new()),
        }
    }

    /// The global key layout in use.
    pub fn paths(&self) -> &GlobalPaths {
        &self.paths
    }

    /// Creates or updates the Cell record so its managed fields match `spec`; no write when they
    /// already do. Retries compare-and-swap conflicts a few times before returning `Conflict`.
    pub async fn register_cell(&self, spec: &CellSpec) -> Result<Registration, TopoError> {
        self.register(&self.paths.cell(&spec.name), || self.plan_cell(spec))
            .await
    }

    /// Creates or updates the Database record; see [`TopoStore::register_cell`].
    pub async fn register_database(&self, spec: &DatabaseSpec) -> Result<Registration, TopoError> {
        self.register(&self.paths.database(&spec.name), || {
            self.plan_database(spec)
        })
        .await
    }

    /// Reads the Cell record and computes the write `register_cell` would make.
    pub async fn plan_cell(&self, spec: &CellSpec) -> Result<Plan, TopoError> {
        spec.validate()?;
        self.plan(self.paths.cell(&spec.name), |existing| {
            merge_cell(existing, spec)
        })
        .await
    }

    /// Reads the Database record and computes the write `register_database` would make.
    pub async fn plan_database(&self, spec: &DatabaseSpec) -> Result<Plan, TopoError> {
        spec.validate()?;
        self.plan(self.paths.database(&spec.name), |existing| {
            merge_database(existing, spec)
        })
        .await
    }

    /// Writes a plan in one transaction conditional on [`WritePlan::expected`]; `Conflict` when
    /// the key changed since the plan was made.
    pub async fn apply(&self, plan: &WritePlan) -> Result<Registration, TopoError> {
        let (compare, outcome) = match plan.expected {
            Expected::Absent => (
                Compare::create_revision(plan.key.as_str(), CompareOp::Equal, 0),
                Registration::Created,
            ),
            Expected::ModRevision(revision) => (
                Compare::mod_revision(plan.key.as_str(), CompareOp::Equal, revision),
                Registration::Updated,
            ),
        };
        let txn = Txn::new().when([compare]).and_then([TxnOp::put(
            plan.key.as_str(),
            plan.value.clone(),
            None,
        )]);
        let mut kv = self.client.kv_client();
        let operation = "conditional put";
        let response = self.request(operation, kv.txn(txn)).await?;
        if response.succeeded() {
            self.op_results(operation, &response, &[OpKind::Put])?;
            Ok(outcome)
        } else {
            Err(TopoError::Conflict {
                key: plan.key.clone(),
                attempts: 1,
            })
        }
    }

    /// Removes the Cell record unless a Database record still lists the cell. Returns whether a
    /// record was removed (an absent record is not an error). The check and the delete are one
    /// transaction: it fails if any key under `databases/` changed in between, and is retried.
    pub async fn deregister_cell(&self, cell: &str) -> Result<bool, TopoError> {
        validate_name("cell", cell)?;
        let cell_key = self.paths.cell(cell);
        let prefix = self.paths.databases_prefix();
        for attempt in 1..=MAX_CAS_ATTEMPTS {
            let read_revision = self.check_unreferenced(cell).await?;
            let mut kv = self.client.kv_client();
            let unchanged = Compare::mod_revision(
                prefix.as_str(),
                CompareOp::Less,
                read_revision.saturating_add(1),
            )
            .with_prefix();
            let txn = Txn::new()
                .when([unchanged])
                .and_then([TxnOp::delete(cell_key.as_str(), None)]);
            let operation = "delete cell";
            let response = self.request(operation, kv.txn(txn)).await?;
            if response.succeeded() {
                let results = self.op_results(operation, &response, &[OpKind::Delete])?;
                return Ok(deleted_first(&results));
            }
            tokio::time::sleep(CAS_BACKOFF * attempt).await;
        }
        Err(TopoError::Conflict {
            key: cell_key,
            attempts: MAX_CAS_ATTEMPTS,
        })
    }

    /// Every ownership marker under the global root: the record and the identity of the
    /// MultigresCluster (`namespace/name`) that registered it.
    pub async fn owners(&self) -> Result<BTreeMap<RecordRef, String>, TopoError> {
        let prefix = self.paths.owners_prefix();
        let mut kv = self.client.kv_client();
        let response = self
            .request(
                "list owners",
                kv.get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
            )
            .await?;
        Ok(response
            .kvs()
            .iter()
            .filter_map(|entry| {
                let record = self.paths.owned_record_of(entry.key_str().ok()?)?;
                Some((record, String::from_utf8_lossy(entry.value()).into_owned()))
            })
            .collect())
    }

    /// Marks `owner` as the owner of `record` unless a marker exists: `Ok(true)` when this call
    /// wrote the marker, `Ok(false)` when `owner` already held it, `OwnedByOther` when another
    /// cluster does. One transaction, so two clusters can never both claim a record.
    pub async fn claim(&self, record: &RecordRef, owner: &str) -> Result<bool, TopoError> {
        validate_name(&record.kind.to_string(), &record.name)?;
        let key = self.paths.owner(record);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), owner, None)])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let mut kv = self.client.kv_client();
        let operation = "claim";
        let response = self.request(operation, kv.txn(txn)).await?;
        if response.succeeded() {
            self.op_results(operation, &response, &[OpKind::Put])?;
            return Ok(true);
        }
        match marker_value(&self.op_results(operation, &response, &[OpKind::Get])?) {
            Some(holder) if holder == owner => Ok(false),
            holder => Err(TopoError::OwnedByOther {
                record: record.to_string(),
                owner: holder.unwrap_or_default(),
            }),
        }
    }

    /// Removes a record `owner` holds, with its ownership marker, in one transaction guarded by
    /// the marker. A Cell record is kept (`CellReferenced`) while a Database record lists the
    /// cell, checked in the same transaction as for [`TopoStore::deregister_cell`]. Returns
    /// whether the record itself was removed; `Ok(false)` when no marker exists (nothing of
    /// `owner`'s to remove) and `OwnedByOther` when another cluster holds it.
    pub async fn release(&self, record: &RecordRef, owner: &str) -> Result<bool, TopoError> {
        validate_name(&record.kind.to_string(), &record.name)?;
        let record_key = self.paths.record(record);
        let marker_key = self.paths.owner(record);
        let databases = self.paths.databases_prefix();
        for attempt in 1..=MAX_CAS_ATTEMPTS {
            let mut kv = self.client.kv_client();
            let mut compares = vec![Compare::value(marker_key.as_str(), CompareOp::Equal, owner)];
            if record.kind == RecordKind::Cell {
                let read_revision = self.check_unreferenced(&record.name).await?;
                compares.push(
                    Compare::mod_revision(
                        databases.as_str(),
                        CompareOp::Less,
                        read_revision.saturating_add(1),
                    )
                    .with_prefix(),
                );
            }
            let txn = Txn::new()
                .when(compares)
                .and_then([
                    TxnOp::delete(record_key.as_str(), None),
                    TxnOp::delete(marker_key.as_str(), None),
                ])
                .or_else([TxnOp::get(marker_key.as_str(), None)]);
            let operation = "release";
            let response = self.request(operation, kv.txn(txn)).await?;
            if response.succeeded() {
                let results =
                    self.op_results(operation, &response, &[OpKind::Delete, OpKind::Delete])?;
                return Ok(deleted_first(&results));
            }
            match marker_value(&self.op_results(operation, &response, &[OpKind::Get])?) {
                None => return Ok(false),
                Some(holder) if holder != owner => {
                    return Err(TopoError::OwnedByOther {
                        record: record.to_string(),
                        owner: holder,
                    });
                }
                // Still ours: a Database record changed between the check and the delete.
                Some(_) => tokio::time::sleep(CAS_BACKOFF * attempt).await,
            }
        }
        Err(TopoError::Conflict {
            key: record_key,
            attempts: MAX_CAS_ATTEMPTS,
        })
    }

    /// Fails with `CellReferenced` when a Database record lists `cell`; otherwise returns the
    /// revision the Database records were read at.
    async fn check_unreferenced(&self, cell: &str) -> Result<i64, TopoError> {
        let prefix = self.paths.databases_prefix();
        let mut kv = self.client.kv_client();
        let response = self
            .request(
                "list databases",
                kv.get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
            )
            .await?;
        let mut referencing = Vec::new();
        for (name, key, value) in self.database_records(response.kvs()) {
            let database = decode::<Database>(key, value)?;
            if database.cells.iter().any(|c| c == cell) {
                referencing.push(name.to_string());
            }
        }
        if referencing.is_empty() {
            Ok(response.header().map_or(0, |h| h.revision()))
        } else {
            Err(TopoError::CellReferenced {
                cell: cell.to_string(),
                databases: referencing,
            })
        }
    }

    /// Removes the Database record; returns whether one was removed. Like Multigres'
    /// `DeleteDatabase`, shard init claims and locks below `databases/<db>/` and backups are left.
    pub async fn deregister_database(&self, database: &str) -> Result<bool, TopoError> {
        validate_name("database", database)?;
        let mut kv = self.client.kv_client();
        let response = self
            .request(
                "delete database",
                kv.delete(self.paths.database(database), None::<DeleteOptions>),
            )
            .await?;
        Ok(response.deleted() > 0)
    }

    /// The Cell record, if registered.
    pub async fn get_cell(&self, cell: &str) -> Result<Option<Cell>, TopoError> {
        validate_name("cell", cell)?;
        self.get_record(&self.paths.cell(cell)).await
    }

    /// The Database record, if registered.
    pub async fn get_database(&self, database: &str) -> Result<Option<Database>, TopoError> {
        validate_name("database", database)?;
        self.get_record(&self.paths.database(database)).await
    }

    /// Names of the registered cells, sorted.
    pub async fn list_cells(&self) -> Result<Vec<String>, TopoError> {
        let keys = self.list_keys(&self.paths.cells_prefix()).await?;
        Ok(keys
            .iter()
            .filter_map(|k| self.paths.cell_name_of(k))
            .map(str::to_string)
            .collect())
    }

    /// Names of the databases that have a Database record, sorted.
    pub async fn list_databases(&self) -> Result<Vec<String>, TopoError> {
        let keys = self.list_keys(&self.paths.databases_prefix()).await?;
        Ok(keys
            .iter()
            .filter_map(|k| self.paths.database_name_of(k))
            .map(str::to_string)
            .collect())
    }

    /// Every Multipooler record of a cell, sorted by key. The cell's root and etcd endpoints come
    /// from its Cell record, how to secure the connection from `tls` (the cell's own settings
    /// when it has its own etcd); a cell on other endpoints gets its own client (same timeouts).
    pub async fn list_poolers(
        &self,
        cell: &str,
        tls: &CellTls,
    ) -> Result<Vec<PoolerRecord>, TopoError> {
        let record = self
            .get_cell(cell)
            .await?
            .ok_or_else(|| TopoError::CellNotRegistered {
                cell: cell.to_string(),
            })?;
        let client = self.client_for(&record.server_addresses, tls).await?;
        let prefix = poolers_prefix(&record.root);
        let mut kv = client.kv_client();
        let response = self
            .request(
                "list poolers",
                kv.get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
            )
            .await?;
        let mut poolers = Vec::new();
        for entry in response.kvs() {
            let Ok(key) = entry.key_str() else { continue };
            let Some(id) = pooler_id_of(key, &record.root) else {
                continue;
            };
            poolers.push(PoolerRecord {
                key: key.to_string(),
                revision: entry.mod_revision(),
                id: id.to_string(),
                pooler: decode::<Multipooler>(key, entry.value())?,
            });
        }
        Ok(poolers)
    }

    /// Marks the pooler `record` of `cell` shut down (`lifecycle_status` SHUTDOWN with
    /// `reason`), as upstream's operator does for records no pod backs, unless the record
    /// changed since it was read. Nothing is deleted: a pooler that registers again overwrites
    /// its record, and the gateways treat a SHUTDOWN record as gone. The record as written, or
    /// `None` when it changed (its pooler wrote it meanwhile).
    pub async fn mark_shut_down(
        &self,
        cell: &str,
        tls: &CellTls,
        record: &PoolerRecord,
        reason: &str,
    ) -> Result<Option<Multipooler>, TopoError> {
        let cell_record =
            self.get_cell(cell)
                .await?
                .ok_or_else(|| TopoError::CellNotRegistered {
                    cell: cell.to_string(),
                })?;
        let client = self.client_for(&cell_record.server_addresses, tls).await?;
        let mut pooler = record.pooler.clone();
        let now = std::time::SystemTime::now();
        pooler.lifecycle_status = Some(PoolerLifecycle {
            status: PoolerLifecycleStatus::LifecycleShutdown as i32,
            reason: reason.to_owned(),
            updated: Some(prost_types::Timestamp::from(now)),
        });
        let key = record.key.as_str();
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key,
                CompareOp::Equal,
                record.revision,
            )])
            .and_then([TxnOp::put(key, pooler.encode_to_vec(), None)]);
        let operation = "mark a pooler shut down";
        let response = self.request(operation, client.kv_client().txn(txn)).await?;
        if !response.succeeded() {
            return Ok(None);
        }
        self.op_results(operation, &response, &[OpKind::Put])?;
        Ok(Some(pooler))
    }

    async fn register<F, Fut>(&self, key: &str, plan: F) -> Result<Registration, TopoError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Plan, TopoError>>,
    {
        for attempt in 1..=MAX_CAS_ATTEMPTS {
            let write = match plan().await? {
                Plan::Unchanged => return Ok(Registration::Unchanged),
                Plan::Write(write) => write,
            };
            match self.apply(&write).await {
                Err(TopoError::Conflict { .. }) => {
                    tracing::debug!(
                        key,
                        attempt,
                        "topology record changed concurrently; retrying"
                    );
                    tokio::time::sleep(CAS_BACKOFF * attempt).await;
                }
                other => return other,
            }
        }
        Err(TopoError::Conflict {
            key: key.to_string(),
            attempts: MAX_CAS_ATTEMPTS,
        })
    }

    async fn plan(
        &self,
        key: String,
        merge: impl FnOnce(Option<&[u8]>) -> Result<Merge, RecordError>,
    ) -> Result<Plan, TopoError> {
        let mut kv = self.client.kv_client();
        let response = self.request("get", kv.get(key.as_str(), None)).await?;
        let current = response.kvs().first();
        let merged =
            merge(current.map(KeyValue::value)).map_err(|source| TopoError::Malformed {
                key: key.clone(),
                source,
            })?;
        Ok(match merged {
            Merge::Unchanged => Plan::Unchanged,
            Merge::Write(value) => Plan::Write(WritePlan {
                expected: current.map_or(Expected::Absent, |kv| {
                    Expected::ModRevision(kv.mod_revision())
                }),
                key,
                value,
            }),
        })
    }

    async fn get_record<M: Message + Default>(&self, key: &str) -> Result<Option<M>, TopoError> {
        let mut kv = self.client.kv_client();
        let response = self.request("get", kv.get(key, None)).await?;
        response
            .kvs()
            .first()
            .map(|entry| decode(key, entry.value()))
            .transpose()
    }

    async fn list_keys(&self, prefix: &str) -> Result<Vec<String>, TopoError> {
        let mut kv = self.client.kv_client();
        let options = GetOptions::new().with_prefix().with_keys_only();
        let response = self.request("list", kv.get(prefix, Some(options))).await?;
        Ok(response
            .kvs()
            .iter()
            .filter_map(|entry| entry.key_str().ok())
            .map(str::to_string)
            .collect())
    }

    /// `(database name, key, value)` of the Database records among `entries`.
    fn database_records<'r>(
        &self,
        entries: &'r [KeyValue],
    ) -> impl Iterator<Item = (&'r str, &'r str, &'r [u8])> {
        entries.iter().filter_map(|entry| {
            let key = entry.key_str().ok()?;
            let name = self.paths.database_name_of(key)?;
            Some((name, key, entry.value()))
        })
    }

    /// The client for a cell topology: the global one when the cell keeps its records on the
    /// global endpoints, else one made with the cell's own TLS settings (`tls`).
    async fn client_for(&self, addresses: &[String], tls: &CellTls) -> Result<Client, TopoError> {
        let plaintext = match tls {
            CellTls::Global => self.config.tls.is_none(),
            CellTls::Own(tls) => tls.is_none(),
        };
        // Plaintext only: a TLS server is verified against the name written.
        let addresses: Vec<String> = match &self.config.namespace {
            Some(namespace) if plaintext => addresses
                .iter()
                .map(|a| super::qualified(a, namespace))
                .collect(),
            _ => addresses.to_vec(),
        };
        let addresses = addresses.as_slice();
        let endpoints = normalized(addresses);
        let own_tls = match tls {
            CellTls::Global if endpoints == normalized(&self.config.endpoints) => {
                return Ok(self.client.clone());
            }
            CellTls::Global => self.config.tls.clone(),
            CellTls::Own(tls) => tls.clone(),
        };
        let key = (endpoints, own_tls.as_ref().map(TlsPem::digest));
        if let Some(client) = self.cached_cell_client(&key) {
            return Ok(client);
        }
        let config = TopoConfig {
            tls: own_tls,
            ..self.config.clone()
        };
        let client = connect_client(&config, addresses).await?;
        let mut cache = self
            .cell_clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(cache.entry(key).or_insert(client).clone())
    }

    fn cached_cell_client(&self, key: &CellClientKey) -> Option<Client> {
        self.cell_clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(key)
            .cloned()
    }

    /// The results of the operations of the branch a transaction took, checked to be what etcd
    /// answers: one result per operation, each of the operation's kind. etcd-client's own
    /// `op_responses()` panics on a result of no kind, and indexing trusts the count; an
    /// endpoint is whatever a cluster's spec names, so a fake or broken one gets
    /// [`TopoError::BadAnswer`] instead.
    fn op_results<'r>(
        &self,
        operation: &str,
        response: &'r TxnResponse,
        expected: &[OpKind],
    ) -> Result<Vec<&'r PbTxnOpResponse>, TopoError> {
        let bad = |reason: String| TopoError::BadAnswer {
            operation: operation.to_string(),
            endpoints: self.config.endpoints.join(", "),
            reason,
        };
        let results = &response.0.responses;
        if results.len() != expected.len() {
            return Err(bad(format!(
                "the transaction succeeded={} with {} operation result(s) for {} operation(s)",
                response.succeeded(),
                results.len(),
                expected.len()
            )));
        }
        results
            .iter()
            .zip(expected)
            .enumerate()
            .map(|(i, (result, want))| match &result.response {
                Some(got) if OpKind::of(got) == *want => Ok(got),
                Some(got) => Err(bad(format!(
                    "operation result {i} is a {:?} result where a {want:?} was asked",
                    OpKind::of(got)
                ))),
                None => Err(bad(format!("operation result {i} has no kind"))),
            })
            .collect()
    }

    /// Runs one etcd request under the request timeout and classifies its failure.
    async fn request<T>(
        &self,
        operation: &str,
        call: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, TopoError> {
        match tokio::time::timeout(self.config.request_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(source)) => Err(TopoError::from_etcd(operation, source)),
            Err(_) => Err(TopoError::Timeout {
                operation: operation.to_string(),
                after: self.config.request_timeout,
            }),
        }
    }
}

async fn connect_client(config: &TopoConfig, endpoints: &[String]) -> Result<Client, TopoError> {
    if endpoints.is_empty() {
        return Err(TopoError::Config("no etcd endpoints configured".into()));
    }
    let mut options = ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        .with_timeout(config.request_timeout)
        .with_keep_alive(KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT)
        .with_require_leader(true);
    if let Some(tls) = &config.tls {
        if let Some(plain) = endpoints.iter().find(|e| e.starts_with("http://")) {
            return Err(TopoError::Config(format!(
                "TLS is configured but endpoint {plain} is plain http://"
            )));
        }
        let mut tls_options = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca));
        match (&tls.client_cert, &tls.client_key) {
            (Some(cert), Some(key)) => {
                tls_options = tls_options.identity(Identity::from_pem(cert, key));
            }
            (None, None) => {}
            _ => {
                return Err(TopoError::Config(
                    "a client certificate and its key must be given together".into(),
                ));
            }
        }
        if let Some(name) = &tls.server_name {
            tls_options = tls_options.domain_name(name);
        }
        options = options.with_tls(tls_options);
    }
    match tokio::time::timeout(
        config.connect_timeout,
        Client::connect(endpoints, Some(options)),
    )
    .await
    {
        Ok(Ok(client)) => Ok(client),
        // The channel is lazy, so a failure here is about the settings, not reachability.
        Ok(Err(source)) => Err(TopoError::Config(format!(
            "building the etcd client for {endpoints:?}: {source}"
        ))),
        Err(_) => Err(TopoError::Timeout {
            operation: "connect".into(),
            after: config.connect_timeout,
        }),
    }
}

fn decode<M: Message + Default>(key: &str, value: &[u8]) -> Result<M, TopoError> {
    M::decode(value).map_err(|source| TopoError::Malformed {
        key: key.to_string(),
        source: RecordError::Decode(source),
    })
}

/// The kind of a transaction operation, to check its result against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Put,
    Get,
    Delete,
    Txn,
}

impl OpKind {
    fn of(result: &PbTxnOpResponse) -> Self {
        match result {
            PbTxnOpResponse::ResponsePut(_) => Self::Put,
            PbTxnOpResponse::ResponseRange(_) => Self::Get,
            PbTxnOpResponse::ResponseDeleteRange(_) => Self::Delete,
            PbTxnOpResponse::ResponseTxn(_) => Self::Txn,
        }
    }
}

/// The value of the key read by the `get` of a transaction's failure branch.
fn marker_value(results: &[&PbTxnOpResponse]) -> Option<String> {
    results.iter().find_map(|r| match r {
        PbTxnOpResponse::ResponseRange(get) => get
            .kvs
            .first()
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()),
        _ => None,
    })
}

/// Whether the first operation, a delete, removed a key.
fn deleted_first(results: &[&PbTxnOpResponse]) -> bool {
    matches!(results.first(), Some(PbTxnOpResponse::ResponseDeleteRange(d)) if d.deleted > 0)
}

/// Endpoints without scheme or trailing slash, sorted, for comparing endpoint sets.
fn normalized(endpoints: &[String]) -> Vec<String> {
    let mut out: Vec<String> = endpoints
        .iter()
        .map(|e| {
            e.trim_start_matches("http://")
                .trim_start_matches("https://")
                .trim_end_matches('/')
                .to_string()
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_sets_compare_without_scheme_or_order() {
        assert_eq!(
            normalized(&["http://b:1/".into(), "a:2".into()]),
            normalized(&["a:2".into(), "b:1".into(), "b:1".into()])
        );
        assert_ne!(normalized(&["a:1".into()]), normalized(&["a:2".into()]));
    }
}
