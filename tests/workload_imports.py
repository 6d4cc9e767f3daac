"""The modules the workload side never imports on the embedded pool, whatever way it is started
(the install, `python -m gpupool`, the zipapp): checked by tests/cli/test_lazy_imports.py and
tests/cli/test_pyz.py against a real process.

`gpupool.core.usage`: the usage records, which only a server's watchdog writes; `gpupool.core.queues`
and `gpupool.pooling.pool.admission`: the queue rules, which a pool without queues never applies (the
store, the pool and its accounting import them only once a queue is defined); `gpupool.core.filters`:
the device filters, parsed only when a claim has some; `gpupool.core.nodescore`: the node scores
of the extender and the simulator; `gpupool.pooling.pool.renewal`: a server's start; `gpupool.core.attestation`:
the node socket's protocol, which only a remote pool's runner speaks; `cuda.bindings.driver`: the
driver bindings of the cuda suspend backend (isolation/parking.py), loaded only when a lease is
suspended or resumed on real GPUs; the rest: the
network stack a remote pool needs and `logging` until a record is shown. (`typing` and `shutil`
are no longer here: every module takes `TYPE_CHECKING` from typing, and argparse imports shutil
for the help width; issue 24.)
"""

EMBEDDED_NEVER = (
    "ssl",
    "urllib.request",
    "http.client",
    "email",
    "logging",
    "gpupool.core.usage",
    "gpupool.core.queues",
    "gpupool.pooling.pool.admission",
    "gpupool.core.filters",
    "gpupool.core.nodescore",
    "gpupool.pooling.pool.renewal",
    "gpupool.core.attestation",
    "cuda.bindings.driver",
)
