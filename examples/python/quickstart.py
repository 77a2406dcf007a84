"""pinmem from Python: pinned buffers, copies from any memory, one adapter."""
import numpy as np

import pinmem

buf = pinmem.empty(4 << 20)                  # 4 MiB page-locked, in microseconds
host = buf.numpy(np.float32)                 # a numpy view of the same memory
host[:] = 1.0

data = np.arange(1 << 20, dtype=np.float32)  # ordinary (pageable) memory
dev = pinmem.device_empty(data.nbytes)       # device memory (simulated on POSIX)
pinmem.copy(dev, data)                       # through the staging engine
pinmem.copy(buf, dev)                        # device -> pinned: straight to DMA
assert np.array_equal(host, data)

with pinmem.register(np.zeros(1 << 18)) as reg:  # pin existing memory in place
    pinmem.copy(reg, dev, 2 << 20)

if pinmem.backend() == "cuda":               # an adapter: PyTorch tensors
    import torch
    import pinmem.torch
    t = pinmem.torch.to_device(torch.from_numpy(data))  # like .to("cuda"), faster
    assert torch.equal(pinmem.torch.to_host(t), torch.from_numpy(data))
print("pinmem", pinmem.version(), "on", pinmem.backend(), ": ok")
