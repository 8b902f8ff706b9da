"""A small Llama (from a config) in bf16: generate() 64 new tokens for a batch of prompts."""
import argparse
import torch
from transformers import LlamaConfig, LlamaForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=16)
ap.add_argument("--prompt", type=int, default=256)
ap.add_argument("--new", type=int, default=64)
a = ap.parse_args()
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=8, vocab_size=32000, max_position_embeddings=2048)
model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
ids = torch.randint(3, 32000, (a.batch_size, a.prompt), device="cuda")
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False,
                         pad_token_id=0)
print("generated", tuple(out.shape))
