"""`gpupool data`: build class-folder data sets (ImageNet synsets, scikit-learn digits)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterator


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `data imagenet` and `data digits`."""
    parser = subparsers.add_parser(
        "data",
        help="prepare image data sets as DIR/<class>/*.jpg",
        description="Prepare image data sets in the class-folder layout the trainer reads.",
    )
    verbs = parser.add_subparsers(dest="data_command", metavar="SOURCE", required=True)

    imagenet = verbs.add_parser(
        "imagenet",
        help="extract chosen ILSVRC2012 synsets",
        description="Extract chosen synsets from ILSVRC2012 (outer tar, per-class tars "
        "or extracted folders) into TO/<synset>/.",
    )
    imagenet.add_argument(
        "--from", dest="source", required=True, type=Path, help="ILSVRC2012 train folder, or ILSVRC2012_img_train.tar"
    )
    imagenet.add_argument("--synsets", required=True, help="comma-separated synset ids, e.g. n01440764,n02119022")
    imagenet.add_argument("--to", required=True, help="output folder or bucket URL (s3://, gs://, az://)")
    imagenet.add_argument("--limit", type=int, default=0, help="at most N images per synset (0: all)")
    imagenet.add_argument("--json", action="store_true", help="print counts as JSON on stdout")
    imagenet.set_defaults(func=_imagenet)

    digits = verbs.add_parser(
        "digits",
        help="export scikit-learn's digits (offline, 1,797 images)",
        description="Export scikit-learn's bundled 8x8 handwritten digits as PNGs, "
        "TO/<digit>/<n>.png: a real, small data set that needs no network.",
    )
    digits.add_argument("--to", required=True, help="output folder or bucket URL (s3://, gs://, az://)")
    digits.add_argument("--limit-per-class", type=int, default=0, help="at most N images per class (0: all)")
    digits.add_argument("--json", action="store_true", help="print counts as JSON on stdout")
    digits.set_defaults(func=_digits)


def _print_counts(args: argparse.Namespace, counts: Dict[str, int]) -> None:
    from gpupool.train.storage import redact  # a URL's password or signature is never printed

    to = redact(str(args.to))
    if args.json:
        print(json.dumps({"to": to, "classes": counts, "images": sum(counts.values())}))
    else:
        print(f"wrote {sum(counts.values())} images in {len(counts)} classes to {to}", file=sys.stderr)


@contextlib.contextmanager
def _target(to: str) -> Iterator[Path]:
    """The folder to write into: TO itself, or for a bucket URL a temporary folder copied to it
    once complete (a failed export leaves the bucket as it was)."""
    from gpupool.train import storage

    if not storage.is_remote(to):
        yield storage.local_path(to)
        return
    storage.require_bucket(to)  # before minutes of extraction, not after
    with tempfile.TemporaryDirectory(prefix="gpupool-data-") as tmp:
        yield Path(tmp)
        print(f"copying to {storage.redact(to)}", file=sys.stderr)
        storage.put_tree(tmp, to)


def _imagenet(args: argparse.Namespace) -> int:
    from gpupool.train.imagenet import extract_synsets, parse_synsets

    synsets = parse_synsets(args.synsets)
    with _target(args.to) as to:
        counts = extract_synsets(args.source, synsets, to, limit=max(0, args.limit))
    _print_counts(args, counts)
    return 0


def _digits(args: argparse.Namespace) -> int:
    from gpupool.core.errors import InvalidInput

    try:
        from gpupool.train.digits import export_digits

        with _target(args.to) as to:
            counts = export_digits(to, limit_per_class=max(0, args.limit_per_class))
    except ImportError as err:
        raise InvalidInput(
            f"`gpupool data digits` needs the train extra ({err}); pip install 'gpupool[train]'"
        ) from None
    _print_counts(args, counts)
    return 0
