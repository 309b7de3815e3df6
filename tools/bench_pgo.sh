#!/usr/bin/env bash
# Shape profiles shared through the database (profiles, on by default with a key), side by side with static
# max-autotune and default mode at the same sizes, in one session:
#
#   tools/bench_pgo.sh OUTDIR JOB [JOB ...]
#
# JOB is MODE:TOKENS, run in the order given, each on a new node (a fresh Inductor cache):
#   pgo:N      max-autotune + tunecache on OUTDIR/pgo.db and one job id
#              for every pgo job: the first size compiles static; a job that then sees
#              another size compiles it dynamic and publishes the profile; every later
#              job, at any size, loads the profile and the dynamic graph;
#   plain:N    static max-autotune, every GEMM and kernel tuned in full (the step time a
#              profile's dynamic graph is held to);
#   default:N  torch.compile's default mode (the compile time the third size is held to).
# e.g. tools/bench_pgo.sh OUT pgo:8192 pgo:4096 pgo:2048 pgo:16384 default:2048 plain:2048
# A throwaway default-mode job runs first (the first job on a fresh machine is slower).
# Environment: ARGS (tools/bench_gpu.py arguments: --model ...), STEPS (default 21: the
# median of the last 20 is step_ms), JOB_ID (default tunecache-bench-pgo), DEADLINE_S
# (stop starting jobs past this many seconds, default 520), TUNECACHE_SIGNING_KEY
# (required: profiles and graphs are shared only signed). Each job appends its JSON lines
# to OUTDIR/bench.jsonl and its log to OUTDIR/TAG.log; Dynamo's profile lines (what each
# job read and wrote) go to OUTDIR/pgo-lines.txt.
set -u
out=$1; shift
mkdir -p "$out"
: "${TUNECACHE_SIGNING_KEY:?profiles and graphs are shared only with a signing key (tunecache keygen)}"
deadline=$(( $(date +%s) + ${DEADLINE_S:-520} ))
steps=${STEPS:-21}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
{
    date -u +%FT%TZ; hostname; nvidia-smi -L 2>/dev/null
    python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)'
} >>"$out/env.txt" 2>&1

bench() {  # tag, then tools/bench_gpu.py arguments
    local tag=$1; shift
    local left=$(( deadline - $(date +%s) ))
    if (( left < 30 )); then echo "skip $tag: past the deadline" | tee -a "$out/$tag.log"; return; fi
    echo "== $tag (limit ${left}s)"
    timeout "$left" torchrun --standalone --nproc-per-node 1 "$here/tools/bench_gpu.py" \
        --out "$out/bench.jsonl" --tag "$tag" --steps "$steps" ${ARGS:-} "$@" >>"$out/$tag.log" 2>&1
    echo "   rc=$? $(grep -h '"kind": "job"' "$out/$tag.log" | tail -1 | head -c 400)"
}

bench warmup --mode default --tiny --steps 1
for job in "$@"; do
    mode=${job%%:*} tokens=${job#*:}
    case $mode in
        pgo)
            # Dynamo's own log of the profile it read and wrote, kept apart from the job's.
            TORCH_COMPILE_JOB_ID=${JOB_ID:-tunecache-bench-pgo} \
                TORCH_LOGS=torch._dynamo.pgo TUNECACHE_DB=$out/pgo.db \
                bench "pgo-$tokens" --mode tunecache --inductor-caches --tokens "$tokens"
            grep -h "code_state" "$out/pgo-$tokens.log" | sed "s/^/pgo-$tokens: /" \
                | cut -c1-300 >>"$out/pgo-lines.txt" ;;
        plain|default) bench "$mode-$tokens" --mode "$mode" --tokens "$tokens" ;;
        *) echo "unknown job $job (pgo:N, plain:N or default:N)" >&2; exit 2 ;;
    esac
done
