"""Class-folder datasets, the seeded train/val/test split, and the DataLoaders.

Layout: DIR/<class>/*.{jpg,jpeg,png}. Images are decoded and resized inside DataLoader
workers and leave them as uint8 tensors: a quarter of the bytes of float32 through the
worker pipe and the host-to-device copy; conversion and normalisation happen on the
device (see `Normalizer`). A file that cannot be decoded becomes a blank image with
label -1, which the loss ignores and the trainer counts: one bad JPEG among a million
must not end a three-day run, and keeping the batch shape keeps DDP ranks in step.
"""

from __future__ import annotations

import json
import logging
import os
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple, Union, cast

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate

from gpupool.core.errors import InvalidInput

if TYPE_CHECKING:
    from gpupool.train.bucket_data import BucketFiles

# Imported here, not in the decode function: forked DataLoader workers then inherit them
# instead of each paying a second of imports on its first image.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from torchvision.io import ImageReadMode, decode_image
    from torchvision.transforms.v2.functional import resize

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
# ImageNet statistics: right for the torchvision backbones, harmless for the rest.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BAD_LABEL = -1
SPLIT_FILE = "split.json"
# torchvision 0.29 marks its decoders deprecated in favour of TorchCodec; they remain the
# fastest libjpeg-turbo path available here, and PIL is the fallback when they go.
warnings.filterwarnings(
    "ignore", message="The image decoding and encoding capabilities of TorchVision", category=DeprecationWarning
)


@dataclass(frozen=True)
class Split:
    """Which files train, validate and test; paths are relative to the data dir."""

    classes: Tuple[str, ...]
    train: Tuple[Tuple[str, int], ...]
    val: Tuple[Tuple[str, int], ...]
    test: Tuple[Tuple[str, int], ...]
    seed: int

    def to_json(self) -> Dict[str, object]:
        """JSON form written to RUN/split.json."""
        return {
            "classes": list(self.classes),
            "seed": self.seed,
            "train": [list(s) for s in self.train],
            "val": [list(s) for s in self.val],
            "test": [list(s) for s in self.test],
        }

    @staticmethod
    def from_json(d: Dict[str, Any]) -> Split:
        """Inverse of to_json (`d` is parsed JSON, checked only by the conversions here)."""

        def _rows(key: str) -> Tuple[Tuple[str, int], ...]:
            return tuple((str(p), int(c)) for p, c in d[key])

        return Split(tuple(d["classes"]), _rows("train"), _rows("val"), _rows("test"), int(d["seed"]))


def scan_class_folders(root: Path) -> Tuple[List[str], List[Tuple[str, int]]]:
    """List classes (sorted sub-folder names) and (relative path, class index) samples.

    Raises:
        InvalidInput: the folder is missing, empty, or holds fewer than two classes.
    """
    if not root.is_dir():
        raise InvalidInput(f"data folder {root} does not exist; expected {root}/<class>/*.jpg")
    classes: List[str] = []
    samples: List[Tuple[str, int]] = []
    for class_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = sorted(f for f in class_dir.rglob("*") if f.suffix.lower() in IMAGE_EXTENSIONS and f.is_file())
        if not files:
            continue
        idx = len(classes)
        classes.append(class_dir.name)
        samples.extend((f.relative_to(root).as_posix(), idx) for f in files)
    if not classes:
        raise InvalidInput(
            f"data folder {root} holds no images; expected {root}/<class>/*.{{jpg,jpeg,png}} "
            "(try `gpupool data digits --to DIR` for a small offline data set)"
        )
    if len(classes) < 2:
        raise InvalidInput(
            f"data folder {root} holds a single class ({classes[0]!r}); a classifier needs at least two class folders"
        )
    return classes, samples


def class_names(root: Path) -> Dict[str, str]:
    """Human-readable names for class folders, from DATA/synsets.json when the data set has
    one (`gpupool data imagenet` writes it: {"n01440764": "tench, Tinca tinca", ...})."""
    path = root / "synsets.json"
    try:
        names = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in names.items()} if isinstance(names, dict) else {}


def make_split(
    classes: Sequence[str], samples: Sequence[Tuple[str, int]], fractions: Tuple[float, float, float], seed: int
) -> Split:
    """Stratified, seeded split: every class is shuffled on its own and cut by the fractions,
    so small classes still appear in val and test and the result does not depend on the
    order the file system lists files in."""
    rng = random.Random(seed)
    _, f_val, f_test = fractions
    train: List[Tuple[str, int]] = []
    val: List[Tuple[str, int]] = []
    test: List[Tuple[str, int]] = []
    by_class: Dict[int, List[Tuple[str, int]]] = {i: [] for i in range(len(classes))}
    for sample in samples:
        by_class[sample[1]].append(sample)
    for idx in range(len(classes)):
        members = sorted(by_class[idx])
        rng.shuffle(members)
        n = len(members)
        n_val = int(round(n * f_val))
        n_test = int(round(n * f_test))
        # Keep at least one image per class in each part when the class allows it.
        if n >= 3:
            n_val, n_test = max(1, n_val), max(1, n_test)
        n_val = min(n_val, max(0, n - 1))
        n_test = min(n_test, max(0, n - 1 - n_val))
        val.extend(members[:n_val])
        test.extend(members[n_val : n_val + n_test])
        train.extend(members[n_val + n_test :])
    return Split(tuple(classes), tuple(sorted(train)), tuple(sorted(val)), tuple(sorted(test)), seed)


def load_or_make_split(
    root: Path,
    run_dir: Path,
    fractions: Tuple[float, float, float],
    seed: int,
    write: bool,
    bucket: Optional[BucketFiles] = None,
) -> Split:
    """The run's split: RUN/split.json when it exists (a resumed or re-run job keeps its
    split even if files were added since), else a fresh one, written when `write` (rank 0).
    A data set in a bucket (`bucket`) is listed here, once per job, and never again."""
    path = run_dir / SPLIT_FILE
    if path.exists():
        split = Split.from_json(json.loads(path.read_text()))
        present = bucket.exists if bucket is not None else (lambda rel: (root / rel).exists())
        missing = [p for p, _ in split.train[:5] if not present(p)]
        if missing:
            where = bucket.url if bucket is not None else root
            raise InvalidInput(
                f"{path} names files missing under {where} (e.g. {missing[0]}); use the same --data or a new --out"
            )
        return split
    classes, samples = bucket.scan() if bucket is not None else scan_class_folders(root)
    split = make_split(classes, samples, fractions, seed)
    if write:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(split.to_json()) + "\n")
        os.replace(tmp, path)
    return split


def decode_resized(data: Union[bytes, torch.Tensor], size: int) -> torch.Tensor:
    """Decode JPEG/PNG (bytes or a uint8 file tensor) to a 3x`size`x`size` uint8 RGB tensor,
    resized with antialiasing.

    torchvision's libjpeg-turbo/libpng decoders first, PIL as the fallback for the odd
    formats they refuse (CMYK JPEGs, palette tricks). Raises on undecodable data.
    """
    img: torch.Tensor
    raw = data if isinstance(data, torch.Tensor) else torch.frombuffer(bytearray(data), dtype=torch.uint8)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            img = decode_image(raw, mode=ImageReadMode.RGB)
    except RuntimeError:
        import io

        import numpy as np
        from PIL import Image

        with Image.open(io.BytesIO(raw.numpy().tobytes())) as pil:
            arr = np.asarray(pil.convert("RGB"))
        img = torch.from_numpy(arr.copy()).permute(2, 0, 1)
    if img.shape[-2:] != (size, size):
        img = resize(img, [size, size], antialias=True)
    return img


def read_bytes(path: str) -> torch.Tensor:
    """The file as a uint8 tensor, read straight into tensor memory (no Python bytes copy)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        buf = torch.empty(size, dtype=torch.uint8)
        if size and f.readinto(buf.numpy().data) != size:
            raise OSError(f"short read on {path}")
    return buf


def _shared_fd_batches() -> bool:
    """Whether worker batches can be written into a memfd that the DataLoader then passes
    to the main process as is (torch's default "file_descriptor" sharing on Linux)."""
    import torch.multiprocessing as mp

    return (
        hasattr(os, "memfd_create")
        and hasattr(torch.UntypedStorage, "_new_shared_fd_cpu")
        and mp.get_sharing_strategy() == "file_descriptor"  # type: ignore[no-untyped-call]  # unannotated in torch
    )


class _SharedFdStorage(Protocol):
    """The private classmethod of torch.UntypedStorage that maps a shared-memory file
    descriptor as a CPU storage (what torch's own fd sharing uses); torch's stubs omit it."""

    def _new_shared_fd_cpu(self, fd: int, size: int, /) -> torch.UntypedStorage: ...


class _SharedBatchWriter:
    """A batch of images written straight into a fresh memfd with pwrite, then mapped as a
    shared tensor storage: what default_collate does in a worker (a new shared-memory
    block per batch, filled by stacking) without faulting in every page of the new
    mapping, which costs more than the copy itself. Unwritten slots read as zeros."""

    def __init__(self, shape: Tuple[int, ...]) -> None:
        self.shape = shape  # N, H, W, C: the bytes as the decoder and resize lay them out
        self.nbytes = 1
        for d in shape:
            self.nbytes *= d
        self.fd = os.memfd_create("gpupool-batch", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self.nbytes)
        except BaseException:
            os.close(self.fd)
            raise

    def write(self, offset: int, hwc: torch.Tensor) -> None:
        view = hwc.contiguous().numpy().data.cast("B")
        while view:
            n = os.pwrite(self.fd, view, offset)
            view, offset = view[n:], offset + n

    def tensor(self) -> torch.Tensor:
        """The batch as N x C x H x W in channels_last memory; the storage keeps its own
        descriptor, this one is closed."""
        try:
            storage = cast(_SharedFdStorage, torch.UntypedStorage)._new_shared_fd_cpu(self.fd, self.nbytes)
        finally:
            os.close(self.fd)
        # The contiguous strides that set_ derives when given none (its stubs demand them).
        stride = [1] * len(self.shape)
        for k in range(len(self.shape) - 2, -1, -1):
            stride[k] = stride[k + 1] * self.shape[k + 1]
        return torch.empty(0, dtype=torch.uint8).set_(storage, 0, self.shape, stride).permute(0, 3, 1, 2)

    def close(self) -> None:
        """Drop an unfinished batch."""
        os.close(self.fd)


class Batch(tuple[torch.Tensor, torch.Tensor, torch.Tensor]):
    """(images, labels, index) built by ImageFiles.__getitems__; `collate` passes it on."""


Sample = Tuple[torch.Tensor, int, int]


class ImageFiles(Dataset[Sample]):
    """(uint8 image, label, index) triples from a list of relative paths; a file that
    fails to read or decode yields a blank image and BAD_LABEL instead of raising.

    DataLoaders fetch whole batches through `__getitems__`, which builds the batch tensors
    itself; `collate` hands them on unchanged.
    """

    def __init__(
        self, root: Union[Path, BucketFiles], samples: Sequence[Tuple[str, int]], size: int, hflip: bool = False
    ) -> None:
        # A bucket's files are read through its local cache, fetched on their first read.
        self.bucket = None if isinstance(root, Path) else root
        self.root = str(root) if isinstance(root, Path) else root.url
        self.paths = [p for p, _ in samples]
        self.labels = [c for _, c in samples]
        self.size = size
        self.hflip = hflip

    def __len__(self) -> int:
        return len(self.paths)

    def _load(self, i: int) -> Tuple[Optional[torch.Tensor], int]:
        """(image, label), or (None, BAD_LABEL) for a file that cannot be read or decoded."""
        try:
            rel = self.paths[i]
            path = self.bucket.local(rel) if self.bucket is not None else os.path.join(self.root, rel)
            img = decode_resized(read_bytes(path), self.size)
        except Exception as err:  # any decoder or I/O failure: skip and count, never crash
            log.debug("unreadable image %s: %s", self.paths[i], err)
            return None, BAD_LABEL
        if self.hflip and torch.rand(()) < 0.5:
            img = img.flip(-1)
        return img, self.labels[i]

    def __getitem__(self, i: int) -> Sample:
        img, label = self._load(i)
        if img is None:
            img = torch.zeros(3, self.size, self.size, dtype=torch.uint8)
        return img, label, i

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        """A whole batch: images decoded one by one into a single uint8 batch tensor (in a
        DataLoader worker, one that is already in shared memory), plus labels and indices.

        The batch is N x 3 x H x W in channels_last memory: libjpeg-turbo, libpng and the
        antialiased resize all produce interleaved RGB, so each image is copied as it is,
        not transposed to planar (which cost more than the copy). `Normalizer` produces
        whichever layout the model wants in the same pass that converts to float.
        """
        indices = [int(i) for i in indices]
        s = self.size
        per_image = 3 * s * s
        labels: List[int] = []
        writer = (
            _SharedBatchWriter((len(indices), s, s, 3))
            if torch.utils.data.get_worker_info() is not None and _shared_fd_batches()
            else None
        )
        images = (
            None
            if writer is not None
            else torch.empty((len(indices), 3, s, s), dtype=torch.uint8, memory_format=torch.channels_last)
        )
        try:
            for j, i in enumerate(indices):
                img, label = self._load(i)
                labels.append(label)
                if writer is not None:
                    if img is not None:
                        writer.write(j * per_image, img.permute(1, 2, 0))
                else:
                    assert images is not None  # allocated above whenever there is no writer
                    if img is None:
                        images[j].zero_()
                    else:
                        images[j].copy_(img)
        except BaseException:
            if writer is not None:
                writer.close()
            raise
        if writer is not None:
            images = writer.tensor()
        assert images is not None
        return Batch((images, torch.tensor(labels, dtype=torch.long), torch.tensor(indices, dtype=torch.long)))


def collate(
    batch: Union[Batch, List[Sample]],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch from `ImageFiles.__getitems__` as it is; a list of samples stacked (in a
    worker default_collate builds the batch directly in shared memory)."""
    if isinstance(batch, Batch):
        images, labels, index = batch
        return images, labels, index
    images, labels, index = default_collate(batch)
    return images, labels, index


class Normalizer(torch.nn.Module):
    """uint8 NCHW on the device -> normalised float, optionally channels_last."""

    mean: torch.Tensor  # buffers, registered in __init__
    inv_std: torch.Tensor

    def __init__(self, channels_last: bool = False) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(MEAN).view(1, 3, 1, 1) * 255.0, persistent=False)
        self.register_buffer("inv_std", 1.0 / (torch.tensor(STD).view(1, 3, 1, 1) * 255.0), persistent=False)
        self.channels_last = channels_last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Convert, lay out as the model wants and normalise: one pass that reads the uint8
        batch in whatever layout it came (the loader's is channels_last) and writes float,
        then one in-place scale."""
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device, memory_format=fmt)
        torch.sub(x, self.mean, out=out)
        return out.mul_(self.inv_std)


def default_workers(device_type: str, local_world_size: int) -> int:
    """Workers per process: CPUs left after the training threads. On a CPU-only box the
    training itself needs the cores, so tiny machines get 0 (decode in the main process)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_proc = max(1, cpus // max(1, local_world_size))
    if device_type == "cuda":
        return max(1, min(8, per_proc - 1))
    return max(0, min(4, per_proc - 1))


def make_loader(
    dataset: ImageFiles,
    batch_size: int,
    workers: int,
    pin_memory: bool,
    shuffle: bool,
    seed: int,
    rank: int,
    world_size: int,
    persistent: bool = True,
) -> Tuple[DataLoader[Sample], Optional[ResumableSampler]]:
    """A DataLoader over the rank's shard.

    Training uses DistributedSampler even for one process: its shuffle is a pure function
    of (seed, epoch), so a resumed run sees exactly the batches the unbroken run would.
    Evaluation shards by striding without padding, so no image is counted twice.
    """
    sampler: Optional[ResumableSampler] = None
    if shuffle:
        sampler = ResumableSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        source: Dataset[Sample] = dataset
    else:
        source = torch.utils.data.Subset(dataset, list(range(rank, len(dataset), world_size)))
    loader = DataLoader(
        source,
        batch_size=batch_size,
        sampler=sampler,
        shuffle=False,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=persistent and workers > 0,
        prefetch_factor=4 if workers > 0 else None,
        collate_fn=collate,
        drop_last=False,
        worker_init_fn=_ignore_sigterm if workers > 0 else None,
    )
    return loader, sampler


def close_loaders(*loaders: DataLoader[Sample]) -> None:
    """Stop the persistent workers of LOADERS now. They ignore SIGTERM (see _ignore_sigterm), and
    torch leaves workers whose loader is still alive at interpreter exit to multiprocessing's
    exit handler, which SIGTERMs and then joins them: a loader kept alive by a reference cycle
    until then would block the exit for ever."""
    for loader in loaders:
        iterator = getattr(loader, "_iterator", None)
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        loader._iterator = None


class ResumableSampler(DistributedSampler[int]):
    """DistributedSampler whose next pass can start some batches in, for a run resumed in the
    middle of an epoch: the order is still a pure function of (seed, epoch), so the resumed pass
    sees exactly the samples the unbroken one had left."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._skip = 0

    def skip_next(self, samples: int) -> None:
        """Leave out the first `samples` indices of the next pass only."""
        self._skip = max(0, samples)

    def __iter__(self) -> Iterator[int]:
        skip, self._skip = self._skip, 0
        indices = list(super().__iter__())
        return iter(indices[skip:])


def _ignore_sigterm(worker_id: int) -> None:
    """Loader workers share the trainer's process group: a preemption's SIGTERM reaches them
    too, and a worker dying of it would fail the step the trainer finishes before it stops.
    They end with the trainer (torch shuts them down, and watches for its death)."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
