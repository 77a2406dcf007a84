"""pinmem.torch.install(): the honest error on a PyTorch without the hook
(here), and on a GPU with PyTorch 2.11 or later, the allocator itself, in a
process of its own (it replaces PyTorch's allocator for good)."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT, requires_cuda

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
pt = pytest.importorskip("pinmem.torch", reason="pinmem.torch does not import here")
from pinmem import torch_host  # noqa: E402

has_hook = torch_host._torch_version() >= torch_host.NEEDED_TORCH


def test_versions_read():
    assert torch_host._torch_version("2.11.0+cu130") == (2, 11)
    assert torch_host._torch_version("1.13.0a0") == (1, 13)
    assert torch_host._torch_version("2.11.0") >= torch_host.NEEDED_TORCH > (2, 10)
    assert torch_host._torch_version("nightly") == (0, 0)


@pytest.mark.skipif(has_hook, reason="this PyTorch has the hook")
def test_install_says_which_pytorch_it_needs(monkeypatch):
    from torch.utils import cpp_extension

    def no_build(*args, **kwargs):
        raise AssertionError("nothing may be built for a PyTorch without the hook")

    monkeypatch.setattr(cpp_extension, "load", no_build)
    with pytest.raises(RuntimeError, match=r"needs PyTorch 2\.11 or later.*this is PyTorch "):
        pt.install()
    assert not pt.installed() and torch_host.pool() is None
    pt.uninstall()  # nothing installed: nothing to undo


# Checks, in a fresh process on the GPU: sizes by the pool's classes, not
# powers of two; the statistics; reuse only after the stream used the block;
# empty_cache; capture and replay of a copy from a pinned tensor.
_PROGRAM = r"""
import torch, pinmem, pinmem.torch as pt
from pinmem import torch_host
pool = pt.install()
assert pt.installed()
try:  # PyTorch's frees reach the pool for good
    pool.close()
    raise AssertionError("the installed pool closed")
except BufferError as e:
    assert "PyTorch's host allocator" in str(e), e
n = (9 << 20) + 1
x = torch.empty(n, dtype=torch.uint8, pin_memory=True)
assert x.is_pinned()
used = pool.stats()["used"]
assert n <= used <= n * 9 // 8, used          # PyTorch's own would take 16 MiB
assert torch_host.counts()["live"] == 1
if hasattr(torch.cuda, "host_memory_stats"):
    torch.cuda.init()  # before it, host_memory_stats answers {} whatever is allocated
    # PyTorch's names for the statistics vary by version: find the current
    # count of active requests and bytes among the flattened keys.
    stats = torch.cuda.host_memory_stats()
    def current(stat):
        keys = [k for k in stats if stat in k and k.endswith("current")]
        assert keys, ("no current " + stat + " among", sorted(stats))
        return stats[keys[0]]
    assert current("active_requests") == 1 and current("active_bytes") == n, stats
del x
assert torch_host.counts()["live"] == 0

src = torch.full((64 << 20,), 7, dtype=torch.uint8, pin_memory=True)
dev = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
torch.cuda._sleep(int(1e9))
dev.copy_(src, non_blocking=True)
del src
assert torch_host.counts()["pending"] == 1
again = torch.full((64 << 20,), 9, dtype=torch.uint8, pin_memory=True)
torch.cuda.synchronize()
assert bool((dev == 7).all()), "a block was reused before the copy from it was done"
del again
torch.empty(1, dtype=torch.uint8, pin_memory=True)  # an allocation gives back what is done
assert torch_host.counts()["pending"] == 0
if hasattr(torch._C, "_host_emptyCache"):
    torch._C._host_emptyCache()
    assert pool.stats()["reserved"] < (64 << 20), pool.stats()

host = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
out = torch.empty(1 << 20, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    out.copy_(host, non_blocking=True)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    out.copy_(host, non_blocking=True)
host.add_(1)
g.replay()
torch.cuda.synchronize()
assert torch.equal(out.cpu(), host)
# PyTorch releases a graph's pool into the allocator current when the graph
# dies, so uninstall() refuses while one lives.
try:
    pt.uninstall()
    raise AssertionError("uninstall() while a graph lives did not raise")
except RuntimeError as e:
    assert "delete the graph first" in str(e), e
assert pt.installed()
del g
pt.uninstall()
assert not pt.installed()
print("ok")
"""


@requires_cuda
@pytest.mark.skipif(not has_hook, reason="this PyTorch has no replaceable host allocator")
def test_allocator_on_the_gpu(tmp_path):
    _run_fresh(_PROGRAM, tmp_path)


def _run_fresh(program, tmp_path):
    """Runs program in a Python of its own, which must print ok."""
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda is not available")
    env = dict(os.environ)
    if os.environ.get("PINMEM_TEST_INSTALLED") != "1":
        env["PYTHONPATH"] = str(ROOT / "python")
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         env=env, cwd=str(tmp_path), timeout=900)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


# A graph captured with PyTorch's own allocator, then install(): the graph's
# pool is released into pinmem's allocator when the graph dies, and must go
# back to the allocator that made it (a throw there ended the process).
_GRAPH_BEFORE_INSTALL = r"""
import torch, pinmem.torch as pt
host = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
out = torch.empty(1 << 20, device="cuda")
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    out.copy_(host, non_blocking=True)
pt.install()
g.replay()
torch.cuda.synchronize()
assert torch.equal(out.cpu(), host)
del g
x = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
assert x.is_pinned()
print("ok")
"""


@requires_cuda
@pytest.mark.skipif(not has_hook, reason="this PyTorch has no replaceable host allocator")
def test_graph_captured_before_install(tmp_path):
    _run_fresh(_GRAPH_BEFORE_INSTALL, tmp_path)


def test_extension_built_without_ninja(tmp_path, monkeypatch):
    """The compiler-only path of pinmem.torch_build, with a small extension
    (the allocator itself needs PyTorch 2.11 and CUDA)."""
    import shutil

    from torch.utils import cpp_extension

    from pinmem import torch_build

    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler here")
    if torch_build.missing_headers() is not None:
        pytest.skip(torch_build.missing_headers())
    src = tmp_path / "tiny.cpp"
    # c10 returning a std::string checks the C++ ABI flags as well as the paths.
    src.write_text("#include <c10/core/DeviceType.h>\n#include <pybind11/pybind11.h>\n"
                   "#include <pybind11/stl.h>\n"
                   "int twice(int x) { return 2 * x; }\n"
                   "std::string cpu() { return c10::DeviceTypeName(c10::DeviceType::CPU); }\n"
                   "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
                   "  m.def(\"twice\", &twice);\n  m.def(\"cpu\", &cpu);\n}\n")
    monkeypatch.setenv("PINMEM_TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    module = torch_build.load("pinmem_tiny_extension", src, cuda=False)
    assert module.twice(21) == 42 and module.cpu() == "CPU"
    built = list((tmp_path / "cache").rglob("pinmem_tiny_extension*.so"))
    assert len(built) == 1
    mtime = built[0].stat().st_mtime_ns
    assert torch_build.load("pinmem_tiny_extension", src, cuda=False).twice(2) == 4
    assert built[0].stat().st_mtime_ns == mtime  # cached, not built again
