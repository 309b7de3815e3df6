#!/usr/bin/env bash
# After an upgrade, on one GPU, side by side with plain max-autotune (issue: an upgrade
# keeps the cluster warm):
#
#   MODEL_ARGS="--model block --tokens 4096" tools/bench_upgrade_gpu.sh OUTDIR
#
# 1. plain            max-autotune, every GEMM tuned (the baseline, in the same call);
# 2. tunecache-cold   tunecache on an empty database: the cluster before the upgrade;
# 3. age-db           that database relabelled as recorded under torch $FROM_TORCH
#                     (tools/age_db.py, default 2.10.0+cu130): GEMM and Triton config
#                     keys (AGE_KINDS, default gemm,triton_config);
# 4. tunecache-warm   the first job after the upgrade, on the relabelled database: each GEMM
#                     key starts from its entry under the older torch;
# 5. tunecache-warm-2 the next job (hits).
# Each step's JSON line (tools/bench_gpu.py: compile seconds, step ms, Inductor's cache
# counters, GEMM benchmarks) is in OUTDIR/bench.jsonl; logs in OUTDIR/*.log.
set -u
out=$1
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
export NPROC=${NPROC:-1} ARGS=${MODEL_ARGS:-} DEADLINE_S=${DEADLINE_S:-480}
DB=$out/cold.db "$here/tools/bench_gpu_suite.sh" "$out" plain tunecache-cold
AGE_FROM=$out/cold.db DB=$out/aged.db WARM_FROM_TORCH=${FROM_TORCH:-2.10.0+cu130} \
    AGE_KINDS=${AGE_KINDS:-gemm,triton_config} \
    DEADLINE_S=$(( DEADLINE_S - SECONDS )) \
    "$here/tools/bench_gpu_suite.sh" "$out" age-db tunecache-warm tunecache-warm
