"""GPT-2 (6 layers, from a config) trained with bf16 autocast and fused AdamW; loss logged with .item()."""
import argparse
import torch
from transformers import GPT2Config, GPT2LMHeadModel

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=8)
ap.add_argument("--seq", type=int, default=512)
ap.add_argument("--steps", type=int, default=3)
a = ap.parse_args()
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=1024)).to("cuda")
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
for step in range(a.steps):
    ids = torch.randint(0, 50257, (a.batch_size, a.seq), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.4f}")
