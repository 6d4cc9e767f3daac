"""Classify image files with a trained run's model (RUN/model.pt)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from gpupool.core.errors import InvalidInput
from gpupool.train import storage
from gpupool.train.data import Normalizer, decode_resized
from gpupool.train.export import MODEL_FILE, load_serving


@dataclass(frozen=True)
class Prediction:
    """The top classes for one file, or why it could not be read."""

    file: str
    top: Tuple[Tuple[str, float], ...] = ()
    error: Optional[str] = None
    names: Tuple[Optional[str], ...] = ()  # display names of the top classes, where known

    def to_json(self) -> Dict[str, Any]:
        """Machine form for --json."""
        if self.error:
            return {"file": self.file, "error": self.error}
        label, prob = self.top[0]
        names = self.names or (None,) * len(self.top)
        answer = {
            "file": self.file,
            "class": label,
            "probability": round(prob, 6),
            "top": [
                {"class": c, "probability": round(p, 6), **({"name": n} if n else {})}
                for (c, p), n in zip(self.top, names)
            ],
        }
        if names[0]:
            answer["name"] = names[0]
        return answer

    def describe(self) -> str:
        """One human line: `file: class (name) 0.973, ...`."""
        if self.error:
            return f"{self.file}: error: {self.error}"
        names = self.names or (None,) * len(self.top)
        return f"{self.file}: " + ", ".join(
            f"{c}{f' ({n})' if n else ''} {p:.3f}" for (c, p), n in zip(self.top, names)
        )


def _local_model(model: Union[str, Path]) -> Path:
    """A run folder or model file, local or in a bucket (fetched to a temporary folder)."""
    if not storage.is_remote(model):
        return storage.local_path(model)
    url = str(model)
    url = url if url.endswith(".pt") else storage.join(url, MODEL_FILE)
    local = Path(tempfile.mkdtemp(prefix="gpupool-model-")) / MODEL_FILE
    storage.get_file(url, local)
    return local


def _exists(file: str) -> bool:
    return storage.exists(file) if storage.is_remote(file) else storage.local_path(file).is_file()


def _read(file: str) -> bytes:
    return storage.read_bytes(file) if storage.is_url(file) else Path(file).read_bytes()


def predict_files(
    model_path: Union[str, Path],
    files: Sequence[str],
    top: int = 1,
    batch_size: int = 32,
    device: Optional[str] = None,
) -> List[Prediction]:
    """Predict each file; an unreadable image yields a Prediction with `error`, not an exception.
    The model and the files may be bucket URLs.

    Raises:
        InvalidInput: no model there, or a file does not exist.
    """
    missing = [f for f in files if not _exists(f)]
    if missing:
        raise InvalidInput(f"image file {missing[0]} does not exist")
    model, payload = load_serving(_local_model(model_path))
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(dev)
    normalize = Normalizer().to(dev)
    classes: List[str] = payload["classes"]
    display = payload.get("class_names") or {}
    size = int(payload["preprocess"]["image_size"])
    k = max(1, min(top, len(classes)))
    results: List[Prediction] = []
    ok: List[Tuple[str, torch.Tensor]] = []
    for f in files:
        try:
            ok.append((f, decode_resized(_read(f), size)))
        except Exception as err:
            results.append(Prediction(file=f, error=f"cannot decode image: {err}"))
    with torch.no_grad():
        for start in range(0, len(ok), batch_size):
            chunk = ok[start : start + batch_size]
            x = normalize(torch.stack([t for _, t in chunk]).to(dev))
            probs = torch.softmax(model(x).float(), dim=1).cpu()
            values, indices = probs.topk(k, dim=1)
            for (f, _), vals, idxs in zip(chunk, values.tolist(), indices.tolist()):
                results.append(
                    Prediction(
                        file=f,
                        top=tuple((classes[i], v) for i, v in zip(idxs, vals)),
                        names=tuple(display.get(classes[i]) for i in idxs),
                    )
                )
    order = {f: i for i, f in enumerate(files)}
    return sorted(results, key=lambda p: order[p.file])
