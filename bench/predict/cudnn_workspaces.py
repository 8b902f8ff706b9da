#!/usr/bin/env python3
"""What cuDNN's convolutions take from PyTorch's allocator beyond their outputs, on this GPU
(docs/predict.md section 3): the ground truth a workspace rule for the fake device would need.

Collects the Conv2d configurations of eight torchvision models (ResNet-50/18, MobileNet-V2,
VGG-11, EfficientNet-B0, ConvNeXt-T, RegNetY-400MF, DenseNet-121, at 224x224), then for each at
batch 8 and 32, in fp32 NCHW, bf16 NCHW and fp16 channels_last, runs one forward and backward with
torch.backends.cudnn.benchmark off (PyTorch's default, the cuDNN v8 API) under the memory history,
and writes every allocation freed inside the call (its workspaces and transient buffers).

    python3 bench/predict/cudnn_workspaces.py OUT.json      (on the GPU machine)
"""
import json, sys, torch, torch.nn.functional as F, torchvision
torch.backends.cudnn.benchmark = False
dev = "cuda"
configs = {}
def hook(m, inp, out):
    x = inp[0]
    key = (tuple(x.shape[1:]), m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation, m.groups, m.bias is not None)
    configs[key] = 1
models = {"resnet50": torchvision.models.resnet50, "resnet18": torchvision.models.resnet18,
          "mobilenet_v2": torchvision.models.mobilenet_v2, "vgg11": torchvision.models.vgg11,
          "efficientnet_b0": torchvision.models.efficientnet_b0, "convnext_tiny": torchvision.models.convnext_tiny,
          "regnet_y_400mf": torchvision.models.regnet_y_400mf, "densenet121": torchvision.models.densenet121}
for name, ctor in models.items():
    m = ctor().to(dev)
    hs = [c.register_forward_hook(hook) for c in m.modules() if isinstance(c, torch.nn.Conv2d)]
    with torch.no_grad():
        m(torch.randn(1, 3, 224, 224, device=dev))
    for h in hs: h.remove()
    del m
print(len(configs), "configs", file=sys.stderr)
torch.cuda.empty_cache()
rows = []
def measure(key, n, dtype, cl):
    (c, h, w), k, ks, st, pd, dl, g, bias = key
    x = torch.randn(n, c, h, w, device=dev, dtype=dtype, requires_grad=True)
    wt = torch.randn(k, c // g, *ks, device=dev, dtype=dtype, requires_grad=True)
    if cl:
        x = x.detach().to(memory_format=torch.channels_last).requires_grad_()
        wt = wt.detach().to(memory_format=torch.channels_last).requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    y = F.conv2d(x, wt, None, st, pd, dl, g)
    gy = torch.ones_like(y)
    gx, gw = torch.autograd.grad(y, (x, wt), gy)
    torch.cuda.synchronize()
    tr = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    live = {}; ws = []
    for e in tr:
        if e["action"] == "alloc": live[e["addr"]] = e["size"]
        elif e["action"] == "free_requested" and e["addr"] in live:
            ws.append(live.pop(e["addr"]))
    rows.append({"in": [n, c, h, w], "k": k, "ks": list(ks), "stride": list(st), "pad": list(pd), "dil": list(dl),
                 "groups": g, "dtype": str(dtype).split(".")[-1], "cl": cl, "y": list(y.shape),
                 "transient": ws})
    del x, wt, y, gy, gx, gw
for key in configs:
    for n in (8, 32):
        for dtype, cl in ((torch.float32, False), (torch.bfloat16, False), (torch.float16, True)):
            try:
                measure(key, n, dtype, cl)
            except Exception as e:
                print("fail", key, n, dtype, e, file=sys.stderr)
    torch.cuda.empty_cache()
json.dump({"device": torch.cuda.get_device_name(), "cudnn": torch.backends.cudnn.version(), "torch": torch.__version__,
           "rows": rows}, open(sys.argv[1], "w"))
print(len(rows), "rows", file=sys.stderr)
