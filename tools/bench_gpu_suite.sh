#!/usr/bin/env bash
# Side-by-side compile benchmark of GEMM autotuning on one multi-GPU node, in one session:
#
#   tools/bench_gpu_suite.sh OUTDIR STEP [STEP ...]
#
# STEP is one of the names below, optionally followed by either or both (in this order) of
#   :changed               add $CHANGED_ARGS (e.g. "--layers 3": the same GEMM keys in a new
#                          graph)
#   :profile               add --profile-compile 40 (cProfile of the compile step, in the log)
# STEP is one of
#   plain                  max-autotune, every rank benchmarks every GEMM
#   inductor-distributed   max-autotune + Inductor's distributed_max_autotune_gemm
#   default                torch.compile without max-autotune
#   tunecache-cold         max-autotune + tunecache on an empty database ($DB)
#   tunecache-warm         the same database, fresh Inductor caches: a new node, a later job
#   plain-node             plain, with Inductor's FX graph and AOTAutograd caches on in one
#                          cache directory per suite: name it twice for a restart on one node
#   tunecache-node         the same with tunecache on its own database ($NODE_DB, default
#                          $out/node.db)
#   tunecache-newnode      tunecache on $NODE_DB with Inductor's caches on but empty
#                          (a fresh cache directory): another node of the cluster, whose
#                          compiled graphs and tunings come from the database alone
#   age-db                 $DB becomes a copy of $AGE_FROM with its GEMM keys recorded
#                          under $WARM_FROM_TORCH (tools/age_db.py)
#   warm-command           `tunecache warm` re-tunes the keys in $DB recorded under
#                          $WARM_FROM_TORCH (another torch), then a job on a fresh cache runs
#
# Each step appends its JSON lines (tools/bench_gpu.py) to OUTDIR/bench.jsonl and its log to
# OUTDIR/STEP.log. Environment: NPROC (ranks, default: number of GPUs), DB (default
# OUTDIR/tunecache.db), DEADLINE_S (stop starting steps past this many seconds, default
# 560), ARGS (extra bench_gpu.py arguments).
set -u
out=$1; shift
mkdir -p "$out"
nproc=${NPROC:-$(nvidia-smi -L | wc -l)}
db=${DB:-$out/tunecache.db}
deadline=$(( $(date +%s) + ${DEADLINE_S:-560} ))
# NVLink multicast stays off on shared hosts (it can take the host's GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}

{
    date -u +%FT%TZ; hostname; nvidia-smi -L
    python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)'
} >>"$out/env.txt" 2>&1

declare -A runs
bench() {  # tag, then bench_gpu.py arguments; a step's second run is tagged STEP-2
    runs[$1]=$(( ${runs[$1]:-0} + 1 ))
    local tag=$1; (( runs[$1] > 1 )) && tag="$1-${runs[$1]}"; shift
    local left=$(( deadline - $(date +%s) ))
    if (( left < 30 )); then echo "skip $tag: past the deadline" | tee -a "$out/$tag.log"; return; fi
    echo "== $tag (limit ${left}s)"
    timeout "$left" torchrun --standalone --nproc-per-node "$nproc" "$here/tools/bench_gpu.py" \
        --out "$out/bench.jsonl" --tag "$tag" ${ARGS:-} "$@" >>"$out/$tag.log" 2>&1
    echo "   rc=$? $(grep -h '"kind": "job"' "$out/$tag.log" | tail -1)"
}

for spec in "$@"; do
    step=${spec%%:*}
    tag=${spec//:/-}
    extra=()
    case $spec in
        *:changed*) read -r -a extra <<<"${CHANGED_ARGS:?CHANGED_ARGS names the changed graph}" ;;
    esac
    case $spec in
        *:profile*) extra+=(--profile-compile 40) ;;
    esac
    case $step in
        plain|inductor-distributed|default) bench "$tag" --mode "$step" "${extra[@]}" ;;
        tunecache-cold) rm -f "$db"; TUNECACHE_DB=$db bench "$tag" --mode tunecache "${extra[@]}" ;;
        tunecache-warm) TUNECACHE_DB=$db bench "$tag" --mode tunecache "${extra[@]}" ;;
        plain-node)
            bench "$tag" --mode plain --inductor-caches --keep-inductor-cache "$out/node-plain" \
                "${extra[@]}" ;;
        tunecache-node)
            TUNECACHE_DB=${NODE_DB:-$out/node.db} bench "$tag" --mode tunecache --inductor-caches \
                --keep-inductor-cache "$out/node-tunecache" "${extra[@]}" ;;
        tunecache-newnode)
            TUNECACHE_DB=${NODE_DB:-$out/node.db} bench "$tag" --mode tunecache --inductor-caches \
                "${extra[@]}" ;;
        age-db)
            rm -f "$db"
            python3 "$here/tools/age_db.py" "${AGE_FROM:?}" "$db" --torch "${WARM_FROM_TORCH:?}" \
                --kinds "${AGE_KINDS:-gemm}" >>"$out/$step.log" 2>&1
            echo "== age-db rc=$?" ;;
        warm-command)
            timeout $(( deadline - $(date +%s) )) torchrun --standalone --nproc-per-node "$nproc" \
                -m tunecache.cli warm --db "$db" --from-torch "${WARM_FROM_TORCH:?}" \
                >>"$out/$step.log" 2>&1
            echo "== warm-command rc=$?"
            TUNECACHE_DB=$db bench "$tag" --mode tunecache ;;
        *) echo "unknown step $step" >&2; exit 2 ;;
    esac
done
