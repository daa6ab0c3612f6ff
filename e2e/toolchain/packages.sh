#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need, if any is missing: protoc with the
# well-known types (our protos, etcd-client), iproute2 and util-linux (the test sandbox),
# containerd, runc, the CNI plugins, iptables and conntrack (real nodes), and what the
# data-plane images are built with (pgBackRest's meson build and libraries, jq, unzip), and
# Chromium, the real browser that loads the multiadmin web UI.
# Quiet and quick when everything is there.
set -euo pipefail

wanted=(
  protobuf-compiler libprotobuf-dev
  iproute2 util-linux mount
  containerd runc containernetworking-plugins iptables conntrack
  jq unzip dash gcc libc6-dev postgresql-client locales
  meson ninja-build pkg-config libssl-dev libxml2-dev liblz4-dev libzstd-dev libbz2-dev
  libyaml-dev zlib1g-dev libpq-dev
  chromium
)
missing=()
for pkg in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "packages.sh: missing Debian packages: ${missing[*]}; install them (apt-get install) or run as root" >&2
  exit 1
fi
echo "[packages] installing ${missing[*]}" >&2
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
