"""`gpupool bench`: throughput, scaling and sharing reports, run through the pool and the job machinery.

`bench scaling` runs one data-parallel job per GPU count (each a gang claim from the pool,
run by the local executor); `bench share` runs 1/f concurrent single-worker jobs on one GPU
for each fraction f. Each replica is `python -m gpupool.bench.worker`, which trains the
trainer's model the way the trainer does (same model, loaders, autocast, channels_last,
optimizer) and writes its step times; the driver turns them into report.json, a Markdown
table and a PNG.

Owns: the bench plan (`plan`: settings, runs, job specs — pure), the figures (`figures`:
images/s, efficiency, slowdown, fairness — pure), the worker (`worker`, torch), the driver
(`driver`: submit, progress, interruption) and the outputs (`report`).
May import: every floor below it (jobs, train, client, core ...); torch only in the worker,
matplotlib only when a plot is drawn.
"""
