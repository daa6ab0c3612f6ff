#!/usr/bin/env bash
# Runs the end-to-end tests against the real local control plane.
#
# Everything that may need the network (the control-plane toolchain, Rust dependencies, the test
# build) happens first, on the host network. The tests then run inside a private network
# namespace that has only loopback (`unshare --net`), with cargo `--offline`, so an accidental dial
# of a pod, node or Service address fails on the spot instead of leaving the machine.
#
# Usage: e2e/run-e2e.sh [extra `cargo test` arguments, e.g. `--test api` or `-- --nocapture`]
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

MULTIGRES_TOOLCHAIN_BIN=$(bash e2e/toolchain/build.sh)
export MULTIGRES_TOOLCHAIN_BIN
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost

cargo test -p multigres-e2e --no-run

# Test output is shown for passing tests too: it carries the API server version, startup time
# and memory figures.
test_cmd=(cargo test --offline -p multigres-e2e "$@")
if [[ " $* " != *" -- "* ]]; then
  test_cmd+=(-- --show-output)
fi

if unshare --net -- ip link set lo up 2>/dev/null; then
  echo "run-e2e.sh: running the tests in a private network namespace (loopback only)" >&2
  exec unshare --net -- bash -c 'ip link set lo up && exec "$@"' run-e2e "${test_cmd[@]}"
fi
echo "run-e2e.sh: WARNING: cannot create a network namespace with loopback up ('unshare --net'" \
  "needs root or CAP_SYS_ADMIN, and 'ip' from iproute2); running the tests on the host network." \
  "Everything still binds and dials 127.0.0.1 only, but nothing enforces it." >&2
exec "${test_cmd[@]}"
