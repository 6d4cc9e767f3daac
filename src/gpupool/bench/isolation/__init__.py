"""`gpupool bench isolation`: whether a lease's compute and memory shares hold on a real GPU.

Compute splits (two saturating matmul leases, delivered against asked), a latency-sensitive
neighbour (batch-1 inference beside a trainer, in each isolation mode) and memory caps that fail
closed (many over-allocating starts while the MPS daemon is killed). Every probe is a lease's
command under `gpupool run`, so it gets exactly the contract a user's job gets.

Owns: the probes (`probe`: torch; `alloc`: stdlib, the CUDA driver API), the figures (`figures`:
pure), the rounds (`rounds`, `caps`: processes) and the report (`harness`).
May import: core, isolation (env names, the MPS daemon's folders); torch only in `probe`.
"""
