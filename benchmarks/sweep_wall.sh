#!/usr/bin/env bash
# Whole sweeps timed as `make reproduce` runs them: the code of one commit (a worktree of it, so edits in this
# tree do not leak in), each sweep in turn with --engine library on the default 2 workers, into a runs folder
# of its own. A sweep can be cut to some of its seeds (SWEEP:SEEDS, e.g. hoffer_large:0; a two-stage spec's
# selection seeds, e.g. steps_to_target_large:1) by a copy of its spec with those seeds, written beside the
# specs in the worktree. With UNTIL (any date `date -d` reads, e.g. UNTIL=09:35), no sweep starts after it and
# the one running then is stopped as Ctrl-C stops it (its finished runs stay; wall.csv says which).
#
#   bash benchmarks/sweep_wall.sh OUT "SWEEP[:SEEDS] ..." [COMMIT]
#   UNTIL=09:35 bash benchmarks/sweep_wall.sh /tmp/rw "keskar hoffer goyal"
#
# OUT gets runs/ (the run directories), sweep_NAME.log, wall.csv (sweep, commit, seconds, exit_status; 130 or
# 124 = stopped at UNTIL, not_started = after it) appended to if present, and, from
# benchmarks/reproduce_cost.py, cost/ with the runs' own seconds and spans per sweep (its table, like
# reproduce_cost_<machine>.csv). COMMIT (default HEAD) must accept the specs as it has them and run on this
# environment's packages; its package comes first on the path (the environment's editable install points here).
set -uo pipefail
out=${1:?usage: sweep_wall.sh OUT "SWEEP[:SEEDS] ..." [COMMIT]}
sweeps=${2:?usage: sweep_wall.sh OUT "SWEEP[:SEEDS] ..." [COMMIT]}
here=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$here" rev-parse --short "${3:-HEAD}") || exit 1
python=${PYTHON:-$here/.venv/bin/python}
deadline=""
if [ -n "${UNTIL:-}" ]; then
  deadline=$(date -d "$UNTIL" +%s 2>/dev/null) || { echo "error: UNTIL=$UNTIL is not a time date -d reads (e.g. 09:35, '+2 hours')"; exit 2; }
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
tree=$(mktemp -d)/tree
git -C "$here" worktree add -q --detach "$tree" "$commit" || exit 1
trap 'git -C "$here" worktree remove --force "$tree"' EXIT
[ -f "$out/wall.csv" ] || echo "sweep,commit,seconds,exit_status" > "$out/wall.csv"
for item in $sweeps; do
  name=${item%%:*}
  spec=$tree/experiments/$name.yaml
  if [ "$item" != "$name" ]; then
    spec=$tree/experiments/zz_cut_$name.yaml
    sed "s/^seeds: .*/seeds: [${item#*:}]/" "$tree/experiments/$name.yaml" > "$spec"
  fi
  limit=()
  if [ -n "$deadline" ]; then
    left=$((deadline - $(date +%s)))
    if [ $left -le 0 ]; then echo "$name,$commit,,not_started" | tee -a "$out/wall.csv"; continue; fi
    limit=(timeout -s INT "$left")
  fi
  start=$(date +%s.%N)
  (cd "$tree" && PYTHONPATH=$tree "${limit[@]}" "$python" -m bsresearch sweep "$spec" --engine library --quiet \
     --runs "$out/runs") > "$out/sweep_$name.log" 2>&1
  status=$?
  echo "$name,$commit,$(echo "$(date +%s.%N) - $start" | bc),$status" | tee -a "$out/wall.csv"
done
# every sweep this OUT has timed, this call's and earlier ones' (those not started have no runs)
mapfile -t names < <(tail -n +2 "$out/wall.csv" | grep -v ",not_started$" | cut -d, -f1 | sort -u)
"$python" "$here/benchmarks/reproduce_cost.py" --runs "$out/runs" --out-dir "$out/cost" "${names[@]}" > /dev/null
