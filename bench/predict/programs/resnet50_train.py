"""torchvision ResNet-50 trained with SGD in fp32 (cuDNN convolutions); loss logged with .item()."""
import argparse
import torch
import torchvision

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=32)
ap.add_argument("--steps", type=int, default=3)
a = ap.parse_args()
torch.manual_seed(0)
model = torchvision.models.resnet50().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
lossf = torch.nn.CrossEntropyLoss()
for step in range(a.steps):
    x = torch.randn(a.batch_size, 3, 224, 224).pin_memory().cuda(non_blocking=True)
    y = torch.randint(0, 1000, (a.batch_size,)).cuda()
    loss = lossf(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
