"""`gpupool predict`: classify images with a trained run's model."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `predict`."""
    p = subparsers.add_parser(
        "predict",
        help="classify images with a trained model",
        description="Print the predicted class and its probability for each image.",
    )
    p.add_argument(
        "--model", required=True, help="run folder of `gpupool train` (or its model.pt), local or a bucket URL"
    )
    p.add_argument("images", nargs="+", help="image files (jpg, jpeg, png), local or bucket URLs")
    p.add_argument("--top", type=int, default=1, help="show the K most likely classes (default 1)")
    p.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    p.add_argument("--json", action="store_true", help="one JSON list on stdout")
    p.set_defaults(func=_predict)


def _predict(args: argparse.Namespace) -> int:
    from gpupool.core.errors import InvalidInput

    try:
        from gpupool.train.predict import predict_files
    except ImportError as err:
        raise InvalidInput(f"`gpupool predict` needs the train extra ({err}); pip install 'gpupool[train]'") from None
    results = predict_files(args.model, args.images, top=args.top, device=args.device)
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        for r in results:
            print(r.describe())
    return 1 if any(r.error for r in results) else 0
