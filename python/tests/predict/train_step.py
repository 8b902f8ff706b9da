"""A training step with backward, autocast and GradScaler, a side stream with record_stream, and a
value read from the GPU: the capture side of cachet predict must run it with no GPU visible."""
import argparse
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=64)
ap.add_argument("--raise-at", type=int, default=-1)
a = ap.parse_args()
assert torch.cuda.is_available() and torch.cuda.device_count() == 1
props = torch.cuda.get_device_properties(0)
print("device", torch.cuda.get_device_name(0), props.major, props.minor, props.multi_processor_count)
free, total = torch.cuda.mem_get_info()
assert 0 < free < total, (free, total)
m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.AdamW(m.parameters(), fused=True)
scaler = torch.amp.GradScaler("cuda")
side = torch.cuda.Stream()
for step in range(3):
    if step == a.raise_at:
        raise ValueError("planted failure at step %d" % step)
    with torch.cuda.stream(side):
        x = torch.randn(a.batch_size, 1024).pin_memory().to("cuda", non_blocking=True)
    torch.cuda.current_stream().wait_stream(side)
    x.record_stream(torch.cuda.current_stream())
    with torch.autocast("cuda", dtype=torch.float16):
        loss = m(x).float().square().mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    torch.cuda.synchronize()
    print("step", step, "loss", loss.item(), "allocated", torch.cuda.memory_allocated())
