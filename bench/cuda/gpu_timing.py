"""gpu_timing.py — the peers' timing, as ours (bench/cuda/bench_*.c): device
events around each call (or graph replay), warm-up first, median of >= 30.
Shared by bench_torch.py and bench_flashinfer.py."""
import torch

REPS = 30


def median_ms(replay, calls=1, reps=REPS):
    """Median ms of replay() over `reps` timed calls after 3 warm-up calls,
    divided by `calls` (the runs one replay holds)."""
    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[reps // 2] / calls


def graph_of(fns):
    """A CUDA graph of one call of each fn (run once on a side stream first,
    as torch asks); returns its replay. Raises if the capture is refused."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    return g.replay


def replay_or_eager(fns):
    """(replay, "graph"), or (a loop over fns, "eager") where a run cannot be
    captured (it syncs or allocates on the host)."""
    try:
        return graph_of(fns), "graph"
    except Exception as e:
        print(f"  graph capture refused ({type(e).__name__}: {str(e)[:100]}): eager timing")
        torch.cuda.synchronize()

        def loop():
            for f in fns:
                f()
        return loop, "eager"
