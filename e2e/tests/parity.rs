//! Upstream parity, end to end: each feature of the upstream API that goes beyond the core
//! topology (backups, internal TLS, external endpoints, multiadmin web, PostgreSQL
//! configuration, image rollout policy, data-plane observability) produces exactly the objects
//! and contents it should on a real control plane, with the handlers running as their own
//! ServiceAccounts (`multigres_e2e::harness`). One module per feature, in `parity/`.

#[path = "parity/external_endpoints.rs"]
mod external_endpoints;
#[path = "parity/image_policy.rs"]
mod image_policy;
#[path = "parity/internal_tls.rs"]
mod internal_tls;
#[path = "parity/observability.rs"]
mod observability;
#[path = "parity/postgres_config.rs"]
mod postgres_config;
#[path = "parity/warnings.rs"]
mod warnings;
