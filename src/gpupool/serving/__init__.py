"""Floor 2, the servers: the pool's HTTP API, the watchdog that enforces shares, Jupyter kernels on a share."""
