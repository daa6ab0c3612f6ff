#!/usr/bin/env bash
# The previous operator version's image, for the upgrade test (e2e/tests/upgrade.rs): the commit
# named in e2e/images/previous-operator, its tree exported with `git archive` and built by that
# commit's own e2e/images/operator.sh (test profile) in a cargo target directory of its own (two
# source trees sharing one target directory would take each other's artifacts for fresh).
# Cached per machine and commit: only a cold machine builds it (5-15 minutes on 2 cores). Its
# chart and CRDs stay beside the archive, in src/. Prints "<ref> <archive>" as its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
commit=$(grep -v '^#' "$here/previous-operator" | head -n 1)
[[ $commit =~ ^[0-9a-f]{40}$ ]] || { echo "previous-operator.sh: no commit in $here/previous-operator" >&2; exit 1; }
git -C "$repo" cat-file -e "$commit^{commit}" 2>/dev/null ||
  { echo "previous-operator.sh: commit $commit is not in this clone (a shallow clone?); fetch it" >&2; exit 1; }
cache=${MULTIGRES_TOOLCHAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multigres-operator}/previous-operator
dir=$cache/$commit
ref=localhost/multigres-operator-previous:${commit:0:12}
if [ ! -f "$dir/ready" ]; then
  rm -rf "$dir"
  mkdir -p "$dir/src"
  git -C "$repo" archive "$commit" | tar -x -C "$dir/src"
  echo "previous-operator.sh: building the operator of $commit (first time on this machine: 5-15 minutes)" >&2
  built=$(MULTIGRES_OPERATOR_IMAGE=$ref MULTIGRES_OPERATOR_PROFILE=dev CARGO_TARGET_DIR=$cache/target \
    bash "$dir/src/e2e/images/operator.sh" | tail -n 1)
  mv "${built#* }" "$dir/operator.tar"
  # Other commits' builds go: one previous version is kept.
  find "$cache" -mindepth 1 -maxdepth 1 -type d -name '[0-9a-f]*' ! -path "$dir" -exec rm -rf {} +
  touch "$dir/ready"
fi
echo "$ref $dir/operator.tar"
