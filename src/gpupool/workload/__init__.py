"""Floor 2, standard library only: what runs beside the user's command (`gpupool run` and the pool client).

It ships in gpupool-run.pyz with core/ and pooling/ and imports nothing outside the standard
library (tests/test_layers.py).
"""
