"""transformers RoBERTa (from a config) for sequence classification, bf16 autocast, fused AdamW,
gradient accumulation over 2 micro-batches; a held-out program."""
import argparse
import torch
from transformers import RobertaConfig, RobertaForSequenceClassification

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=16)
ap.add_argument("--seq-len", type=int, default=256)
ap.add_argument("--steps", type=int, default=2)
a = ap.parse_args()
torch.manual_seed(0)
cfg = RobertaConfig(num_hidden_layers=6, hidden_size=512, num_attention_heads=8, intermediate_size=2048,
                    vocab_size=30000, max_position_embeddings=a.seq_len + 2, num_labels=4)
model = RobertaForSequenceClassification(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=3e-5, fused=True)
for step in range(a.steps):
    for micro in range(2):
        ids = torch.randint(3, cfg.vocab_size, (a.batch_size, a.seq_len), device="cuda")
        labels = torch.randint(0, 4, (a.batch_size,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss / 2
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.4f}")
