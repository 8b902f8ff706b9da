#!/usr/bin/env python3
"""Sleep and wake through cachet_torch (issue 24; cachet's rules: docs/sleep-wake.md): the
issue's Done-when 1-4, each a scenario in fresh processes, and 6 by running each under
--policy pytorch|cachet and --expandable on|off. Exit 77 = skipped (no PyTorch, no CUDA device,
no libcachet_c10.so); exit 1 with a message when cachet_torch has no sleep yet.

usage: test_sleep.py SCENARIO [--policy pytorch|cachet] [--expandable on|off]

Scenarios:
  rl_loop   an "engine" (GPT-2 small, random weights from a fixed seed, tagged "weights"; a
            KV-cache buffer tagged "kv_cache"; a decode step captured once as a CUDA graph, its
            pool tagged "graph") and a "trainer" (a second GPT-2 small trained with AdamW) in one
            process, under a cap that fits the engine and the trainer's weights and optimizer
            state but not the trainer's step beside the awake engine. 5 cycles: the engine
            replays its graph, sleeps (weights backed up, the KV cache and graph not), the trainer
            steps, empty_cache, the engine wakes and replays. The decode outputs equal those of a
            run without sleeps (bitwise), the trainer's losses equal a run of the trainer alone,
            the graph is captured once (Done-when 1).
  give_back after sleep(), mem_get_info()'s free memory rises by >= 99% of what sleep() reports,
            which is >= 99% of reserved; after wake() every data_ptr() is unchanged and every
            backed-up tensor is bitwise equal to before (Done-when 2).
  cycles    100 sleep/wake cycles: device free memory, reserved bytes, the backup bytes and the
            process's resident host memory return to their values after the first cycle, within
            2 MiB (Done-when 3).
  wake_oom  a wake that does not fit (another allocation took the memory) raises
            torch.OutOfMemoryError and everything stays asleep; after that memory is freed a
            second wake succeeds with the backups intact (Done-when 4).

Environment: as tests/test_c10.py (CACHET_TORCH_LIB or CACHET_C10_LIB); CACHET_SLEEP_OUT (a
folder: each run writes SCENARIO-POLICY-EXPANDABLE.json there).
"""
import json
import os
import sys
import tempfile

import preamble

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
MiB = 1 << 20
GiB = 1 << 30
SCENARIOS = ("rl_loop", "give_back", "cycles", "wake_oom")
check = preamble.Checks()
failures = check.failures
deterministic = preamble.deterministic


rss_bytes = preamble.rss_bytes


# ------------------------------------------------------------------------------------ workers

def gpt2(torch, seed):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(attn_implementation="eager")).cuda()


class Engine:
    """GPT-2 small weights ("weights"), a KV-cache buffer ("kv_cache"), a decode step captured
    once as a CUDA graph ("graph"). The decode writes the KV buffer before reading it, so its
    undefined contents after a wake without backup do not matter."""

    def __init__(self, torch, ct, kv_bytes):
        self.torch = torch
        with ct.tag("weights"):
            self.model = gpt2(torch, 1).eval()
            self.ids = torch.zeros((4, 64), dtype=torch.long, device="cuda")
            self.pos = torch.arange(64, device="cuda")
        with ct.tag("kv_cache"):
            self.kv = torch.empty(kv_bytes // 4, dtype=torch.float32, device="cuda")
        self.captures = 0
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(3):  # warm up on a side stream, as torch.cuda.graphs asks
                self.step()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with ct.tag("graph"), torch.no_grad(), torch.cuda.graph(self.graph):
            self.out = self.step()
        self.captures += 1

    def step(self):
        # GPT-2's blocks called one by one: the model's own forward builds its attention mask from
        # a CPU tensor, which a CUDA graph capture refuses (the blocks then attend without a mask;
        # the same computation every run, which is all this test compares).
        tr = self.model.transformer
        h = tr.wte(self.ids) + tr.wpe(self.pos)
        for block in tr.h:
            out = block(h)
            h = out[0] if isinstance(out, tuple) else out
        h = tr.ln_f(h)  # [4, 64, 768]
        n = h.numel()
        self.kv[:n].copy_(h.reshape(-1))
        return self.model.lm_head(self.kv[:n].view_as(h)[:, -1]).float()

    def decode(self, cycle):
        g = self.torch.Generator(device="cpu").manual_seed(100 + cycle)
        self.ids.copy_(self.torch.randint(0, 50257, (4, 64), generator=g))
        self.graph.replay()
        self.torch.cuda.synchronize()
        return self.out.cpu()


def trainer_step(torch, model, opt, cycle):
    g = torch.Generator(device="cpu").manual_seed(1000 + cycle)
    ids = torch.randint(0, 50257, (8, 512), generator=g).cuda()
    opt.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids).loss
    loss.backward()
    opt.step()
    return float.hex(loss.item())


def w_rl_loop(torch, ct, res, mode):
    deterministic(torch)
    kv_bytes = 4 * GiB
    if mode in ("engine", "rl"):
        if mode == "rl":
            cap = int(os.environ["CACHET_SLEEP_CAP"])
            torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(0).total_memory)
        engine = Engine(torch, ct, kv_bytes)
        torch.cuda.synchronize()
        res["engine_reserved"] = torch.cuda.memory_reserved()
    if mode in ("trainer", "rl"):
        trainer = gpt2(torch, 2).train()
        opt = torch.optim.AdamW(trainer.parameters(), lr=1e-4)
    outputs, losses = [], []
    for cycle in range(5):
        if mode in ("engine", "rl"):
            outputs.append(engine.decode(cycle).numpy().tobytes().hex())
        if mode == "rl":
            res.setdefault("slept", []).append(
                int(ct.sleep(tags=("weights", "kv_cache", "graph"), backup=("weights",))))
        if mode in ("trainer", "rl"):
            losses.append(trainer_step(torch, trainer, opt, cycle))
            if mode == "trainer" and cycle == 0:
                # The trainer's footprint between steps (weights, grads, AdamW state), and its peak.
                torch.cuda.synchronize()
                res["trainer_between"] = torch.cuda.memory_allocated()
        if mode == "rl":
            torch.cuda.empty_cache()  # the trainer's cached activations go back before the wake
            ct.wake(tags=("weights", "kv_cache", "graph"))
    if mode == "trainer":
        res["trainer_peak"] = torch.cuda.max_memory_reserved()
    res["outputs"] = outputs
    res["losses"] = losses
    if mode in ("engine", "rl"):
        res["captures"] = engine.captures
        res["replay_after_loop"] = engine.decode(5).numpy().tobytes().hex()


def w_give_back(torch, ct, res):
    with ct.tag("weights"):
        w = [torch.randn(64 * MiB, device="cuda") for _ in range(4)]  # 1 GiB, backed up
    with ct.tag("kv_cache"):
        kv = [torch.empty(256 * MiB, dtype=torch.uint8, device="cuda") for _ in range(4)]  # 1 GiB
    host = [t.cpu() for t in w]
    ptrs = [t.data_ptr() for t in w + kv]
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    free0 = torch.cuda.mem_get_info()[0]
    n = int(ct.sleep(tags=None, backup=("weights",)))
    free1 = torch.cuda.mem_get_info()[0]
    res.update(reserved=reserved, slept=n, free_rise=free1 - free0, sleeping=list(ct.sleeping()))
    res["stats_asleep"] = {k: v for k, v in ct.memory_stats(0).items() if k.startswith("sleep.")}
    ct.wake()
    res["ptrs_same"] = ptrs == [t.data_ptr() for t in w + kv]
    res["backups_equal"] = all(torch.equal(a.cpu(), b) for a, b in zip(w, host))
    res["sleeping_after"] = list(ct.sleeping())


def w_cycles(torch, ct, res):
    with ct.tag("weights"):
        w = [torch.randn(64 * MiB, device="cuda") for _ in range(4)]
    with ct.tag("kv_cache"):
        kv = torch.empty(GiB, dtype=torch.uint8, device="cuda")
    host = [t.cpu() for t in w]
    rows = []
    for i in range(100):
        ct.sleep(tags=None, backup=("weights",))
        ct.wake()
        torch.cuda.synchronize()
        st = ct.memory_stats(0)
        rows.append([torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved(),
                     st.get("sleep.backup_bytes.current", -1), rss_bytes()])
    res["rows"] = [rows[0], rows[-1]]
    res["max_dev"] = [max(abs(r[k] - rows[0][k]) for r in rows) for k in range(4)]
    res["backups_equal"] = all(torch.equal(a.cpu(), b) for a, b in zip(w, host))
    del kv


def w_wake_oom(torch, ct, res):
    with ct.tag("weights"):
        w = [torch.randn(64 * MiB, device="cuda") for _ in range(8)]  # 2 GiB
    host = [t.cpu() for t in w]
    ct.sleep(tags=None, backup=("weights",))
    free = torch.cuda.mem_get_info()[0]
    hog = torch.empty(free - 512 * MiB, dtype=torch.uint8, device="cuda")  # takes the memory
    try:
        ct.wake()
        res["first_wake"] = "returned"
    except torch.OutOfMemoryError as e:
        res["first_wake"] = "OutOfMemoryError: " + str(e)[:300]
    res["sleeping_after_oom"] = list(ct.sleeping())
    res["stats_after_oom"] = {k: v for k, v in ct.memory_stats(0).items() if k.startswith("sleep.")}
    del hog
    torch.cuda.empty_cache()
    ct.wake()
    res["sleeping_after_wake"] = list(ct.sleeping())
    res["backups_equal"] = all(torch.equal(a.cpu(), b) for a, b in zip(w, host))


def worker(scenario, mode, out):
    res = {"scenario": scenario, "mode": mode}
    import cachet_torch as ct
    ct.install(backend="c10")
    res["backend"] = ct.backend()
    import torch
    if scenario == "rl_loop":
        w_rl_loop(torch, ct, res, mode)
    else:
        {"give_back": w_give_back, "cycles": w_cycles, "wake_oom": w_wake_oom}[scenario](torch, ct, res)
    with open(out, "w") as f:
        json.dump(res, f, default=str)
    return 0


def run_worker(scenario, mode, tmp, env=None):
    out = os.path.join(tmp, f"{scenario}-{mode}.json")
    return preamble.run_worker([os.path.abspath(__file__), "--worker", scenario, mode, out], out,
                               f"{scenario}/{mode}", check, env=env)


# ------------------------------------------------------------------------------ orchestrator

def run(scenario, tmp):
    res = {}
    if scenario == "rl_loop":
        eng = run_worker(scenario, "engine", tmp)  # the engine alone, no sleeps
        tr = run_worker(scenario, "trainer", tmp)  # the trainer alone
        if eng is None or tr is None:
            return res
        # Fits the engine, the trainer's state and half its step's transient memory: the step
        # does not fit beside the awake engine, it fits once the engine sleeps.
        cap = eng["engine_reserved"] + tr["trainer_between"] + (tr["trainer_peak"] - tr["trainer_between"]) // 2
        check(eng["engine_reserved"] + tr["trainer_peak"] > cap,
              f"rl_loop: premise: engine {eng['engine_reserved']} + trainer peak {tr['trainer_peak']} exceed the "
              f"cap {cap}")
        env = dict(os.environ, CACHET_SLEEP_CAP=str(cap))
        rl = run_worker(scenario, "rl", tmp, env)
        res.update(engine=eng, trainer=tr, rl=rl, cap=cap)
        if rl is None:
            return res
        check(rl["outputs"] == eng["outputs"], "rl_loop: 5 decode outputs bitwise equal to the run without sleeps")
        check(rl["replay_after_loop"] == eng["replay_after_loop"], "rl_loop: a replay after the loop too")
        check(rl["losses"] == tr["losses"], "rl_loop: the trainer's 5 losses equal the trainer alone's")
        check(rl["captures"] == 1, f"rl_loop: the decode graph was captured once ({rl['captures']})")
        check(all(n > 0 for n in rl["slept"]), f"rl_loop: each sleep gave memory back ({rl['slept']})")
    else:
        r = run_worker(scenario, "cachet", tmp)
        res["cachet"] = r
        if r is None:
            return res
        if scenario == "give_back":
            check(r["free_rise"] >= 0.99 * r["slept"],
                  f"give_back: free memory rose by {r['free_rise']} >= 99% of the {r['slept']} bytes sleep() reported")
            check(r["slept"] >= 0.99 * r["reserved"], f"give_back: {r['slept']} >= 99% of reserved {r['reserved']}")
            check(r["ptrs_same"], "give_back: every data_ptr() unchanged after wake()")
            check(r["backups_equal"], "give_back: every backed-up tensor bitwise equal to before")
            check(sorted(r["sleeping"]) == ["kv_cache", "weights"] and r["sleeping_after"] == [],
                  f"give_back: sleeping() {r['sleeping']} while asleep, {r['sleeping_after']} after")
        elif scenario == "cycles":
            labels = ("device free", "reserved", "backup bytes", "host RSS")
            for k, name in enumerate(labels):
                check(r["max_dev"][k] <= 2 * MiB, f"cycles: {name} within 2 MiB of cycle 1 over 100 cycles "
                      f"(largest difference {r['max_dev'][k]})")
            check(r["backups_equal"], "cycles: the backed-up tensors bitwise equal after 100 cycles")
        elif scenario == "wake_oom":
            check(r["first_wake"].startswith("OutOfMemoryError"),
                  f"wake_oom: the wake that does not fit raises torch.OutOfMemoryError ({r['first_wake'][:120]!r})")
            check(r["sleeping_after_oom"] == ["weights"], f"wake_oom: still asleep ({r['sleeping_after_oom']})")
            check(r["stats_after_oom"].get("sleep.num_wake_ooms") == 1, "wake_oom: sleep.num_wake_ooms is 1")
            check(r["sleeping_after_wake"] == [] and r["backups_equal"],
                  "wake_oom: the second wake succeeds with the backups intact")
    return res


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], sys.argv[3], sys.argv[4])
    args = sys.argv[1:]
    opts = {"--policy": "pytorch", "--expandable": "off"}
    for o in list(opts):
        if o in args:
            i = args.index(o)
            opts[o] = args[i + 1]
            del args[i:i + 2]
    if len(args) != 1 or args[0] not in SCENARIOS or opts["--policy"] not in ("pytorch", "cachet") or \
            opts["--expandable"] not in ("on", "off"):
        print(f"usage: test_sleep.py {{{'|'.join(SCENARIOS)}}} [--policy pytorch|cachet] [--expandable on|off]",
              file=sys.stderr)
        return 2
    scenario = args[0]
    _, _, skip = preamble.start(plugin=False)
    if skip is not None:
        return skip
    import cachet_torch
    if cachet_torch.c10_library_path() is None:
        print("skipped: no libcachet_c10.so (built only where a torch was found)")
        return preamble.SKIP
    if not all(hasattr(cachet_torch, f) for f in ("tag", "sleep", "wake", "sleeping")):
        print("FAIL  cachet_torch has no tag/sleep/wake/sleeping yet (issue 24: docs/sleep-wake.md)")
        return 1
    conf = [f"policy:{opts['--policy']}", "cachet_sleep:True"]
    if opts["--expandable"] == "on":
        conf.append("expandable_segments:True")
    os.environ["CACHET_ALLOC_CONF"] = ",".join(conf)
    tmp = tempfile.mkdtemp(prefix=f"cachet-sleep-{scenario}-")
    res = run(scenario, tmp)
    outdir = os.environ.get("CACHET_SLEEP_OUT")
    if outdir:
        os.makedirs(outdir, exist_ok=True)
        name = f"{scenario}-{opts['--policy']}-expandable-{opts['--expandable']}.json"
        with open(os.path.join(outdir, name), "w") as f:
            json.dump({"result": res, "failures": failures}, f, default=str, indent=1)
    print(f"{scenario}: {'FAIL' if failures else 'ok'} ({len(failures)} failures)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
