//! Protocol messages shared by the handlers: the `HandlerInfo` gRPC service, in `topo` the
//! Multigres topology records the data-handler writes to etcd, and in `multipooler` the
//! multipooler's management service, whose `ReloadConfig` the data-handler calls to apply
//! reload-class settings, and its query service, through which it keeps PostgreSQL roles. The
//! Multigres messages come from upstream's own `.proto` files, unchanged
//! (`proto/multigres/UPSTREAM` names the commit; a test checks them).

/// `multigres.operator.v1`: the HandlerInfo service.
pub mod operator {
    pub mod v1 {
        tonic::include_proto!("multigres.operator.v1");
    }
}

/// `clustermetadata`: the Multigres topology records (Cell, Database, Multipooler, ...) as stored
/// in etcd, compiled from upstream's own `clustermetadata.proto` so the bytes are exactly what
/// Multigres components read and write.
pub mod topo {
    tonic::include_proto!("clustermetadata");
}

/// `multipoolermanager` / `multipoolermanagerdata`: the multipooler's management service, compiled
/// from upstream's own files so the gRPC paths and wire format are the real multipooler's.
pub mod multipooler {
    /// The topology records, where the generated code of the manager's messages (which embed
    /// some: pooler ids, types, routing roles) looks them up.
    pub use crate::topo as clustermetadata;
    /// Request and response messages.
    pub mod multipoolermanagerdata {
        tonic::include_proto!("multipoolermanagerdata");
    }
    /// The `MultipoolerManager` service client and server.
    pub mod multipoolermanager {
        tonic::include_proto!("multipoolermanager");
    }
    /// Query messages (targets, results), used by the query service.
    pub mod query {
        tonic::include_proto!("query");
    }
    /// Caller identities and RPC errors, used by the query service.
    pub mod mtrpc {
        tonic::include_proto!("mtrpc");
    }
    /// The `MultipoolerService` query service: the data-handler runs its role statements
    /// through the primary's multipooler, as the superuser the multipooler already holds, so
    /// the operator itself never reads the superuser password.
    pub mod multipoolerservice {
        tonic::include_proto!("multipoolerservice");
    }
}
