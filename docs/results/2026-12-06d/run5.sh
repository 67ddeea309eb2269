#!/usr/bin/env bash
# Session 36, call 5 (H100; the H200 of run4.sh did not come). (a) The expert pass's start after
# its wait: tl loads the tile's entry with the tile count instead of after testing it (two
# dependent memory round trips before the weight loads instead of three: count, entry, the
# expert's row count); afirst (branch tile-loads) also issues the first stages' weights before
# working out the token rows (w13 reads them through perm, one more round trip). Same bits
# expected (only the order of loads changes). The whole gpu suite on afirst's tree first
# (tests_af.txz: main 1dceb26 + afirst), then b1 / b8 steps at 1k and 4k (three rounds) and
# b256 x 512 (two rounds). (b) The stamps build (1dceb26 -Dstamps=true, stamps.txz) at b1 x 1k,
# read by tools/bench/stamps.py. Archive: pack-variants base=- tl=tl.patch afirst=afirst.patch.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r5_gpu.txt"
s0=$SECONDS
timeout 200 tools/gpu/run-packed.sh .gpu-pack/tests_af.txz > "$R/r5_suite.txt" 2>&1
tail -4 "$R/r5_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r5_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 200 tools/gpu/run-variants.sh --rounds 3 base tl afirst -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r5_steps.txt"
echo "steps done at $((SECONDS - s0)) s"
OUT=$R/b256 RW_VARIANT_TIMEOUT=90 timeout 150 tools/gpu/run-variants.sh --rounds 2 base afirst -- $C \
    decode --batches 256 --ctxs 512 --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/b256/variants.txt" --what "decode_bf16" | tee "$R/r5_b256.txt"
mv "$R/steps/variants.txt" "$R/r5_steps_variants.txt"; mv "$R/b256/variants.txt" "$R/r5_b256_variants.txt"
rm -rf "$R/steps" "$R/b256"
mkdir -p /tmp/rw-st && tar xJf .gpu-pack/stamps.txz -C /tmp/rw-st
timeout 60 /tmp/rw-st/rw-stamps $C decode --batches 1 --ctxs 1024 --steps 20 --gen 1,16,2 \
    --gen-reps 1 --no-quant --no-forward > "$R/r5_stamps_bench.jsonl" 2> /tmp/r5_stamps.txt
grep -v RW_STAMP /tmp/r5_stamps.txt | tail -3
python3 tools/bench/stamps.py /tmp/r5_stamps.txt --around route --pick 100 > "$R/r5_stamps_summary.txt"
head -40 "$R/r5_stamps_summary.txt"
grep RW_STAMP /tmp/r5_stamps.txt | tail -60000 | gzip -9 > "$R/r5_stamps_tail.txt.gz"
echo "all took $((SECONDS - s0)) s"
