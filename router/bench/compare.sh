#!/usr/bin/env bash
# The router benchmark's closed-loop table for this tree and for another commit, runs
# alternating: `make bench-router-compare REF=HEAD~1 ARGS=--stream [ROUNDS=3]`
# (or `PY=venv/bin/python ROUNDS=3 router/bench/compare.sh REF [router_bench args...]`).
#
# Why: on a shared VM the CPU per turn of one tree drifts by 20 % and more from one run to the
# next (the engines' CPU per turn drifts with it: the machine, not the code), more than a small
# change moves it. Runs alternating in one sitting see the same drift; compare their medians.
# The order flips each round: the second run of a pair tends to find the machine a little
# slower (the engines' CPU per turn, the same code in both, shows it).
#
# REF is checked out in a temporary git worktree. Each run puts its tree's router first on
# PYTHONPATH (ahead of the editable install, which points at whichever checkout last ran
# `make`); the harness and fake engines are this tree's. Nothing is installed: the worktree
# never goes through `make`, which would re-point the cached venv at it.
set -euo pipefail
ref=${1:?usage: compare.sh REF [router_bench args...]}
shift
rounds=${ROUNDS:-3}
py=${PY:?PY: the dev venv python (make sets it)}
here=$(git rev-parse --show-toplevel)
base=$(mktemp -d)
rows=$(mktemp)
trap 'rm -f "$rows"; git -C "$here" worktree remove --force "$base" >/dev/null 2>&1 || rm -rf "$base"' EXIT
git -C "$here" worktree add --detach --force "$base" "$ref" >/dev/null
harness="$here/router/tests:$here/router/bench:$here/e2e"
echo "this tree ($(git -C "$here" rev-parse --short HEAD)$(git -C "$here" diff --quiet || echo +changes)) against $ref ($(git -C "$base" rev-parse --short HEAD)), $rounds rounds"
echo "| round | tree | load before | conversations | router turns/s | router CPU ms/turn | engines CPU ms/turn |"
echo "|---|---|---|---|---|---|---|"
for round in $(seq 1 "$rounds"); do
  order=("$ref" this)
  [ $((round % 2)) = 1 ] || order=(this "$ref")  # ABBA: neither tree always runs second
  for tree in "${order[@]}"; do
    path="$here/router/src:$harness"
    [ "$tree" = this ] || path="$base/router/src:$harness"
    load=$(cut -d' ' -f1 /proc/loadavg)
    PYTHONPATH=$path "$py" -m router_bench --saturation-only --no-memory "$@" 2>&1 |
      awk -F'|' -v r="$round" -v t="$tree" -v l="$load" \
        '/^\| [0-9]/ {printf "| %s | %s | %s |%s|%s|%s|%s|\n", r, t, l, $2, $7, $8, $9}
         /rror|FAIL/ {print}' | tee -a "$rows"
  done
done
echo
echo "Medians over the rounds (compare_summary.py):"
PYTHONPATH=$harness "$py" -m compare_summary <"$rows"
