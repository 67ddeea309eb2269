#!/usr/bin/env bash
# Session 34, prepared for the next session (not run): the timer stamps of run10.sh on the GEMV
# forms that request the second half of each slice earlier, to see why they make steps slower
# (the kernel ahead slowed, or the GEMV's CTAs resident later or fewer): stamps = main's ring
# (gvstamps.patch), ring8 (all 8 stages before the wait: ring8_stamps.patch), ring8w (4 before,
# 4 right after: ring8w_stamps.patch). Archive: tools/gpu/pack-variants.sh BUILD
# stamps=gvstamps.patch ring8=ring8_stamps.patch ring8w=ring8w_stamps.patch.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R" /tmp/rw-variants
tar xJf .gpu-pack/variants.txz -C /tmp/rw-variants
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
for v in stamps ring8 ring8w; do
    timeout 60 /tmp/rw-variants/rw-$v $C decode --batches 1 --ctxs 1024 --steps 20 --gen 1,16,2 \
        --gen-reps 1 --no-quant --no-forward 2>&1 | grep GVDBG > "$R/r12_$v.txt"
    echo "== $v" | tee -a "$R/r12_summary.txt"
    sed -n '/^python3 - /,/^PY$/p' docs/results/2026-12-06b/run10.sh | sed '1d;$d' > /tmp/st.py
    python3 /tmp/st.py "$R/r12_$v.txt" | tee -a "$R/r12_summary.txt"
done
