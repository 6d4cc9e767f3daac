"""The modules the workload side never imports on the embedded pool, whatever way it is started
(the install, `python -m gpupool`, the zipapp): checked by tests/cli/test_lazy_imports.py and
tests/test_pyz.py against a real process.

`typing`: annotations only, see gpupool.TYPE_CHECKING; `shutil`: argparse's help width, read by
gpupool.cli.parser instead; `gpupool.core.usage`: the usage records, which only a server's
watchdog writes; the rest: the network stack a remote pool needs and `logging` until a record
is shown.
"""

EMBEDDED_NEVER = ("ssl", "urllib.request", "http.client", "email", "logging", "typing", "shutil", "gpupool.core.usage")
