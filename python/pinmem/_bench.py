"""python -m pinmem bench: pinmem beside PyTorch in one process.

Cold pinning (pinmem.empty against torch.empty(pin_memory=True), PyTorch's
default and its pinned_use_cuda_host_register setting each in a process of
its own, since PyTorch reads that setting once), pageable copies both ways
(pinmem.copy against tensor.copy_, with a pinned tensor's copy as the
ceiling), batches of scattered page-locked blocks by pinmem.copy_batch and
pinmem.copy_blocks against one contiguous copy, and what a pinmem.copy call
costs in Python over the C call. On the posix backend it runs what needs no
GPU (pinning, and copies to the simulated device memory) and says what it
skips.
"""

import argparse
import ctypes
import json
import os
import random
import statistics
import subprocess
import sys
import time

import pinmem
from pinmem import _lib

MiB = 1 << 20


def _size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    word = text.strip().upper().rstrip("B").rstrip("I")
    try:
        n = (int(float(word[:-1]) * units[word[-1]]) if word and word[-1] in units
             else int(word))
    except (ValueError, OverflowError):
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (a positive count of bytes, "
                                         f"as 4096, 64K, 16M or 1G)")
    return n


def _sizes(text):
    return [_size(word) for word in text.split(",")]


def _repetitions(text):
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive count")
    return n


def _label(n):
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB" if n >= MiB else f"{n >> 10} KiB"


def _torch_cuda():
    try:
        import torch
    except Exception as e:
        return None, f"PyTorch does not import ({e.__class__.__name__})"
    if not torch.cuda.is_available():
        return None, "PyTorch has no CUDA device here"
    return torch, None


def _median_time(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ------------------------------------------------------------ cold pinning

def _pin_pinmem(size):
    t0 = time.perf_counter()
    b = pinmem.empty(size)
    elapsed = time.perf_counter() - t0
    b.close()
    return elapsed


_TORCH_PIN_CHILD = r"""
import json, sys, time, torch
torch.cuda.init()
torch.empty(1, device="cuda")
out = {}
for size in [int(s) for s in sys.argv[1:]]:
    t0 = time.perf_counter()
    t = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    out[size] = time.perf_counter() - t0
    del t
print(json.dumps(out))
"""


def _pin_torch(sizes, conf):
    env = dict(os.environ)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    else:
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    run = subprocess.run([sys.executable, "-c", _TORCH_PIN_CHILD] + [str(s) for s in sizes],
                         env=env, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        return None, run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed"
    return {int(k): v for k, v in json.loads(run.stdout.strip().splitlines()[-1]).items()}, None


def bench_pinning(sizes, reps):
    print("== cold pinning (first touch of fresh memory), milliseconds")
    torch, why = _torch_cuda()
    default = best = None
    best_conf = "pinned_use_cuda_host_register:True,pinned_num_register_threads:16"
    if torch is not None:
        default, why_default = _pin_torch(sizes, None)
        best, why_best = _pin_torch(sizes, best_conf)
        if default is None:
            print(f"  skipped: torch default: {why_default}")
        if best is None:
            print(f"  skipped: torch {best_conf}: {why_best}")
    else:
        print(f"  skipped: torch.empty(pin_memory=True): {why}")
    print(f"  {'size':>8} {'pinmem':>10} {'torch':>10} {'ratio':>7} {'torch best':>11} {'ratio':>7}")
    results = {}
    for size in sizes:
        try:
            ours = statistics.median(_pin_pinmem(size) for _ in range(reps))
        except pinmem.PinmemError as e:
            print(f"  {_label(size):>8} skipped: {e.result} ({e.detail[:90]})")
            continue
        row = f"  {_label(size):>8} {ours * 1e3:10.1f}"
        for table in (default, best):
            if table and size in table:
                row += f" {table[size] * 1e3:10.1f} {table[size] / ours:6.1f}x"
            else:
                row += f" {'-':>10} {'-':>7}"
        print(row)
        results[size] = (ours, default and default.get(size), best and best.get(size))
    return results


# --------------------------------------------------------- pageable copies

def _host_array(size):
    try:
        import numpy
        a = numpy.empty(size, dtype=numpy.uint8)
        a[::4096] = 1  # fault the pages in, as a program's data would be
        return a
    except ImportError:
        b = bytearray(size)
        return b


def _copy_reps(size, reps):
    """reps for a copy of 64 MiB and up; proportionally more below (at most
    200), so that a small copy's median is not taken over the copy engine's
    first copies, in which it still learns its settings."""
    return max(reps, min(200, reps * (64 << 20) // size))


def _warm_ups(size):
    """pinmem's synchronous copies to the device of 64 MiB and up try both
    kinds of stores in turn over their first seven in each size class
    (docs/design.md, "Demoting stores, learnt"); warmed past those, a median
    is what a program that copies such sizes again and again gets."""
    return 7 if size >= 64 << 20 else 1


def bench_copies(sizes, reps):
    print("== pageable copies, GB/s (median of the repetitions; more below 64 MiB)")
    torch, why = _torch_cuda()
    cuda = pinmem.backend() == "cuda"
    if torch is None:
        print(f"  skipped: tensor.copy_ and the pinned ceiling: {why}")
    if not cuda:
        print("  posix backend: pinmem copies to simulated device memory (host memory); no PCIe")
    header = f"  {'size':>8} {'way':>4} {'pinmem':>8}"
    if torch is not None:
        header += f" {'torch':>8} {'ratio':>7} {'pinned':>8} {'share':>6}"
    print(header)
    results = {}
    for size in sizes:
        host = _host_array(size)
        if torch is not None:
            dev = torch.empty(size, dtype=torch.uint8, device="cuda")
            host_t = torch.from_numpy(host) if hasattr(host, "dtype") else torch.frombuffer(host, dtype=torch.uint8)
            pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        else:
            dev = pinmem.device_empty(size)
        for way in ("h2d", "d2h"):
            dst, src = (dev, host) if way == "h2d" else (host, dev)

            def ours():
                pinmem.copy(dst, src)

            for _ in range(_warm_ups(size)):
                ours()
            n = _copy_reps(size, reps)
            t_ours = _median_time(ours, n)
            row = f"  {_label(size):>8} {way:>4} {size / t_ours / 1e9:8.1f}"
            if torch is not None:
                tdst, tsrc = (dev, host_t) if way == "h2d" else (host_t, dev)
                pdst, psrc = (dev, pinned) if way == "h2d" else (pinned, dev)

                def theirs():
                    tdst.copy_(tsrc)
                    torch.cuda.synchronize()

                def ceiling():
                    pdst.copy_(psrc, non_blocking=True)
                    torch.cuda.synchronize()

                theirs()
                ceiling()
                t_theirs = _median_time(theirs, n)
                t_ceiling = _median_time(ceiling, n)
                row += (f" {size / t_theirs / 1e9:8.1f} {t_theirs / t_ours:6.1f}x "
                        f"{size / t_ceiling / 1e9:8.1f} {t_ceiling / t_ours * 100:5.0f}%")
                results[(size, way)] = (t_ours, t_theirs, t_ceiling)
            else:
                results[(size, way)] = (t_ours, None, None)
            print(row)
        del host, dev
    return results


# ------------------------------------------------------- batches of blocks

def bench_batch(reps, count=1000, block=64 << 10):
    print(f"== pinmem.copy_batch and copy_blocks: {count} scattered {block >> 10} KiB blocks of "
          "page-locked memory, GB/s (share of one contiguous copy of the same bytes)")
    try:
        host = pinmem.empty(2 * count * block)
    except pinmem.PinmemError as e:
        print(f"  skipped: {2 * count * block >> 20} MiB cannot be pinned here ({e.result})")
        return {}
    dev = pinmem.device_empty(2 * count * block)
    order = list(range(count))
    random.Random(1).shuffle(order)
    ways = {"h2d": ([dev.ptr + 2 * k * block for k in order],
                    [host.ptr + 2 * i * block for i in range(count)])}
    ways["d2h"] = ways["h2d"][::-1]
    sizes = [block] * count
    try:
        import numpy
    except ImportError:
        numpy = None
    results = {}
    for way, (dsts, srcs) in ways.items():
        whole = (dev.ptr, host.ptr) if way == "h2d" else (host.ptr, dev.ptr)
        pairs = [(2 * i, 2 * k) for i, k in enumerate(order)]
        if way == "d2h":
            pairs = [(k, i) for i, k in pairs]
        ends = (dev, host) if way == "h2d" else (host, dev)
        forms = [("lists", pinmem.copy_batch, (dsts, srcs, sizes))]
        if numpy is not None:
            forms.insert(0, ("arrays", pinmem.copy_batch,
                             tuple(numpy.array(v, dtype=numpy.uint64) for v in (dsts, srcs, sizes))))
            pairs = numpy.array(pairs, dtype=numpy.int64)
        forms.append(("copy_blocks", pinmem.copy_blocks, ends + (pairs, block)))
        pinmem.copy(*whole, count * block)
        t_whole = _median_time(lambda: pinmem.copy(*whole, count * block), max(reps, 11))
        row = f"  {way}: contiguous {count * block / t_whole / 1e9:5.1f}"
        for name, call, args in forms:
            call(*args)
            t = _median_time(lambda: call(*args), max(reps, 11))
            row += f", {name} {count * block / t / 1e9:5.1f} ({t_whole / t * 100:.1f}%)"
            results[(way, name)] = (t, t_whole)
        print(row)
    host.close()
    dev.close()
    return results


# ------------------------------------------------------- Python call cost

def bench_overhead(reps):
    print("== one 64-byte pinmem.copy call from Python, microseconds")
    lib = _lib.load()
    n = 64
    src = pinmem.empty(4096)
    dst = pinmem.device_empty(4096)
    calls = 20000

    def per_call(fn):
        fn()
        best = float("inf")
        for _ in range(max(reps, 3)):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - t0) / calls)
        return best * 1e6

    d_ptr, s_ptr = dst.ptr, src.ptr
    raw = per_call(lambda: lib.pm_memcpy(d_ptr, s_ptr, n))
    rows = [("C call through ctypes (pm_memcpy)", raw),
            ("pinmem.copy(int, int, 64)", per_call(lambda: pinmem.copy(d_ptr, s_ptr, n))),
            ("pinmem.copy(DeviceBuffer, Buffer, 64)", per_call(lambda: pinmem.copy(dst, src, n)))]
    # an int address is checked by the library (pm_mem_check_access): host
    # memory, pinmem's or not, by its mapping, device memory by its allocation
    rows.append(("pinmem.copy(int, int inside a Buffer)", per_call(lambda: pinmem.copy(d_ptr, s_ptr + 64, n))))
    page = bytearray(4096)
    held = (ctypes.c_char * len(page)).from_buffer(page)
    p_ptr = ctypes.addressof(held)
    rows.append(("pinmem.copy(int, foreign int, 64)", per_call(lambda: pinmem.copy(d_ptr, p_ptr, n))))
    foreign = ctypes.c_uint64()
    if lib.pm_device_alloc(ctypes.byref(foreign), 4096) == 0:
        f_ptr = foreign.value
        rows.append(("pinmem.copy(foreign device int, int)",
                     per_call(lambda: pinmem.copy(f_ptr, s_ptr, n))))
        lib.pm_device_free(f_ptr)
    rows.append(("pinmem.copy(DeviceBuffer, bytearray)", per_call(lambda: pinmem.copy(dst, page, n))))
    try:
        import numpy
        arr = numpy.empty(n, dtype=numpy.uint8)
        rows.append(("pinmem.copy(DeviceBuffer, ndarray)", per_call(lambda: pinmem.copy(dst, arr, n))))
    except ImportError:
        pass
    torch, _ = _torch_cuda()
    if torch is not None:
        a = torch.empty(n, dtype=torch.uint8)
        d = torch.empty(n, dtype=torch.uint8, device="cuda")
        rows.append(("pinmem.copy(cuda tensor, cpu tensor)", per_call(lambda: pinmem.copy(d, a))))
    else:
        try:
            import torch
            a = torch.empty(n, dtype=torch.uint8)
            rows.append(("pinmem.copy(DeviceBuffer, cpu tensor)", per_call(lambda: pinmem.copy(dst, a, n))))
        except ImportError:
            pass
    for name, us in rows:
        extra = "" if name.startswith("C call") else f"  (+{us - raw:.2f} over the ctypes call)"
        print(f"  {name:<40} {us:7.2f}{extra}")
    del held
    src.close()
    dst.close()
    return dict(rows)


def main(argv):
    parser = argparse.ArgumentParser(prog="python -m pinmem bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="*", default=["pin", "copy", "batch", "overhead"],
                        help="pin, copy, batch, overhead (default: all)")
    parser.add_argument("--pin-sizes", type=_sizes, default="64M,1G",
                        help="sizes to pin cold (default 64M,1G)")
    parser.add_argument("--sizes", type=_sizes, default="1M,4M,16M,64M,256M,1G",
                        help="copy sizes (default 1M,4M,16M,64M,256M,1G)")
    parser.add_argument("--reps", type=_repetitions, default=5,
                        help="repetitions per figure (default 5; copies below 64 MiB repeat "
                             "proportionally more, at most 200)")
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 repetitions")
    args = parser.parse_args(argv)
    if args.quick:
        args.pin_sizes, args.sizes, args.reps = [16 * MiB], [MiB, 16 * MiB], 3
    unknown = set(args.what) - {"pin", "copy", "batch", "overhead"}
    if unknown:
        parser.error(f"unknown part(s): {', '.join(sorted(unknown))}")
    print(f"pinmem {pinmem.version()} ({pinmem.library_path()}), backend {pinmem.backend()}, "
          f"{pinmem.capabilities()['device_name']}")
    if "pin" in args.what:
        bench_pinning(args.pin_sizes, args.reps)
    if "copy" in args.what:
        bench_copies(args.sizes, args.reps)
    if "batch" in args.what:
        bench_batch(args.reps)
    if "overhead" in args.what:
        bench_overhead(args.reps)
    return 0
