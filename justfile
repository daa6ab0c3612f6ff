# Multigres operator: everyday commands. `just demo` runs the operator; `just test` runs every test.

set shell := ["bash", "-euo", "pipefail", "-c"]

# List the recipes.
default:
    @just --list

# Build every crate.
build:
    cargo build --workspace --all-targets

# Regenerate deploy/crds/*.yaml from the Rust types.
crds:
    cargo run -q -p multigres-api --bin crdgen

# Formatting check, clippy with warnings denied, and workspace-hack/ current with every member depending on it (.config/hakari.toml).
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    command -v cargo-hakari >/dev/null || cargo install --locked --quiet cargo-hakari@0.9.39
    cargo hakari generate --diff
    cargo hakari manage-deps --dry-run

# The operator's image as an OCI archive, without Docker (from the Dockerfile; e2e/images/operator.sh); prints "<ref> <archive>".
image:
    bash e2e/images/operator.sh

# Build (once per machine, cached outside the repo) the control-plane and node binaries; prints their directory.
toolchain:
    bash e2e/toolchain/build.sh

# Unit and component tests (real etcd on loopback for the topology tests). multigres-api's run
# apart: its tests' CEL interpreter (kube's `cel` feature) would otherwise recompile every crate.
unit:
    MULTIGRES_TOOLCHAIN_BIN="$(bash e2e/toolchain/build.sh)" cargo test --workspace --exclude multigres-e2e --exclude multigres-api
    cargo test -p multigres-api

# End-to-end tests against a real local control plane: kwok fake nodes, and real nodes running the images.
e2e:
    MULTIGRES_TOOLCHAIN_BIN="$(bash e2e/toolchain/build.sh)" bash e2e/run-e2e.sh

# Benchmarks against the local control plane, release build (docs/performance.md); e.g. `just bench --clusters 1,10 --runs 1 --idle-minutes 1`.
bench *ARGS:
    cargo build --release -p cluster-handler -p resource-handler -p data-handler -p webhook-server -p multigres-e2e --bins
    MULTIGRES_TOOLCHAIN_BIN="$(bash e2e/toolchain/build.sh)" NO_PROXY=127.0.0.1,localhost "${CARGO_TARGET_DIR:-target}/release/bench" {{ARGS}}

# The real data plane's figures (apply -> first SELECT 1, failover, rolling restart) on real nodes: runs e2e/tests/data_plane.rs and prints its `[figure]` lines.
data-plane-figures:
    MULTIGRES_TOOLCHAIN_BIN="$(bash e2e/toolchain/build.sh)" bash e2e/run-e2e.sh --test data_plane -- --nocapture 2>&1 | tee target/data-plane.log | grep -E '^\[figure\]|^test result'

# The same story N times (default 5), each figure's value per run with its median and maximum: `just data-plane-runs 5`.
data-plane-runs N="5":
    MULTIGRES_TOOLCHAIN_BIN="$(bash e2e/toolchain/build.sh)" bash e2e/figure-runs.sh data_plane {{N}}

# A zone's loss and return (e2e/tests/zones.rs) N times (default 3), figures as data-plane-runs.
zone-runs N="3":
    MULTIGRES_TOOLCHAIN_BIN="$(bash e2e/toolchain/build.sh)" bash e2e/figure-runs.sh zones {{N}}

# Install the kubectl plugin into ~/.cargo/bin, so `kubectl multigres status <cluster>` works.
plugin:
    cargo install --locked --path kubectl-multigres

# Everything: lint, unit + component, end to end.
test: lint unit e2e

# Run the operator and apply a sample cluster: against KUBECONFIG if set, else a local control plane.
demo:
    MULTIGRES_TOOLCHAIN_BIN="$(bash e2e/toolchain/build.sh)" bash deploy/demo.sh
