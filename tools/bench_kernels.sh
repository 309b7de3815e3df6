#!/usr/bin/env bash
# A changed graph on a new node, side by side in one session (tools/bench_gpu_suite.sh):
#
#   tools/bench_kernels.sh OUTDIR
#
# 1. default at the recorded layer count: a throwaway job (the first on a fresh machine is
#    slower), and default mode's figure;
# 2. record: max-autotune + tunecache at $LAYERS layers on node A (its own Inductor cache),
#    publishing tunings, compiled graphs and compiled kernels into OUTDIR/node.db;
# 3. for each count in $CHANGED (default "3 4"): default mode, then tunecache on a new node
#    (an empty Inductor cache) with TUNECACHE_SHARE=-kernels (kernels compiled again) and with
#    kernel sharing on. Each of the two runs on its own copy of the recorded database, so
#    that neither finds the changed graph the other published.
#
# Environment: ARGS (bench_gpu.py arguments, e.g. "--model gpt"), LAYERS (default 2),
# CHANGED, PROFILE (see the end), DEADLINE_S (default 560), and TUNECACHE_SIGNING_KEY (required: kernels and
# graphs are shared only signed). Every job's JSON line goes to OUTDIR/bench.jsonl.
set -u
out=$1
here=$(cd "$(dirname "$0")/.." && pwd)
: "${TUNECACHE_SIGNING_KEY:?kernels are shared only with a signing key (tunecache keygen)}"
layers=${LAYERS:-2}
export DEADLINE_S=${DEADLINE_S:-560}
start=$(date +%s)
left() { echo $(( DEADLINE_S - ($(date +%s) - start) )); }
suite() { DEADLINE_S=$(left) bash "$here/tools/bench_gpu_suite.sh" "$out" "$@"; }
# A new node on a copy of the recorded database (its blob files beside it).
fresh_copy() {
    rm -rf "$out/copy.db" "$out/copy.db.blobs"
    cp "$out/node.db" "$out/copy.db"
    [ -d "$out/node.db.blobs" ] && cp -r "$out/node.db.blobs" "$out/copy.db.blobs"
    export NODE_DB=$out/copy.db
}

ARGS="${ARGS:-} --layers $layers" suite default tunecache-node
for n in ${CHANGED:-3 4}; do
    export CHANGED_ARGS="--layers $n"
    ARGS="${ARGS:-} --layers $layers" suite default:changed
    fresh_copy
    TUNECACHE_SHARE=-kernels ARGS="${ARGS:-} --layers $layers" suite tunecache-newnode:changed
    fresh_copy
    ARGS="${ARGS:-} --layers $layers" suite tunecache-newnode:changed
done
# PROFILE=1: one more kernel-sharing job at the last count, under cProfile (its log).
if [ -n "${PROFILE:-}" ]; then
    fresh_copy
    ARGS="${ARGS:-} --layers $layers" suite tunecache-newnode:changed:profile
fi
