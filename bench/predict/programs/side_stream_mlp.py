"""An MLP trained while a side stream prefetches the next batch from pinned memory; the batch is
handed to the compute stream with record_stream."""
import argparse
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=4096)
ap.add_argument("--steps", type=int, default=6)
a = ap.parse_args()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 8192),
                            torch.nn.GELU(), torch.nn.Linear(8192, 1000)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
side = torch.cuda.Stream()
host = [torch.randn(a.batch_size, 2048).pin_memory() for _ in range(2)]

def prefetch(i):
    with torch.cuda.stream(side):
        return host[i % 2].to("cuda", non_blocking=True)

nxt = prefetch(0)
for step in range(a.steps):
    torch.cuda.current_stream().wait_stream(side)
    x = nxt
    x.record_stream(torch.cuda.current_stream())
    nxt = prefetch(step + 1)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del x
    print(f"step {step} loss {loss.item():.4f}")
torch.cuda.synchronize()
