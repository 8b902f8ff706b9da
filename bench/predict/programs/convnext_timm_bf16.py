"""timm ConvNeXt-Tiny (no weights) trained with bf16 autocast and fused AdamW, channels_last."""
import argparse
import timm
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=32)
ap.add_argument("--steps", type=int, default=3)
a = ap.parse_args()
torch.manual_seed(0)
model = timm.create_model("convnext_tiny", pretrained=False).cuda().to(memory_format=torch.channels_last)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
for step in range(a.steps):
    x = torch.randn(a.batch_size, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (a.batch_size,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.4f}")
