//! Protocol messages shared by the handlers: the `HandlerInfo` gRPC service, in `topo` the
//! Multigres topology records the data-handler writes to etcd, and in `multipooler` the
//! multipooler's `ReloadConfig` RPC the data-handler calls to apply reload-class settings.

/// `multigres.operator.v1`: the HandlerInfo service.
pub mod operator {
    pub mod v1 {
        tonic::include_proto!("multigres.operator.v1");
    }
}

/// `clustermetadata`: the Multigres topology records (Cell, Database, Multipooler, ...) as stored
/// in etcd, byte-compatible with what Multigres components read and write.
pub mod topo {
    tonic::include_proto!("clustermetadata");
}

/// `multipoolermanager` / `multipoolermanagerdata`: the multipooler's management service, trimmed
/// to `ReloadConfig`, with the upstream packages so the gRPC path and wire format match.
pub mod multipooler {
    /// Request and response messages.
    pub mod multipoolermanagerdata {
        tonic::include_proto!("multipoolermanagerdata");
    }
    /// The `MultiPoolerManager` service client and server.
    pub mod multipoolermanager {
        tonic::include_proto!("multipoolermanager");
    }
}
