//! `kubectl multigres`: what a user of a Multigres cluster asks most, answered from the objects
//! the operator publishes, without reading several `kubectl describe` outputs: which pod is the
//! primary, whether every replica streams, when the last backup was taken (`status`); a
//! switchover on request (`switchover`); a backup on request (`backup`); psql through the
//! gateway (`psql`); maintenance: holding the operator's hands off a cluster and releasing
//! supervised restarts (`pause`, `resume`, `restart`).

pub mod backup;
pub mod maintenance;
pub mod psql;
pub mod status;
pub mod switchover;
pub mod view;
