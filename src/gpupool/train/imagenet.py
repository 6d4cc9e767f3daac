"""Extract chosen ImageNet (ILSVRC2012) synsets into a class-folder data set, TO/<synset>/*.JPEG.

Accepted sources, tried in this order for each synset:
  FROM/<synset>/            an already extracted class folder (also under FROM/train/ or
                            Kaggle's FROM/ILSVRC/Data/CLS-LOC/train/)
  FROM/<synset>.tar         the per-class tars inside ILSVRC2012_img_train.tar (same places)
  ILSVRC2012_img_train.tar  the outer tar itself (FROM, or FROM/ILSVRC2012_img_train.tar):
                            streamed once, only the chosen inner tars are read
Only regular files with an image extension are written, under their base name, so a
crafted archive cannot write outside TO.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tarfile
from pathlib import Path
from typing import IO, Dict, Iterable, List, Optional, Sequence

from gpupool.core.errors import InvalidInput

log = logging.getLogger(__name__)

SYNSET_RE = re.compile(r"^n\d{8}$")
OUTER_TAR = "ILSVRC2012_img_train.tar"
SUBDIRS = (".", "train", "ILSVRC/Data/CLS-LOC/train")
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
NAME_FILES = ("LOC_synset_mapping.txt", "synset_words.txt")


def parse_synsets(text: str) -> List[str]:
    """ "n01440764,n02119022" -> list; raises InvalidInput on a malformed id or duplicates."""
    synsets = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in synsets if not SYNSET_RE.match(s)]
    if bad:
        raise InvalidInput(f"{bad[0]!r} is not an ImageNet synset id (expected n + 8 digits, e.g. n01440764)")
    if len(synsets) < 2:
        raise InvalidInput("give at least two synsets, comma-separated, e.g. --synsets n01440764,n02119022")
    if len(set(synsets)) != len(synsets):
        raise InvalidInput(f"duplicate synsets in {text!r}")
    return synsets


def _copy_members(tar: tarfile.TarFile, dest: Path, limit: int) -> int:
    """Extract image members of an inner tar into dest by base name; returns the count."""
    n = 0
    for member in tar:
        if limit and n >= limit:
            break
        name = Path(member.name).name
        if not member.isfile() or not name.lower().endswith(IMAGE_SUFFIXES) or name.startswith("."):
            continue
        src = tar.extractfile(member)
        if src is None:
            continue
        with src, open(dest / name, "wb") as f:
            shutil.copyfileobj(src, f)
        n += 1
    return n


def _from_folder(src: Path, dest: Path, limit: int) -> int:
    files = sorted(f for f in src.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
    if limit:
        files = files[:limit]
    for f in files:
        target = dest / f.name
        if not (target.exists() and target.stat().st_size == f.stat().st_size):
            shutil.copyfile(f, target)
    return len(files)


def _from_tar(fileobj: IO[bytes], dest: Path, limit: int) -> int:
    with tarfile.open(fileobj=fileobj, mode="r|*") as inner:
        return _copy_members(inner, dest, limit)


def _find_outer(root: Path) -> Optional[Path]:
    if root.is_file() and tarfile.is_tarfile(root):
        return root
    candidate = root / OUTER_TAR
    return candidate if candidate.is_file() else None


def _write_names(root: Path, to: Path, synsets: Sequence[str]) -> None:
    """Copy human-readable class names next to the data when the source ships them."""
    base = root if root.is_dir() else root.parent
    for name in NAME_FILES:
        mapping = base / name
        if mapping.is_file():
            names: Dict[str, str] = {}
            for line in mapping.read_text(errors="replace").splitlines():
                parts = line.split(None, 1)
                if len(parts) == 2 and parts[0] in synsets:
                    names[parts[0]] = parts[1].strip()
            (to / "synsets.json").write_text(json.dumps(names, indent=2) + "\n")
            return


def extract_synsets(root: Path, synsets: Iterable[str], to: Path, limit: int = 0) -> Dict[str, int]:
    """Extract each synset's images to TO/<synset>/; returns images per synset.

    Raises:
        InvalidInput: the source does not exist or lacks one of the synsets.
    """
    wanted = list(synsets)
    if not root.exists():
        raise InvalidInput(f"ImageNet source {root} does not exist; point --from at the ILSVRC2012 train folder or tar")
    to.mkdir(parents=True, exist_ok=True)
    counts: Dict[str, int] = {}
    pending: List[str] = []
    for synset in wanted:
        dest = to / synset
        dest.mkdir(exist_ok=True)
        found = False
        if root.is_dir():
            for sub in SUBDIRS:
                folder, tar_path = root / sub / synset, root / sub / f"{synset}.tar"
                if folder.is_dir():
                    counts[synset], found = _from_folder(folder, dest, limit), True
                elif tar_path.is_file():
                    with open(tar_path, "rb") as f:
                        counts[synset], found = _from_tar(f, dest, limit), True
                if found:
                    break
        if not found:
            pending.append(synset)
    if pending:
        outer = _find_outer(root)
        if outer is not None:
            log.info("streaming %s for %s", outer, ", ".join(pending))
            with tarfile.open(outer, mode="r|*") as big:
                for member in big:
                    stem = Path(member.name).name.removesuffix(".tar")
                    if member.isfile() and stem in pending:
                        inner = big.extractfile(member)
                        if inner is not None:
                            counts[stem] = _from_tar(inner, to / stem, limit)
        missing = [s for s in pending if s not in counts]
        if missing:
            raise InvalidInput(
                f"synset {missing[0]} not found in {root} (looked for {missing[0]}/, {missing[0]}.tar and "
                f"{OUTER_TAR}); check the id or the --from path"
            )
    empty = [s for s, n in counts.items() if n == 0]
    if empty:
        raise InvalidInput(f"synset {empty[0]} holds no images in {root}")
    _write_names(root, to, wanted)
    return counts
