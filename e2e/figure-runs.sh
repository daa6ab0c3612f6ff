#!/usr/bin/env bash
# Runs one real-node story (a test file of e2e/tests) N times and prints, for every `[figure]`
# line, its value in each run, the median and the maximum: for data_plane.rs the failed
# statements and the longest gap of a failover, a switchover asked for by a person, a rollout
# and a scale-down; for zones.rs a zone's loss and return. Figures are observations, not
# assertions (docs/reliability.md).
#
# Usage: e2e/figure-runs.sh TEST [N]   (default 5); logs in target/TEST-runs/.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
test=$1
runs=${2:-5}
out=target/$test-runs
mkdir -p "$out"
rm -f "$out"/run-*.log
for i in $(seq 1 "$runs"); do
  echo "run $i of $runs" >&2
  status=0
  bash e2e/run-e2e.sh --test "$test" -- --nocapture >"$out/run-$i.log" 2>&1 || status=$?
  grep -E '^test result' "$out/run-$i.log" >&2 || echo "run $i: no test result (exit $status)" >&2
done
# One row per figure: the first number of each run's value, then median and maximum.
cat "$out"/run-*.log | grep -E '^\[figure\]' | sed 's/^\[figure\] //' | awk -F': ' '
  { name = $1; value = $2; sub(/ .*/, "", value); if (value == "none") value = "-";
    if (!(name in seen)) { seen[name] = 1; order[++n] = name }
    values[name] = values[name] " " value }
  END {
    for (k = 1; k <= n; k++) {
      name = order[k]; count = split(values[name], v, " "); m = 0
      for (i = 1; i <= count; i++) if (v[i] != "-") nums[++m] = v[i] + 0
      for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (nums[j] < nums[i]) { t = nums[i]; nums[i] = nums[j]; nums[j] = t }
      median = m == 0 ? "-" : (m % 2 ? nums[(m + 1) / 2] : (nums[m / 2] + nums[m / 2 + 1]) / 2)
      printf "%s: runs%s; median %s; max %s\n", name, values[name], median, m == 0 ? "-" : nums[m]
      delete nums
    }
  }'
