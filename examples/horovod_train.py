"""A minimal Horovod (PyTorch) script: sums ranks with allreduce and prints the result."""

import horovod.torch as hvd
import torch

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
print(f"rank {hvd.rank()} of {hvd.size()}: sum {int(total.item())}", flush=True)
