"""BERT-base (from a config) masked-LM training with gradient accumulation (4 micro-batches), fp32."""
import argparse
import torch
from transformers import BertConfig, BertForMaskedLM

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=8)
ap.add_argument("--seq", type=int, default=256)
ap.add_argument("--steps", type=int, default=2)
ap.add_argument("--accum", type=int, default=4)
a = ap.parse_args()
torch.manual_seed(0)
model = BertForMaskedLM(BertConfig()).to("cuda")
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(a.steps):
    for micro in range(a.accum):
        ids = torch.randint(0, 30522, (a.batch_size, a.seq), device="cuda")
        loss = model(input_ids=ids, labels=ids).loss / a.accum
        loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
