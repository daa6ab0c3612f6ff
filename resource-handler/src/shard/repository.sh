# Marks a shard's own pgBackRest repository as its cluster's, or finds that it is: the object
# `owner` at the repository's root (next to Multigres's archive/ and backup/ trees) holds
# OWNER, the cluster's namespace and name and the UID of the Kubernetes cluster's kube-system
# namespace. A repository marked by another cluster, in this Kubernetes cluster or another,
# ends the script with status 3, which fails the Job at once (its podFailurePolicy): no pool
# pod of this shard starts, so nothing of it is restored from or written to that repository.
# Other failures (the bucket unreachable, keys refused) end it with status 1 and are tried
# again by the Job. The marker is only ever written where none is.
#
# Runs after pgbackrest.sh, with only the repository's settings; PostgreSQL is not started.
task="marking $OWN_DESC"
repo_conf "$dir/own.conf" "$OWN_BUCKET" "$OWN_REGION" "${OWN_ENDPOINT:-}" \
  "${OWN_KEY_PREFIX:-}" "${OWN_ENV_CREDENTIALS:-}" "${OWN_KEY:-}" "${OWN_SECRET:-}"
own="--config=$dir/own.conf"

# The marker as stored: exit status 1 with no output is pgBackRest's "missing" (with
# --ignore-missing); anything else is a failure to read.
read_marker() {
  status=0
  marker=$(pgbackrest $own repo-get --raw --ignore-missing owner 2>&1) || status=$?
  case $status in
    0) ;;
    1) [ -z "$marker" ] || fail "cannot read the owner of $OWN_DESC: $(verdict "$marker")" ;;
    *) fail "cannot read the owner of $OWN_DESC: $(verdict "$marker")" ;;
  esac
  return "$status"
}

owned_elsewhere() {
  fail "$OWN_DESC belongs to another cluster (its marker says: $1), not to $OWNER. A repository holds one cluster's backups: give this cluster a spec.backup.s3.keyPrefix nothing is stored under, or recover from that repository into this one with backup.recovery.source. If that cluster and its Kubernetes cluster are gone for good and this cluster takes its repository over, delete the object owner under that path in the bucket, then the failed Job" 3
}

if read_marker; then
  [ "$marker" = "$OWNER" ] || owned_elsewhere "$marker"
  printf '%s already belongs to %s\n' "$OWN_DESC" "$OWNER"
  exit 0
fi
out=$(printf '%s\n' "$OWNER" | pgbackrest $own repo-put --raw owner 2>&1) ||
  fail "cannot write the owner of $OWN_DESC: $(verdict "$out")"
# Read back: of two clusters that found no marker at the same moment, the one whose marker
# was overwritten finds the other's and stops here.
read_marker || fail "the owner of $OWN_DESC is missing right after it was written"
[ "$marker" = "$OWNER" ] || owned_elsewhere "$marker"
printf '%s now belongs to %s\n' "$OWN_DESC" "$OWNER"
