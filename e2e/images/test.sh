#!/usr/bin/env bash
# Checks the image archives the way the real-node tests use them: imports each into a
# throwaway containerd (own root, state and socket under a temp dir; runc), reads the config
# back from containerd's content store, and runs each image's binaries with `ctr run` as the
# user the operator's pods use. The operator image is also compared with the Dockerfile, read
# here independently of operator.sh's parser. Builds what is missing first. Needs root.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

mapfile -t images < <(bash "$here/operator.sh" | tail -n1; bash "$here/build.sh")

tmp=$(mktemp -d /tmp/images-test.XXXXXX)
sock=$tmp/containerd.sock
cat >"$tmp/config.toml" <<EOF
version = 2
root = "$tmp/root"
state = "$tmp/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$tmp/opt"
EOF
containerd --config "$tmp/config.toml" >"$tmp/containerd.log" 2>&1 &
containerd_pid=$!
cleanup() {
  kill "$containerd_pid" 2>/dev/null && wait "$containerd_pid" || true
  # containerd 1.6 puts shim sockets in /run/containerd/s whatever its state dir: drop the
  # directory if this run created it and nothing else uses it.
  rmdir /run/containerd/s /run/containerd 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
for _ in $(seq 50); do ctr -a "$sock" version >/dev/null 2>&1 && break; sleep 0.2; done

c() { ctr -a "$sock" -n k8s.io "$@"; }
passed=0
failed=0
check() {
  local name=$1
  shift
  if "$@" >"$tmp/out" 2>&1; then
    passed=$((passed + 1))
    echo "ok    $name"
  else
    failed=$((failed + 1))
    echo "FAIL  $name"
    sed 's/^/      /' "$tmp/out"
  fi
}
# The image config of REF, from containerd's content store.
image_config() {
  local manifest
  manifest=$(c images ls | awk -v r="$1" '$1 == r {print $3}')
  c content get "$(c content get "$manifest" | jq -r .config.digest)" | jq -c .config
}
# run REF ARGS...: runs ARGS in a new container of REF as the image's user, then removes it.
run_n=0
run() {
  local ref=$1
  run_n=$((run_n + 1))
  shift
  c run --rm --fifo-dir "$tmp/fifo" --runc-root "$tmp/runc" "$ref" "check-$run_n" "$@"
}
# The image reference built for NAME (localhost/multigres/NAME:...).
ref_of() { printf '%s\n' "${images[@]}" | grep -o "^localhost/multigres/$1:[^ ]*"; }
expect() { [ "$1" = "$2" ] || { echo "want: $2"; echo "got:  $1"; return 1; }; }

for line in "${images[@]}"; do
  read -r ref path <<<"$line"
  check "import $ref ($path)" c images import "$path"
  check "listed $ref" bash -c "ctr -a '$sock' -n k8s.io images ls -q | grep -qx '$ref'"
done

# The operator image against the Dockerfile's final stage.
op=localhost/multigres-operator:dev
final=$(awk '/^FROM /{buf=""} {buf=buf $0 "\n"} END {printf "%s", buf}' "$repo/Dockerfile")
cfg=$(image_config "$op")
check "operator: USER as the Dockerfile" expect "$(jq -r .User <<<"$cfg")" "$(sed -n 's/^USER //p' <<<"$final")"
check "operator: ENTRYPOINT as the Dockerfile" expect "$(jq -c .Entrypoint <<<"$cfg")" "$(sed -n 's/^ENTRYPOINT //p' <<<"$final" | jq -c .)"
check "operator: EXPOSE as the Dockerfile" expect "$(jq -r '.ExposedPorts | keys[] | rtrimstr("/tcp")' <<<"$cfg" | sort)" \
  "$(sed -n 's/^EXPOSE //p' <<<"$final" | tr ' ' '\n' | sort)"
check "operator: LABEL keys as the Dockerfile" expect "$(jq -r '.Labels | keys[]' <<<"$cfg" | sort)" \
  "$(grep -o 'org\.opencontainers\.image\.[a-z]*=' <<<"$final" | tr -d = | sort)"
dest=$(sed -n 's|^COPY --from=build /out/ \(.*\)$|\1|p' <<<"$final")
for handler in $(grep -o 'for handler in [^;]*' "$repo/Dockerfile" | cut -d' ' -f4-); do
  check "operator: $dest$handler --help as $(jq -r .User <<<"$cfg")" run "$op" "$dest$handler" --help
done

# multigres: the binaries the resource-handler calls (/multigres/bin/<name>) and pgBackRest
# (multipooler runs backups), as the image's user (ctr 1.6 run has no --user; build.sh also
# runs them as 999, multipooler's user in pool pods).
mg=$(ref_of multigres)
for b in multigateway multiorch multiadmin multipooler; do
  check "multigres: /multigres/bin/$b --help" run "$mg" /multigres/bin/$b --help
done
check "multigres: pgbackrest version" run "$mg" pgbackrest version

# pgctld: pgctld and a real PostgreSQL: initdb, start, query, stop, as postgres (999).
pg=$(ref_of pgctld)
check "pgctld: /usr/local/bin/pgctld --help" run "$pg" /usr/local/bin/pgctld --help
check "pgctld: pgbackrest version" run "$pg" pgbackrest version
check "pgctld: initdb, pg_ctl start, psql, pg_isready, pg_controldata" run "$pg" /bin/sh -ec '
  initdb -D /tmp/pg -U postgres --data-checksums >/dev/null
  pg_ctl -D /tmp/pg -o "-k /tmp -c listen_addresses=" -w start >/dev/null
  pg_isready -h /tmp
  psql -h /tmp -U postgres -tAc "select version(), current_setting(\$\$server_encoding\$\$), current_user"
  pg_ctl -D /tmp/pg -w stop >/dev/null
  pg_controldata /tmp/pg | while read -r line; do case $line in *"cluster state"*) echo "$line" ;; esac; done'
sed 's/^/      /' "$tmp/out"

# multiadmin-web: the standalone Next.js server starts as the image's user (1001) and serves
# the pooler page (its table is filled in the browser, from multiadmin's API).
check "multiadmin-web: node server.js serves /dashboard/multipoolers" run "$(ref_of multiadmin-web)" node -e '
  process.env.HOSTNAME = "127.0.0.1";
  require("/app/server.js");
  setTimeout(async () => {
    const answer = await fetch("http://127.0.0.1:18100/dashboard/multipoolers");
    const page = await answer.text();
    console.log(answer.status, page.includes("<title>Multigres - Admin UI</title>"));
    process.exit(answer.status === 200 && page.includes("<title>Multigres - Admin UI</title>") ? 0 : 1);
  }, 3000);'

# etcd and pause.
check "etcd: /usr/local/bin/etcd --version" run "$(ref_of etcd)" /usr/local/bin/etcd --version
pause_runs_until_term() {
  c run -d --fifo-dir "$tmp/fifo" --runc-root "$tmp/runc" "$(ref_of pause)" check-pause
  sleep 1
  c task ls | grep -q '^check-pause .*RUNNING'
  c task kill -s TERM check-pause
  for _ in $(seq 20); do c task ls | grep -q '^check-pause .*STOPPED' && break; sleep 0.2; done
  c task ls | grep -q '^check-pause .*STOPPED'
  c task rm check-pause
  c containers rm check-pause
}
check "pause: runs until SIGTERM" pause_runs_until_term

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
