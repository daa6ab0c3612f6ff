#!/usr/bin/env bash
# Builds the real control-plane binaries (kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, etcd, kwok, helm), the real-node binaries (kubelet, kube-proxy, CoreDNS,
# kube-network-policies as `netpol` (NetworkPolicy enforcement, wrapped in ./netpol), Versity's
# S3 gateway `versitygw` as the S3 server of backups), cert-manager's controller (issues the gateway certificates
# of spec.issuerName; ./cert-manager), Prometheus's promtool (checks and unit-tests the chart's
# alerts) and Prometheus itself (scrapes the handlers, receives the data plane's OTLP metrics and
# evaluates the alerts in the real-node tier) from the Go module proxy into a cache outside the
# repository, keyed by version, so a machine builds them once. Prints the binary directory on stdout.
set -euo pipefail

KUBE_VERSION=v1.36.2
ETCD_VERSION=v3.6.14
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.21.4
COREDNS_VERSION=v1.15.0
PROMETHEUS_VERSION=v0.316.0

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${MULTIGRES_TOOLCHAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multigres-operator}
bin="$cache_root/k8s-$KUBE_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION/bin"
k8s_cmds=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
wanted=("${k8s_cmds[@]}" etcd kwok helm coredns)
# promtool and prometheus live in directories of their own version, linked into $bin, so a new
# version rebuilds them alone and not the control plane.
promtool_dir="$cache_root/promtool-$PROMETHEUS_VERSION"
prometheus_dir="$cache_root/prometheus-$PROMETHEUS_VERSION"
# versitygw, likewise, at the version its wrapper module pins (read from versitygw/go.mod, so
# the pin lives in one place).
VERSITYGW_VERSION=$(awk '$1 == "github.com/versity/versitygw" { print $2 }' "$here/versitygw/go.mod")
versitygw_dir="$cache_root/versitygw-$VERSITYGW_VERSION"
# netpol and cert-manager are our own wrappers: keyed by their sources, so a change to them
# rebuilds them.
source_key() { cat "$here/$1"/main.go "$here/$1"/go.mod "$here/$1"/go.sum | sha256sum | cut -c1-16; }
netpol_dir="$cache_root/netpol-$(source_key netpol)"
cert_manager_dir="$cache_root/cert-manager-$(source_key cert-manager)"

missing=()
for b in "${wanted[@]}"; do [ -x "$bin/$b" ] || missing+=("$b"); done
[ -x "$promtool_dir/promtool" ] && [ "$(readlink "$bin/promtool")" = "$promtool_dir/promtool" ] ||
  missing+=(promtool)
[ -x "$prometheus_dir/prometheus" ] && [ "$(readlink "$bin/prometheus")" = "$prometheus_dir/prometheus" ] ||
  missing+=(prometheus)
[ -x "$versitygw_dir/versitygw" ] && [ "$(readlink "$bin/versitygw")" = "$versitygw_dir/versitygw" ] ||
  missing+=(versitygw)
[ -x "$netpol_dir/netpol" ] && [ "$(readlink "$bin/netpol")" = "$netpol_dir/netpol" ] || missing+=(netpol)
[ -x "$cert_manager_dir/cert-manager" ] && [ -d "$cert_manager_dir/crds" ] &&
  [ "$(readlink "$bin/cert-manager")" = "$cert_manager_dir/cert-manager" ] || missing+=(cert-manager)
stages="$bin/../kwok-stages"
if [ ${#missing[@]} -eq 0 ] && [ -d "$stages" ]; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "build.sh: Go >= 1.26.7 is required to build the toolchain (promtool needs it)" >&2; exit 1; }
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$bin"
log() { echo "[toolchain] $*" >&2; }
# One build at a time per cache: test runs, helpers and the demo may start together, and two
# Kubernetes builds side by side take twice the CPU for the same binaries. A later caller
# waits here and builds only what is still missing.
exec 9>"$bin/../.build.lock"
if ! flock -n 9; then
  log "another build of this toolchain is running; waiting for it"
  flock 9
fi
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)

k8s_missing=()
for cmd in "${k8s_cmds[@]}"; do [ -x "$bin/$cmd" ] || k8s_missing+=("k8s.io/kubernetes/cmd/$cmd"); done
if [ ${#k8s_missing[@]} -gt 0 ]; then
  # One module and one go build for all of them: the kubelet shares most packages with the
  # control plane, and a separate module would resolve some dependencies differently.
  log "building Kubernetes $KUBE_VERSION: ${k8s_missing[*]##*/} (first time on this machine: about 5 minutes on 2 cores)"
  minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
  ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
  done
  (cd "$here/kubernetes" && go build -trimpath -ldflags "all=$ldflags -s -w" -o "$bin/" "${k8s_missing[@]}")
fi
if [ ! -x "$bin/etcd" ]; then
  log "building etcd $ETCD_VERSION"
  (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
fi
if [ ! -x "$bin/kwok" ]; then
  log "building kwok $KWOK_VERSION"
  (cd "$here/kwok" && go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
    -o "$bin/kwok" sigs.k8s.io/kwok/cmd/kwok)
fi
if [ ! -x "$bin/helm" ]; then
  log "building helm $HELM_VERSION"
  (cd "$here/helm" && go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    -o "$bin/helm" helm.sh/helm/v3/cmd/helm)
fi
if [ ! -x "$bin/coredns" ]; then
  log "building CoreDNS $COREDNS_VERSION"
  (cd "$here/coredns" && go build -trimpath -ldflags "-s -w" -o "$bin/coredns" github.com/coredns/coredns)
fi
if [ ! -x "$netpol_dir/netpol" ]; then
  log "building kube-network-policies (netpol, about a minute)"
  mkdir -p "$netpol_dir"
  (cd "$here/netpol" && go build -trimpath -ldflags "-s -w" -o "$netpol_dir/netpol.tmp" .)
  mv "$netpol_dir/netpol.tmp" "$netpol_dir/netpol"
fi
ln -sfn "$netpol_dir/netpol" "$bin/netpol"
if [ ! -x "$cert_manager_dir/cert-manager" ] || [ ! -d "$cert_manager_dir/crds" ]; then
  # Its CRDs ship in the module; a copy beside the binary (crds/) lets the tests install them.
  log "building cert-manager's controller (about a minute)"
  mkdir -p "$cert_manager_dir"
  (cd "$here/cert-manager" && go build -trimpath -ldflags "-s -w" -o "$cert_manager_dir/cert-manager.tmp" .)
  src=$(cd "$here/cert-manager" && go list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)
  rm -rf "$cert_manager_dir/crds"
  cp -r "$src/deploy/crds" "$cert_manager_dir/crds"
  chmod -R u+w "$cert_manager_dir/crds"
  mv "$cert_manager_dir/cert-manager.tmp" "$cert_manager_dir/cert-manager"
fi
ln -sfn "$cert_manager_dir/cert-manager" "$bin/cert-manager"
if [ ! -x "$versitygw_dir/versitygw" ]; then
  log "building versitygw $VERSITYGW_VERSION (about a minute)"
  mkdir -p "$versitygw_dir"
  (cd "$here/versitygw" && go build -trimpath -ldflags "-s -w -X main.Version=$VERSITYGW_VERSION" \
    -o "$versitygw_dir/versitygw.tmp" github.com/versity/versitygw/cmd/versitygw)
  mv "$versitygw_dir/versitygw.tmp" "$versitygw_dir/versitygw"
fi
ln -sfn "$versitygw_dir/versitygw" "$bin/versitygw"
if [ ! -x "$promtool_dir/promtool" ]; then
  # Without the service-discovery plugins (remove_all_sd): rule checks and rule unit tests need
  # none, and leaving out their cloud SDKs makes the build about a fifth smaller.
  mkdir -p "$promtool_dir"
  log "building promtool $PROMETHEUS_VERSION (first time on this machine: about a minute; log in $promtool_dir/build.log)"
  (cd "$here/prometheus" && go build -trimpath -tags remove_all_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}" \
    -o "$promtool_dir/promtool.tmp" github.com/prometheus/prometheus/cmd/promtool) >"$promtool_dir/build.log" 2>&1 ||
    { tail -n 20 "$promtool_dir/build.log" >&2; log "building promtool failed; full log in $promtool_dir/build.log"; exit 1; }
  mv "$promtool_dir/promtool.tmp" "$promtool_dir/promtool"
fi
ln -sfn "$promtool_dir/promtool" "$bin/promtool"
if [ ! -x "$prometheus_dir/prometheus" ]; then
  # Kubernetes service discovery only (the tests find the handlers' metrics Services as a
  # ServiceMonitor would); the web UI's assets are not embedded (builtinassets): the tests use
  # the HTTP API, which needs none.
  mkdir -p "$prometheus_dir"
  log "building Prometheus $PROMETHEUS_VERSION (first time on this machine: about a minute after promtool; log in $prometheus_dir/build.log)"
  (cd "$here/prometheus" && go build -trimpath -tags remove_all_sd,enable_kubernetes_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}" \
    -o "$prometheus_dir/prometheus.tmp" github.com/prometheus/prometheus/cmd/prometheus) >"$prometheus_dir/build.log" 2>&1 ||
    { tail -n 20 "$prometheus_dir/build.log" >&2; log "building Prometheus failed; full log in $prometheus_dir/build.log"; exit 1; }
  mv "$prometheus_dir/prometheus.tmp" "$prometheus_dir/prometheus"
fi
ln -sfn "$prometheus_dir/prometheus" "$bin/prometheus"
# kwok's stage files ship in its module; keep a copy beside the binaries so the harness needs no Go.
if [ ! -d "$stages" ]; then
  src=$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
  mkdir -p "$stages"
  cp -r "$src/kustomize/stage/." "$stages/"
  chmod -R u+w "$stages"
fi
echo "$bin"
