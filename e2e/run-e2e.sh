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
images=${CARGO_TARGET_DIR:-$repo/target}/images/list
mkdir -p "$(dirname "$images")"
MULTIGRES_TOOLCHAIN_BIN=$MULTIGRES_TOOLCHAIN_BIN bash e2e/images/build.sh >"$images.tmp"
MULTIGRES_OPERATOR_PROFILE=dev bash e2e/images/operator.sh | tail -n 1 >>"$images.tmp"
# postgres_exporter beside PostgreSQL in pool pods (cached per version and script).
bash e2e/images/postgres-exporter.sh | tail -n 1 >>"$images.tmp"
# The previous operator version, for the upgrade test (cached per machine and commit).
bash e2e/images/previous-operator.sh | tail -n 1 >>"$images.tmp"
mv "$images.tmp" "$images"
export MULTIGRES_IMAGES=$images
phase "images ready: $(cut -d' ' -f1 "$images" | tr '\n' ' ')"

export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
cargo test -p multigres-e2e --no-run
phase "tests built"

# The Go programs the tests start (kube-apiserver, etcd, the controller manager, kwok, the
# kubelets, containerd, ...) collect garbage when their heap has grown by 400 % rather than
# 100 %: this phase is bound by CPU, not memory (24 GiB here), and the API server, its largest
# user, took 15 % less CPU for the same tests (faults.rs: 134.6 -> 113.9 s).
export GOGC=400

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
# All of them: every test binary, each in its own sandbox, each file's time summarised at the
# end, and the images themselves, run in a throwaway containerd (e2e/images/test.sh). A failing
# file does not stop the others.
#
# The binaries run directly, not through `cargo test` (which holds the build directory's lock
# while tests run), so two lanes run at once, each with about half of the work: one takes the
# S3 backups, the data-plane story, then a teardown; the other the image checks (which open it
# instead of holding both lanes up), the kwok-tier files, then Prometheus, the operator's own
# pods, the multi-cell sample, an operator upgrade and a zone's loss (real nodes too). By the
# per-file times of the fresh-clone run of 2026-12-06 at 12:00 the two lanes hold about 1,340 s
# of work each (the first varies by about 150 s from run to run: the scheduled backups wait for
# the minute, a cluster restored from the bucket elects its primary in 31-114 s). The
# data-plane story meets mostly kwok-tier files that way; it asserts what must hold under any
# load, and its figures of record come from `just data-plane-runs`, which runs it alone. Each sandbox names its cgroups (e2e/sandbox.sh) and the S3 server's
# sockets (e2e/src/s3.rs) apart, so two control planes with real nodes do not meet. The
# handlers the tests start are built first, so no test builds them.
failed=()
cargo build -p cluster-handler -p resource-handler -p data-handler -p webhook-server -p kubectl-multigres
real_lane=(backups data_plane real_teardown)
kwok_lane_tail=(observability real_nodes samples upgrade zones)
kwok=() first=() tail=()
while read -r kind name src exe; do
  entry="$name|$src|$exe"
  if [[ " ${real_lane[*]} " == *" $name "* && $kind == test ]]; then
    first+=("$entry")
  elif [[ " ${kwok_lane_tail[*]} " == *" $name "* && $kind == test ]]; then
    tail+=("$entry")
  else
    kwok+=("$entry")
  fi
done < <(cargo test -p multigres-e2e --no-run --message-format=json 2>/dev/null |
  jq -r 'select(.reason == "compiler-artifact" and .profile.test == true and .executable != null)
         | "\(.target.kind[0]) \(.target.name) \(.target.src_path) \(.executable)"' | sort -k2)
[ ${#first[@]} -eq ${#real_lane[@]} ] && [ ${#tail[@]} -eq ${#kwok_lane_tail[@]} ] ||
  { echo "run-e2e.sh: a real-node test file is missing: ${first[*]} ${tail[*]}" >&2; exit 1; }

# Runs each "name|source|executable" in its own sandbox from the crate's directory, as cargo
# would, with a `Running <source>` line for the summary, its tests `$1` at a time (empty: one
# per core, libtest's default); fails if any failed.
run_binaries() {
  local threads=$1 status=0 entry name src exe
  shift
  for entry in "$@"; do
    IFS='|' read -r name src exe <<<"$entry"
    echo "     Running ${src#"$repo/e2e/"} ($exe)"
    (cd "$repo/e2e" && bash sandbox.sh "$exe" --show-output ${threads:+--test-threads=$threads}) ||
      status=1
  done
  return "$status"
}
# The kwok tier's tests mostly wait for the API server and the handlers' reconciles, so its
# files run four tests at once rather than one per core (resource_handler.rs alone: 85 s with
# two, 50 s with four; cluster_handler.rs, bound by one long test, 95 s either way). The
# real-node files keep the default: their tests share one cluster's nodes.
kwok_test_threads=4
# The image checks, then the kwok tier's files, then the real-node files of this lane.
image_checks_and_kwok_lane() {
  local status=0
  phase "start image checks"
  if MULTIGRES_OPERATOR_PROFILE=dev bash e2e/sandbox.sh bash e2e/images/test.sh; then
    phase "passed image checks"
  else
    phase "FAILED image checks"
    status=1
  fi
  run_binaries "$kwok_test_threads" "${kwok[@]}" || status=1
  run_binaries "" "${tail[@]}" || status=1
  return "$status"
}
log=$(mktemp)
kwok_log=$(mktemp)
phase "start the end-to-end tests: ${first[*]%%|*} beside the image checks and the kwok tier, then ${tail[*]%%|*}"
image_checks_and_kwok_lane >"$kwok_log" 2>&1 &
kwok_pid=$!
run_binaries "" "${first[@]}" 2>&1 | tee "$log" || failed+=(real-nodes-lane)
phase "${first[*]%%|*} done"
wait "$kwok_pid" || failed+=(image-checks-and-kwok-lane)
tee -a "$log" <"$kwok_log"
phase "the kwok tier and ${tail[*]%%|*} done"
awk '/^ *Running /{ file = $2 } /^test result:/{ printf "[e2e] %-28s %s %s\n", file, $3, $NF }' "$log" >&2
# A long run's log is cut before it reaches CI's summary; repeat each panic (with the lines
# after it, where the message continues, up to its backtrace: at most 12) at the very end so a
# failure's cause is never lost under the frames.
awk '/panicked at/ { n = 13 } /^stack backtrace:/ { n = 0 } n > 0 { print "[e2e panic] " $0; n-- }' "$log" >&2 || true
rm -f "$log" "$kwok_log"
if [ ${#failed[@]} -gt 0 ]; then
  phase "failed: ${failed[*]}"
  exit 1
fi
phase "all end-to-end tests passed"
