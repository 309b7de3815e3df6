#!/usr/bin/env bash
# Cold start with transfer, side by side with plain max-autotune, in one session:
#
#   tools/bench_transfer.sh OUTDIR
#
# 1. (unless RECORDED names a database to start from) record: tunecache on an empty
#    database at RECORD_TOKENS tokens (default 8192), the cluster's earlier job;
# 2. for each of TOKENS (default "4096 16384"), every key new:
#      plain-N     max-autotune, every GEMM and kernel tuned in full (PLAIN=0 skips it)
#      transfer-N  tunecache on a copy of the recorded database, its defaults (transfer
#                  on, the decisive levers' defaults)
#    and, with DECISIVE=VALUE, transfer-decisive-VALUE-N: the same with
#    the decisive levers of VALUE (0: no part, every new key measured; 1: every part; or parts,
#    DECISIVE=fusion,triton, tagged fusion+triton);
#    with OFF=1, transfer-off-N: the same with TUNECACHE_SHARE=-transfer;
#    with AHEAD=T, transfer-ahead-T-N: the same with compile_ahead=T (a descent's
#    candidates compiled in T threads, 0: each just before its benchmark), and
#    OUTDIR/ahead-configs-N.txt: which kernels it tuned to the transfer job's config, and
#    each kernel's tuning seconds in both (tools/triton_config_diff.py; AHEAD set to the
#    default compares two identical jobs);
#    with POOL=1, transfer-pool-N: the transfer job with Inductor's compile workers started
#    and answering before its compile (tools/bench_gpu.py --wait-compile-pool).
# With PROFILE=N, each transfer-N job's compile step is profiled (cProfile, its N costliest
# calls) into OUTDIR/profile-transfer-N.txt; with PROFILE_PLAIN=N, each plain-N job's, into
# OUTDIR/profile-plain-N.txt (a profiled job's compile seconds are not comparable).
# With KERNELS=1, the Triton kernels of the record and transfer-N jobs' compiled graphs are
# dumped (tools/kernel_diff.py dump) into OUTDIR/kernels-TAG.json: which kernels of a new
# size have a recorded kernel of their family.
# After the jobs, tools/decisive_regret.py reads the database of the job that measured
# more (transfer-decisive-0-N with DECISIVE=0, else transfer-N): for every key it measured,
# what its neighbours alone would have decided and what that would have cost at N, and
# the regret of what the other job decided, into OUTDIR/decisions-N.json. DECISIVE=0 is
# the run that measures every part's regret.
# With REGRET=1, each transfer job's database is then re-tuned in full
# (`tunecache warm --exhaustive --json`, into OUTDIR/regret-TAG.json): the regret of every
# transferred or decided GEMM entry.
# A throwaway default-mode job runs first (the first job on a fresh machine is slower).
# Environment: ARGS (tools/bench_gpu.py arguments: --model, --layers ...), STEPS (timed
# steps, default 21: the median of the last 20 is step_ms), NPROC (default 1), DEADLINE_S
# (stop starting jobs past this many seconds, default 560). Each job appends its JSON
# lines to OUTDIR/bench.jsonl and its log to OUTDIR/TAG.log.
set -u
out=$1
mkdir -p "$out"
nproc=${NPROC:-1}
deadline=$(( $(date +%s) + ${DEADLINE_S:-560} ))
steps=${STEPS:-21}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
{
    date -u +%FT%TZ; hostname; nvidia-smi -L 2>/dev/null
    python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
} >>"$out/env.txt" 2>&1

bench() {  # tag, then tools/bench_gpu.py arguments
    local tag=$1; shift
    local left=$(( deadline - $(date +%s) ))
    if (( left < 30 )); then echo "skip $tag: past the deadline" | tee -a "$out/$tag.log"; return; fi
    echo "== $tag (limit ${left}s)"
    timeout "$left" torchrun --standalone --nproc-per-node "$nproc" "$here/tools/bench_gpu.py" \
        --out "$out/bench.jsonl" --tag "$tag" --steps "$steps" ${ARGS:-} "$@" >>"$out/$tag.log" 2>&1
    echo "   rc=$? $(grep -h '"kind": "job"' "$out/$tag.log" | tail -1)"
}

copy_db() {  # a SQLite database with the blob directory beside it (compiled kernels)
    cp "$1" "$2"
    if [[ -d $1.blobs ]]; then rm -rf "$2.blobs"; cp -r "$1.blobs" "$2.blobs"; fi
}

regret() {  # tag: re-tune the transfer job's GEMM entries in full
    local tag=$1 left=$(( deadline - $(date +%s) ))
    if (( left < 30 )); then echo "skip regret-$tag: past the deadline"; return; fi
    echo "== regret-$tag (limit ${left}s)"
    TUNECACHE_DB=$out/$tag.db timeout "$left" python3 -m tunecache.cli warm --exhaustive --json \
        >"$out/regret-$tag.json" 2>>"$out/regret-$tag.log"
    echo "   rc=$? $(head -c 300 "$out/regret-$tag.json")"
}

decisions() {  # tokens: what neighbours alone decide at that size, and what it costs
    local db=$out/transfer-$1.db decisive=()
    if [[ ${DECISIVE:-} == 0 ]]; then  # the job that measured every new key
        db=$out/decisive-$1.db decisive=(--decisive "$out/transfer-$1.db")
    elif [[ -f $out/decisive-$1.db ]]; then
        decisive=(--decisive "$out/decisive-$1.db")
    fi
    [[ -f $db ]] || return 0
    echo "== decisions-$1"
    python3 "$here/tools/decisive_regret.py" "$db" "${decisive[@]}" -o "$out/decisions-$1.json" \
        >"$out/decisions-$1.txt" 2>&1
    echo "   rc=$? $(grep -A20 '^by margin' "$out/decisions-$1.txt" | head -c 1500)"
}

keep_profile() {  # tag: the cProfile its job printed, into OUTDIR/profile-TAG.txt
    sed -n '/where the compile step/,/"kind": "job"/p' "$out/$1.log" | head -c 30000 \
        >"$out/profile-$1.txt"
}

dump_kernels() {  # tag: its job's final kernels, from its Inductor cache directory
    [[ ${KERNELS:-0} == 1 ]] || return 0
    local dir
    dir=$(python3 -c 'import json, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
print([r for r in lines if r["kind"] == "rank" and r["tag"] == sys.argv[2]][-1]["inductor_cache_dir"])
' "$out/bench.jsonl" "$1") && python3 "$here/tools/kernel_diff.py" dump "$dir" "$out/kernels-$1.json"
}

bench warmup --mode default --tiny --steps 1
recorded=${RECORDED:-}
if [[ -z $recorded ]]; then
    recorded=$out/recorded.db
    rm -f "$recorded"
    TUNECACHE_DB=$recorded bench "record-${RECORD_TOKENS:-8192}" --mode tunecache \
        --tokens "${RECORD_TOKENS:-8192}"
    dump_kernels "record-${RECORD_TOKENS:-8192}"
fi
decisive_levers() {  # DECISIVE's value (0, 1, or parts: gemm,fusion) as TUNECACHE_LEVERS
    local parts=$1 out=() p
    [[ $parts == 1 ]] && parts=gemm,triton,fusion
    [[ $parts == 0 ]] && parts=
    for p in gemm triton fusion; do
        [[ ,$parts, == *,$p,* ]] && out+=("+decisive_$p") || out+=("-decisive_$p")
    done
    (IFS=,; echo "${out[*]}")
}
for tokens in ${TOKENS:-4096 16384}; do
    plain_profile=()
    [[ -n ${PROFILE_PLAIN:-} ]] && plain_profile=(--profile-compile "$PROFILE_PLAIN")
    if [[ ${PLAIN:-1} == 1 ]]; then
        bench "plain-$tokens" --mode plain --tokens "$tokens" "${plain_profile[@]}"
        [[ -n ${PROFILE_PLAIN:-} ]] && keep_profile "plain-$tokens"
    fi
    copy_db "$recorded" "$out/transfer-$tokens.db"
    profile=()
    [[ -n ${PROFILE:-} ]] && profile=(--profile-compile "$PROFILE")
    TUNECACHE_DB=$out/transfer-$tokens.db bench "transfer-$tokens" --mode tunecache \
        --tokens "$tokens" "${profile[@]}"
    [[ -n ${PROFILE:-} ]] && keep_profile "transfer-$tokens"
    dump_kernels "transfer-$tokens"
    if [[ ${POOL:-0} == 1 ]]; then
        copy_db "$recorded" "$out/pool-$tokens.db"
        TUNECACHE_DB=$out/pool-$tokens.db bench "transfer-pool-$tokens" --mode tunecache \
            --tokens "$tokens" --wait-compile-pool
    fi
    if [[ -n ${DECISIVE:-} ]]; then
        copy_db "$recorded" "$out/decisive-$tokens.db"
        TUNECACHE_LEVERS=$(decisive_levers "$DECISIVE") TUNECACHE_DB=$out/decisive-$tokens.db bench \
            "transfer-decisive-${DECISIVE//,/+}-$tokens" --mode tunecache --tokens "$tokens"
    fi
    if [[ -n ${AHEAD:-} ]]; then
        copy_db "$recorded" "$out/ahead-$tokens.db"
        TUNECACHE_LEVERS=$( (( AHEAD > 0 )) && echo +compile_ahead || echo -compile_ahead) \
            TUNECACHE_DB=$out/ahead-$tokens.db bench \
            "transfer-ahead-$AHEAD-$tokens" --mode tunecache --tokens "$tokens"
    fi
    if [[ ${OFF:-0} == 1 ]]; then
        copy_db "$recorded" "$out/off-$tokens.db"
        TUNECACHE_SHARE=-transfer TUNECACHE_DB=$out/off-$tokens.db bench "transfer-off-$tokens" \
            --mode tunecache --tokens "$tokens"
    fi
done
triton_configs() {  # tokens: the Triton configs the transfer job and the AHEAD job chose
    local tag listings=()
    for tag in "transfer-$1" "ahead-$1"; do
        python3 -m tunecache.cli ls --json --kind triton_config --limit 1000 \
            --db "$out/$tag.db" >"$out/$tag-triton.json" 2>/dev/null || return 0
        listings+=("$out/$tag-triton.json")
    done
    if [[ -s $recorded ]]; then  # what both started from is not compared
        python3 -m tunecache.cli ls --json --kind triton_config --limit 1000 \
            --db "$recorded" >"$out/recorded-triton.json" 2>/dev/null \
            && listings+=(--recorded "$out/recorded-triton.json")
    fi
    python3 "$here/tools/triton_config_diff.py" "${listings[@]}" \
        >"$out/ahead-configs-$1.txt" 2>&1
    echo "== ahead-configs-$1: $(head -1 "$out/ahead-configs-$1.txt")"
}

# Before the regret runs: `warm --exhaustive` tops up the databases it reads.
for tokens in ${TOKENS:-4096 16384}; do
    decisions "$tokens"
    [[ -n ${AHEAD:-} ]] && triton_configs "$tokens"
done
if [[ ${REGRET:-0} == 1 ]]; then
    for tokens in ${TOKENS:-4096 16384}; do
        regret "transfer-$tokens"
        if [[ -n ${DECISIVE:-} ]]; then regret "decisive-$tokens"; fi
    done
fi
