"""torchvision ResNet-18, fp16 autocast with GradScaler, channels_last, SGD; a held-out program
(written after cachet predict was built, never tuned against)."""
import argparse
import torch
import torchvision

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=64)
ap.add_argument("--steps", type=int, default=3)
a = ap.parse_args()
torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=100).cuda().to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
scaler = torch.amp.GradScaler("cuda")
for step in range(a.steps):
    x = torch.randn(a.batch_size, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 100, (a.batch_size,), device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.4f}")
