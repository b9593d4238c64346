import sys, torch
mode = sys.argv[1]
dev = torch.device("cuda", 0)
x = torch.ones(4, device=dev)
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        y = x * 2
        if mode.startswith("sync"):
            torch.cuda.synchronize()
        else:
            y.sum().item()
except Exception as e:
    print(mode, "capture failed:", type(e).__name__, str(e).splitlines()[0][:100])
try:
    torch.cuda.synchronize()
except Exception as e:
    print(mode, "sync after:", str(e)[:80])
if mode.endswith("fix"):
    gen = torch.cuda.default_generators[0]
    print(mode, "has api", hasattr(gen, "graphsafe_set_state"), hasattr(gen, "clone_state"))
    gen.graphsafe_set_state(gen.clone_state())
try:
    print(mode, "randn after:", torch.randn(3, device=dev).shape, "ok")
except Exception as e:
    print(mode, "randn after FAILED:", str(e)[:100])
try:
    print(mode, "new graph with randn:", end=" ")
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        z = torch.randn(3, device=dev) + x[:3]
    g2.replay(); torch.cuda.synchronize(); print("ok")
except Exception as e:
    print("FAILED", str(e)[:100])
