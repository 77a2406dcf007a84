"""python -m pinmem info | bench [options] (bench --help for them) | preload-path."""

import sys

USAGE = """usage: python -m pinmem COMMAND
  info    the library, its backend and the machine's capabilities
  bench   pinning and copies side by side with PyTorch (python -m pinmem bench --help)
  preload-path
          the LD_PRELOAD library for unmodified programs: LD_PRELOAD=$(python -m pinmem
          preload-path) python train.py
"""


def info():
    import pinmem
    from pinmem import _lib

    print(f"pinmem (Python package) {pinmem.__version__}")
    try:
        path = pinmem.library_path()
    except pinmem.LibraryNotFound as e:
        print(f"  library:               not found\n  {e}")
        return 1
    print(f"  library:               {path} (version {pinmem.version()})")
    try:
        caps = pinmem.capabilities()
    except pinmem.PinmemError as e:
        print(f"  backend:               none: {e}")
        return 1
    for key, value in caps.items():
        print(f"  {key + ':':<46} {value}")
    print("  settings (the PINMEM_* variables; value, and where it came from):")
    for name, s in pinmem.settings().items():
        print(f"    {name:<32} = {s['value']:<8} ({s['source']})")
    frameworks = []
    for name in ("numpy", "torch", "cupy", "numba", "cuda.core"):
        try:
            mod = __import__(name, fromlist=["_"])
            frameworks.append(f"{name} {getattr(mod, '__version__', '?')}")
        except Exception:
            frameworks.append(f"{name} (absent)")
    print(f"  frameworks:            {', '.join(frameworks)}")
    print(f"  library search order:  {'; '.join(_lib.candidates())}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    if argv[0] == "info":
        return info()
    if argv[0] == "preload-path":
        from ._preload import path

        try:
            print(path())
        except FileNotFoundError as e:
            print(e, file=sys.stderr)
            return 1
        return 0
    if argv[0] == "bench":
        from ._bench import main as bench

        return bench(argv[1:])
    print(f"pinmem: unknown command {argv[0]!r}\n{USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
