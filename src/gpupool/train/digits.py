"""Export scikit-learn's bundled handwritten digits (1,797 8x8 images, 10 classes) as a
class-folder data set of PNGs: a real data set that needs no network, for demos and tests."""

from __future__ import annotations

from pathlib import Path
from typing import Dict


def export_digits(to: Path, limit_per_class: int = 0) -> Dict[str, int]:
    """Write TO/<digit>/<index>.png (grayscale, 0-255); returns images per class.

    `limit_per_class` > 0 keeps only that many per class (tiny test fixtures). Existing
    files are overwritten, so the export is idempotent.
    """
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    counts: Dict[str, int] = {}
    for index, (image, target) in enumerate(zip(digits.images, digits.target)):
        name = str(int(target))
        if limit_per_class and counts.get(name, 0) >= limit_per_class:
            continue
        folder = to / name
        folder.mkdir(parents=True, exist_ok=True)
        # Pixel values are 0..16; stretch to the full byte range.
        pixels = np.clip(image * (255.0 / 16.0), 0, 255).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(folder / f"{index:04d}.png")
        counts[name] = counts.get(name, 0) + 1
    return counts
