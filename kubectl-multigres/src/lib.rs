//! `kubectl multigres`: what a user of a Multigres cluster asks most, answered from the objects
//! the operator publishes, without reading several `kubectl describe` outputs: which pod is the
//! primary, whether every replica streams, when the last backup was taken (`status`); a
//! switchover on request (`switchover`); psql through the gateway (`psql`).

pub mod psql;
pub mod status;
pub mod switchover;
pub mod view;
