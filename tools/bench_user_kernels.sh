#!/usr/bin/env bash
# Users' own @triton.autotune kernels (tools/bench_user_kernels.py), side by side in one
# session, for each LIBRARY (fla, liger):
#
#   tools/bench_user_kernels.sh OUTDIR LIBRARY [LIBRARY ...]
#
#   triton         Triton's own behaviour: every config of every key benchmarked, no cache
#                  (FLA_CACHE_RESULTS=0: flash-linear-attention turns Triton's file cache
#                  on by default); the outputs of the first job that runs are the
#                  reference the others are held to. TRITON_ALONE=0 leaves this job out
#                  (node-cold benchmarks the same configs, and writes the files)
#   node-cold      Triton's node-local cache (TRITON_CACHE_AUTOTUNING=1) on an empty cache
#   node-warm      the same cache directory again: a warm restart on one node
#   tunecache      tunecache on an empty database, fresh Triton cache (records)
#   newnode        the same database, fresh Triton cache: another node of the cluster
#   ranks-N        NPROC processes (default 4) on the one GPU, each on a fresh Triton cache,
#                  started together on another empty database: each key tuned once in all
# Environment: SIZES (default 2048,4096,8192), STEPS (default 10), NPROC, PROFILE=N (a
# cProfile of each job's first step, its N costliest calls, in the job's log), DEADLINE_S
# (stop starting jobs past this many seconds, default 520); with TUNECACHE_SIGNING_KEY set,
# compiled kernels are shared too (tunecache.triton_cache). Each job appends its line to
# OUTDIR/bench.jsonl and its output to OUTDIR/TAG.log.
set -u
out=$1; shift
mkdir -p "$out"
work=$(mktemp -d /tmp/bench-user-kernels.XXXXXX)
deadline=$(( $(date +%s) + ${DEADLINE_S:-520} ))
nproc=${NPROC:-4}
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
    date -u +%FT%TZ; hostname; nvidia-smi -L 2>/dev/null
    python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
} >>"$out/env.txt" 2>&1

job() {  # tag library, then environment assignments
    local tag=$1 library=$2; shift 2
    local left=$(( deadline - $(date +%s) ))
    if (( left < 30 )); then echo "skip $tag: past the deadline"; return; fi
    echo "== $tag (limit ${left}s)"
    env "$@" timeout "$left" python3 "$here/tools/bench_user_kernels.py" --library "$library" \
        --sizes "${SIZES:-2048,4096,8192}" --steps "${STEPS:-10}" --out "$out/bench.jsonl" \
        --tag "$tag" --reference "$work/reference" --profile-first "${PROFILE:-0}" \
        >>"$out/$tag.log" 2>&1
    echo "   rc=$? $(tail -1 "$out/$tag.log" | head -c 300)"
}

for library in "$@"; do
    off=(TUNECACHE_MODE=off FLA_CACHE_RESULTS=0 TRITON_CACHE_AUTOTUNING=0)
    if [[ ${TRITON_ALONE:-1} == 1 ]]; then
        job "$library-triton" "$library" "${off[@]}" TRITON_CACHE_DIR="$work/$library-triton"
    fi
    node=(TUNECACHE_MODE=off FLA_CACHE_RESULTS=1 TRITON_CACHE_AUTOTUNING=1
          TRITON_CACHE_DIR="$work/$library-node")
    job "$library-node-cold" "$library" "${node[@]}"
    job "$library-node-warm" "$library" "${node[@]}"
    db=$work/$library.db
    job "$library-tunecache" "$library" TUNECACHE_DB="$db" TRITON_CACHE_DIR="$work/$library-tc1"
    job "$library-newnode" "$library" TUNECACHE_DB="$db" TRITON_CACHE_DIR="$work/$library-tc2"
    left=$(( deadline - $(date +%s) ))
    if (( left < 30 )); then echo "skip $library-ranks-$nproc: past the deadline"; continue; fi
    echo "== $library-ranks-$nproc (limit ${left}s)"
    # the schema, before the processes race to make it
    python3 -c "import tunecache, sys; tunecache.open(sys.argv[1]).close()" "$work/$library-ranks.db"
    pids=()
    for (( i = 0; i < nproc; i++ )); do
        TUNECACHE_DB=$work/$library-ranks.db TRITON_CACHE_DIR=$work/$library-rank$i \
            timeout "$left" python3 "$here/tools/bench_user_kernels.py" --library "$library" \
            --sizes "${SIZES:-2048,4096,8192}" --steps "${STEPS:-10}" --out "$out/bench.jsonl" \
            --tag "$library-ranks-$nproc-$i" --reference "$work/reference" \
            >>"$out/$library-ranks-$nproc-$i.log" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
    grep -h '"tag"' "$out/$library"-ranks-"$nproc"-*.log | tail -n "$nproc"
done
