#!/usr/bin/env bash
# Whole sweeps, an older commit against this tree, in one session: for each sweep, the older commit's code runs it,
# then this tree's code, one after the other (so a machine whose speed drifts during the session slows both
# sides of a pair alike), each with --engine library on the default 2 workers, into runs folders of its own.
# A sweep can be cut to some of its seeds (SEEDS, e.g. "0"; a two-stage spec's selection seeds, e.g. "1"),
# by a copy of its spec with those seeds; the copies are written beside the specs as zz_ab_*.yaml and removed.
#
#   bash benchmarks/sweep_ab.sh OLD_COMMIT OUT "SWEEP[:SEEDS] ..."
#   bash benchmarks/sweep_ab.sh 74c5a63 /tmp/ab "hoffer_large:0 smith_le_large:0 steps_to_target_large:1"
#
# OUT gets runs_old/ and runs_new/ (the run directories), wall.csv (sweep, side, commit, seconds, exit status)
# and, from benchmarks/reproduce_cost.py, old/ and new/ with each side's run-seconds and spans per sweep.
# The older commit must accept the spec as this tree has it (its fields) and run on this environment's packages.
set -uo pipefail
old=${1:?usage: sweep_ab.sh OLD_COMMIT OUT "SWEEP[:SEEDS] ..."}
out=${2:?usage: sweep_ab.sh OLD_COMMIT OUT "SWEEP[:SEEDS] ..."}
sweeps=${3:?usage: sweep_ab.sh OLD_COMMIT OUT "SWEEP[:SEEDS] ..."}
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$here/.venv/bin/python}
mkdir -p "$out"
out=$(cd "$out" && pwd)
tree=$(mktemp -d)/old
git -C "$here" worktree add -q --detach "$tree" "$old" || exit 1
trap 'git -C "$here" worktree remove --force "$tree"; rm -f "$here"/experiments/zz_ab_*.yaml' EXIT
new=$(git -C "$here" rev-parse --short HEAD)
echo "sweep,side,commit,seconds,exit_status" > "$out/wall.csv"
names=()
for item in $sweeps; do
  name=${item%%:*}
  seeds=$([ "$item" != "$name" ] && echo "${item#*:}")
  names+=("$name")
  for side in old new; do
    root=$([ $side = old ] && echo "$tree" || echo "$here")
    spec=$root/experiments/$name.yaml
    if [ -n "$seeds" ]; then
      spec=$root/experiments/zz_ab_$name.yaml
      sed "s/^seeds: .*/seeds: [$seeds]/" "$root/experiments/$name.yaml" > "$spec"
    fi
    start=$(date +%s.%N)
    # the older side's package first on the path (the environment's editable install points at this tree)
    (cd "$root" && PYTHONPATH=$([ $side = old ] && echo "$tree") "$python" -m bsresearch sweep "$spec" \
       --engine library --quiet --runs "$out/runs_$side") > "$out/sweep_${side}_$name.log" 2>&1
    status=$?
    seconds=$(echo "$(date +%s.%N) - $start" | bc)
    commit=$([ $side = old ] && echo "$old" || echo "$new")
    echo "$name,$side,$commit,$seconds,$status" | tee -a "$out/wall.csv"
  done
done
for side in old new; do
  "$python" "$here/benchmarks/reproduce_cost.py" --runs "$out/runs_$side" --out-dir "$out/$side" "${names[@]}" \
    > /dev/null
done
