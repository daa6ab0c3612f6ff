//! The gRPC server every handler runs: grpc.health.v1 (for Kubernetes `grpc:` probes) and
//! `HandlerInfo` (for tests and status tooling).

use multigres_proto::operator::v1::handler_info_server::{HandlerInfo, HandlerInfoServer};
use multigres_proto::operator::v1::{GetInfoRequest, GetInfoResponse};
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use crate::state::HandlerState;

/// `HandlerInfo` backed by the handler's shared state.
#[derive(Debug, Clone)]
pub struct HandlerInfoService {
    state: HandlerState,
}

impl HandlerInfoService {
    /// Serves `state`.
    pub fn new(state: HandlerState) -> Self {
        Self { state }
    }
}

#[tonic::async_trait]
impl HandlerInfo for HandlerInfoService {
    async fn get_info(
        &self,
        _request: Request<GetInfoRequest>,
    ) -> Result<Response<GetInfoResponse>, Status> {
        Ok(Response::new(self.state.info()))
    }
}

/// Serves grpc.health.v1 and `HandlerInfo` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    state: HandlerState,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    Server::builder()
        .add_service(state.health_service())
        .add_service(HandlerInfoServer::new(HandlerInfoService::new(state)))
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), shutdown)
        .await
}
