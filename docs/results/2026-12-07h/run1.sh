#!/usr/bin/env bash
# Forty-ninth session, call 1 (main 02eab3c): the three scripts the forty-eighth session prepared,
# in one call, each behind a check of the time left. First ../2026-12-07g/run9.sh (wsp's GPU tests,
# then main / wsp / wspw2 on the expert layer at 16,384 and 2048 tokens and on the 8 x 2k prefill),
# then run8.sh (noA / noB / noAB, timing only), then run7.sh (th32 / th96). Any card.
# Archives: tools/gpu/pack-variants.sh BUILD main=- wsp=... wspw2=... noA=... noB=... noAB=...
#   th32=... th96=... (the patches of ../2026-12-07g); tests_wsp.txz as run9.sh's head says.
R=${OUT:-out}
mkdir -p "$R"
s0=$SECONDS
B=${RW_CALL_BUDGET:-570}
G=docs/results/2026-12-07g
bash $G/run9.sh
left=$((B - (SECONDS - s0)))
echo "run9 done at $((SECONDS - s0)) s"
[ $left -ge 90 ] && bash $G/run8.sh
left=$((B - (SECONDS - s0)))
[ $left -ge 120 ] && bash $G/run7.sh
echo "call took $((SECONDS - s0)) s"
