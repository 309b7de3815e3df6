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
#   hostile       (TRUST=1) a copy of tunecache's database with a hostile config planted in
#                 each entry of one kernel (tools/user_kernels_trust.py plant: bad warps, a
#                 huge block, an unknown name, in turn): those keys are refused, each
#                 kernel with one warning, and tuned again; the others load
#   upgraded      (TRUST=1) the same database, with a copy of the library in which one
#                 kernel's source has changed (a comment line added): that kernel is tuned
#                 again, the others load
#   warm, after-warm (WARM=1) `tunecache warm --user-kernels PACKAGE` on a copy of the
#                 database under TRITON_DEFAULT_FP_FUSION=0 (a setting Triton keys its
#                 kernels on, standing for a new Triton), then a job under that setting
# NODE=0 leaves out the node-local jobs, RANKS=0 the ranks job.
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

copy_db() {  # a SQLite database with the blob directory beside it (compiled kernels)
    cp "$1" "$2"
    if [[ -d $1.blobs ]]; then rm -rf "$2.blobs"; cp -r "$1.blobs" "$2.blobs"; fi
}

# What TRUST=1 plants in and edits, and what WARM=1 warms, per library.
declare -A planted=([fla]=l2norm [liger]=_dyt_)
declare -A upgraded=([fla]="fla.modules.norm.l2norm l2norm_fwd_kernel"
                     [liger]="liger_kernel.ops.dyt _dyt_fwd_kernel")
declare -A package=([fla]=fla [liger]=liger_kernel)

for library in "$@"; do
    off=(TUNECACHE_MODE=off FLA_CACHE_RESULTS=0 TRITON_CACHE_AUTOTUNING=0)
    if [[ ${TRITON_ALONE:-1} == 1 ]]; then
        job "$library-triton" "$library" "${off[@]}" TRITON_CACHE_DIR="$work/$library-triton"
    fi
    if [[ ${NODE:-1} == 1 ]]; then
        node=(TUNECACHE_MODE=off FLA_CACHE_RESULTS=1 TRITON_CACHE_AUTOTUNING=1
              TRITON_CACHE_DIR="$work/$library-node")
        job "$library-node-cold" "$library" "${node[@]}"
        job "$library-node-warm" "$library" "${node[@]}"
    fi
    db=$work/$library.db
    job "$library-tunecache" "$library" TUNECACHE_DB="$db" TRITON_CACHE_DIR="$work/$library-tc1"
    job "$library-newnode" "$library" TUNECACHE_DB="$db" TRITON_CACHE_DIR="$work/$library-tc2"
    if [[ ${TRUST:-0} == 1 ]]; then
        copy_db "$db" "$work/$library-hostile.db"
        python3 "$here/tools/user_kernels_trust.py" plant "$work/$library-hostile.db" \
            --kernel "${planted[$library]}" | tee -a "$out/$library-hostile.log"
        job "$library-hostile" "$library" TUNECACHE_DB="$work/$library-hostile.db" \
            TRITON_CACHE_DIR="$work/$library-tc3"
        copy_db "$db" "$work/$library-upgraded.db"
        # shellcheck disable=SC2086 # module and kernel
        python3 "$here/tools/user_kernels_trust.py" upgrade "$work/upgraded-site" \
            ${upgraded[$library]} | tee -a "$out/$library-upgraded.log"
        job "$library-upgraded" "$library" TUNECACHE_DB="$work/$library-upgraded.db" \
            TRITON_CACHE_DIR="$work/$library-tc4" PYTHONPATH="$work/upgraded-site:$PYTHONPATH"
    fi
    if [[ ${WARM:-0} == 1 ]]; then
        left=$(( deadline - $(date +%s) ))
        if (( left >= 30 )); then
            echo "== $library-warm (limit ${left}s)"
            copy_db "$db" "$work/$library-warm.db"
            TRITON_DEFAULT_FP_FUSION=0 TUNECACHE_DB=$work/$library-warm.db \
                TRITON_CACHE_DIR=$work/$library-tc5 timeout "$left" \
                python3 -m tunecache.cli warm --user-kernels "${package[$library]}" --json \
                >"$out/$library-warm.json" 2>>"$out/$library-warm.log"
            echo "   rc=$? $(head -c 300 "$out/$library-warm.json")"
            job "$library-after-warm" "$library" TRITON_DEFAULT_FP_FUSION=0 \
                TUNECACHE_DB="$work/$library-warm.db" TRITON_CACHE_DIR="$work/$library-tc6"
        fi
    fi
    [[ ${RANKS:-1} == 1 ]] || continue
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
