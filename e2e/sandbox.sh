#!/usr/bin/env bash
# Runs a command inside the test sandbox: private network (only loopback; real nodes add their
# addresses to it), mount and PID namespaces. Nothing the command does can reach beyond the
# machine, and whatever it leaves behind (a process, a mount, an interface) dies with the
# sandbox. Cgroups are not namespaced: real nodes name theirs `multigres-e2e-<this script's PID>-*`
# (PIDs inside are the sandbox's own, the same in every sandbox), the harness removes its own,
# and this script removes what its sandbox left, and what a sandbox no longer running left,
# never the cgroups of another sandbox that runs beside it.
#
# Usage: e2e/sandbox.sh <command> [args...]
set -euo pipefail

if ! unshare --net --mount --pid --fork --mount-proc -- true 2>/dev/null; then
  echo "sandbox.sh: cannot create network, mount and PID namespaces ('unshare' needs root or" \
    "CAP_SYS_ADMIN, and 'ip' from iproute2; e2e/toolchain/packages.sh installs them)" >&2
  exit 1
fi

status=0
# bash stays PID 1 of the sandbox (the command is its child, so terminal signals reach it the
# usual way); when it exits, the kernel kills everything else inside.
unshare --net --mount --pid --fork --mount-proc -- \
  env MULTIGRES_E2E_SANDBOX_ID=$$ \
  bash -c 'ip link set lo up && MULTIGRES_E2E_SANDBOX=1 "$@"; exit $?' sandbox "$@" || status=$?

for hierarchy in /sys/fs/cgroup/*/; do
  for leftover in "$hierarchy"multigres-e2e-*; do
    [ -d "$leftover" ] || continue
    owner=${leftover##*/multigres-e2e-}
    owner=${owner%%-*}
    if [ "$owner" = $$ ] || ! [[ $owner =~ ^[0-9]+$ ]] || ! kill -0 "$owner" 2>/dev/null; then
      find "$leftover" -depth -type d -exec rmdir {} + 2>/dev/null || true
    fi
  done
done
exit "$status"
