"""A small Llama (transformers, from a config) trained with gradient checkpointing, bf16 weights,
AdamW; a held-out program."""
import argparse
import torch
from transformers import LlamaConfig, LlamaForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=8)
ap.add_argument("--seq-len", type=int, default=512)
ap.add_argument("--steps", type=int, default=3)
a = ap.parse_args()
torch.manual_seed(0)
cfg = LlamaConfig(num_hidden_layers=6, hidden_size=768, intermediate_size=2048, num_attention_heads=12,
                  num_key_value_heads=4, vocab_size=32000, max_position_embeddings=a.seq_len)
model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16)
model.gradient_checkpointing_enable()
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(a.steps):
    ids = torch.randint(0, cfg.vocab_size, (a.batch_size, a.seq_len), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.4f}")
