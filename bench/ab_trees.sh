#!/bin/bash
# Same-run A/B of this tree against an older commit: the lookup, catch-up and export benches run
# from each tree in turn (the order flips every round, which cancels the drift of a shared host's
# load), then one table of each figure per side and the ratio of the means.
#
#   bench/ab_trees.sh 09f03af 4        # base commit, rounds (default 2)
#   BENCHES=export EXPORT_ARGS="--partitions 4 --mib 64 --repeat 1 --no-spark" bench/ab_trees.sh 09f03af 4
#   BENCHES=kafka bench/ab_trees.sh main 4     # the Kafka listener's catch-up (KAFKA_ARGS)
#
# The base tree is a temporary `git worktree` of BASE sharing this checkout's venv and compiled
# decoder (the decoder's C sources must be the same in both trees: it says so when not).
set -eu
BASE_REV=$1; ROUNDS=${2:-2}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$HERE/.venv/bin/python}
BASE=$(mktemp -d /tmp/rlm-ab-XXXXXX)
LOG=$(mktemp /tmp/rlm-ab-XXXXXX.log)
trap 'git -C "$HERE" worktree remove --force "$BASE"' EXIT
git -C "$HERE" worktree add -q --detach "$BASE" "$BASE_REV"
if ! git -C "$HERE" diff --quiet "$BASE_REV" HEAD -- 'rlm/formats/records/*.c' 'rlm/formats/records/*.h'; then
  echo "the decoder's sources differ between $BASE_REV and HEAD: build the base tree's first" >&2; exit 2
fi
cp "$HERE"/rlm/formats/records/*.so "$BASE"/rlm/formats/records/
export AWS_DEFAULT_REGION=us-east-1
for round in $(seq 1 "$ROUNDS"); do
  order="base new"; [ $((round % 2)) = 0 ] && order="new base"
  for side in $order; do
    T=$BASE; [ "$side" = new ] && T=$HERE
    cd "$T"
    for bench in ${BENCHES:-lookup catchup export}; do
      echo "=== round $round $side $bench $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> "$LOG"
      case $bench in
        lookup) args="--no-record --lookups 200 --http-requests 2000" ;;
        catchup) args="--segments 4 --segment-mib 16 --rounds 1 --no-record" ;;
        export) args=${EXPORT_ARGS:-"--partitions 4 --mib 16 --repeat 1 --no-spark"} ;;
        kafka) args=${KAFKA_ARGS:-"--segments 2 --segment-mib 16 --rounds 1 --no-record"} ;;
      esac
      PYTHONPATH=$T $PY bench/${bench}_bench.py $args >> "$LOG" 2>&1
    done
  done
done
$PY "$HERE/bench/ab_table.py" "$LOG"
echo "raw output: $LOG"
