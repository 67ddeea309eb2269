# Makes tests/fixtures/qwen3-moe-tp8: a small random Qwen3-MoE checkpoint whose head counts and
# expert width split 8 ways (8 q heads, 4 kv heads, moe_intermediate 256), with a reference from
# Hugging Face transformers, for TP4/TP8 reproduction tests. Run where torch and transformers
# exist (the GPU machine):  python3 tools/gpu/make_fixture_tp8.py OUT_DIR
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures"))
from make_fixture import build

out = sys.argv[1]
build(f"{out}/qwen3-moe-tp8", 4321,
      dict(vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=256,
           num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
           num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, rope_theta=1000000.0,
           rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=False,
           decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False),
      [7, 40], 16, 0.06)
