#!/usr/bin/env bash
# `just demo`: install the operator with its Helm chart and watch a sample cluster converge.
#
# Without KUBECONFIG (or when it points nowhere), everything runs on this machine, on loopback:
#   1. the real local control plane (kube-apiserver, controller-manager, scheduler, etcd, and kwok
#      fake nodes, which run pods as fakes);
#   2. `helm install` of deploy/helm/multigres-operator (CRDs, ServiceAccounts, RBAC, webhooks,
#      Deployments), with the webhooks registered on 127.0.0.1;
#   3. the four handlers as local processes, since kwok runs no containers: each with the
#      arguments of its Deployment and a token of the chart's ServiceAccount, so it works under
#      exactly the chart's RBAC;
#   4. a real etcd on loopback as the Multigres topology, and the sample
#      deploy/samples/external-topo.yaml pointed at it;
#   5. a live view of `kubectl get multigres` until the cluster is Available, then (on a
#      terminal) until Ctrl-C, with the command to inspect it yourself.
# With a reachable KUBECONFIG, the chart is installed into that cluster instead (image from
# DEMO_IMAGE=<repository>:<tag>, built from the Dockerfile) and deploy/samples/minimal.yaml is
# applied.
#
# In CI (CI=true) or without a terminal it never waits for Ctrl-C: it exits 0 once the cluster
# is Available and 1 after DEMO_TIMEOUT seconds (default 300).
#
# Environment: DEMO_NAMESPACE (default multigres-demo), DEMO_SAMPLE (another sample file),
# DEMO_TIMEOUT, DEMO_IMAGE, MULTIGRES_TOOLCHAIN_BIN (the control-plane binaries).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
release=multigres-operator
system=multigres-system
namespace=${DEMO_NAMESPACE:-multigres-demo}
timeout=${DEMO_TIMEOUT:-300}
chart=deploy/helm/multigres-operator
state=$(mktemp -d /tmp/multigres-demo.XXXXXX)
bin_dir=${MULTIGRES_TOOLCHAIN_BIN:-$(bash e2e/toolchain/build.sh)}
export PATH="$bin_dir:$PATH" NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
export HELM_CACHE_HOME="$state/helm/cache" HELM_CONFIG_HOME="$state/helm/config" HELM_DATA_HOME="$state/helm/data"
interactive=false
if [ -t 1 ] && [ "${CI:-}" != "true" ]; then interactive=true; fi
pids=()
local_cluster=
say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
fail() { printf '\033[31mdemo: %s\033[0m\n' "$*" >&2; exit 1; }

cleanup() {
  set +e
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  if [ -n "$local_cluster" ]; then
    say "stopping the local control plane"
    target/debug/local-cluster down --state-dir "$state/cluster" >/dev/null 2>&1
    wait "$local_cluster" 2>/dev/null
  fi
  echo "logs: $state"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free TCP port on 127.0.0.1.
free_port() {
  local port
  for _ in $(seq 1 100); do
    port=$((20000 + RANDOM % 30000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  fail "no free port on 127.0.0.1"
}

# Waits up to $1 seconds for the command "$@" (after the first argument) to succeed.
wait_for() {
  local seconds=$1
  shift
  for _ in $(seq 1 "$seconds"); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 1
  done
  return 1
}

# Whether every MultigresCluster in the namespace reports Available=True.
available() {
  local statuses
  statuses=$(kubectl get multigresclusters -n "$namespace" \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Available")].status}{" "}{end}')
  [ -n "$statuses" ] && [[ "$statuses" != *False* ]] && [[ "$statuses" != *Unknown* ]] &&
    [[ "$statuses" == *True* ]]
}

# The live view: the multigres tree and its workloads.
show() {
  echo "MultigresClusters and their children in $namespace ($(date +%T)):"
  kubectl get multigres -n "$namespace" 2>&1
  echo
  kubectl get statefulsets,deployments -n "$namespace" 2>&1
}

# Refreshes the view until the cluster is Available; returns 1 after the timeout.
watch_convergence() {
  local deadline=$((SECONDS + timeout))
  local converged=false
  while [ $SECONDS -lt $deadline ]; do
    # Checked before the view is drawn, so the last view shows the converged state.
    if available; then converged=true; fi
    if $interactive; then clear; fi
    show
    if $converged; then return 0; fi
    if $interactive; then sleep 2; else sleep 10; fi
  done
  return 1
}

# Starts one handler the way its Deployment would run it, as its ServiceAccount, on loopback.
start_handler() {
  local handler=$1 webhook_port=$2 server=$3 ca=$4 kubeconfig token args=()
  kubeconfig="$state/$handler.kubeconfig"
  token=$(kubectl create token "$release-$handler" -n "$system" --duration=24h)
  kubectl config --kubeconfig "$kubeconfig" set-cluster local --server "$server" \
    --certificate-authority "$ca" --embed-certs >/dev/null
  kubectl config --kubeconfig "$kubeconfig" set-credentials "$handler" --token "$token" >/dev/null
  kubectl config --kubeconfig "$kubeconfig" set-context local --cluster local --user "$handler" >/dev/null
  kubectl config --kubeconfig "$kubeconfig" use-context local >/dev/null
  while IFS= read -r arg; do
    case "$arg" in
      --grpc-bind-address=:* | --metrics-bind-address=:*) arg="${arg%%=*}=127.0.0.1:${arg##*:}" ;;
      --webhook-bind-address=*) arg="--webhook-bind-address=127.0.0.1:$webhook_port" ;;
      --log-format=*) arg="--log-format=text" ;;
    esac
    args+=("$arg")
  done < <(kubectl get deployment "$release-$handler" -n "$system" \
    -o jsonpath='{range .spec.template.spec.containers[0].args[*]}{@}{"\n"}{end}')
  POD_NAMESPACE=$system POD_NAME="$handler-local" \
    "target/debug/$handler" "${args[@]}" --kubeconfig "$kubeconfig" >"$state/$handler.log" 2>&1 &
  pids+=($!)
  echo "    $handler (pid $!): ${args[*]}"
}

say "building the operator"
cargo build -q -p cluster-handler -p resource-handler -p data-handler -p webhook-server -p multigres-e2e --bins

if [ -n "${KUBECONFIG:-}" ] && kubectl version --request-timeout=5s >/dev/null 2>&1; then
  say "installing the chart into the cluster in KUBECONFIG ($(kubectl config current-context 2>/dev/null || echo '?'))"
  image=()
  if [ -n "${DEMO_IMAGE:-}" ]; then
    image=(--set "image.repository=${DEMO_IMAGE%:*}" --set "image.tag=${DEMO_IMAGE##*:}")
  fi
  helm upgrade --install "$release" "$chart" -n "$system" --create-namespace --wait --timeout 10m \
    "${image[@]}" 2> >(grep -v 'found symbolic link' >&2)
  kubectl get deployments -n "$system"
  sample=${DEMO_SAMPLE:-deploy/samples/minimal.yaml}
  say "applying $sample to namespace $namespace"
  kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl apply -n "$namespace" --server-side -f "$sample"
else
  say "no reachable cluster in KUBECONFIG: starting the local control plane (logs in $state/cluster/logs)"
  # No CRDs from the harness: `helm install` creates them from the chart's crds/.
  mkdir -p "$state/cluster" "$state/no-crds"
  target/debug/local-cluster up --state-dir "$state/cluster" --crds "$state/no-crds" >"$state/local-cluster.log" 2>&1 &
  local_cluster=$!
  wait_for 300 test -f "$state/cluster/kubeconfig" || {
    tail -n 30 "$state/local-cluster.log"
    fail "the local control plane did not start"
  }
  export KUBECONFIG="$state/cluster/kubeconfig"
  kubectl get nodes

  webhook_port=$(free_port)
  say "helm install $release (webhooks on https://127.0.0.1:$webhook_port)"
  helm install "$release" "$chart" -n "$system" --create-namespace --wait --timeout 5m \
    --set "webhook.url=https://127.0.0.1:$webhook_port" \
    --set-json 'webhookServer.extraArgs=["--webhook-extra-sans=127.0.0.1"]' \
    2> >(grep -v 'found symbolic link' >&2)
  kubectl get deployments,serviceaccounts -n "$system"

  say "starting the four handlers as the chart's ServiceAccounts (logs in $state)"
  server=$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')
  ca=$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')
  start_handler webhook-server "$webhook_port" "$server" "$ca"
  caBundle() {
    [ -n "$(kubectl get mutatingwebhookconfiguration multigres-operator-mutating-webhook-configuration \
      -o jsonpath='{.webhooks[0].clientConfig.caBundle}')" ]
  }
  wait_for 60 caBundle || { tail -n 20 "$state/webhook-server.log"; fail "the webhook-server did not set its caBundle"; }
  for handler in cluster-handler resource-handler data-handler; do
    start_handler "$handler" "$webhook_port" "$server" "$ca"
  done
  sleep 2
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || { tail -n 20 "$state"/*-handler.log "$state/webhook-server.log"; fail "a handler exited"; }
  done

  topo_port=$(free_port)
  topo_peer=$(free_port)
  say "starting the Multigres topology: etcd on 127.0.0.1:$topo_port"
  etcd --name topo --data-dir "$state/topo" \
    --listen-client-urls "http://127.0.0.1:$topo_port" --advertise-client-urls "http://127.0.0.1:$topo_port" \
    --listen-peer-urls "http://127.0.0.1:$topo_peer" --initial-advertise-peer-urls "http://127.0.0.1:$topo_peer" \
    --initial-cluster "topo=http://127.0.0.1:$topo_peer" --log-level warn >"$state/topo-etcd.log" 2>&1 &
  pids+=($!)
  wait_for 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$topo_port" || fail "the topology etcd did not start"

  sample=${DEMO_SAMPLE:-deploy/samples/external-topo.yaml}
  say "applying $sample to namespace $namespace (topology endpoints -> 127.0.0.1:$topo_port)"
  kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  sed -E "s#http://[a-z0-9.-]+:2379#http://127.0.0.1:$topo_port#" "$sample" |
    kubectl apply -n "$namespace" --server-side -f -
fi

say "waiting for the cluster to converge (up to ${timeout}s)"
if ! watch_convergence; then
  kubectl describe multigresclusters -n "$namespace" | tail -n 30
  fail "not Available after ${timeout}s"
fi
say "converged: every MultigresCluster in $namespace is Available"
echo "Inspect it yourself:"
echo "  export KUBECONFIG=$KUBECONFIG"
echo "  kubectl get multigres -n $namespace"
echo "  kubectl describe multigrescluster -n $namespace"
if [ -n "$local_cluster" ]; then
  echo "  curl -s 127.0.0.1:8081/metrics   # cluster-handler (8082 resource, 8083 data, 8084 webhook)"
  echo "  handler logs: $state/*.log"
fi
if $interactive; then
  say "live view until Ctrl-C"
  trap 'exit 0' INT
  while true; do
    sleep 5
    clear
    show
    echo
    echo "KUBECONFIG=$KUBECONFIG   (Ctrl-C stops the demo)"
  done
fi
