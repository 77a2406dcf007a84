"""What pinmem's copies and cold pinning give a PyTorch process whose main
thread OpenMP has bound to one CPU (run it with OMP_PROC_BIND=close: importing
torch binds the thread then), against the same process unbound; run once a
setting, each a process of its own (bench/gpu-cpus.sh does, with and without
PINMEM_THREAD_CPUS=process). It prints one line: the main thread's CPUs after
importing torch, pinmem's staging workers, cold pinning of 1 GiB in ms, and
pageable copies each way as a share of a page-locked torch tensor's copy in
the same process.

    python bound_main_thread.py [label]
"""
import os
import statistics
import sys
import time

import torch

import pinmem

SIZES = [4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
REPS = 5


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def median_rate(nbytes, fn):
    fn()  # warm: the engine's first copy starts its workers
    return nbytes / statistics.median(timed(fn) for _ in range(REPS)) / 1e9


def cold_pin_ms(nbytes):
    start = time.perf_counter()
    buf = pinmem.empty(nbytes)
    elapsed = (time.perf_counter() - start) * 1e3
    buf.close()
    return elapsed


def copy_workers():
    """pinmem's staging threads now running, and how many CPUs they may use between them."""
    cpus, count = set(), 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != "pinmem-copy":
                    continue
            cpus |= os.sched_getaffinity(int(tid))
            count += 1
        except OSError:
            continue  # a thread that ended meanwhile
    return count, len(cpus)


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "run"
    cpus = os.sched_getaffinity(0)
    pin = min(cold_pin_ms(1 << 30) for _ in range(3))
    shares = []
    for n in SIZES:
        host = torch.full((n,), 7, dtype=torch.uint8)
        pinned = torch.full((n,), 7, dtype=torch.uint8).pin_memory()
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        to_dev = median_rate(n, lambda: pinmem.copy(dev, host))
        ceiling_to = median_rate(n, lambda: dev.copy_(pinned))
        from_dev = median_rate(n, lambda: pinmem.copy(host, dev))
        ceiling_from = median_rate(n, lambda: pinned.copy_(dev))
        assert torch.equal(host[:4096], torch.full((4096,), 7, dtype=torch.uint8))
        shares.append(f"{n >> 20}M {100 * to_dev / ceiling_to:.0f}%/{100 * from_dev / ceiling_from:.0f}%"
                      f" ({to_dev:.1f}/{from_dev:.1f} GB/s)")
        del host, pinned, dev
    workers, worker_cpus = copy_workers()
    print(f"{label}: main thread on {len(cpus)} CPU(s), {workers} workers on {worker_cpus} CPU(s), "
          f"cold 1 GiB {pin:.0f} ms; "
          f"pageable to/from the device as % of pinned: " + "; ".join(shares), flush=True)


if __name__ == "__main__":
    main()
