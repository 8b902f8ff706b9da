"""transformers BART (from a config) seq2seq training under fp16 autocast with GradScaler and
AdamW, with a side-stream copy of the next batch; a held-out program."""
import argparse
import torch
from transformers import BartConfig, BartForConditionalGeneration

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=12)
ap.add_argument("--steps", type=int, default=3)
a = ap.parse_args()
torch.manual_seed(0)
cfg = BartConfig(encoder_layers=4, decoder_layers=4, d_model=512, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, vocab_size=32000)
model = BartForConditionalGeneration(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cuda")
side = torch.cuda.Stream()
cpu = [torch.randint(0, cfg.vocab_size, (a.batch_size, 384)).pin_memory() for _ in range(2)]
with torch.cuda.stream(side):
    nxt = cpu[0].to("cuda", non_blocking=True)
for step in range(a.steps):
    torch.cuda.current_stream().wait_stream(side)
    src = nxt
    src.record_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        nxt = cpu[(step + 1) % 2].to("cuda", non_blocking=True)
    tgt = src[:, :192]
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(input_ids=src, labels=tgt).loss
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.4f}")
