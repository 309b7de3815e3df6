#!/usr/bin/env bash
# Which compiled kernels a changed graph finds in the database, and why the rest compile:
#
#   tools/bench_kernel_diff.sh OUTDIR MODEL_ARGS
#
# One GPU. MODEL_ARGS are tools/bench_gpu.py arguments (e.g. "--model reduce"). Jobs, each
# appending its JSON line to OUTDIR/bench.jsonl as it ends:
#   warmup     default mode, 1 layer (the first job of a fresh machine is slower)
#   record     max-autotune + tunecache at $LAYERS layers (default 2) on an empty database
# then for each layer count N in $CHANGED (default LAYERS + 1; e.g. CHANGED="3 4"):
#   changed-N    tunecache on a new node (empty Inductor caches)
#   same-node-N  the same on a copy of the node that recorded (its Inductor and Triton
#                caches)
#   default-N    default mode
# REPEAT (default 1) runs the three REPEAT times, alternating (tags changed-N-2 ...).
# Each tunecache job runs on its own copy of the database as the recording left it (a
# job publishes its graph, which a later job would load). tools/kernel_diff.py then dumps
# the recording's and each changed-N job's final kernels and Triton keys, with the kernel
# keys the database held, into OUTDIR/diff-N.txt.
# Environment: TUNECACHE_SIGNING_KEY (required), DEADLINE_S (default 480), PROFILE=1 (a
# cProfile of each changed-N and same-node-N compile, in its log).
set -u
out=$1 model=$2
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
: "${TUNECACHE_SIGNING_KEY:?kernels are shared only with a signing key (tunecache keygen)}"
layers=${LAYERS:-2}
changed=${CHANGED:-$(( layers + 1 ))}
work=${WORK:-/tmp/bench-kernel-diff}
deadline=$(( $(date +%s) + ${DEADLINE_S:-480} ))
rm -rf "$work"; mkdir -p "$work"
export PYTHONUNBUFFERED=1 PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
db=$work/node.db
profile=(); [ "${PROFILE:-0}" = 1 ] && profile=(--profile-compile 40)

job() {  # tag, then bench_gpu.py arguments
    local tag=$1; shift
    local left=$(( deadline - $(date +%s) ))
    if (( left < 30 )); then echo "skip $tag: past the deadline"; return 1; fi
    echo "== $tag (limit ${left}s)"
    timeout "$left" python3 "$here/tools/bench_gpu.py" --out "$out/bench.jsonl" --tag "$tag" \
        $model "$@" >"$out/$tag.log" 2>&1
    echo "   rc=$? $(grep -h '"kind": "job"' "$out/$tag.log" | tail -1 | cut -c1-300)"
}

job warmup --mode default --layers 1 --steps 2
TUNECACHE_DB=$db job record --mode tunecache --inductor-caches \
    --keep-inductor-cache "$work/record" --layers "$layers" || exit 0
python3 -m tunecache.cli ls --kind kernel --json --limit 1000000 --db "$db" >"$work/stored.json"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("kernel entries after the recording:", len(r), "bytes:", sum(x.get("size") or 0 for x in r))' \
    "$work/stored.json" | tee "$out/recording.txt"
ls -la "$db" >>"$out/recording.txt"
python3 "$here/tools/kernel_diff.py" dump "$work/record/rank0" "$out/record.json"
# The database as the recording left it: the file, its write-ahead log if one is left,
# and its blob directory.
copy_db() {  # destination
    rm -rf "$1" "$1-wal" "$1.blobs"
    for part in "$db" "$db-wal" "$db.blobs"; do
        [ -e "$part" ] && cp -r "$part" "$1${part#"$db"}"
    done
}
for n in $changed; do
    for r in $(seq "${REPEAT:-1}"); do
        tag=$([ "$r" = 1 ] && echo "$n" || echo "$n-$r")
        copy_db "$work/changed-$n.db"
        rm -rf "$work/changed-$n"
        TUNECACHE_DB=$work/changed-$n.db job "changed-$tag" --mode tunecache \
            --inductor-caches --keep-inductor-cache "$work/changed-$n" --layers "$n" "${profile[@]}"
        copy_db "$work/same-node-$n.db"
        rm -rf "$work/same-node-$n"; cp -r "$work/record" "$work/same-node-$n"
        TUNECACHE_DB=$work/same-node-$n.db job "same-node-$tag" --mode tunecache \
            --inductor-caches --keep-inductor-cache "$work/same-node-$n" --layers "$n" "${profile[@]}"
        job "default-$tag" --mode default --layers "$n"
    done
    python3 "$here/tools/kernel_diff.py" dump "$work/changed-$n/rank0" "$out/changed-$n.json" \
        --stored "$work/stored.json"
    python3 "$here/tools/kernel_diff.py" diff "$out/record.json" "$out/changed-$n.json" \
        >"$out/diff-$n.txt" 2>&1
    head -c 2000 "$out/diff-$n.txt"
done
