"""The generated reference pages, each built from the code that defines what it describes.

`PAGES` maps a page's path under docs/ to the function that writes its markdown. tools/docs/hooks.py
hands them to MkDocs at build time, so no copy of them is committed and none can drift;
`python tools/docs/reference.py DIR` writes them to DIR to read them without building the site.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
if str(SRC) not in sys.path:  # a checkout that was not installed still builds its docs
    sys.path.insert(0, str(SRC))

GENERATED = "<!-- Generated at build time by tools/docs/reference.py from {source}: edit that, not this page. -->\n\n"
HELP_COLUMNS = "100"  # argparse wraps help to $COLUMNS: a fixed width, so the page is the same everywhere


def _cell(text: Any) -> str:
    """`text` as one markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


# -- command line ------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[Tuple[str, str, argparse.ArgumentParser]]:
    """(name, help line, parser) of each subcommand of `parser`, in the parser's order, aliases once."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield name, helps.get(name, ""), sub


def _command_sections(parser: argparse.ArgumentParser, words: List[str], help_line: str, level: int) -> Iterator[str]:
    title = " ".join(words)
    yield f"{'#' * level} {title}\n\n"
    if help_line:
        yield f"{help_line[0].upper()}{help_line[1:]}.\n\n"
    yield f"```text\n{parser.format_help().rstrip()}\n```\n\n"
    for name, line, sub in _subcommands(parser):
        yield from _command_sections(sub, [*words, name], line, min(level + 1, 4))


def cli_page() -> str:
    """Every command and subcommand of `gpupool`, with its help as argparse prints it."""
    from gpupool.cli.main import COMMANDS, build_parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        parser = build_parser()
        parts = [
            "# Command line\n\n",
            GENERATED.format(source="the argparse parser of `gpupool` (src/gpupool/cli/)"),
            "Every command of `gpupool`, with the help it prints for `gpupool COMMAND --help`. "
            "What an exit code means is in [Exit codes](exit-codes.md).\n\n",
            "| command | what it does |\n|---|---|\n",
        ]
        parts += [f"| [`gpupool {name}`](#gpupool-{name}) | {_cell(line)} |\n" for name, (_, line) in COMMANDS.items()]
        parts.append("\n")
        parts.append(f"## gpupool\n\n```text\n{parser.format_help().rstrip()}\n```\n\n")
        for name, line, sub in _subcommands(parser):
            parts += _command_sections(sub, ["gpupool", name], line, 2)
        return "".join(parts)
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


# -- exit codes --------------------------------------------------------------------------------


def exit_codes_page() -> str:
    """The exit code of each error class (core/errors.py), with its HTTP status and error code."""
    from gpupool.core import errors

    classes = [
        cls
        for name, cls in vars(errors).items()
        if isinstance(cls, type) and issubclass(cls, errors.GpupoolError) and name == cls.__name__
    ]
    by_exit: Dict[int, List[type]] = {}
    for cls in classes:
        by_exit.setdefault(cls.exit_code, []).append(cls)
    parts = [
        "# Exit codes\n\n",
        GENERATED.format(source="the error classes of src/gpupool/core/errors.py"),
        "Every error gpupool reports on purpose is one class, which fixes both its exit code on the "
        "command line and its HTTP status and `error.code` over the API (the answer's body is "
        '`{"error": {"code": ..., "message": ...}}`). The message names the bad value and the fix.\n\n',
        "| exit code | meaning |\n|---|---|\n",
        "| 0 | success |\n",
    ]
    for code in sorted(by_exit):
        meanings = "; ".join(_doc_line(cls) for cls in by_exit[code])
        parts.append(f"| {code} | {_cell(meanings)} |\n")
    parts += [
        "| the command's own, 128+N | `gpupool run`, `gpupool kernel` and the jobs exit with the code of the "
        "command they ran, 128+N when signal N ended it |\n",
        "| 130 | interrupted (Ctrl-C) |\n",
        "| 141 | the reader of the output went away (`gpupool jobs \\| head -1`): the status of a program "
        "that SIGPIPE ended, said quietly |\n",
        "\nA command-line error of argparse's own (an unknown option, a missing argument) exits 2 too.\n\n",
        "## Errors over HTTP\n\n",
        "| `error.code` | HTTP status | exit code | class | meaning |\n|---|---|---|---|---|\n",
    ]
    for cls in classes:
        parts.append(
            f"| `{cls.code}` | {cls.http_status} | {cls.exit_code} | `{cls.__name__}` | {_cell(_doc_line(cls))} |\n"
        )
    return "".join(parts)


def _doc_line(obj: Any) -> str:
    """The first paragraph of `obj`'s docstring, on one line."""
    if getattr(obj, "__name__", "") == "GpupoolError":  # the base class: its docstring says what it is for
        return "an error of no more specific kind (the message says what and how to fix it)"
    doc = (obj.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(doc.split())


# -- environment variables ---------------------------------------------------------------------

_ENV_NAME = re.compile(r"^GPUPOOL_[A-Z0-9_]+$")

# What a variable means to a user, where the comment at its definition is missing or speaks to
# gpupool's developers; each is written here once. A variable with neither fails the build.
ENV_NOTES: Dict[str, str] = {
    "GPUPOOL_STATE": "The state dir of the embedded pool (`gpupool run` without a server) and the default of "
    "`gpupool server --state`; else `$XDG_STATE_HOME/gpupool` or `~/.local/state/gpupool`.",
    "GPUPOOL_SERVER": "The pool server(s) a client uses, comma-separated; beats `client.yaml`, loses to `--server`.",
    "GPUPOOL_TOKEN": "The bearer token a client sends; beats `client.yaml`, loses to `--token-file`.",
    "GPUPOOL_CA": "The CA certificate a client verifies an HTTPS pool server with, where `client.yaml` names none.",
    "GPUPOOL_CONFIG": "The client config file, instead of `~/.gpupool/client.yaml`.",
    "GPUPOOL_SYNC": "SQLite's `synchronous` mode for the pool database (default `NORMAL`, with WAL).",
    "GPUPOOL_FAST_PATH": "`0` in the server's environment serves claim, heartbeat and release through FastAPI's "
    "routes instead of the fast path.",
    "GPUPOOL_HOOK_DEBUG": "`1` makes the post-import hook print what it applied or skipped.",
    "GPUPOOL_HOOK_DIR": "Set for a run's command: the folder of the post-import hook, first on `PYTHONPATH`.",
    "GPUPOOL_MEMORY_FRACTION": "Set for a run's command: its share of each visible GPU's memory, as a fraction.",
    "GPUPOOL_ALLOCATOR_FRACTION": "Set for a run's command: the fraction the hook caps the framework's allocator at "
    "(the grant less the CUDA context reserve).",
    "GPUPOOL_DEVICES": "The GPUs a pool serves where no `--devices` names them: `auto` (NVML), "
    "`emulated:2x16GiB[,1x80GiB]`, or both.",
    "GPUPOOL_EMULATED_USAGE": "For emulated GPUs: a JSON file of what each process uses "
    '(`{"GPU-uuid": {"PID": MiB}}`), read where NVML would be asked.',
    "GPUPOOL_CONTEXT_RESERVE_MIB": "In the runner's environment: the MiB per GPU kept out of the allocator cap for "
    "the CUDA context (default 768).",
    "GPUPOOL_MEMORY_LIMIT_MIB": "Set for a run's command: the MiB of each visible GPU the pool granted it.",
    "GPUPOOL_ALLOCATOR_LIMIT_MIB": "Set for a run's command: the MiB the hook caps the framework's allocator at "
    "(the grant less the CUDA context reserve).",
    "GPUPOOL_LEASE_ID": "Set for a run's command: its lease; the runner and the server's watchdog find the lease's "
    "processes by it.",
    "GPUPOOL_PREEMPTED": "Set by `gpupool run --requeue` on a rerun after a preemption: `1`, so the command can "
    "resume from its checkpoint.",
    "GPUPOOL_RENDEZVOUS_TOKEN": "Set for a job's key-value rendezvous store started on its own: the token its "
    "callers must send.",
    "GPUPOOL_ATTEMPT": "Set by `gpupool run --requeue` on a rerun after a preemption: the attempt number (2 on the "
    "first rerun).",
    "GPUPOOL_CACHE_DIR": "Where the trainer caches data read from object storage (default `~/.cache/gpupool`).",
    "GPUPOOL_CHECKPOINTS": "Set in every replica of a job whose spec has `checkpoints:`: that place, the trainer's "
    "default `--out`.",
    "GPUPOOL_JOB_NAME": "Set in every process of a job: the job's name.",
    "GPUPOOL_JOB_DIR": "Set in every process of a job: the job's folder (`$(GPUPOOL_JOB_DIR)` in a spec's commands).",
    "GPUPOOL_REPLICA": "Set in every replica of a job: its name, e.g. `worker-1`.",
    "GPUPOOL_ROLE": "Set in every replica of a job: its role, e.g. `worker`.",
    "GPUPOOL_REPLICA_INDEX": "Set in every replica of a job: its index within its role, from 0.",
    "GPUPOOL_RESTART_COUNT": "Set in every replica of a job: how many times it was restarted (0 on the first run).",
    "GPUPOOL_RANK": "Set in the pods of an indexed Kubernetes Job: the pod's completion index.",
    "GPUPOOL_HTTP_BODY_TIMEOUT": "Seconds a server waits for a request's body (default 10).",
    "GPUPOOL_HTTP_HEAD_TIMEOUT": "Seconds a server waits for a request's head, and idle keep-alive connections live "
    "(default 30).",
    "GPUPOOL_NODE_AGENT": "Set by the device plugin in a GPU container: the URL of its node's agent.",
    "GPUPOOL_UNITS": "Set by the device plugin in a GPU container: how many `gpupool.io/gpu` units it was allocated.",
    "GPUPOOL_POD_NAME": "Set by the webhook in a GPU pod (downward API): the pod's name, the holder of its lease.",
    "GPUPOOL_POD_NAMESPACE": "Set by the webhook in a GPU pod (downward API): the pod's namespace.",
    "GPUPOOL_POD_UID": "Set by the webhook in a GPU pod (downward API): the pod's UID.",
    "GPUPOOL_NODE_NAME": "Set by the webhook in a GPU pod (downward API): the node it runs on.",
    "GPUPOOL_NODE_IP": "Set by the webhook in a GPU pod (downward API): its node's IP, where the node agent listens.",
}


# The variables the test suite reads (tests/), for contributors; each must still be read there.
TEST_ENV_NOTES: Dict[str, str] = {
    "GPUPOOL_FUZZ_S": "Seconds the API fuzz test (tests/serving/server/test_fuzz.py) runs each phase (default 20).",
    "GPUPOOL_CRASH_ROUNDS": "Rounds of the kill -9 test of a busy server (tests/serving/server/test_crash.py; default 3).",
    "GPUPOOL_KUEUE_CRDS": "A folder of Kueue's CRD schemas, used instead of those of the Kueue module the test "
    "bed pins: the Kueue example tests validate against them, and skip with neither.",
    "GPUPOOL_KUBEFLOW_CRDS": "A folder of the Kubeflow training operator's CRD schemas, used instead of those of "
    "the module tools/crds/go.mod pins: the job manifest tests validate against them, and skip with neither.",
    "GPUPOOL_DASHBOARD_SCREENSHOT": "A file the dashboard's browser test copies its screenshot to (how "
    "docs/dashboard.png is made).",
    "GPUPOOL_DOCS_TEST": "Set in the shell sessions of the code-block test (tests/docs): finds every process a "
    "page started.",
}


def _comment_at(lines: List[str], lineno: int) -> str:
    """The comment that defines the constant on line `lineno` (1-based): its own `#` comment, else the
    comment block right above it, else the comment above the group of assignments it stands in."""
    line = lines[lineno - 1]
    code, _, comment = line.partition("#")
    if comment and code.count('"') % 2 == 0:
        return comment.strip()
    i = lineno - 2
    while i >= 0 and re.match(r"^[A-Z_][A-Z0-9_]* = \S", lines[i]) and "#" not in lines[i]:
        i -= 1  # a constant of the same group, without a comment of its own
    block: List[str] = []
    while i >= 0 and lines[i].lstrip().startswith("#"):
        block.insert(0, lines[i].lstrip()[1:].strip())
        i -= 1
    return " ".join(block)


def environment_variables() -> Dict[str, Dict[str, List[str]]]:
    """GPUPOOL_* name -> {"where": [module.CONSTANT ...], "notes": [the comments that define it]}.

    Found in the source itself: each module-level constant whose value is a `GPUPOOL_*` name (its
    comment is what it means), and each such name written as a literal elsewhere (a variable set
    for a pod, or read by the post-import hook, which cannot import gpupool).
    """
    found: Dict[str, Dict[str, List[str]]] = {}
    package = SRC / "gpupool"
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        if "GPUPOOL_" not in text:
            continue
        module = ".".join(path.relative_to(SRC).with_suffix("").parts)
        lines = text.splitlines()
        tree = ast.parse(text)
        constants = set()
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and _ENV_NAME.match(node.value.value)
            ):
                entry = found.setdefault(node.value.value, {"where": [], "notes": []})
                entry["where"].append(f"{module}.{node.targets[0].id}")
                note = _comment_at(lines, node.lineno)
                if note and note not in entry["notes"]:
                    entry["notes"].append(note)
                constants.add(id(node.value))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _ENV_NAME.match(node.value)
                and id(node) not in constants
            ):
                entry = found.setdefault(node.value, {"where": [], "notes": []})
                if not any(w == module or w.startswith(module + ".") for w in entry["where"]):
                    entry["where"].append(module)
    return dict(sorted(found.items()))


def environment_page() -> str:
    rows = environment_variables()
    parts = [
        "# Environment variables\n\n",
        GENERATED.format(source="the `GPUPOOL_*` names in src/gpupool"),
        "Every `GPUPOOL_*` variable that gpupool reads or sets, and the module that defines it. "
        "A flag on the command line beats its variable; a variable beats the client config file.\n\n",
        "| variable | defined in | what it is |\n|---|---|---|\n",
    ]
    for name, entry in rows.items():
        where = ", ".join(f"`{w}`" for w in entry["where"])
        note = ENV_NOTES.get(name) or " ".join(entry["notes"])
        if not note:
            raise ValueError(
                f"{name} ({where}) has no description: put a comment at its definition, or a line in "
                "ENV_NOTES of tools/docs/reference.py"
            )
        parts.append(f"| `{name}` | {where} | {_cell(note)} |\n")
    parts.append("\n## The test suite\n\nRead by `make test`'s tests, for contributors.\n\n")
    parts.append("| variable | what it is |\n|---|---|\n")
    parts += [f"| `{name}` | {_cell(note)} |\n" for name, note in sorted(TEST_ENV_NOTES.items())]
    return "".join(parts)


# -- metrics -----------------------------------------------------------------------------------


def _families(registry: Any) -> Iterator[Tuple[str, str, str, List[str]]]:
    """(name, type, help, label names) of each family a registry exposes."""
    for metric in registry.collect():
        labels = list(getattr(metric, "_labelnames", ()) or ())
        for sample in metric.samples:
            labels += [k for k in sample.labels if k not in labels and k not in ("le", "quantile")]
        name = metric.name + ("_total" if metric.type == "counter" else "")
        yield name, metric.type, metric.documentation, labels


def metrics_page() -> str:
    """The families the server's /metrics and the webhook's expose, read from their registries."""
    from gpupool.kube.webhook_metrics import WebhookMetrics
    from gpupool.pooling.devices import emulated_devices
    from gpupool.pooling.pool import Pool
    from gpupool.serving.server.metrics import Metrics

    parts = [
        "# Metrics\n\n",
        GENERATED.format(
            source="the registries of src/gpupool/serving/server/metrics.py and src/gpupool/kube/webhook_metrics.py"
        ),
        "Memory is in bytes, time in seconds (Prometheus' base units). Every GPU series has the NVML "
        "`uuid` label; lease and holder series of a Kubernetes pod have `namespace` and `pod` labels.\n\n",
    ]
    with tempfile.TemporaryDirectory(prefix="gpupool-docs-") as state:
        pool = Pool(state, devices=emulated_devices("1x16GiB"))
        try:
            server = list(_families(Metrics(pool).registry))
        finally:
            pool.close()
    for title, where, families in (
        ("Pool server", "`gpupool server`'s `GET /metrics`", server),
        (
            "Webhook and scheduler extender",
            "`gpupool kube webhook`'s `GET /metrics`",
            _families(WebhookMetrics().registry),
        ),
    ):
        parts.append(
            f"## {title}\n\nServed at {where}.\n\n| metric | type | labels | what it is |\n|---|---|---|---|\n"
        )
        for name, kind, doc, labels in sorted(families):
            label_text = ", ".join(f"`{label}`" for label in labels)
            parts.append(f"| `{name}` | {kind} | {label_text} | {_cell(doc)} |\n")
        parts.append("\n")
    return "".join(parts)


# -- HTTP API ----------------------------------------------------------------------------------


def openapi_document() -> Dict[str, Any]:
    """The server's own OpenAPI document, as an authenticated server serves it at /openapi.json."""
    from gpupool.pooling.devices import emulated_devices
    from gpupool.pooling.pool import Pool
    from gpupool.serving.server.app import create_app
    from gpupool.serving.server.auth import Authenticator

    with tempfile.TemporaryDirectory(prefix="gpupool-docs-") as state:
        pool = Pool(state, devices=emulated_devices("1x16GiB"))
        try:
            app = create_app(pool, Authenticator("docs", pool.store))
            return app.openapi()
        finally:
            pool.close()


def _schema_type(schema: Dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_schema_type(s) for s in schema[key])
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_schema_type(schema.get('items', {}))}"
    if isinstance(kind, list):
        return " or ".join(kind)
    return str(kind)


def _anchor(name: str) -> str:
    return "schema-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def api_page() -> str:
    doc = openapi_document()
    parts = [
        "# HTTP API\n\n",
        GENERATED.format(source="the OpenAPI document of the server's FastAPI app (src/gpupool/serving/server/)"),
        f"{doc['info'].get('description', '')}\n\n",
        f"A running server serves this document at `/openapi.json`; the one this page was made from "
        f"is [openapi.json](openapi.json) (version {doc['info']['version']}). Errors have the body "
        '`{"error": {"code": ..., "message": ...}}`; their codes and statuses are in '
        "[Exit codes](exit-codes.md#errors-over-http).\n\n",
        "| method | path | what it does |\n|---|---|---|\n",
    ]
    operations = [
        (path, method, op)
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if method in ("get", "post", "put", "patch", "delete")
    ]
    for path, method, op in operations:
        parts.append(
            f"| {method.upper()} | [`{path}`](#{_op_anchor(method, path)}) | {_cell(op.get('summary', ''))} |\n"
        )
    parts.append("\n## Operations\n\n")
    for path, method, op in operations:
        parts.append(f"### {method.upper()} {path} {{#{_op_anchor(method, path)}}}\n\n")
        if op.get("description"):
            parts.append(f"{op['description'].strip()}\n\n")
        if op.get("security"):
            parts.append("Needs a token (`Authorization: Bearer <token>`).\n\n")
        params = op.get("parameters") or []
        if params:
            parts.append("| parameter | in | type | required | what it is |\n|---|---|---|---|---|\n")
            for p in params:
                schema = p.get("schema", {})
                parts.append(
                    f"| `{p['name']}` | {p['in']} | {_schema_type(schema)} | {'yes' if p.get('required') else 'no'} "
                    f"| {_cell(p.get('description') or schema.get('description') or '')} |\n"
                )
            parts.append("\n")
        body = (op.get("requestBody") or {}).get("content", {})
        for media, content in body.items():
            parts.append(f"Request body ({media}): {_schema_type(content.get('schema', {}))}\n\n")
        parts.append("| status | answer |\n|---|---|\n")
        for status, answer in (op.get("responses") or {}).items():
            schemas = [c.get("schema", {}) for c in (answer.get("content") or {}).values()]
            body_text = "; ".join(_schema_type(s) for s in schemas if s)
            text = answer.get("description", "") + (f": {body_text}" if body_text else "")
            parts.append(f"| {status} | {_cell(text)} |\n")
        parts.append("\n")
    parts.append("## Schemas\n\n")
    for name, schema in sorted(doc.get("components", {}).get("schemas", {}).items()):
        parts.append(f"### {name} {{#{_anchor(name)}}}\n\n")
        if schema.get("description"):
            parts.append(f"{_cell(schema['description'])}\n\n")
        props = schema.get("properties") or {}
        if props:
            required = set(schema.get("required", []))
            parts.append("| field | type | required | what it is |\n|---|---|---|---|\n")
            for field, sub in props.items():
                parts.append(
                    f"| `{field}` | {_schema_type(sub)} | {'yes' if field in required else 'no'} "
                    f"| {_cell(sub.get('description', ''))} |\n"
                )
            parts.append("\n")
        elif "enum" in schema or "type" in schema:
            parts.append(f"Type: {_schema_type(schema)}\n\n")
    return "".join(parts)


def _op_anchor(method: str, path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", f"{method} {path}".lower()).strip("-")


# -- job spec ----------------------------------------------------------------------------------


def job_spec_schema() -> Dict[str, Any]:
    from gpupool.jobs.spec_model import JobModel

    return JobModel.model_json_schema(by_alias=True)


def job_spec_page() -> str:
    schema = job_spec_schema()
    defs = schema.get("$defs", {})
    parts = [
        "# Job spec\n\n",
        GENERATED.format(source="the pydantic models of src/gpupool/jobs/spec_model.py"),
        "The YAML file `gpupool submit` runs. Every mapping is closed (an unknown key is an error that "
        'names the known ones) and strict (`"2"` is not a number). The JSON schema this page was made '
        "from is [job-spec.schema.json](job-spec.schema.json): point an editor's YAML support at it.\n\n",
    ]
    for name, sub in [("Job", schema), *sorted(defs.items())]:
        parts.append(f"## {name} {{#{_anchor(name)}}}\n\n")
        if sub.get("description"):
            parts.append(f"{sub['description'].strip()}\n\n")
        props = sub.get("properties") or {}
        if props:
            required = set(sub.get("required", []))
            parts.append("| field | type | default | what it is |\n|---|---|---|---|\n")
            for field, prop in props.items():
                if prop.get("not") == {}:  # a field a role may not set (it is the job's)
                    continue
                kind = _schema_type(prop)
                if prop.get("type") == "object" and "additionalProperties" in prop:
                    kind = f"mapping of name to {_schema_type(prop['additionalProperties'])}"
                default = "required" if field in required else f"`{json.dumps(prop.get('default'))}`"
                examples = prop.get("examples")
                note = prop.get("description", "") + (
                    f" e.g. {', '.join(f'`{e}`' for e in examples)}" if examples else ""
                )
                parts.append(f"| `{field}` | {kind} | {default} | {_cell(note)} |\n")
            parts.append("\n")
        elif "enum" in sub:
            parts.append(f"One of {_schema_type(sub)}.\n\n")
    return "".join(parts)


# -- the pages ---------------------------------------------------------------------------------

PAGES: Dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/exit-codes.md": exit_codes_page,
    "reference/environment.md": environment_page,
    "reference/metrics.md": metrics_page,
    "reference/api.md": api_page,
    "reference/job-spec.md": job_spec_page,
}
# Files the pages link to: the documents they were made from.
FILES: Dict[str, Callable[[], str]] = {
    "reference/openapi.json": lambda: json.dumps(openapi_document(), indent=2) + "\n",
    "reference/job-spec.schema.json": lambda: json.dumps(job_spec_schema(), indent=2) + "\n",
}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="write the generated reference pages to DIR")
    parser.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    for name, make in {**PAGES, **FILES}.items():
        target = args.dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(make())
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
