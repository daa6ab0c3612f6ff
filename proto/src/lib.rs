//! Protocol messages shared by the handlers: the `HandlerInfo` gRPC service and, in `topo`, the
//! Multigres topology records the data-handler writes to etcd.

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
