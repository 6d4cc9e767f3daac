"""Floor 1, standard library only: the pool and its store, the devices it pools and the isolation it hands out.

The pool runs inside the server and, embedded, inside `gpupool run`; so this folder ships in
gpupool-run.pyz and imports nothing outside the standard library (tests/test_layers.py).
"""
