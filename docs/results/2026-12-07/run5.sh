#!/usr/bin/env bash
# Prepared in the forty-second session for the next call (any card; the session's device time
# ran out before it could start): does the row-whole mxfp8 layout's access pattern itself cap
# the decode expert tile's weight stream? tools/gpu/stream_probe.cu (a GPU build's
# tools/gpu/stream_probe, copied to .gpu-pack) copies the w13 and w2 panels of Qwen3-30B-A3B's
# expert shapes the way the tile does, with no arithmetic: rows64 pf0 / pf128 / pf256, rows128
# pf256, and the same bytes read K-blocked, beside a device-to-device copy in the same run.
# First with the split w13 tile's shared memory (91 KB a CTA, two CTAs an SM, five stages),
# then four stages at 73 KB (three CTAs an SM). Then, on an H200, the target rows G1 / G2 / G3
# as in run4.sh (rw-main of .gpu-pack/variants.txz; rebuild it from main with
# tools/gpu/pack-variants.sh BUILD main=- if the archive is gone).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/n_gpu.txt"
s0=$SECONDS
timeout 60 .gpu-pack/stream_probe > "$R/n_probe.jsonl" 2> "$R/n_probe.err"; echo "probe exit $?"
timeout 40 .gpu-pack/stream_probe --stages 4 --smem-kb 73 > "$R/n_probe_st4.jsonl" 2>> "$R/n_probe.err"
echo "probe st4 exit $?"; cat "$R/n_probe.err"
python3 -c "
import json,sys
for f in sys.argv[1:]:
    for l in open(f):
        o=json.loads(l)
        print(o['case'].ljust(14), o['M'], o['K'], 'st', o['stages'], 'cta/sm', o['ctas_per_sm'], o['median_ms'], 'ms', o['read_gbps'], 'GB/s', 'copy', o['copy_gbps'], 'ratio', o['ratio'], 'sum', o['sum_ok'])
" "$R/n_probe.jsonl" "$R/n_probe_st4.jsonl"
echo "probe done at $((SECONDS - s0)) s"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
left=$((${RW_CALL_BUDGET:-200} - (SECONDS - s0)))
if [ "${mem:-0}" -ge 100000 ] && [ $left -ge 90 ]; then
    mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants
    C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
    timeout $((left - 5)) /tmp/rw-variants/rw-main $C decode --batches 1,256 --ctxs 1024 \
        --steps 10 --gen 1,16,2 --gen-reps 1 > "$R/n_g123.jsonl" 2> "$R/n_g123.err"
    echo "rw-bench exit $?"
    grep -h '"decode_bf16\|"decode_mxfp8\|decode_forward' "$R/n_g123.jsonl" | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l)
    print(o['what'], o.get('batch'), o.get('ctx'), round(o.get('median_s',0)*1e3,3), 'ms', o.get('ratio'), o.get('hbm_gbps'), o.get('target_id'), o.get('met'))"
    tail -3 "$R/n_g123.err"
fi
echo "all took $((SECONDS - s0)) s"
