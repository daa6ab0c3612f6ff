# Shared by the scripts the resource-handler runs in the pgctld image (PostgreSQL, pgBackRest and
# dash, no coreutils): failing with a message Kubernetes keeps, and one S3 repository written as
# pgBackRest configuration. Every value comes from the environment and is only ever quoted,
# never parsed as shell.
set -eu
umask 077
dir=/var/lib/pooler
data=$dir/pg_data

# fail MESSAGE [STATUS]: ends the script with STATUS (1 by default); MESSAGE becomes the
# container's termination message, which the resource-handler quotes in the Shard's condition.
fail() {
  printf '%s\n' "$1" >/dev/termination-log
  printf '%s failed: %s\n' "$task" "$1" >&2
  exit "${2:-1}"
}

# The lines of $1 that carry pgBackRest's, PostgreSQL's or psql's verdict (all of $1 if none).
verdict() {
  found=
  while IFS= read -r line; do
    case $line in
      *ERROR*|*FATAL*|*PANIC*|*WARN*|*error*) found="$found${found:+ | }$line" ;;
    esac
  done <<EOF
$1
EOF
  printf '%s' "${found:-$1}"
}

# repo_conf FILE BUCKET REGION ENDPOINT KEY_PREFIX ENV_CREDENTIALS KEY SECRET: one S3
# repository as Multigres configures its own (go/common/backup/config.go): the stanza
# `multigres` under the key prefix, path-style and unverified TLS for a custom endpoint.
repo_conf() {
  file=$1 bucket=$2 region=$3 endpoint=$4 prefix=$5 env_credentials=$6 key=$7 secret=$8
  path=/multigres
  [ -z "$prefix" ] || path="/${prefix%/}/multigres"
  if [ "$env_credentials" = true ]; then
    key=${AWS_ACCESS_KEY_ID:-} secret=${AWS_SECRET_ACCESS_KEY:-}
  fi
  {
    printf '[global]\nlog-level-console=warn\nlog-level-file=off\nlock-path=%s/lock\n' "$dir"
    printf 'spool-path=%s/spool\ncompress-type=zst\nstart-fast=y\narchive-copy=y\nresume=n\n' "$dir"
    printf 'repo1-type=s3\nrepo1-path=%s\nrepo1-s3-bucket=%s\nrepo1-s3-region=%s\n' "$path" "$bucket" "$region"
    printf 'repo1-block=y\nrepo1-bundle=y\n'
    if [ -n "$endpoint" ]; then
      printf 'repo1-s3-endpoint=%s\nrepo1-s3-uri-style=path\nrepo1-storage-verify-tls=n\n' "$endpoint"
    else
      printf 'repo1-s3-endpoint=s3.%s.amazonaws.com\nrepo1-s3-uri-style=host\n' "$region"
    fi
    if [ -n "$key" ]; then
      printf 'repo1-s3-key-type=shared\nrepo1-s3-key=%s\nrepo1-s3-key-secret=%s\n' "$key" "$secret"
      if [ "$env_credentials" = true ] && [ -n "${AWS_SESSION_TOKEN:-}" ]; then
        printf 'repo1-s3-token=%s\n' "$AWS_SESSION_TOKEN"
      fi
    elif [ -n "${AWS_WEB_IDENTITY_TOKEN_FILE:-}" ]; then
      printf 'repo1-s3-key-type=web-id\n'
    else
      printf 'repo1-s3-key-type=auto\n'
    fi
    printf '[multigres]\npg1-path=%s\npg1-socket-path=%s\npg1-port=5432\n' "$data" "$dir"
    printf 'pg1-user=%s\npg1-database=postgres\n' "$POSTGRES_USER"
  } >"$file"
}

