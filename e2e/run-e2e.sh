#!/usr/bin/env bash
# Runs the end-to-end tests against the real local control plane: the kwok tier (fake nodes)
# and the real-node tier (kubelet, containerd, runc, CNI, kube-proxy, CoreDNS; pods really run).
#
# Everything that may need the network (packages, the control-plane toolchain, the images,
# Rust dependencies, the test build) happens first, on the host network. The tests then run in
# the sandbox of e2e/sandbox.sh (private network, mount and PID namespaces), with cargo
# `--offline`, so an accidental dial of anything outside fails on the spot and nothing the
# tests start outlives them.
#
# Usage: e2e/run-e2e.sh [extra `cargo test` arguments, e.g. `--test api` or `-- --nocapture`]
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
phase_start=$(date +%s)
phase() {
  local now
  now=$(date +%s)
  echo "[e2e +$((now - phase_start))s] $*" >&2
}

bash e2e/toolchain/packages.sh
MULTIGRES_TOOLCHAIN_BIN=$(bash e2e/toolchain/build.sh)
export MULTIGRES_TOOLCHAIN_BIN
phase "toolchain ready"

# The images real nodes import: the data plane and the operator's own (`just image`).
images=$repo/target/images/list
mkdir -p "$(dirname "$images")"
MULTIGRES_TOOLCHAIN_BIN=$MULTIGRES_TOOLCHAIN_BIN bash e2e/images/build.sh >"$images.tmp"
bash e2e/images/operator.sh | tail -n 1 >>"$images.tmp"
mv "$images.tmp" "$images"
export MULTIGRES_IMAGES=$images
phase "images ready: $(cut -d' ' -f1 "$images" | tr '\n' ' ')"

export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
cargo test -p multigres-e2e --no-run
phase "tests built"

# Test output is shown for passing tests too: it carries the API server version, startup time
# and memory figures.
run_tests() {
  local args=("$@")
  [[ " ${args[*]} " == *" -- "* ]] || args+=(-- --show-output)
  bash e2e/sandbox.sh cargo test --offline -p multigres-e2e "${args[@]}"
}
if [ $# -gt 0 ]; then
  status=0
  run_tests "$@" || status=$?
  phase "tests done (exit $status)"
  exit "$status"
fi
# All of them, one test file at a time, each timed (and each in a fresh sandbox); first the
# images themselves, run in a throwaway containerd (e2e/images/test.sh).
failed=()
phase "start image checks"
if bash e2e/sandbox.sh bash e2e/images/test.sh; then
  phase "passed image checks"
else
  phase "FAILED image checks"
  failed+=(image-checks)
fi
for target in --lib --bins $(for f in e2e/tests/*.rs; do echo "--test=$(basename "$f" .rs)"; done); do
  phase "start $target"
  if run_tests "$target"; then
    phase "passed $target"
  else
    phase "FAILED $target"
    failed+=("$target")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  phase "failed: ${failed[*]}"
  exit 1
fi
phase "all end-to-end tests passed"
