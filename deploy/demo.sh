#!/usr/bin/env bash
# `just demo`: run the operator and show a sample cluster converge.
#
# With KUBECONFIG pointing at a reachable cluster, the demo uses it. Without, it starts the real
# local control plane (kube-apiserver, controller-manager, scheduler, kwok fake nodes, etcd on
# loopback) and tears it down at the end. The four handler binaries run as local processes with
# that kubeconfig; the CRDs are applied server-side; the sample is applied to the namespace
# `multigres-demo` (override with DEMO_NAMESPACE; DEMO_SAMPLE picks another sample, DEMO_KEEP=1
# leaves everything running until Ctrl-C).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
namespace=${DEMO_NAMESPACE:-multigres-demo}
sample=${DEMO_SAMPLE:-deploy/samples/minimal.yaml}
state=$(mktemp -d /tmp/multigres-demo.XXXXXX)
bin_dir=${MULTIGRES_TOOLCHAIN_BIN:-$(bash e2e/toolchain/build.sh)}
export PATH="$bin_dir:$PATH" NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
pids=()
say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

cleanup() {
  set +e
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  if [ -n "${local_cluster:-}" ]; then
    say "stopping the local control plane"
    target/debug/local-cluster down --state-dir "$state" >/dev/null 2>&1
    wait "$local_cluster" 2>/dev/null
  fi
  echo "logs: $state"
}
trap cleanup EXIT

say "building the operator"
cargo build -q --bins

if [ -n "${KUBECONFIG:-}" ] && kubectl version --request-timeout=5s >/dev/null 2>&1; then
  say "using the cluster in KUBECONFIG ($(kubectl config current-context 2>/dev/null || echo '?'))"
  kubectl apply --server-side --force-conflicts -f deploy/crds/ >/dev/null
else
  say "no reachable cluster in KUBECONFIG: starting the local control plane"
  target/debug/local-cluster up --state-dir "$state" >"$state/local-cluster.log" 2>&1 &
  local_cluster=$!
  for _ in $(seq 1 180); do
    [ -f "$state/kubeconfig" ] && break
    kill -0 "$local_cluster" 2>/dev/null || { tail -n 30 "$state/local-cluster.log"; exit 1; }
    sleep 1
  done
  [ -f "$state/kubeconfig" ] || { echo "local control plane did not start"; tail -n 30 "$state/local-cluster.log"; exit 1; }
  export KUBECONFIG="$state/kubeconfig"
  kubectl get nodes
fi

say "starting the handlers (logs in $state)"
for handler in cluster-handler resource-handler data-handler; do
  "target/debug/$handler" --log-format text >"$state/$handler.log" 2>&1 &
  pids+=($!)
done
sleep 2
for pid in "${pids[@]}"; do
  kill -0 "$pid" 2>/dev/null || { echo "a handler exited early:"; tail -n 20 "$state"/*-handler.log; exit 1; }
done

say "applying $sample to namespace $namespace"
kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply -n "$namespace" --server-side -f "$sample"

say "waiting for the cluster to converge"
deadline=$((SECONDS + ${DEMO_TIMEOUT:-180}))
while [ $SECONDS -lt $deadline ]; do
  available=$(kubectl get multigresclusters -n "$namespace" -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Available")].status}{" "}{end}')
  [ -n "$available" ] && [[ "$available" != *False* ]] && [[ "$available" != *Unknown* ]] && [[ "$available" == *True* ]] && break
  sleep 3
done
kubectl get multigres -n "$namespace" -o wide
kubectl get statefulsets,deployments,services,pods,pvc -n "$namespace"
if [ -n "${DEMO_KEEP:-}" ]; then
  say "DEMO_KEEP set: running until Ctrl-C (KUBECONFIG=$KUBECONFIG)"
  wait
fi
