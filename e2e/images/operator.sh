#!/usr/bin/env bash
# `just image`: the operator's image without Docker, as an OCI archive in target/images/.
# The Dockerfile stays the one description of the image: this script reads its final stage
# (LABEL, COPY destination, USER, EXPOSE, ENTRYPOINT/CMD) and its build stage (the cargo
# packages and the binaries copied to /out/), and refuses any instruction it does not know, so
# the two cannot drift apart silently. Only the base differs: gcr.io/distroless/cc-debian12
# cannot be pulled here, so its part is made from host files — the glibc/libgcc files ldd names
# for the binaries (with the loader at its usual path), CA certificates, /etc/passwd and
# /etc/group with nonroot (65532), /tmp and /home/nonroot — and its config (PATH,
# SSL_CERT_FILE, WORKDIR) is written below. Prints "<ref> <archive>" as its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=e2e/images/lib.sh
source "$here/lib.sh"

ref=${MULTIGRES_OPERATOR_IMAGE:-localhost/multigres-operator:dev}
dockerfile=$repo/Dockerfile
target=${CARGO_TARGET_DIR:-$repo/target}
out_dir=$target/images
out=$out_dir/operator.tar
BASE=gcr.io/distroless/cc-debian12:nonroot
# The config that base image carries (distroless: nonroot user and its home, the CA bundle).
base_config='{"User":"65532","WorkingDir":"/home/nonroot","Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"]}'

fail() { echo "operator.sh: $*" >&2; exit 1; }

# Logical lines of a Dockerfile: comment lines dropped, continuation lines joined.
logical_lines() {
  sed '/^[[:space:]]*#/d' "$1" | sed -e ':a' -e '/\\$/{N; s/\\\n/ /; ta}' | sed '/^[[:space:]]*$/d'
}

mapfile -t lines < <(logical_lines "$dockerfile")
final=-1
for i in "${!lines[@]}"; do [[ ${lines[i]} =~ ^FROM[[:space:]] ]] && final=$i; done
[ "$final" -ge 0 ] || fail "no FROM in $dockerfile"
read -r _ from <<<"${lines[final]}"
[ "$from" = "$BASE" ] || fail "final stage is FROM $from; this script stands in for $BASE only"

# Build stage: the packages built and the binaries copied to /out/.
build_run=$(printf '%s\n' "${lines[@]:0:final}" | grep -m1 'cargo build' || true)
[[ $build_run =~ for\ handler\ in\ ([a-z0-9 -]+)\; ]] || fail "no 'for handler in ...;' in the build stage"
read -ra binaries <<<"${BASH_REMATCH[1]}"
mapfile -t packages < <(grep -o -- '-p [a-z][a-z0-9-]*' <<<"$build_run" | cut -d' ' -f2)
[ ${#packages[@]} -gt 0 ] || fail "no 'cargo build -p ...' in the build stage"

# Final stage, instruction by instruction.
config=$base_config
dest=
for line in "${lines[@]:final+1}"; do
  read -r instr rest <<<"$line"
  case ${instr^^} in
    LABEL)
      while [[ $rest =~ ^[[:space:]]*([^=[:space:]]+)=\"([^\"]*)\"(.*)$ ]]; do
        config=$(jq -c --arg k "${BASH_REMATCH[1]}" --arg v "${BASH_REMATCH[2]}" '.Labels[$k] = $v' <<<"$config")
        rest=${BASH_REMATCH[3]}
      done
      [[ $rest =~ ^[[:space:]]*$ ]] || fail "LABEL: cannot read '$rest' (key=\"value\" pairs only)"
      ;;
    COPY)
      [[ $rest =~ ^--from=build[[:space:]]+/out/[[:space:]]+(/[^[:space:]]*)$ ]] \
        || fail "COPY: only 'COPY --from=build /out/ <dir>' is understood, not '$rest'"
      dest=${BASH_REMATCH[1]%/}
      ;;
    USER) config=$(jq -c --arg u "$rest" '.User = $u' <<<"$config") ;;
    EXPOSE)
      for port in $rest; do
        [[ $port == */* ]] || port=$port/tcp
        config=$(jq -c --arg p "$port" '.ExposedPorts[$p] = {}' <<<"$config")
      done
      ;;
    ENTRYPOINT | CMD)
      key=$([ "${instr^^}" = CMD ] && echo Cmd || echo Entrypoint)
      config=$(jq -c --arg k "$key" --argjson v "$rest" \
        'if ($v | type) == "array" then .[$k] = $v else error("exec form only") end' <<<"$config") \
        || fail "$instr: only the JSON (exec) form is understood"
      ;;
    *) fail "the final stage has '$instr', which this script does not reproduce: teach it" ;;
  esac
done
[ -n "$dest" ] || fail "the final stage copies no binaries"

start=$SECONDS
# The Dockerfile's release build; MULTIGRES_OPERATOR_PROFILE=dev packs the test profile's
# binaries instead (the e2e run, which builds them anyway: a release build would double its
# compile time).
profile=${MULTIGRES_OPERATOR_PROFILE:-release}
profile_dir=$profile
[ "$profile" = dev ] && profile_dir=debug
quietly "operator-cargo-build-$profile" "cargo build --profile $profile, first time: 5-15 minutes" \
  env -C "$repo" cargo build --profile "$profile" --locked "${packages[@]/#/--package=}"
log "operator: cargo build --profile $profile: $((SECONDS - start)) s"

start=$SECONDS
mkdir -p "$out_dir"
# A staging root of this run's own: other runs (tests, the demo) may build at the same time.
root=$(mktemp -d "$out_dir/.root.XXXXXX")
trap 'rm -rf "$root"' EXIT
new_root "$root"
mkdir -p "$root$dest"
for b in "${binaries[@]}"; do install -m 0755 "$target/$profile_dir/$b" "$root$dest/$b"; done
# The test profile's binaries carry symbols and line tables: 394 of the image's 398 MB, which
# every real node of every real-node test file imports (containerd and ctr took 500 s of CPU in
# one e2e run, the largest share after the API servers). The image's copies are stripped to
# 180 MB (a panic's message still names its file and line; a backtrace loses its names); the
# binaries in target/, which the kwok tier runs, keep everything.
[ "$profile" = dev ] && strip "${binaries[@]/#/$root$dest/}"
copy_libs "$root" "${binaries[@]/#/$root$dest/}"
copy_host_file "$root" /etc/ssl/certs/ca-certificates.crt
add_users "$root" nonroot:65532:65532:/home/nonroot
# Smoke test in the staged root as the image's user: every binary loads with only its files.
user=$(jq -r .User <<<"$config")
for b in "${binaries[@]}"; do
  chroot --userspec="$user" "$root" "$dest/$b" --help >/dev/null || fail "$dest/$b --help failed in the image"
done
oci_archive "$root" "$config" "$ref" "$out"
log "operator: image: $((SECONDS - start)) s"
echo "$ref $out"
