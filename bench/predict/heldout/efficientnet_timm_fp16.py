"""timm EfficientNet-B0 (from its config, no weights) trained with fp16 autocast, GradScaler and
AdamW; a held-out program."""
import argparse
import timm
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=48)
ap.add_argument("--steps", type=int, default=3)
a = ap.parse_args()
torch.manual_seed(0)
model = timm.create_model("efficientnet_b0", pretrained=False, num_classes=200).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda")
for step in range(a.steps):
    x = torch.randn(a.batch_size, 3, 224, 224, device="cuda")
    y = torch.randint(0, 200, (a.batch_size,), device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
