#!/usr/bin/env bash
# `just demo`: install the operator with its Helm chart and watch a sample cluster converge.
#
# Without KUBECONFIG (or when it points nowhere), everything runs on this machine, inside the
# sandbox of e2e/sandbox.sh (private network, mount and PID namespaces):
#   1. the images, built without Docker or a registry: the operator's (`just image`) and the
#      data plane's (e2e/images/build.sh: etcd, multigres, pgctld with PostgreSQL 17);
#   2. the real local control plane with three real nodes (kubelet, containerd, runc, CNI,
#      kube-proxy, CoreDNS; one per zone), the images imported into every node;
#   3. `helm install` of deploy/helm/multigres-operator with that image: the four handlers run as
#      real pods under the chart's ServiceAccounts, the webhook is reached through its Service;
#   4. deploy/samples/minimal.yaml (a managed 3-member etcd topology and one cell), with
#      `spec.images` pointing at the local data-plane images;
#   5. a live view of `kubectl get multigres` until the cluster is Available, then a SQL query
#      answered through multigateway, the kubectl plugin's status screen
#      (`kubectl multigres status`, kubectl-multigres/) and how to connect; on a terminal the
#      view stays until Ctrl-C, with the command to enter the sandbox and inspect it yourself.
# With a reachable KUBECONFIG, the chart is installed into that cluster instead (image from
# DEMO_IMAGE=<repository>:<tag>, built from the Dockerfile) and deploy/samples/minimal.yaml is
# applied.
#
# In CI (CI=true) or without a terminal it never waits for Ctrl-C: it exits 0 once the cluster
# is Available and every step after that (SQL, the web UI, the plugin) passed, and 1 after
# DEMO_TIMEOUT seconds (default 600) or when a step failed. On a terminal a failed step is
# reported and the cluster stays up for inspection until Ctrl-C.
#
# Environment: DEMO_NAMESPACE (default multigres-demo), DEMO_SAMPLE (another sample file),
# DEMO_TIMEOUT, DEMO_IMAGE, MULTIGRES_TOOLCHAIN_BIN (the control-plane binaries),
# MULTIGRES_OPERATOR_PROFILE (the cargo profile of the local operator image, default release;
# CI passes dev, the profile its tests build anyway).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
release=multigres-operator
system=multigres-system
namespace=${DEMO_NAMESPACE:-multigres-demo}
timeout=${DEMO_TIMEOUT:-600}
chart=deploy/helm/multigres-operator
target=${CARGO_TARGET_DIR:-$repo/target}
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

# On success the state directory goes (a stopped local cluster leaves about 750 MB of node
# roots and images there); after a failure it stays, with its logs.
cleanup() {
  local status=$?
  set +e
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  if [ -n "$local_cluster" ]; then
    say "stopping the local control plane"
    "$target/debug/local-cluster" down --state-dir "$state/cluster" >/dev/null 2>&1
    wait "$local_cluster" 2>/dev/null
  fi
  if [ "$status" -eq 0 ]; then
    rm -rf "$state"
  else
    echo "logs: $state"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

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

# Answers `$1` (SQL) through the first cluster's multigateway Service with psql, as a client in
# the cluster's network would (the sandbox routes Service IPs): prints the result.
query() {
  local cluster svc ip secret key password
  cluster=$(kubectl get multigresclusters -n "$namespace" -o jsonpath='{.items[0].metadata.name}')
  svc=$cluster-multigateway
  ip=$(kubectl get service -n "$namespace" "$svc" -o jsonpath='{.spec.clusterIP}')
  secret=$(kubectl get multigrescluster -n "$namespace" "$cluster" -o jsonpath='{.spec.postgresPasswordSecretRef.name}')
  key=$(kubectl get multigrescluster -n "$namespace" "$cluster" -o jsonpath='{.spec.postgresPasswordSecretRef.key}')
  password=$(kubectl get secret -n "$namespace" "$secret" -o jsonpath="{.data.${key:-password}}" | base64 -d)
  # Over TLS, the gateway verified against the CA the operator publishes (plaintext only for a
  # sample that turns client TLS off).
  local target="host=$ip sslmode=disable"
  if kubectl get configmap -n "$namespace" "$cluster-gateway-ca" -o jsonpath='{.data.ca\.crt}' \
    >"$state/gateway-ca.crt" 2>/dev/null && [ -s "$state/gateway-ca.crt" ]; then
    target="host=$svc.$namespace.svc hostaddr=$ip sslmode=verify-full sslrootcert=$state/gateway-ca.crt"
  fi
  PGPASSWORD=$password PGCONNECT_TIMEOUT=5 psql -X -A -t -P pager=off \
    "$target port=5432 user=postgres dbname=postgres" -c "$1"
}

# Loads the first cluster's multiadmin web UI (its pooler page) in headless Chromium through
# its Service, once its pod is Ready, and saves a screenshot whose path it prints.
web_ui_screenshot() {
  local cluster ip shot
  cluster=$(kubectl get multigresclusters -n "$namespace" -o jsonpath='{.items[0].metadata.name}')
  if ! command -v chromium >/dev/null; then
    echo "(no chromium here: apt-get install chromium, to see the web UI from the demo)"
    return 0
  fi
  if ! kubectl rollout status -n "$namespace" "deployment/$cluster-multiadmin-web" --timeout=180s >/dev/null; then
    echo "the web UI's pod is not Ready: kubectl describe pods -n $namespace -l app.kubernetes.io/component=multiadmin-web"
    return 0
  fi
  ip=$(kubectl get service -n "$namespace" "$cluster-multiadmin-web" -o jsonpath='{.spec.clusterIP}')
  shot=$target/demo/multiadmin-web.png
  mkdir -p "${shot%/*}"
  say "the multiadmin web UI, http://$ip:18100/dashboard/multipoolers, in headless Chromium"
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --no-proxy-server \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$state/chromium" --virtual-time-budget=15000 --window-size=1600,900 \
    --screenshot="$shot" "http://$ip:18100/dashboard/multipoolers" >/dev/null 2>&1 &&
    echo "screenshot of its pooler page: $shot"
}

# Builds every binary the demo runs, whatever target/ already holds: the local control plane's
# launcher (the local case only) and the kubectl plugin. Two cargo invocations, because
# `--bin local-cluster` would limit every package named with it to that one binary. The plugin
# is put in $state/bin, which the demo's PATH and the shell it offers both lead with, so
# `kubectl multigres ...` works as it will for a user who ran `just plugin`.
build_binaries() {
  if [ "${1:-}" = local ]; then cargo build -q -p multigres-e2e --bin local-cluster; fi
  cargo build -q -p kubectl-multigres --bin kubectl-multigres
}

# Puts the plugin where `kubectl multigres` finds it ($state/bin, first on PATH).
install_plugin() {
  mkdir -p "$state/bin"
  install -m 0755 "$target/debug/kubectl-multigres" "$state/bin/kubectl-multigres"
  export PATH="$state/bin:$PATH"
}

# Steps after convergence that failed, in order: they are reported and, on a terminal, the
# cluster stays up for inspection; in CI the demo exits 1 after the last step.
failed_steps=()

# Runs "$@" (after the description in $1) as a step after convergence: a failure is reported
# and remembered, never fatal on its own.
step() {
  local description=$1
  shift
  if ! "$@"; then
    printf '\033[31mdemo: step failed: %s\033[0m\n' "$description" >&2
    failed_steps+=("$description")
  fi
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


if [ -n "${KUBECONFIG:-}" ] && kubectl version --request-timeout=5s >/dev/null 2>&1; then
  say "installing the chart into the cluster in KUBECONFIG ($(kubectl config current-context 2>/dev/null || echo '?'))"
  image=()
  if [ -n "${DEMO_IMAGE:-}" ]; then
    image=(--set "image.repository=${DEMO_IMAGE%:*}" --set "image.tag=${DEMO_IMAGE##*:}")
  fi
  build_binaries
  helm upgrade --install "$release" "$chart" -n "$system" --create-namespace --wait --timeout 10m \
    "${image[@]}" 2> >(grep -v 'found symbolic link' >&2)
  kubectl get deployments -n "$system"
  sample=${DEMO_SAMPLE:-deploy/samples/minimal.yaml}
  say "applying $sample to namespace $namespace"
  kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl apply -n "$namespace" --server-side -f "$sample"
elif [ "${MULTIGRES_E2E_SANDBOX:-}" != 1 ]; then
  say "no reachable cluster in KUBECONFIG: building the images (cached in ~/.cache/multigres-operator)"
  echo "[demo] building the local control plane's launcher and kubectl-multigres (first time: a few minutes)" >&2
  build_binaries local
  mkdir -p "$target/images"
  MULTIGRES_TOOLCHAIN_BIN=$bin_dir bash e2e/images/build.sh >"$target/images/demo-list"
  bash e2e/images/operator.sh | tail -n 1 >>"$target/images/demo-list"
  bash e2e/images/postgres-exporter.sh | tail -n 1 >>"$target/images/demo-list"
  say "entering the sandbox (private network, mount and PID namespaces)"
  trap - EXIT
  rm -rf "$state"
  exec env MULTIGRES_IMAGES="$target/images/demo-list" bash e2e/sandbox.sh bash "$0"
else
  image() { grep -m1 "^$1" "$MULTIGRES_IMAGES" | cut -d' ' -f1; }
  say "starting the local control plane with three real nodes (logs in $state/cluster/logs)"
  # No CRDs from the harness: `helm install` creates them from the chart's crds/.
  mkdir -p "$state/cluster" "$state/no-crds"
  "$target/debug/local-cluster" up --real-nodes --prometheus --state-dir "$state/cluster" --crds "$state/no-crds" \
    >"$state/local-cluster.log" 2>&1 &
  local_cluster=$!
  wait_for 600 test -f "$state/cluster/kubeconfig" || {
    tail -n 30 "$state/local-cluster.log"
    fail "the local control plane did not start"
  }
  export KUBECONFIG="$state/cluster/kubeconfig"
  prometheus=$(sed -n 's|^Prometheus ready at \([^,]*\),.*|\1|p' "$state/local-cluster.log")
  kubectl get nodes -o wide

  operator=$(image localhost/multigres-operator:)
  say "helm install $release with the image $operator"
  helm install "$release" "$chart" -n "$system" --create-namespace --wait --timeout 5m \
    --set "image.repository=${operator%:*}" --set "image.tag=${operator##*:}" --set image.pullPolicy=Never \
    2> >(grep -v 'found symbolic link' >&2)
  kubectl get pods -n "$system" -o wide

  sample=${DEMO_SAMPLE:-deploy/samples/minimal.yaml}
  say "applying $sample to namespace $namespace, with the local data-plane images"
  kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl create --dry-run=client -o json -n "$namespace" -f "$sample" |
    jq --arg etcd "$(image localhost/multigres/etcd:)" --arg multigres "$(image localhost/multigres/multigres:)" \
      --arg pgctld "$(image localhost/multigres/pgctld:)" --arg web "$(image localhost/multigres/multiadmin-web:)" \
      --arg otlp "$prometheus/api/v1/otlp" '
      (if .kind == "List" then .items else [.] end)[] |
      if .kind == "MultigresCluster" then
        .spec.observability = {otlpEndpoint: $otlp, otlpProtocol: "http/protobuf", metricsExporter: "otlp"}
        | .spec.images = {imagePullPolicy: "Never", multigateway: $multigres, multiorch: $multigres,
                        multipooler: $multigres, multiadmin: $multigres, postgres: $pgctld,
                        multiadminWeb: $web}
        | if (.spec.globalTopoServer // {} | has("external") or has("templateRef")) then .
          else .spec.globalTopoServer.etcd.image = $etcd end
      elif .kind == "CoreTemplate" and .spec.globalTopoServer.etcd != null then
        .spec.globalTopoServer.etcd.image = $etcd
      else . end' |
    kubectl apply -n "$namespace" --server-side -f -
fi

install_plugin
say "waiting for the cluster to converge (up to ${timeout}s)"
if ! watch_convergence; then
  kubectl describe multigresclusters -n "$namespace" | tail -n 30
  fail "not Available after ${timeout}s"
fi
say "converged: every MultigresCluster in $namespace is Available"
cluster=$(kubectl get multigresclusters -n "$namespace" -o jsonpath='{.items[0].metadata.name}')
gateway=$cluster-multigateway
secret=$(kubectl get multigresclusters -n "$namespace" -o jsonpath='{.items[0].spec.postgresPasswordSecretRef.name}')
# Answers SQL through the gateway within 180 s, and prints the server's version.
sql_through_the_gateway() {
  if ! wait_for 180 query 'select 1'; then
    echo "the cluster is Available but the gateway does not answer SQL: $(query 'select 1' 2>&1 | head -n 1)" >&2
    return 1
  fi
  query "select 'answered by ' || version()"
  if [ -s "$state/gateway-ca.crt" ]; then
    echo "(over TLS: sslmode=verify-full against the CA in ConfigMap $cluster-gateway-ca)"
  fi
}
if [ -n "$local_cluster" ]; then
  say "SQL through the multigateway Service (psql to its ClusterIP)"
  step "SQL through the multigateway Service" sql_through_the_gateway
  step "the multiadmin web UI in headless Chromium" web_ui_screenshot
fi
say "the kubectl plugin: kubectl multigres status $cluster -n $namespace"
step "kubectl multigres status" kubectl multigres status "$cluster" -n "$namespace"

# How to reach the cluster: every command works when pasted into the shell named first (the
# sandbox's, for the local control plane; any shell with this KUBECONFIG otherwise).
instructions() {
  local gateway_ip web_ip
  if [ -n "$local_cluster" ]; then
    gateway_ip=$(kubectl get service -n "$namespace" "$gateway" -o jsonpath='{.spec.clusterIP}' 2>/dev/null || true)
    web_ip=$(kubectl get service -n "$namespace" "$cluster-multiadmin-web" -o jsonpath='{.spec.clusterIP}' 2>/dev/null || true)
    echo "The cluster runs in a sandbox. Enter it from another terminal (as root); every command below works there:"
    echo "  nsenter --target \$(pgrep -o -f 'local-cluster up --real-nodes') --net --mount \\"
    echo "    env PATH=$state/bin:$bin_dir:\$PATH KUBECONFIG=$KUBECONFIG bash"
  else
    echo "With KUBECONFIG=$KUBECONFIG (the plugin: \`just plugin\` installs kubectl-multigres into ~/.cargo/bin):"
  fi
  echo "  kubectl multigres status $cluster -n $namespace"
  echo "  kubectl multigres psql $cluster -n $namespace -- -c 'select 1'   # psql through a port-forward to the gateway"
  echo "  kubectl multigres switchover $cluster -n $namespace --wait"
  echo "  kubectl get multigres -n $namespace"
  echo "  kubectl -n $system logs deploy/$release-cluster-handler           # and the other handlers"
  echo "psql as the superuser (user postgres, the password in Secret $secret):"
  echo "  export PGPASSWORD=\$(kubectl -n $namespace get secret $secret -o jsonpath='{.data.password}' | base64 -d)"
  if [ -n "$local_cluster" ]; then
    echo "  psql -h $gateway_ip -p 5432 -U postgres postgres                  # the gateway Service's ClusterIP"
    echo "  kubectl -n $namespace get configmap $cluster-gateway-ca -o jsonpath='{.data.ca\\.crt}' > /tmp/gateway-ca.crt"
    echo "  psql \"host=$gateway.$namespace.svc hostaddr=$gateway_ip sslmode=verify-full sslrootcert=/tmp/gateway-ca.crt user=postgres dbname=postgres\"   # TLS, the gateway verified"
  fi
  echo "  kubectl -n $namespace port-forward svc/$gateway 15432:5432 >/dev/null &"
  echo "  psql -h 127.0.0.1 -p 15432 -U postgres postgres"
  echo "  (from a pod in the cluster: psql -h $gateway.$namespace.svc -p 5432 -U postgres postgres)"
  echo "The multiadmin web UI (Service $cluster-multiadmin-web, port 18100):"
  if [ -n "$local_cluster" ]; then
    echo "  curl -sL -o /dev/null -w '%{http_code} %{url_effective}\\n' http://$web_ip:18100/dashboard   # the UI answers (it redirects)"
    echo "  in this machine's browser: bridge a local port into the sandbox (as root, outside it; needs socat),"
    echo "  then open http://127.0.0.1:18100/dashboard"
    echo "    socat TCP-LISTEN:18100,bind=127.0.0.1,fork,reuseaddr \\"
    echo "      EXEC:\"nsenter --target \$(pgrep -o -f 'local-cluster up --real-nodes') --net socat STDIO TCP:$web_ip:18100\""
    echo "Prometheus ($prometheus) scrapes the handlers as the chart's ServiceMonitor says, evaluates the"
    echo "chart's alerts and receives the data plane's metrics over OTLP; it answers the queries of the"
    echo "Grafana dashboards in deploy/dashboards/:"
    echo "  curl -s '$prometheus/api/v1/query?query=multigres_operator_shard_primaries'   # serving primaries per shard"
    echo "  curl -s '$prometheus/api/v1/alerts'                                             # alerts pending or firing"
  else
    echo "  kubectl -n $namespace port-forward svc/$cluster-multiadmin-web 18100:18100 >/dev/null &"
    echo "  then open http://127.0.0.1:18100/dashboard"
  fi
}
echo
instructions
if [ ${#failed_steps[@]} -gt 0 ]; then
  printf '\033[31mdemo: %d step(s) failed after convergence: %s\033[0m\n' "${#failed_steps[@]}" "$(IFS=';'; echo "${failed_steps[*]}")" >&2
fi
if $interactive; then
  if [ ${#failed_steps[@]} -gt 0 ]; then
    say "the cluster stays up for inspection; live view until Ctrl-C"
  else
    say "live view until Ctrl-C"
  fi
  trap 'exit 0' INT
  while true; do
    sleep 5
    clear
    show
    echo
    instructions
    if [ ${#failed_steps[@]} -gt 0 ]; then echo "failed after convergence: ${failed_steps[*]}"; fi
    echo "(Ctrl-C stops the demo)"
  done
fi
[ ${#failed_steps[@]} -eq 0 ]
