"""transformers GPT-2 (from a config) in fp16, batched greedy generate() of 48 new tokens; a
held-out program."""
import argparse
import torch
from transformers import GPT2Config, GPT2LMHeadModel

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=16)
ap.add_argument("--prompt-len", type=int, default=128)
a = ap.parse_args()
torch.manual_seed(0)
cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024)
model = GPT2LMHeadModel(cfg).to(device="cuda", dtype=torch.float16).eval()
ids = torch.randint(0, cfg.vocab_size, (a.batch_size, a.prompt_len), device="cuda")
with torch.no_grad():
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False,
                         pad_token_id=0)
print("generated", out.shape, int(out[0, -1].item()))
