# Makes tests/fixtures/qwen3-moe-hd128: a small random Qwen3-MoE checkpoint with the attention shape
# of the large models (head_dim 128, 16 q / 4 kv heads: GQA 4), an expert width that is not a
# multiple of 128 (moe_intermediate 160: padded to 256 in the packed layout) and one prompt longer
# than 256 tokens (three 128-key attention segments), with a reference from Hugging Face
# transformers. Run where torch and transformers exist (the GPU machine):
#   python3 tools/gpu/make_fixture_hd128.py OUT_DIR
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures"))
from make_fixture import build

out = sys.argv[1]
build(f"{out}/qwen3-moe-hd128", 2718,
      dict(vocab_size=1024, hidden_size=256, intermediate_size=512, moe_intermediate_size=160,
           num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=4, head_dim=128,
           num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, rope_theta=1000000.0,
           rms_norm_eps=1e-6, max_position_embeddings=1024, tie_word_embeddings=False,
           decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False),
      [6, 45, 300], 24, 0.06)
