"""`train(cfg)`: split, model, loaders, the epoch loop with early stopping, checkpoints,
and at the end the test evaluation, the report, the plots and the serving export.

Every rank runs this function; rank 0 alone writes files. All the checks on user input
happen before the process group is joined, so a bad flag fails every rank the same way
(exit 2) instead of leaving the others waiting at a collective.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Union, cast

import torch

from gpupool.core.errors import InvalidInput
from gpupool.train import checkpoint, distributed, preempt, report, storage
from gpupool.train.bucket_data import DEFAULT_CACHE_BYTES, BucketFiles, default_cache_dir
from gpupool.train.config import TrainConfig, save_config
from gpupool.train.data import (
    ImageFiles,
    Normalizer,
    Split,
    class_names,
    close_loaders,
    default_workers,
    load_or_make_split,
    make_loader,
)
from gpupool.train.export import save_serving
from gpupool.train.loop import Engine, PartialEpoch, epoch_row, evaluate, train_epoch
from gpupool.train.networks import build_model, count_parameters
from gpupool.train.run_place import RunPlace

log = logging.getLogger(__name__)


def _say(denv: distributed.DistEnv, message: str) -> None:
    """User-facing progress on stderr, from rank 0 only."""
    if denv.is_main:
        print(message, file=sys.stderr, flush=True)


def _check_inputs(cfg: TrainConfig, split: Split, world_size: int) -> None:
    """Reject data sets the run cannot work with, naming the fix."""
    n_train = len(split.train)
    if n_train < world_size:
        raise InvalidInput(
            f"{n_train} training images cannot feed {world_size} workers; add images or use fewer workers"
        )
    if cfg.batch_size > n_train:
        raise InvalidInput(
            f"--batch-size {cfg.batch_size} is larger than the training set ({n_train} images of "
            f"{n_train + len(split.val) + len(split.test)} after the split); use --batch-size {max(1, n_train // 4)} or add images"
        )
    if not split.val or not split.test:
        raise InvalidInput(
            f"the data set is too small to split: {len(split.val)} validation and {len(split.test)} test images; "
            "add images (at least 3 per class)"
        )


def _amp_dtype(cfg: TrainConfig, device: torch.device) -> Optional[torch.dtype]:
    """bf16 where the GPU has it, else fp16 (with a scaler); none on CPU, where autocast
    mostly costs time on CPUs without bf16 matrix units."""
    if not cfg.amp or device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _set_threads(denv: distributed.DistEnv, device: torch.device) -> None:
    """Split the cores between co-located CPU workers unless the launcher already did."""
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cpus // denv.local_world_size))


def train(cfg: TrainConfig) -> Dict[str, Any]:
    """Run (or resume) one training job; returns the report (on every rank).

    Raises:
        InvalidInput: bad data, flags, weights or an incompatible checkpoint.
    """
    try:
        denv = distributed.read_env()
    except ValueError as err:
        raise InvalidInput(str(err)) from None
    device = distributed.pick_device(denv, cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInput(f"--device {cfg.device} asked for a GPU but none is visible; use --device cpu")
    cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
    place = RunPlace.for_out(cfg.out, cache_dir, denv.rank, cfg.keep_checkpoints)
    data_dir: Union[Path, BucketFiles] = (
        BucketFiles(cfg.data, cache_dir, cfg.cache_size or DEFAULT_CACHE_BYTES)
        if storage.is_remote(cfg.data)
        else storage.local_path(cfg.data)
    )
    out = place.local
    torch.manual_seed(cfg.seed)
    _set_threads(denv, device)

    # A bucket run's local copy becomes what the bucket holds (the bucket is checked here, before
    # any work, so a missing one or refused credentials fail at once).
    place.pull()
    # A rerun after a preemption resumes even under --no-resume: the checkpoint there is the one
    # this same command saved when it was stopped.
    ckpt = place.load_checkpoint() if cfg.resume or preempt.rerun_after_preemption() else None
    if ckpt is not None and ckpt["config"]["structural"] != cfg.structural():
        raise InvalidInput(
            f"{place.shown()} holds a checkpoint of a different run ({ckpt['config']['structural']}); "
            "use a new --out, or --no-resume to start this one over"
        )
    bucket = data_dir if isinstance(data_dir, BucketFiles) else None
    split = load_or_make_split(
        data_dir if isinstance(data_dir, Path) else Path(), out, cfg.split, cfg.seed, write=denv.is_main, bucket=bucket
    )
    _check_inputs(cfg, split, denv.world_size)
    num_classes = len(split.classes)
    arch = {"name": cfg.model, "head": cfg.head, "hidden": cfg.hidden, "dropout": cfg.dropout}
    model = build_model(
        num_classes=num_classes,
        image_size=cfg.image_size,
        weights=cfg.weights,
        train_last=cfg.train_last,
        name=cfg.model,
        head=cfg.head,
        hidden=cfg.hidden,
        dropout=cfg.dropout,
    )

    distributed.init(denv, device)
    try:
        with preempt.StopRequest(device) as stop:
            return _fit(cfg, denv, device, place, data_dir, split, model, arch, ckpt, stop)
    except _Stopped:
        pass
    finally:
        distributed.shutdown()
    raise SystemExit(preempt.STOPPED_EXIT_CODE)


class _Stopped(Exception):
    """SIGTERM arrived: the checkpoint is saved, the trainer exits with STOPPED_EXIT_CODE."""


def _fit(
    cfg: TrainConfig,
    denv: distributed.DistEnv,
    device: torch.device,
    place: RunPlace,
    data_dir: Union[Path, BucketFiles],
    split: Split,
    model: Any,
    arch: Dict[str, Any],
    ckpt: Optional[Dict[str, Any]],
    stop: preempt.StopRequest,
) -> Dict[str, Any]:
    """The part of train() that runs inside the process group."""
    out, shown = place.local, place.shown()
    t_start = time.perf_counter()
    channels_last = cfg.channels_last if cfg.channels_last is not None else device.type == "cuda"
    model.to(device)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    amp_dtype = _amp_dtype(cfg, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    params = [p for p in model.parameters() if p.requires_grad]
    # fused Adam: one kernel for all parameters on GPU; foreach (the CPU default) elsewhere.
    opt_kwargs: Dict[str, Any] = {"fused": True} if device.type == "cuda" else {"foreach": True}
    optimizer = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **opt_kwargs)
    if cfg.schedule == "cosine":
        scheduler: Any = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.epochs)
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)

    start_epoch, history = 0, []  # type: int, List[Dict[str, Any]]
    best: Dict[str, Any] = {"val_loss": float("inf"), "epoch": 0, "bad_epochs": 0, "stopped": False, "state": None}
    partial: Optional[PartialEpoch] = None
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        scheduler.load_state_dict(ckpt["scheduler"])
        checkpoint.set_rng_state(ckpt["rng"])
        start_epoch, history, best = int(ckpt["epoch"]), list(ckpt["history"]), dict(ckpt["early_stopping"])
        if ckpt.get("partial"):
            partial = PartialEpoch.from_dict(ckpt["partial"])
            _say(denv, f"resuming {shown} in epoch {start_epoch + 1} after step {partial.steps}")
        else:
            _say(denv, f"resuming {shown} after epoch {start_epoch}")
    elif preempt.rerun_after_preemption():
        _say(denv, f"attempt {preempt.attempt()} after a preemption, but {shown} holds no checkpoint: starting over")
    if denv.is_main:
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.json")
        report.rewrite_metrics(out / report.METRICS_FILE, history)
        if ckpt is None:  # a fresh start: a report from an earlier run here would be stale
            (out / report.REPORT_FILE).unlink(missing_ok=True)
            place.forget(report.REPORT_FILE)
            place.forget_checkpoints()  # an earlier run's later epochs must never be resumed into this one

    ddp_model: torch.nn.Module = model
    if denv.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp_model = DDP(
            model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True
        )
    # torch.compile's stubs return the callable's type; given a Module it returns a Module
    # (an OptimizedModule wrapping it).
    train_model = cast(torch.nn.Module, torch.compile(ddp_model)) if cfg.compile else ddp_model
    eng = Engine(train_model, model, Normalizer(channels_last).to(device), optimizer, scaler, device, amp_dtype)

    workers = cfg.workers if cfg.workers is not None else default_workers(device.type, denv.local_world_size)
    pin = device.type == "cuda"
    datasets = {
        "train": ImageFiles(data_dir, split.train, cfg.image_size, hflip=cfg.hflip),
        "val": ImageFiles(data_dir, split.val, cfg.image_size),
        "test": ImageFiles(data_dir, split.test, cfg.image_size),
    }
    train_loader, sampler = make_loader(
        datasets["train"], cfg.batch_size, workers, pin, True, cfg.seed, denv.rank, denv.world_size
    )
    val_loader, _ = make_loader(
        datasets["val"], cfg.batch_size, workers, pin, False, cfg.seed, denv.rank, denv.world_size
    )
    params_count = count_parameters(model)
    _say(
        denv,
        f"training {cfg.model} on {len(split.train)}/{len(split.val)}/{len(split.test)} images "
        f"({len(split.classes)} classes), {denv.world_size} worker(s) on {device.type}, "
        f"{params_count['trainable']:,}/{params_count['total']:,} parameters trainable, "
        f"{workers} loader worker(s)/process, amp={amp_dtype}",
    )
    show_progress = denv.is_main and (cfg.progress if cfg.progress is not None else sys.stderr.isatty())
    bad: Dict[str, Set[int]] = {"train": set(), "val": set(), "test": set()}

    for epoch in range(start_epoch + 1, cfg.epochs + 1):
        if best["stopped"]:
            break
        t_epoch = time.perf_counter()
        assert sampler is not None
        sampler.set_epoch(epoch)
        resume, partial = partial, None
        if resume is not None:
            sampler.skip_next(resume.steps * cfg.batch_size)
        tr = train_epoch(
            eng,
            train_loader,
            len(train_loader),
            f"epoch {epoch}/{cfg.epochs}",
            show_progress,
            cfg.max_steps_per_epoch,
            resume=resume,
            stop=stop.requested,
        )
        if tr.partial is not None:
            if denv.is_main:
                _save(out, cfg, model, optimizer, scaler, scheduler, epoch - 1, best, history, tr.partial)
                place.saved(epoch - 1, tr.partial.steps)
            _say(
                denv,
                f"stopped by SIGTERM after step {tr.partial.steps} of epoch {epoch}: checkpoint saved in {shown}; "
                "run the same command again to resume there",
            )
            raise _Stopped()
        va = evaluate(eng, val_loader, len(split.classes), cfg.max_steps_per_epoch)
        bad["train"] |= tr.bad_indices
        bad["val"] |= va.bad_indices
        lr = optimizer.param_groups[0]["lr"]
        scheduler.step()
        # Keras EarlyStopping(monitor="val_loss", min_delta=0): any decrease counts. Every
        # rank sees the same reduced val_loss, so every rank takes the same decision.
        if va.loss < best["val_loss"]:
            best.update(val_loss=va.loss, epoch=epoch, bad_epochs=0, state=checkpoint.changing_state(model))
        else:
            best["bad_epochs"] += 1
            best["stopped"] = best["bad_epochs"] >= cfg.patience
        row = epoch_row(epoch, tr, va, lr, time.perf_counter() - t_epoch)
        history.append(row)
        if denv.is_main:
            _save(out, cfg, model, optimizer, scaler, scheduler, epoch, best, history, None)
            report.append_metrics(out / report.METRICS_FILE, row)
            place.saved(epoch, 0)
        _say(
            denv,
            f"epoch {epoch}/{cfg.epochs} train_loss={tr.loss:.4f} train_acc={tr.accuracy:.4f} "
            f"val_loss={va.loss:.4f} val_acc={va.accuracy:.4f} images/s={tr.images_per_second:.1f}"
            + (" *" if best["epoch"] == epoch else "")
            + (f" (early stop: no val_loss improvement in {cfg.patience} epochs)" if best["stopped"] else ""),
        )
        if epoch < cfg.epochs and not best["stopped"] and stop.requested():
            _say(denv, f"stopped by SIGTERM after epoch {epoch}: checkpoint saved in {shown}; run again to resume")
            raise _Stopped()

    # Restore the best weights (restore_best_weights=True), then test once.
    if best["state"] is not None:
        missing_unexpected = model.load_state_dict(best["state"], strict=False)
        assert not missing_unexpected.unexpected_keys, missing_unexpected.unexpected_keys
    test_loader, _ = make_loader(
        datasets["test"], cfg.batch_size, workers, pin, False, cfg.seed, denv.rank, denv.world_size, persistent=False
    )
    te = evaluate(eng, test_loader, len(split.classes))
    close_loaders(train_loader, val_loader)
    bad["test"] |= te.bad_indices
    bad_files = _gather_bad(bad, datasets)
    result = _report(
        cfg,
        denv,
        device,
        split,
        history,
        best,
        te,
        bad_files,
        params_count,
        amp_dtype,
        time.perf_counter() - t_start,
        data_dir.class_names() if isinstance(data_dir, BucketFiles) else class_names(data_dir),
    )
    if denv.is_main:
        result["exported"] = save_serving(out, model, split.classes, arch, cfg.image_size, result.get("class_names"))
        report.write_json_atomic(result, out / report.REPORT_FILE)
        result["plots"] = report.write_plots(out, history, te.confusion or [], split.classes)
        report.write_json_atomic(result, out / report.REPORT_FILE)
        place.push_results()
    distributed.barrier()  # nobody leaves before rank 0 has written the report
    return result


def _save(
    out: Path,
    cfg: TrainConfig,
    model: Any,
    optimizer: Any,
    scaler: Any,
    scheduler: Any,
    epoch: int,
    best: Dict[str, Any],
    history: List[Dict[str, Any]],
    partial: Optional[PartialEpoch],
) -> None:
    """The one checkpoint format: after `epoch` finished epochs, plus `partial` steps of the next
    one when a SIGTERM stopped it there."""
    checkpoint.atomic_save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
            "scheduler": scheduler.state_dict(),
            "epoch": epoch,
            "partial": partial.to_dict() if partial is not None else None,
            "rng": checkpoint.rng_state(),
            "early_stopping": best,
            "history": history,
            "config": {"structural": cfg.structural(), "full": cfg.to_json()},
        },
        out / checkpoint.CHECKPOINT_FILE,
    )


def _gather_bad(bad: Dict[str, Set[int]], datasets: Dict[str, ImageFiles]) -> List[str]:
    """Paths of unreadable images seen by any rank, sorted."""
    import torch.distributed as dist

    local = sorted({datasets[part].paths[i] for part, idx in bad.items() for i in idx})
    if dist.is_available() and dist.is_initialized():
        gathered: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local)
        return sorted({p for part in gathered for p in part})
    return local


def steady_throughput(history: List[Dict[str, Any]]) -> float:
    """Training images/second over all workers, excluding the first epoch (warm-up) when
    there is more than one, and each epoch's first step."""
    rows = history[1:] if len(history) > 1 else history
    images = sum(r["steady_images"] for r in rows)
    seconds = sum(r["steady_seconds"] for r in rows)
    return images / seconds if seconds > 0 else 0.0


def _report(
    cfg: TrainConfig,
    denv: distributed.DistEnv,
    device: torch.device,
    split: Split,
    history: List[Dict[str, Any]],
    best: Dict[str, Any],
    te: Any,
    bad_files: List[str],
    params_count: Dict[str, int],
    amp_dtype: Optional[torch.dtype],
    seconds: float,
    data_names: Dict[str, str],
) -> Dict[str, Any]:
    """The report.json content."""
    best_row = next((r for r in history if r["epoch"] == best["epoch"]), None)
    confusion = te.confusion or []
    return {
        "test_accuracy": round(te.accuracy, 6),
        "test_loss": round(te.loss, 6),
        "best_val_accuracy": best_row["val_accuracy"] if best_row else None,
        "best_val_loss": best_row["val_loss"] if best_row else None,
        "best_epoch": best["epoch"],
        "epochs_run": len(history),
        "early_stopped": bool(best["stopped"]),
        "images_per_second": round(steady_throughput(history), 2),
        "world_size": denv.world_size,
        "device": device.type,
        "amp": str(amp_dtype).replace("torch.", "") if amp_dtype else None,
        "classes": list(split.classes),
        "class_names": data_names,
        "split_sizes": {"train": len(split.train), "val": len(split.val), "test": len(split.test)},
        "test_images": te.images,
        "per_class": report.per_class_metrics(confusion, split.classes),
        "confusion_matrix": confusion,
        "corrupt_images": {"count": len(bad_files), "files": bad_files[:100]},
        "parameters": params_count,
        "wall_seconds_this_session": round(seconds, 2),
        "config": cfg.to_json(),
    }
