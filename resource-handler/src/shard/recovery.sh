# Seeds a new shard's own pgBackRest repository from another cluster's (backup.recovery):
# restores the source repository to the chosen moment into this pod's scratch volume, runs
# PostgreSQL alone until it promotes, and writes the result as the first backup of the shard's
# own repository. Every pool pod then restores that backup, as Multigres does for any shard
# whose repository already holds one (rpc_first_backup.go).
#
# Runs after pgbackrest.sh. PostgreSQL listens on no TCP address, only on a socket in this pod,
# and the source repository is only read: nothing below writes to it (restore and archive-get
# read; archive-push, stanza-create and backup name own.conf).
task=recovery
log=$dir/postgresql.log

# PostgreSQL's log so far.
server_log() {
  [ -f "$log" ] || return 0
  while IFS= read -r line; do printf '%s\n' "$line"; done <"$log"
}

# What `pgbackrest info` ($1) says the source holds: each backup with its end, and the WAL.
holdings() {
  backups= wal= label=
  while IFS= read -r line; do
    line=${line#"${line%%[! ]*}"}
    case $line in
      "wal archive min/max"*) wal=${line#*: } ;;
      *" backup: "*) label=${line#*backup: } ;;
      "timestamp start/stop: "*) backups="$backups${backups:+, }$label (ended ${line##* / })" ;;
    esac
  done <<EOF
$1
EOF
  printf 'backups %s; archived WAL %s' "${backups:-none}" "${wal:-none}"
}

repo_conf "$dir/source.conf" "$SOURCE_BUCKET" "$SOURCE_REGION" "${SOURCE_ENDPOINT:-}" \
  "${SOURCE_KEY_PREFIX:-}" "${SOURCE_ENV_CREDENTIALS:-}" "${SOURCE_KEY:-}" "${SOURCE_SECRET:-}"
repo_conf "$dir/own.conf" "$OWN_BUCKET" "$OWN_REGION" "${OWN_ENDPOINT:-}" \
  "${OWN_KEY_PREFIX:-}" "${OWN_ENV_CREDENTIALS:-}" "${OWN_KEY:-}" "${OWN_SECRET:-}"
source="--config=$dir/source.conf --stanza=multigres"
own="--config=$dir/own.conf --stanza=multigres"

# 1. The shard's own repository holds no backup: its pool pods would restore the newest one.
# One this shard's recovery wrote (annotated with its RECOVERY_ID: a Job made again after the
# first one's success went unseen) means the work is done.
out=$(pgbackrest $own info --output=json 2>&1) || fail "cannot read this shard's own repository ($OWN_DESC): $(verdict "$out")"
case $out in
  *"\"job_id\":\"$RECOVERY_ID\""*)
    printf '%s\n' "the recovery of this shard already wrote its first backup to $OWN_DESC"
    exit 0 ;;
  *'"label":'*) fail "this shard's own repository ($OWN_DESC) already holds backups, which its pool pods would restore instead of the recovered data; give spec.backup.s3.keyPrefix a prefix nothing is stored under" ;;
  *'"code":99'*|*'"code":4'*) fail "cannot read this shard's own repository ($OWN_DESC): $(verdict "$out")" ;;
esac

# 2. What the source holds, named in every message below.
info=$(pgbackrest $source info 2>&1) || fail "cannot read the recovery source ($SOURCE_DESC): $(verdict "$info")"
case $info in
  *"status: ok"*) ;;
  *) fail "the recovery source ($SOURCE_DESC) holds no backup to restore: $(verdict "$info")" ;;
esac
held=$(holdings "$info")

# 3. The source restored to the target, into the scratch volume.
case $RESTORE_TYPE in
  time) set -- --type=time "--target=$RESTORE_TARGET" --target-action=promote ;;
  lsn) set -- --type=lsn "--target=$RESTORE_TARGET" --target-action=promote ;;
  backup) set -- --type=immediate "--set=$RESTORE_TARGET" --target-action=promote ;;
  *) set -- --type=default ;;
esac
out=$(pgbackrest $source restore "$@" 2>&1) ||
  fail "restoring $SOURCE_DESC to $RESTORE_DESC failed: $(verdict "$out"); the source holds $held"

# 4. PostgreSQL alone on the restored data: no TCP listener (so no TLS and no certificate),
# trust only on this pod's socket, no streaming from the source's primary and no synchronous
# standby to wait for; WAL from the promotion on goes to the shard's own repository.
# The shard's own postgresql.conf (mounted from its ConfigMap) last, as its pool pods include it:
# they run as standbys of what this server writes, and refuse settings below its own.
[ ! -f "$EXTRA_CONF" ] || printf "include_if_exists '%s'\n" "$EXTRA_CONF" >>"$data/postgresql.conf"
printf 'local all all trust\nlocal replication all trust\n' >"$dir/pg_hba.conf"
options="-c listen_addresses= -c port=5432 -c unix_socket_directories=$dir"
options="$options -c hba_file=$dir/pg_hba.conf -c ssl=off -c logging_collector=off -c hot_standby=on"
options="$options -c primary_conninfo= -c primary_slot_name= -c synchronous_standby_names="
options="$options -c archive_mode=on -c archive_command='pgbackrest --config=$dir/own.conf --stanza=multigres archive-push %p'"
pg_ctl -D "$data" -l "$log" -w -t 86400 -o "$options" start >/dev/null 2>&1 ||
  fail "PostgreSQL stopped while recovering $SOURCE_DESC to $RESTORE_DESC: $(verdict "$(server_log)"); the source holds $held"

# 5. Recovery runs until it reaches the target and promotes (pg_sleep is the only sleep here).
psql="psql -X -q -h $dir -p 5432 -U $POSTGRES_USER -d postgres -v ON_ERROR_STOP=1"
tries=0
until [ "$($psql -Atc 'SELECT pg_is_in_recovery()' 2>/dev/null)" = f ]; do
  pg_ctl -D "$data" status >/dev/null 2>&1 ||
    fail "recovery of $SOURCE_DESC to $RESTORE_DESC did not reach it: $(verdict "$(server_log)"); the source holds $held"
  if ! out=$($psql -c 'SELECT pg_sleep(1)' 2>&1); then
    tries=$((tries + 1))
    [ "$tries" -lt 600 ] || fail "cannot wait for the promotion as $POSTGRES_USER: $(verdict "$out")"
  fi
done

# 6. The recovery settings out of postgresql.auto.conf, and this cluster's superuser password in
# (the restored roles are the source's).
password=
read -r password <"$PASSWORD_FILE" || [ -n "$password" ] || fail "cannot read the superuser password at $PASSWORD_FILE"
out=$(NEW_PASSWORD=$password $psql 2>&1 <<'SQL'
SET log_statement = 'none';
ALTER SYSTEM RESET restore_command;
ALTER SYSTEM RESET recovery_target;
ALTER SYSTEM RESET recovery_target_time;
ALTER SYSTEM RESET recovery_target_lsn;
ALTER SYSTEM RESET recovery_target_action;
\getenv password NEW_PASSWORD
\getenv superuser POSTGRES_USER
ALTER ROLE :"superuser" PASSWORD :'password';
SQL
) || fail "cannot set the superuser's password on the restored data: $(verdict "$out")"

# 7. The shard's own repository, and its first backup, annotated as Multigres annotates its
# own (go/services/multipooler/internal/manager/backup/backup.go).
out=$(pgbackrest $own stanza-create 2>&1) || fail "stanza-create in $OWN_DESC: $(verdict "$out")"
version=$($psql -Atc 'SHOW server_version' 2>/dev/null) || version=
set -- --type=full "--annotation=table_group=$TABLE_GROUP" "--annotation=shard=$SHARD" \
  "--annotation=multipooler_id=$JOB_NAME" --annotation=pooler_type=PRIMARY "--annotation=job_id=$RECOVERY_ID"
[ -z "$version" ] || set -- "$@" "--annotation=pg_version=$version"
out=$(pgbackrest $own backup "$@" 2>&1) || fail "the first backup in $OWN_DESC: $(verdict "$out")"
pg_ctl -D "$data" -m fast -w stop >/dev/null 2>&1 || fail "stopping PostgreSQL: $(verdict "$(server_log)")"
printf 'restored %s to %s and wrote it as the first backup of %s\n' "$SOURCE_DESC" "$RESTORE_DESC" "$OWN_DESC"
