#!/usr/bin/env python3
"""Where a staged copy's time goes, from the engine's trace.

    PINMEM_COPY_TRACE=2000000 PINMEM_BENCH_COPY=sizes pinmem bench copy --quick 2>trace.txt
    python3 bench/probe/trace_summary.py trace.txt

For each size and direction, the median over its copies (microseconds from
the copy's start): when the first worker claimed a slice, how many slices
the caller and the workers ran, how long a slice took, when the first and
the last DMA were queued, how long the waits for DMAs took in all, and when
the copy ended."""
import statistics
import sys
from collections import defaultdict


def read(path):
    jobs = defaultdict(lambda: {"events": []})
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 6 or parts[0] != "trace":
                continue
            ns, job, thread, event, arg = int(parts[1]), int(parts[2]), int(parts[3]), parts[4], int(parts[5])
            jobs[job]["events"].append((ns, thread, event, arg))
    return jobs


def summarise(job):
    ev = sorted(job["events"])
    start = next((e for e in ev if e[2] == "job_start"), None)
    end = next((e for e in ev if e[2] == "job_end"), None)
    if not start or not end:
        return None
    t0 = start[0]
    us = lambda ns: (ns - t0) / 1e3
    claims = {}
    slices = []
    for ns, thread, event, arg in ev:
        if event == "claim":
            claims[(thread, arg)] = ns
        elif event == "slice_done" and (thread, arg) in claims:
            slices.append((thread, (ns - claims.pop((thread, arg))) / 1e3))
    worker_claims = [us(ns) for ns, thread, event, _ in ev if event == "claim" and thread > 0]
    dmas = [us(ns) for ns, _, event, _ in ev if event == "dma_queued"]
    begins = {}
    waited = 0.0
    for ns, thread, event, arg in ev:
        if event == "wait_begin":
            begins[(thread, arg)] = ns
        elif event == "wait_end" and (thread, arg) in begins:
            waited += (ns - begins.pop((thread, arg))) / 1e3
    kib = start[3] & 0x7FFFFFFF
    return {
        "key": (kib, "dtoh" if start[3] >> 31 else "htod"),
        "total": us(end[0]),
        "first_worker": min(worker_claims) if worker_claims else float("nan"),
        "caller_slices": sum(1 for t, _ in slices if t == 0),
        "worker_slices": sum(1 for t, _ in slices if t > 0),
        "slice": statistics.median(d for _, d in slices) if slices else float("nan"),
        "first_dma": min(dmas) if dmas else float("nan"),
        "last_dma": max(dmas) if dmas else float("nan"),
        "waited": waited,
    }


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    groups = defaultdict(list)
    for job in read(sys.argv[1]).values():
        s = summarise(job)
        if s:
            groups[s["key"]].append(s)
    cols = ["total", "first_worker", "caller_slices", "worker_slices", "slice", "first_dma",
            "last_dma", "waited"]
    print(f"{'size':>10} {'dir':>5} {'copies':>6} " + " ".join(f"{c:>13}" for c in cols))
    for (kib, way), rows in sorted(groups.items()):
        med = []
        for c in cols:
            seen = [r[c] for r in rows if r[c] == r[c]]  # without the copies that lack it
            med.append(statistics.median(seen) if seen else float("nan"))
        size = f"{kib >> 10} MiB" if kib >= 1024 else f"{kib} KiB"
        print(f"{size:>10} {way:>5} {len(rows):>6} " + " ".join(f"{m:13.1f}" for m in med))
    print("(microseconds from each copy's start, medians over its copies; slices: how many the "
          "caller and the workers ran; waited: all waits for DMAs)")


if __name__ == "__main__":
    main()
