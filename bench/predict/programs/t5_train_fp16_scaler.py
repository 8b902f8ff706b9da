"""T5-small (from a config) trained with fp16 autocast and GradScaler; loss logged with .item()."""
import argparse
import torch
from transformers import T5Config, T5ForConditionalGeneration

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=16)
ap.add_argument("--seq", type=int, default=256)
ap.add_argument("--steps", type=int, default=3)
a = ap.parse_args()
torch.manual_seed(0)
cfg = T5Config(d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8, vocab_size=32128,
               decoder_start_token_id=0, pad_token_id=0)
model = T5ForConditionalGeneration(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cuda")
for step in range(a.steps):
    src = torch.randint(0, 32128, (a.batch_size, a.seq)).cuda()
    tgt = torch.randint(0, 32128, (a.batch_size, a.seq // 2)).cuda()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(input_ids=src, labels=tgt).loss
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
