"""`gpupool simulate`: replay a cluster and a workload through the real placement code and measure what is left.

Owns: trace readers (openb CSVs, `gpupool status --json`), the replay loop (the FGD paper's
arrival method, and a timeline mode), the replay policies over `core` scoring, and the report.
May import: `core` only (floor above core, beside the pool): what it measures is what production runs.
"""
