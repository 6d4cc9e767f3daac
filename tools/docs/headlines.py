"""What docs/benchmarks.md shows first of each benchmark file: its headline figures, before and
after where the file holds an earlier run, and its targets, each met or not.

Only names and paths are written here; every number shown is read from the JSON when the site is
built (tools/docs/figures.py renders these above the file's full, folded, table). A path is as
in tools/docs/figures.py, plus `[*]`: the median over every item of that list
(`rounds[*].after.mutate_32_clients_p99_ms`). A label may cite a figure in braces
(`placement at {placement.devices} GPUs`), and `{#rounds}` is the number of items of a list.
A table with `each` has a row per item of a list (a report's runs).
A path the file lacks fails the build and tests/docs/test_figures.py, naming the file and path.
To give a file a headline, add an entry to HEADLINES keyed by its name in benchmarks/results/.
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Tuple, Union


class Row(NamedTuple):
    """One line of a headline table: a figure per column of its table."""

    label: str
    paths: Tuple[str, ...]
    unit: str = ""


class Table(NamedTuple):
    """With `each`, the path of a list: its one row is written once, its label and paths relative
    to an item, and shown for every item of the list (as many rows as the file has runs)."""

    columns: Tuple[str, ...]  # the first heads the labels
    rows: Tuple[Row, ...]
    caption: str = ""  # a line above the table
    each: Optional[str] = None


class Compare(NamedTuple):
    """One figure before and after; `ratio` is the file's own after÷before, else computed."""

    label: str
    before: str
    after: str
    unit: str = ""
    ratio: Optional[str] = None


class Comparison(NamedTuple):
    before: str  # the column headings
    after: str
    rows: Tuple[Compare, ...]
    note: str = ""


class Target(NamedTuple):
    """`path`'s figure `op` `limit`, a number or the path of the file's own limit. `stated_in` names
    the file's text of the target, which must say `op limit` (so this cannot drift from it); a
    `where` condition the file does not meet shows the target as not measured."""

    label: str
    path: str
    op: str  # one of OPS
    limit: Union[float, str]
    unit: str = ""
    stated_in: Optional[str] = None
    where: Tuple[Tuple[str, object], ...] = ()


class Headline(NamedTuple):
    tables: Tuple[Table, ...] = ()
    comparison: Optional[Comparison] = None
    targets: Tuple[Target, ...] = ()


OPS = ("<", "<=", ">=", ">")
TWO_CORES = (("machine.cpus", 2),)


def _median_ab(label: str, key: str, unit: str) -> Compare:
    """A figure of benchmarks/before_after.py: medians of its rounds, and its ratio of them."""
    return Compare(label, f"rounds[*].before.{key}", f"rounds[*].after.{key}", unit, f"after_over_before.{key}")


def _levels(label: str, kind: str, field: str, unit: str) -> Row:
    return Row(label, tuple(f"{kind}[{i}].{field}" for i in range(3)), unit)


_LAST = "The last round's after run:"
_AB_NOTE = "Before and after ran alternately on the same machine; medians of {#rounds} rounds each."

HEADLINES: Dict[str, Headline] = {
    "pool.json": Headline(
        tables=(
            Table(
                ("over HTTP", "{http[0].clients} client", "{http[1].clients} clients", "{http[2].clients} clients"),
                (
                    _levels("claim+release, fast path", "http", "claim_release_per_s", "/s"),
                    _levels("claim+release, plain routes", "http_plain", "claim_release_per_s", "/s"),
                    _levels("round-trip p99, fast path", "http", "round_trip_p99_ms", "ms"),
                    _levels("round-trip p99, plain routes", "http_plain", "round_trip_p99_ms", "ms"),
                ),
                _LAST,
            ),
            Table(
                ("in process", "value"),
                (
                    Row(
                        "placement at {placement.devices} GPUs, {placement.live_leases} leases",
                        ("placement.place_ms",),
                        "ms",
                    ),
                    Row("claim+release p99, in process", ("placement.pool_claim_release_p99_ms",), "ms"),
                ),
            ),
        ),
        comparison=Comparison(
            "before ({before.src})",
            "after ({after_src})",
            (
                _median_ab("claim+release at 16 clients, fast path", "http_16_clients_claim_release_per_s", "/s"),
                _median_ab("round-trip p99 at 16 clients, fast path", "http_16_clients_round_trip_p99_ms", "ms"),
                _median_ab(
                    "claim+release at 16 clients, plain routes", "http_plain_16_clients_claim_release_per_s", "/s"
                ),
                _median_ab(
                    "round-trip p99 at 16 clients, plain routes", "http_plain_16_clients_round_trip_p99_ms", "ms"
                ),
            ),
            _AB_NOTE,
        ),
        targets=(
            Target(
                "P1: claim+release at 16 clients, 2-core machine",
                "rounds[*].after.http_16_clients_claim_release_per_s",
                ">=",
                1000,
                "/s",
                "target",
                TWO_CORES,
            ),
            Target(
                "P1: round-trip p99 at 16 clients, 2-core machine",
                "rounds[*].after.http_16_clients_round_trip_p99_ms",
                "<",
                10,
                "ms",
                "target",
                TWO_CORES,
            ),
        ),
    ),
    "webhook.json": Headline(
        tables=(
            Table(
                ("webhook over HTTPS", "requests/s", "p50, ms", "p99, ms"),
                (
                    Row(
                        "mutate, {mutate_1_client.clients} client",
                        ("mutate_1_client.rps", "mutate_1_client.p50_ms", "mutate_1_client.p99_ms"),
                    ),
                    Row(
                        "mutate, {mutate_32_clients.clients} clients",
                        ("mutate_32_clients.rps", "mutate_32_clients.p50_ms", "mutate_32_clients.p99_ms"),
                    ),
                ),
                _LAST,
            ),
            Table(
                ("scheduler extender", "p50", "p99"),
                (
                    Row(
                        "extender filter, {extender_filter_1000x8.nodes} nodes × "
                        "{extender_filter_1000x8.gpus_per_node} GPUs",
                        ("extender_filter_1000x8.p50_ms", "extender_filter_1000x8.p99_ms"),
                        "ms",
                    ),
                ),
            ),
        ),
        comparison=Comparison(
            "before ({before.src})",
            "after ({after_src})",
            (
                _median_ab("mutate p99 at 32 clients", "mutate_32_clients_p99_ms", "ms"),
                _median_ab("mutate at 32 clients", "mutate_32_clients_rps", "requests/s"),
                _median_ab("extender filter p99, 1,000 × 8", "extender_filter_1000x8_p99_ms", "ms"),
            ),
            _AB_NOTE,
        ),
        targets=(
            Target(
                "P2: webhook p99 at 32 clients",
                "rounds[*].after.mutate_32_clients_p99_ms",
                "<",
                "target_p99_ms",
                "ms",
            ),
            Target(
                "P2: extender filter p99, {extender_filter_1000x8.nodes} nodes × "
                "{extender_filter_1000x8.gpus_per_node} GPUs",
                "rounds[*].after.extender_filter_1000x8_p99_ms",
                "<",
                "target_p99_ms",
                "ms",
            ),
        ),
    ),
    "extender.json": Headline(
        tables=(
            Table(
                ("filter + prioritize", "p50", "p99", "max"),
                tuple(
                    Row(
                        "{policies[%d].policy}" % i,
                        tuple(f"policies[{i}].filter_plus_prioritize_ms.{q}" for q in ("p50", "p99", "max")),
                        "ms",
                    )
                    for i in range(3)
                ),
                _LAST,
            ),
        ),
        comparison=Comparison(
            "before ({before.src})",
            "after ({after_src})",
            tuple(
                _median_ab(f"{policy}: filter + prioritize p99", f"{policy}_filter_plus_prioritize_p99_ms", "ms")
                for policy in ("fragaware", "binpack", "spread")
            ),
            _AB_NOTE,
        ),
        targets=tuple(
            Target(
                f"filter + prioritize p99, {policy}, {{policies[0].nodes}} nodes × {{policies[0].gpus_per_node}} GPUs",
                f"rounds[*].after.{policy}_filter_plus_prioritize_p99_ms",
                "<",
                "target_p99_ms",
                "ms",
            )
            for policy in ("fragaware", "binpack", "spread")
        ),
    ),
    "launcher.json": Headline(
        tables=(
            Table(
                ("`{command}`", "median, ms", "p90, ms", "÷ `python -c pass`"),
                tuple(
                    Row(
                        label,
                        (f"cases.{case}.median_ms", f"cases.{case}.p90_ms", f"cases.{case}.ratio"),
                        "",
                    )
                    for label, case in (
                        ("installed script (embedded mode)", "embedded_entry_point"),
                        ("python -m gpupool (embedded mode)", "embedded_python_m"),
                        ("the zipapp (embedded mode)", "embedded_zipapp"),
                        ("installed script, with a server", "server_entry_point"),
                        ("the standard library's floor", "stdlib_floor"),
                    )
                ),
            ),
        ),
        comparison=Comparison(
            "before",
            "after",
            (
                Compare(
                    "installed script, median",
                    "cases.before_embedded_entry_point.median_ms",
                    "cases.embedded_entry_point.median_ms",
                    "ms",
                ),
                Compare(
                    "python -m gpupool, median",
                    "cases.before_embedded_python_m.median_ms",
                    "cases.embedded_python_m.median_ms",
                    "ms",
                ),
                Compare(
                    "the zipapp, median",
                    "cases.before_embedded_zipapp.median_ms",
                    "cases.embedded_zipapp.median_ms",
                    "ms",
                ),
                Compare(
                    "with a server, median",
                    "cases.before_server_entry_point.median_ms",
                    "cases.server_entry_point.median_ms",
                    "ms",
                ),
                Compare(
                    "installed script ÷ `python -c pass`",
                    "cases.before_embedded_entry_point.ratio",
                    "cases.embedded_entry_point.ratio",
                ),
            ),
            "Before and after timed in the same rounds, {cases.embedded_entry_point.runs} runs each "
            "(the baseline's checkout is under All figures).",
        ),
        targets=(
            Target(
                "median of `gpupool run -- true`, installed script",
                "cases.embedded_entry_point.median_ms",
                "<=",
                80,
                "ms",
                "target",
                TWO_CORES,
            ),
        ),
    ),
}

_QUIET_LAUNCHER = Headline(
    tables=(
        Table(
            ("`{command}`", "median, ms", "p90, ms", "÷ `python -c pass`"),
            tuple(
                Row(label, (f"cases.{case}.median_ms", f"cases.{case}.p90_ms", f"cases.{case}.ratio"))
                for label, case in (
                    ("installed script (embedded mode)", "embedded_entry_point"),
                    ("the same, before", "before_embedded_entry_point"),
                    ("the standard library's floor", "stdlib_floor"),
                )
            ),
        ),
    ),
)


def _ratio_target(label: str, path: str = "ratio") -> Target:
    return Target(label, path, ">=", "target_ratio")


HEADLINES.update(
    {
        "launcher_quiet.json": _QUIET_LAUNCHER,
        "crash.json": Headline(
            tables=(
                Table(
                    ("{rounds} kills of a busy server, {clients} clients", "claims"),
                    (
                        Row("acknowledged", ("acknowledged",)),
                        Row("lost (acknowledged, gone after the restart)", ("lost",)),
                        Row("resurrected (released, back after the restart)", ("resurrected",)),
                        Row("GPUs overcommitted", ("overcommitted",)),
                        Row("verdict", ("verdict",)),
                    ),
                ),
            ),
        ),
        "fail-closed-cpu.json": Headline(
            tables=(
                Table(
                    ("{starts} starts of a job asking twice its share ({setup.share_mib} MiB)", "starts"),
                    (
                        Row("ran over their cap", ("over_cap",)),
                        Row("ran, capped", ("ran_capped",)),
                        Row("refused before the command started", ("refused",)),
                        Row("refused without a one-line reason", ("refused_without_one_line_reason",)),
                        Row("stopped after they started", ("stopped",)),
                        Row("still ran after their run exited", ("outlived_their_run",)),
                        Row("leases left after their TTL", ("leases_left_after_ttl",)),
                        Row("server kills (kill -9, restarted)", ("server_kills",)),
                    ),
                ),
            ),
        ),
        "outage.json": Headline(
            tables=(
                Table(
                    ("{rounds} outages of {down_s} s, leases' TTL {ttl_s} s", "value"),
                    (
                        Row("leases lost", ("leases_lost",)),
                        Row("runners that gave up (exit 6)", ("runners_exit_6",)),
                        Row("waiting claims granted", ("waiting_granted",)),
                        Row("waiting claims started", ("waiting_started",)),
                        Row("longest wait for all grants after the restart", ("max_all_granted_after_restart_s",), "s"),
                        Row(
                            "longest wait for all heartbeats after the restart",
                            ("max_all_heartbeats_back_after_restart_s",),
                            "s",
                        ),
                        Row("verdict", ("verdict",)),
                    ),
                ),
            ),
        ),
        "dashboard.json": Headline(
            tables=(
                Table(
                    ("{gpus} GPUs, {leases} leases", "p50, ms", "max, ms"),
                    tuple(
                        Row(label, (f"{key}.p50_ms", f"{key}.max_ms"))
                        for label, key in (
                            ("GET the dashboard page", "http_get_page"),
                            ("GET its live part", "http_get_live"),
                            ("GET its live part, status shared", "http_get_live_shared_status"),
                            ("GET /metrics", "http_get_metrics"),
                            ("the pool's status, in process", "pool_status"),
                        )
                    ),
                ),
                Table(
                    ("in a browser", "value"),
                    (
                        Row("page loaded", ("browser.load_event_ms",), "ms"),
                        Row("a refresh fetched and swapped in", ("browser.refresh_fetch_and_swap_ms",), "ms"),
                        Row("page size, gzipped", ("html_gzip_bytes",), "bytes"),
                    ),
                ),
            ),
        ),
        "trainer.json": Headline(
            tables=(
                Table(
                    ("{settings.model} on {settings.data}, {machine.device}", "value"),
                    (
                        Row("gpupool train", ("trainer_images_per_second",), "images/s"),
                        Row("a hand-written loop", ("hand_loop_images_per_second",), "images/s"),
                        Row("trainer ÷ hand loop, best epochs", ("ratio",)),
                        Row("trainer ÷ hand loop, median of {#round_ratios} rounds", ("median_ratio",)),
                    ),
                ),
            ),
            targets=(_ratio_target("trainer ÷ hand loop, best epochs"),),
        ),
        "lightning.json": Headline(
            tables=(
                Table(
                    ("{settings.model} on {settings.data}, {machine.device}", "value"),
                    (
                        Row("gpupool train", ("trainer_images_per_second",), "images/s"),
                        Row("PyTorch Lightning {machine.lightning}", ("lightning_images_per_second",), "images/s"),
                        Row("trainer ÷ Lightning, best epochs", ("ratio",)),
                        Row("trainer ÷ Lightning, median of {#round_ratios} rounds", ("median_ratio",)),
                    ),
                ),
            ),
        ),
        "input_pipeline.json": Headline(
            tables=(
                Table(
                    ("{settings.source} to {settings.resize} px", "value"),
                    (
                        Row("plain decode and resize", ("raw_decode_resize_images_per_second",), "images/s"),
                        Row("the trainer's loader, per worker", ("loader_images_per_second_per_worker",), "images/s"),
                        Row("loader ÷ plain, best rounds", ("ratio",)),
                        Row("loader ÷ plain, medians", ("median_ratio",)),
                    ),
                ),
            ),
            targets=(_ratio_target("loader ÷ plain, best rounds"),),
        ),
        "objstore.json": Headline(
            tables=(
                Table(
                    ("{settings.images} images, {settings.source}", "value"),
                    (
                        Row("local disk", ("local_images_per_second",), "images/s"),
                        Row("bucket, through the cache", ("bucket_cached_images_per_second",), "images/s"),
                        Row("bucket, cold", ("bucket_cold_images_per_second",), "images/s"),
                        Row("cached bucket ÷ local disk", ("ratio",)),
                    ),
                ),
            ),
            targets=(_ratio_target("cached bucket ÷ local disk"),),
        ),
    }
)


def _launcher_cases(cases: Tuple[Tuple[str, str], ...]) -> Table:
    return Table(
        ("`{command}`", "median, ms", "p90, ms", "÷ `python -c pass`"),
        tuple(
            Row(label, (f"cases.{case}.median_ms", f"cases.{case}.p90_ms", f"cases.{case}.ratio"))
            for label, case in cases
        ),
    )


HEADLINES.update(
    {
        "pool_before_issue13.json": Headline(
            tables=(
                Table(
                    ("over HTTP", "{http[0].clients} client", "{http[1].clients} clients", "{http[2].clients} clients"),
                    (
                        _levels("claim+release", "http", "claim_release_per_s", "/s"),
                        _levels("round-trip p99", "http", "round_trip_p99_ms", "ms"),
                    ),
                ),
                Table(
                    ("in process", "value"),
                    (
                        Row(
                            "placement at {placement.devices} GPUs, {placement.live_leases} leases",
                            ("placement.place_ms",),
                            "ms",
                        ),
                    ),
                ),
            ),
        ),
        "launcher_before_issue16.json": Headline(
            tables=(
                _launcher_cases(
                    (
                        ("installed script (embedded mode)", "embedded_entry_point"),
                        ("python -m gpupool (embedded mode)", "embedded_python_m"),
                        ("the zipapp (embedded mode)", "embedded_zipapp"),
                    )
                ),
            ),
        ),
        "simulate.json": Headline(
            tables=(
                Table(
                    ("GPUs left unallocated, gpupool's policies", "mean of {#seeds} seeds", "first failure at arrival"),
                    tuple(
                        Row(policy, (f"summary.{policy}.mean", f"summary.{policy}.first_failure_arrival_percent"), "%")
                        for policy in ("fragaware", "fgd", "binpack", "spread", "random")
                    ),
                ),
                Table(
                    ("published (FGD paper), mean of 10 seeds", "GPUs left unallocated"),
                    tuple(
                        Row(policy, (f"paper_mean_10_seeds.{policy}",), "%")
                        for policy in ("fgd", "bestfit", "packing", "clustering", "dotprod", "random")
                    ),
                ),
            ),
        ),
        "trainer_resnet50_cpu_smoke.json": Headline(
            tables=(
                Table(
                    ("{settings.model} on {settings.data}, {machine.device}", "value"),
                    (
                        Row("gpupool train", ("trainer_images_per_second",), "images/s"),
                        Row("a hand-written loop", ("hand_loop_images_per_second",), "images/s"),
                        Row("trainer ÷ hand loop", ("ratio",)),
                    ),
                ),
            ),
            targets=(_ratio_target("trainer ÷ hand loop"),),
        ),
    }
)


def _values(title: str, rows: Tuple[Tuple[str, str, str], ...]) -> Table:
    """A table of single figures: (label, path, unit) each."""
    return Table((title, "value"), tuple(Row(label, (path,), unit) for label, path, unit in rows))


HEADLINES.update(
    {
        "gpu-isolation.json": Headline(
            tables=(
                _values(
                    "{device}",
                    (
                        ("a CUDA context costs", "context_overhead_mib", "MiB"),
                        ("reserved for it by default", "context_reserve_mib_default", "MiB"),
                        (
                            "each of two half shares filled, of a cap of {two_half_shares_cap_mib} MiB",
                            "two_half_shares_filled_mib",
                            "MiB",
                        ),
                        ("more than its share refused, with the hooks", "hooks_over_share_refused", ""),
                        ("more than its share refused, with MPS", "mps_over_share_refused", ""),
                    ),
                ),
            ),
        ),
        "gpu-enforcement.json": Headline(
            tables=(
                _values(
                    "{watchdog_over_share.gpu}",
                    (
                        ("a job over its share stopped after", "watchdog_over_share.stopped_after_s", "s"),
                        ("its grace", "watchdog_over_share.grace_s", "s"),
                        ("a killed runner's child gone after", "killed_runner.child_gone_after_s", "s"),
                        ("GPU processes left behind", "killed_runner.gpu_processes_after", ""),
                    ),
                ),
            ),
        ),
        "suspend-gpu.json": Headline(
            tables=(
                Table(
                    ("{gpu}, GPU state", "suspend", "resume", "GPU memory parked", "data intact"),
                    tuple(
                        Row(
                            "{runs[%d].state_gib} GiB" % i,
                            tuple(
                                f"runs[{i}].{k}"
                                for k in ("suspend_s", "resume_s", "gpu_used_mib_parked", "data_intact")
                            ),
                        )
                        for i in (0, 2, 4)
                    ),
                    "First cycle of each size (seconds; MiB parked):",
                ),
            ),
        ),
        "suspend-gpu-run.json": Headline(
            tables=(
                _values(
                    "{gpu}: a `gpupool run` suspended mid-training",
                    (
                        ("suspend", "suspend_s", "s"),
                        ("resume", "resume_s", "s"),
                        ("GPU memory running", "used_mib_running", "MiB"),
                        ("GPU memory parked", "used_mib_parked", "MiB"),
                        ("losses the same as an uninterrupted run", "losses_equal", ""),
                    ),
                ),
            ),
        ),
        "suspend-gpu-training.json": Headline(
            tables=(
                _values(
                    "{gpu}: a training suspended at step {steps_at_suspend} of {steps}",
                    (
                        ("suspend", "suspend_s", "s"),
                        ("resume", "resume_s", "s"),
                        ("GPU memory parked", "used_mib_parked", "MiB"),
                        ("losses equal step for step", "losses_equal_step_for_step", ""),
                    ),
                ),
            ),
        ),
        "notebook-gpu.json": Headline(
            tables=(
                _values(
                    "{gpu}: a kernel holding {tensor_gib} GiB, idle for {idle_suspend_s} s",
                    (
                        ("suspended after", "suspended_after_idle_s", "s"),
                        ("GPU memory parked", "used_mib_parked", "MiB"),
                        ("next cell's result after", "cell_start_to_result_s", "s"),
                        ("the same tensor after the resume", "same_sum", ""),
                    ),
                ),
            ),
        ),
    }
)


_SCALING = Headline(
    tables=(
        Table(
            ("{machine.accelerator}", "GPUs", "images/s", "speedup", "efficiency"),
            (Row("{label}", ("gpus", "images_per_second", "speedup", "efficiency")),),
            "{settings.model}, {settings.data} data, batch {settings.batch_size}:",
            each="runs",
        ),
    ),
)
_SHARE = Headline(
    tables=(
        Table(
            ("{machine.accelerator}", "jobs on one GPU", "images/s, all jobs", "÷ one whole job", "fairness"),
            (Row("{label}", ("jobs", "images_per_second", "aggregate_vs_whole", "fairness")),),
            "{settings.model}, {settings.data} data, batch {settings.batch_size}:",
            each="runs",
        ),
    ),
)
_CUDA_TRAINER = Headline(
    tables=(
        Table(
            ("{settings.model} on {settings.data}, {machine.device}", "value"),
            (
                Row("gpupool train", ("trainer_images_per_second",), "images/s"),
                Row("a hand-written loop", ("hand_loop_images_per_second",), "images/s"),
                Row("trainer ÷ hand loop, best epochs", ("ratio",)),
                Row("trainer ÷ hand loop, median of {#round_ratios} rounds", ("median_ratio",)),
            ),
        ),
    ),
    targets=(_ratio_target("trainer ÷ hand loop, best epochs"),),
)

HEADLINES.update(
    {
        "bench_scaling_cpu.json": _SCALING,
        "gpu-bench/r50-scaling-synthetic/report.json": _SCALING,
        "gpu-bench/r50-scaling-jpeg/report.json": _SCALING,
        "bench_share_cpu.json": _SHARE,
        "gpu-bench/r50-share/report.json": _SHARE,
        "gpu-bench/r50-share-hooks-same-run/report.json": _SHARE,
        "gpu-bench/r50-share-mps/report.json": _SHARE,
        "gpu-bench/small-share/report.json": _SHARE,
        "gpu-bench/trainer_resnet50_cuda.json": _CUDA_TRAINER,
        "gpu-bench/lightning_resnet50_cuda.json": HEADLINES["lightning.json"],
        "dashboard_before_after.json": Headline(
            tables=(
                Table(
                    (
                        "rendering {bench_runs.old-3.gpus} GPUs, in turn",
                        "page, ms (min, median)",
                        "live part, ms (min, median)",
                    ),
                    (Row("{code}", ("page_ms_min_median", "live_ms_min_median")),),
                    each="render_only",
                ),
            ),
        ),
    }
)

HEADLINES["release.json"] = Headline(
    tables=(
        Table(
            ("{rounds} releases per pool, leases' TTL {ttl_s} s", "median", "p95", "max"),
            tuple(
                Row(label, (f"pools.{pool}.median_s", f"pools.{pool}.p95_s", f"pools.{pool}.max_s"), "s")
                for label, pool in (("server: release call → command gone", "server"), ("embedded pool", "embedded"))
            ),
        ),
        Table(
            ("what the runners said", "server", "embedded"),
            (
                Row("commands ended", ("pools.server.ended", "pools.embedded.ended")),
                Row("runners that exited 6", ("pools.server.exit_6", "pools.embedded.exit_6")),
                Row("lines naming who released", ("pools.server.named_who", "pools.embedded.named_who")),
            ),
        ),
    ),
    targets=(
        Target("server: median, release call → command gone", "pools.server.median_s", "<", "target_median_s", "s"),
        Target("embedded pool: the same", "pools.embedded.median_s", "<", "target_median_s", "s"),
    ),
)

_PUSH_KINDS = (
    ("release by its owner", "release-owner"),
    ("release by an admin", "release-admin"),
    ("suspend by its owner", "suspend"),
    ("preemption, queue suspends", "preempt-suspend"),
    ("preemption, queue requeues", "preempt-requeue"),
)


def _push_ab(pool: str, label: str, kind: str = "") -> Compare:
    """A median of bench_push.py before and after, of one kind of decision (all kinds: "")."""
    at, key = (f"pools.{pool}.kinds.{kind}", f"{pool}_{kind}") if kind else (f"pools.{pool}", pool)
    return Compare(
        f"{pool}: {label}", f"before.{at}.median_s", f"{at}.median_s", "s", f"after_over_before.{key}_median_s"
    )


HEADLINES["push.json"] = Headline(
    comparison=Comparison(
        "before ({before.src}: re-read every 100 ms)",
        "after ({after_src})",
        tuple(
            row
            for pool in ("server", "embedded")
            for row in (
                _push_ab(pool, "all kinds"),
                *(
                    _push_ab(pool, label, kind)
                    for label, kind in _PUSH_KINDS
                    if (pool, kind) != ("embedded", "release-admin")
                ),
            )
        ),
        "Medians, decision → runner acts. Before and after ran one after the other on the same machine, "
        "{cycles} rounds of each kind each.",
    ),
    targets=(
        Target("server: median, decision → runner acts", "pools.server.median_s", "<", "target_median_s", "s"),
        Target("embedded pool: the same", "pools.embedded.median_s", "<", "target_median_s", "s"),
    ),
)
