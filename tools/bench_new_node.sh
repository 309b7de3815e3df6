#!/usr/bin/env bash
# A recorded graph and a changed one on a new node, for several models, in one session:
#
#   tools/bench_new_node.sh OUTDIR MODEL_ARGS [MODEL_ARGS ...]
#
# For each MODEL_ARGS (tools/bench_gpu.py arguments, e.g. "--model gpt --tokens 2048"), in a
# work directory of its own under $WORK (default /tmp/bench-new-node):
#   default at $LAYERS layers (default 2; the first job of a fresh machine is slower, so
#   the very first one is a throwaway), max-autotune + tunecache recording on an empty
#   database (tunings, compiled graphs and kernels), the same graph on a new node (an empty
#   Inductor cache: everything comes from the database), default at $CHANGED layers
#   (default LAYERS + 1) and tunecache on a new node at $CHANGED layers.
# Every job's JSON line is appended to OUTDIR/bench.jsonl as soon as it is written, so a
# call killed at its limit keeps what finished. Environment: DEADLINE_S (default 520),
# TUNECACHE_SIGNING_KEY (required: graphs and kernels are shared only signed).
set -u
out=$1; shift
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
: "${TUNECACHE_SIGNING_KEY:?graphs and kernels are shared only with a signing key (tunecache keygen)}"
layers=${LAYERS:-2}
changed=${CHANGED:-$(( layers + 1 ))}
work=${WORK:-/tmp/bench-new-node}
deadline=$(( $(date +%s) + ${DEADLINE_S:-520} ))
n=0
for model in "$@"; do
    n=$(( n + 1 ))
    dir=$work/model$n
    rm -rf "$dir"; mkdir -p "$dir"
    steps=(default tunecache-node tunecache-newnode default:changed tunecache-newnode:changed)
    (( n == 1 )) && steps=(default "${steps[@]}")
    CHANGED_ARGS="--layers $changed" ARGS="$model --layers $layers" \
        DEADLINE_S=$(( deadline - $(date +%s) )) NPROC=1 \
        bash "$here/tools/bench_gpu_suite.sh" "$dir" "${steps[@]}" &
    suite=$!
    # Copy the lines out as they come (the suite writes them under its own directory).
    while kill -0 "$suite" 2>/dev/null; do
        sleep 5; cp "$dir/bench.jsonl" "$out/model$n.jsonl" 2>/dev/null
    done
    wait "$suite"
    cp "$dir/bench.jsonl" "$out/model$n.jsonl" 2>/dev/null
    cp "$dir/env.txt" "$out/env.txt" 2>/dev/null
done
cat "$out"/model*.jsonl > "$out/bench.jsonl" 2>/dev/null
