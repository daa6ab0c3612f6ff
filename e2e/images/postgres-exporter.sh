#!/usr/bin/env bash
# The postgres_exporter image that pool pods run beside PostgreSQL (resource-handler's
# `postgres-exporter` container): the upstream Go module, built with CGO off into a static
# binary, on an otherwise empty root like the upstream image (ENTRYPOINT the binary, port 9187,
# user nobody). Tagged with the reference the operator's default names
# (api/src/resolver/defaults.rs: POSTGRES_EXPORTER_IMAGE), so nodes that import it need no
# registry. A script of its own, not a part of build.sh: build.sh's hash keys every image, and
# this one should not rebuild them. Cached per version and per this script and lib.sh.
# Prints "<ref> <archive>" as its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=e2e/images/lib.sh
source "$here/lib.sh"

# The newest version the Go module proxy serves here (v0.18 is refused).
VERSION=v0.17.1
MODULE=github.com/prometheus-community/postgres_exporter
NOBODY=65534
ref=quay.io/prometheuscommunity/postgres-exporter:$VERSION
recipe=$(cat "$here/postgres-exporter.sh" "$here/lib.sh" | sha256sum | cut -c1-12)
out=$images_dir/postgres-exporter-$VERSION-$recipe.tar

[ "$(id -u)" = 0 ] || { echo "postgres-exporter.sh: run as root (layer file owners, chroot check)" >&2; exit 1; }
mkdir -p "$images_dir"
exec 9>"$images_dir/.postgres-exporter.lock"
flock 9

# `go install module@version` consults the deprecation endpoint, which is refused here: a
# throwaway module requiring the exporter builds it from the module cache instead.
build() {
  local mod=$1 bin=$2
  mkdir -p "$mod"
  printf 'module local/pgexp\n\ngo 1.24\n\nrequire %s %s\n' "$MODULE" "$VERSION" >"$mod/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s/cmd/postgres_exporter"\n' "$MODULE" >"$mod/tools.go"
  (cd "$mod" && go mod tidy -e && CGO_ENABLED=0 go build -trimpath \
    -ldflags "-X github.com/prometheus/common/version.Version=${VERSION#v}" -o "$bin" "$MODULE/cmd/postgres_exporter")
}

if [ ! -f "$out" ]; then
  work=$images_dir/work/postgres-exporter
  rm -rf "$work"
  mkdir -p "$work"
  quietly postgres-exporter-build "about 30 s with a warm module cache" build "$work/mod" "$work/postgres_exporter"
  root=$work/root
  new_root "$root"
  cp "$work/postgres_exporter" "$root/usr/bin/postgres_exporter"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:%s:%s:nobody:/nonexistent:/sbin/nologin\n' $NOBODY $NOBODY >"$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:%s:\n' $NOBODY >"$root/etc/group"
  chroot --userspec=$NOBODY:$NOBODY "$root" /usr/bin/postgres_exporter --version 2>&1 | grep -q "version ${VERSION#v} " \
    || { echo "postgres-exporter.sh: the built binary is not $VERSION" >&2; exit 1; }
  timed "postgres-exporter: archive" oci_archive "$root" "$(jq -cn \
    '{User: "65534:65534", Entrypoint: ["/usr/bin/postgres_exporter"], ExposedPorts: {"9187/tcp": {}},
      Labels: {"org.opencontainers.image.source": "https://github.com/prometheus-community/postgres_exporter",
               "org.opencontainers.image.licenses": "Apache-2.0"}}')" "$ref" "$out"
  rm -rf "$work"
  find "$images_dir" -maxdepth 1 -name 'postgres-exporter-*.tar' ! -path "$out" -delete
fi
echo "$ref $out"
