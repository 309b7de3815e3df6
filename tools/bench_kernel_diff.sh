#!/usr/bin/env bash
# Which compiled kernels a changed graph finds in the database, and why the rest compile:
#
#   tools/bench_kernel_diff.sh OUTDIR MODEL_ARGS
#
# One GPU. MODEL_ARGS are tools/bench_gpu.py arguments (e.g. "--model reduce"). Jobs, each
# appending its JSON line to OUTDIR/bench.jsonl as it ends:
#   warmup     default mode, 1 layer (the first job of a fresh machine is slower)
#   record     max-autotune + tunecache at $LAYERS layers (default 2) on an empty database
#   changed    tunecache on a new node (empty Inductor caches) at $CHANGED layers (default
#              LAYERS + 1)
#   same-node  the same on the node that recorded (its Inductor and Triton caches), on a
#              copy of the database as the recording left it (the changed job publishes
#              its graph, which a later job would load)
#   default-changed  default mode at $CHANGED layers
# then tools/kernel_diff.py dumps both jobs' final kernels and Triton keys, with the kernel
# keys the database held before the changed job, and writes the diff to OUTDIR/diff.txt.
# Environment: TUNECACHE_SIGNING_KEY (required), DEADLINE_S (default 480).
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
# The database file, its write-ahead log if one is left, and its blob directory.
for part in "$db" "$db-wal" "$db.blobs"; do
    [ -e "$part" ] && cp -r "$part" "$work/same-node.db${part#"$db"}"
done
TUNECACHE_DB=$db job changed --mode tunecache --inductor-caches \
    --keep-inductor-cache "$work/changed" --layers "$changed"
TUNECACHE_DB=$work/same-node.db job same-node --mode tunecache --inductor-caches \
    --keep-inductor-cache "$work/record" --layers "$changed"
job default-changed --mode default --layers "$changed"
python3 "$here/tools/kernel_diff.py" dump "$work/changed/rank0" "$out/changed.json" \
    --stored "$work/stored.json"
python3 "$here/tools/kernel_diff.py" diff "$out/record.json" "$out/changed.json" >"$out/diff.txt" 2>&1
head -c 3000 "$out/diff.txt"
