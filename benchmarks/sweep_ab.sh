#!/usr/bin/env bash
# Whole sweeps, an older commit against this tree's HEAD, in one session: for each sweep, the older commit's
# code runs it, then HEAD's, one after the other (so a machine whose speed drifts during the session slows both
# sides of a pair alike), each as benchmarks/sweep_wall.sh runs it (--engine library on the default 2 workers,
# a worktree of the commit, a runs folder per side; SWEEP:SEEDS cuts a sweep to some of its seeds).
#
#   bash benchmarks/sweep_ab.sh OLD_COMMIT OUT "SWEEP[:SEEDS] ..."
#   bash benchmarks/sweep_ab.sh 74c5a63 /tmp/ab "hoffer_large:0 smith_le_large:0 steps_to_target_large:1"
#
# OUT gets old/ and new/, each as sweep_wall.sh leaves its OUT: runs/, wall.csv (sweep, commit, seconds, exit
# status) and cost/ (reproduce_cost.py's run-seconds and spans per sweep).
set -uo pipefail
old=${1:?usage: sweep_ab.sh OLD_COMMIT OUT "SWEEP[:SEEDS] ..."}
out=${2:?usage: sweep_ab.sh OLD_COMMIT OUT "SWEEP[:SEEDS] ..."}
sweeps=${3:?usage: sweep_ab.sh OLD_COMMIT OUT "SWEEP[:SEEDS] ..."}
here=$(cd "$(dirname "$0")" && pwd)
for item in $sweeps; do
  bash "$here/sweep_wall.sh" "$out/old" "$item" "$old" || exit 1
  bash "$here/sweep_wall.sh" "$out/new" "$item" HEAD || exit 1
done
