# Shared by e2e/images/*.sh (sourced, not run): stage a root file system from host files and
# write it as a single-layer OCI image archive that `ctr -n k8s.io images import` loads.
#
# Why a hand-written OCI layout instead of umoci or buildah: the format needs only a layer tar,
# two JSON files and an index, all named by their sha256, so tar + sha256sum + jq are the whole
# builder; nothing to install, no storage driver, no user namespaces, and the output is
# byte-for-byte reproducible (sorted entries, fixed mtimes, numeric owners, no timestamps in the
# config), so an unchanged input gives an unchanged image digest.

cache_root=${MULTIGRES_TOOLCHAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multigres-operator}
images_dir=$cache_root/images

log() { echo "[images] $*" >&2; }

# Runs "$@" and logs how long it took (the step name is the first argument).
timed() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  log "$name: $((SECONDS - start)) s"
}

# Runs "$@" (a long build) with all its output in $images_dir/logs/<name>.log: one line says what
# runs, how long it usually takes and where its log is; on failure, the log's last lines.
quietly() {
  local name=$1 expected=$2 file
  shift 2
  mkdir -p "$images_dir/logs"
  file=$images_dir/logs/$name.log
  log "$name ($expected; log: $file)"
  if ! "$@" >"$file" 2>&1; then
    tail -n 40 "$file" >&2
    log "$name failed; its whole log: $file"
    return 1
  fi
}

# A fresh, empty root directory laid out like Debian 12 (merged /usr), so library paths that
# ldd prints as /lib/... or /lib64/... resolve inside the image as they do on the host.
new_root() {
  local root=$1
  rm -rf "$root"
  mkdir -p "$root"/usr/{bin,lib,lib64,sbin} "$root"/etc "$root"/tmp
  chmod 0755 "$root"
  chmod 1777 "$root"/tmp
  for d in bin lib lib64 sbin; do ln -s "usr/$d" "$root/$d"; done
}

# Copies a host file into the root at its canonical directory, following a symlink chain and
# copying every link of it, so sonames and the dynamic loader path keep working.
copy_host_file() {
  local root=$1 f=$2 dir target
  while :; do
    dir=$(realpath "$(dirname "$f")")
    mkdir -p "$root$dir"
    cp -P --preserve=mode "$f" "$root$dir/"
    [ -L "$f" ] || return 0
    target=$(readlink "$f")
    case $target in /*) f=$target ;; *) f=$dir/$target ;; esac
  done
}

# Copies the shared libraries (and the loader) that ldd names for each binary, once each,
# except those already under the root (libraries a bundle ships itself). Fails on any
# unresolved library.
copy_libs() {
  local root=$1 rroot lib
  shift
  rroot=$(realpath "$root")
  for bin in "$@"; do
    ldd_libs "$bin"
  done | sort -u | while read -r lib; do
    case $(realpath "$lib") in "$rroot"/*) continue ;; esac
    copy_host_file "$root" "$lib"
  done
}

# The library paths ldd prints for one binary (none for a static one).
ldd_libs() {
  local out
  out=$(ldd "$1" 2>&1) || { grep -q "not a dynamic executable" <<<"$out" && return 0; echo "$out" >&2; return 1; }
  if grep -q "not found" <<<"$out"; then
    echo "copy_libs: unresolved libraries of $1:" >&2
    grep "not found" <<<"$out" >&2
    return 1
  fi
  awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$out"
}

# Writes /etc/passwd and /etc/group: root plus one "name:uid:gid:home" per argument (the
# homes are created and owned by the user, as a base image's user would have it).
add_users() {
  local root=$1 name uid gid home
  shift
  printf 'root:x:0:0:root:/root:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\n' >"$root/etc/group"
  for u in "$@"; do
    IFS=: read -r name uid gid home <<<"$u"
    printf '%s:x:%s:%s:%s:%s:/sbin/nologin\n' "$name" "$uid" "$gid" "$name" "$home" >>"$root/etc/passwd"
    printf '%s:x:%s:\n' "$name" "$gid" >>"$root/etc/group"
    mkdir -p "$root$home"
    chown "$uid:$gid" "$root$home"
  done
}

# tar flags for reproducible archives: sorted, fixed mtime, numeric owners, no atime/ctime.
reproducible_tar() {
  tar --sort=name --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --mtime=@0 --numeric-owner "$@"
}

# put_blob FILE DIR: moves FILE into DIR named by its sha256; prints the sha256.
put_blob() {
  local sha
  sha=$(sha256sum "$1" | cut -d' ' -f1)
  mv "$1" "$2/$sha"
  echo "$sha"
}

# oci_archive ROOT CONFIG_JSON REF OUT: one uncompressed layer holding ROOT (owners as staged),
# CONFIG_JSON the image config's "config" object (User, Env, Entrypoint, ...). Uncompressed:
# the archives never leave the machine, and then the layer digest is its diff_id.
oci_archive() {
  local root=$1 config=$2 ref=$3 out=$4 layout blobs layer_sha layer_size cfg_sha man_sha
  layout=$(mktemp -d "${out%/*}/.layout.XXXXXX")
  blobs=$layout/blobs/sha256
  mkdir -p "$blobs"
  reproducible_tar -C "$root" -cf "$layout/layer" .
  layer_size=$(stat -c %s "$layout/layer")
  layer_sha=$(put_blob "$layout/layer" "$blobs")
  jq -cn --argjson config "$config" --arg diff "sha256:$layer_sha" \
    '{architecture: "amd64", os: "linux", config: $config, rootfs: {type: "layers", diff_ids: [$diff]}}' \
    >"$layout/config"
  cfg_sha=$(put_blob "$layout/config" "$blobs")
  jq -cn --arg cfg "sha256:$cfg_sha" --argjson cfgsize "$(stat -c %s "$blobs/$cfg_sha")" \
    --arg layer "sha256:$layer_sha" --argjson layersize "$layer_size" \
    '{schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cfg, size: $cfgsize},
      layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $layer, size: $layersize}]}' \
    >"$layout/manifest"
  man_sha=$(put_blob "$layout/manifest" "$blobs")
  echo '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  # ref.name holds the full reference: containerd keeps a reference that has a "/" or ":" as is
  # (a bare tag would be prefixed with "import-<date>").
  jq -cn --arg man "sha256:$man_sha" --argjson size "$(stat -c %s "$blobs/$man_sha")" --arg ref "$ref" \
    '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json",
      manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $man, size: $size,
        platform: {architecture: "amd64", os: "linux"},
        annotations: {"org.opencontainers.image.ref.name": $ref, "io.containerd.image.name": $ref}}]}' \
    >"$layout/index.json"
  # Written beside OUT under a name of its own, then renamed: readers never see half an
  # archive, and concurrent builders do not write into one file.
  local tmp_out
  tmp_out=$(mktemp "$out.XXXXXX")
  reproducible_tar --owner=0 --group=0 -C "$layout" -cf "$tmp_out" oci-layout index.json blobs
  chmod 0644 "$tmp_out"
  mv "$tmp_out" "$out"
  rm -rf "$layout"
}
