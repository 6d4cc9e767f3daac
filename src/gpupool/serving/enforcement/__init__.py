"""Who really uses the pooled GPUs, and what happens to those who break their share.

Owns: mapping sampled GPU processes to leases (`attribution`) from the runners the
node saw attest their lease (`attest`: lease keys and records; `attest_listener`:
the node's Unix socket), and the watchdog that records usage in the pool and warns
about or ends offenders (`watchdog`).
The server and the node agent run it; the embedded pool does not (no process
lives long enough to watch).
May import: core, floor 1 (devices, isolation, pool, store) and its own floor 2.
"""

from .attribution import Attributor
from .watchdog import Watchdog, WatchdogConfig

__all__ = ["Attributor", "Watchdog", "WatchdogConfig"]
