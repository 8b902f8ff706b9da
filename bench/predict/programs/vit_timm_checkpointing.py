"""timm ViT-B/16 (from its config, no weights) with gradient checkpointing, bf16 autocast, AdamW."""
import argparse
import timm
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=32)
ap.add_argument("--steps", type=int, default=3)
a = ap.parse_args()
torch.manual_seed(0)
model = timm.create_model("vit_base_patch16_224", pretrained=False).cuda()
model.set_grad_checkpointing(True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
for step in range(a.steps):
    x = torch.randn(a.batch_size, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (a.batch_size,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.4f}")
