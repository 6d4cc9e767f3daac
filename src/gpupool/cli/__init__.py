"""Command line: one module per verb group, each thin (parse, call one function, print).

Owns: argument parsing, output formats and exit codes (from the error classes).
May import: every floor (4, the top); heavy imports inside handlers.

Importing it puts off the interpreter's first cyclic garbage collection (`defer_gc`): a
`gpupool` process allocates some 20,000 objects while it imports and starts (`gpupool run`: the
pool, the claim, the command), none of them garbage, and the default threshold (700) had the
collector walk them two dozen times, a tenth of the CPU time of `gpupool run -- true`.
"""

from __future__ import annotations

import gc  # and nothing else: typing's and argparse's imports then run under the raised threshold too

# No collection before this many more allocations than deallocations (about twice what
# `gpupool run` makes up to its command's start); the first one restores the usual thresholds.
STARTUP_GC_THRESHOLD = 40_000


def defer_gc(threshold: int = STARTUP_GC_THRESHOLD) -> None:
    """Raise the collector's first-generation threshold to `threshold` until its next collection,
    which puts the thresholds back as they were (a long `gpupool run` or server then collects as
    any process does). Nothing to do where the threshold is that high already or collection off."""
    before: tuple[int, ...] = gc.get_threshold()
    if not gc.isenabled() or before[0] == 0 or before[0] >= threshold:
        return
    gc.set_threshold(threshold, *before[1:])
    state: dict[str, bool] = {"armed": True}

    def restore(phase: str, info: dict[str, int]) -> None:
        # Left in gc.callbacks, a no-op from then on: removing it while the collector walks
        # that list would make it skip the callback after it.
        if phase == "start" and state["armed"]:
            state["armed"] = False
            if gc.get_threshold()[0] == threshold:  # nobody changed it meanwhile
                gc.set_threshold(*before)

    gc.callbacks.append(restore)


defer_gc()
