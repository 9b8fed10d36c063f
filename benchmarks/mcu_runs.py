"""One training run of ``mcu_transfer.py``: CIFAR-10 decoded and subset, the paper's augmentation,
the int8 graph (or its fp32 form) with a row's update, trained and tested; and the worker
process that runs jobs."""

from __future__ import annotations

import io
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from mcu_protocol import MODEL, from_spec

from memplan.models.int8 import fp32_model, int8_model
from memplan.models.int8.ops import fuse_kernels
from memplan.models.int8.updates import Update, apply_update, trained
from memplan.optim import make_optimizer


# ----------------------------------------------------------------------------- data
def decode(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """uint8 N x 3 x 32 x 32 images and labels of a JPEG npz (jpeg, offsets, labels)."""
    from PIL import Image

    with np.load(path) as z:
        jpeg, offsets, labels = z["jpeg"], z["offsets"], z["labels"]
    imgs = [
        np.asarray(Image.open(io.BytesIO(jpeg[offsets[i] : offsets[i + 1]].tobytes())).convert("RGB"))
        for i in range(len(labels))
    ]
    return np.stack(imgs).transpose(0, 3, 1, 2).copy(), labels.astype(np.int64)


def subsets(labels: np.ndarray, train: int, val: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per class, a seeded permutation: the first ``val`` for validation, the next ``train`` for training."""
    rng = np.random.default_rng(seed)
    tr, va = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        va.append(idx[:val])
        tr.append(idx[val : val + train])
    return np.sort(np.concatenate(tr)), np.sort(np.concatenate(va))


def augment(x: torch.Tensor, res: int, gen: torch.Generator) -> torch.Tensor:
    """uint8 B x 3 x h x w -> float pixels B x 3 x res x res in [0, 255], augmented (PROTOCOL)."""
    b = x.shape[0]
    dev = x.device
    u = lambda *s: torch.rand(*s, generator=gen).to(dev)  # noqa: E731
    area = 0.08 + 0.92 * u(b)
    logr = math.log(3 / 4) + (math.log(4 / 3) - math.log(3 / 4)) * u(b)
    ratio = torch.exp(logr)
    sw, sh = torch.sqrt(area * ratio).clamp(max=1), torch.sqrt(area / ratio).clamp(max=1)
    cx, cy = (1 - sw) * (2 * u(b) - 1), (1 - sh) * (2 * u(b) - 1)
    flip = torch.where(u(b) < 0.5, -1.0, 1.0)
    theta = torch.zeros(b, 2, 3, device=dev)
    theta[:, 0, 0], theta[:, 0, 2] = sw * flip, cx
    theta[:, 1, 1], theta[:, 1, 2] = sh, cy
    grid = F.affine_grid(theta, (b, 3, res, res), align_corners=False)
    img = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode="reflection", align_corners=False)
    bright, contrast, sat = (0.6 + 0.8 * u(b).view(b, 1, 1, 1) for _ in range(3))
    img = img * bright
    grey = (0.299 * img[:, 0] + 0.587 * img[:, 1] + 0.114 * img[:, 2]).unsqueeze(1)
    img = (img - grey.mean((2, 3), keepdim=True)) * contrast + grey.mean((2, 3), keepdim=True)
    grey = (0.299 * img[:, 0] + 0.587 * img[:, 1] + 0.114 * img[:, 2]).unsqueeze(1)
    img = (img - grey) * sat + grey
    return img.clamp(0, 255)


def resize(x: torch.Tensor, res: int) -> torch.Tensor:
    return F.interpolate(x.float(), size=(res, res), mode="bilinear", align_corners=False).clamp(0, 255)


def model_input(pixels: torch.Tensor, form: str) -> torch.Tensor:
    """The MCU transform; the fp32 form takes its real value (x_scale 2/255)."""
    x = pixels - 127.5
    return x if form == "int8" else x * (2 / 255)


# ----------------------------------------------------------------------------- one run
def build(form: str, update: Update, device: str) -> torch.nn.Module:
    model = (int8_model if form == "int8" else fp32_model)(MODEL, 10)
    return apply_update(model, update).to(device)


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, form: str, res: int) -> float:
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 500):
            out = model(model_input(resize(x[i : i + 500], res), form))
            correct += int((out.argmax(1) == y[i : i + 500]).sum())
    return 100.0 * correct / len(x)


def run(job: dict, data: dict[str, torch.Tensor]) -> dict:
    """Train one (method, rate, seed); accuracy on validation (selection seeds) or test. A job
    whose ``deadline`` (epoch seconds) has passed is skipped (None)."""
    if time.time() > job.get("deadline", float("inf")):
        return None
    torch.manual_seed(job["seed"])
    form, update, optimizer = from_spec(job["spec"])  # what the job was planned with, whatever the files say now
    dev, p = job["device"], job["protocol"]
    model = build(form, update, dev)
    opt = make_optimizer(trained(model), optimizer, job["lr"])
    x, y = data["x_train"], data["y_train"]
    steps_per_epoch = len(x) // p["batch"]
    total, warm = steps_per_epoch * p["epochs"], steps_per_epoch * p["warmup_epochs"]
    gen = torch.Generator().manual_seed(job["seed"])
    t0, step, losses = time.time(), 0, []
    for _ in range(p["epochs"]):
        perm = torch.randperm(len(x), generator=gen).to(dev)
        for i in range(steps_per_epoch):
            idx = perm[i * p["batch"] : (i + 1) * p["batch"]]
            scale = (step + 1) / warm if step < warm else 0.5 * (1 + math.cos(math.pi * (step - warm) / (total - warm)))
            for g in opt.param_groups:
                g["lr"] = job["lr"] * scale
            loss = F.cross_entropy(model(model_input(augment(x[idx], p["resolution"], gen), form)), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            step += 1
            if not math.isnan(losses[-1]):
                continue
            if all(t.isnan().all() for t in trained(model)):
                break  # diverged: every trained tensor is NaN, and stays so to the last epoch
        else:
            continue
        break
    split = "val" if job["seed"] in p["selection_seeds"] else "test"
    acc = evaluate(model, data[f"x_{split}"], data[f"y_{split}"], form, p["resolution"])
    finite = all(math.isfinite(v) for v in losses)
    return {**{k: job[k] for k in ("id", "experiment", "method", "lr", "seed", "spec")}, "split": split, "acc": acc,
            "final_loss": float(np.mean(losses[-steps_per_epoch:])), "diverged": not finite,
            "seconds": time.time() - t0, "device": device_name(dev)}  # fmt: skip


def device_name(dev: str) -> str:
    return torch.cuda.get_device_name() if dev == "cuda" else "cpu"


def trained_elements(model: torch.nn.Module) -> int:
    """Elements of the parameters that train (a sub-channel weight: its trained channels only)."""
    total = 0
    for m in model.modules():
        for name, t in m.named_parameters(recurse=False):
            if t.requires_grad:
                channels = getattr(m, "weight_channels", None) if name == "weight" else None
                total += t.numel() if channels is None else int(m.weight_channel_mask().sum())
    return total


# ----------------------------------------------------------------------------- driver
_DATA: dict[str, torch.Tensor] = {}


def _init_worker(data_dir: str, device: str, protocol: dict, fuse: bool = True) -> None:
    torch.set_num_threads(1)
    torch.backends.cudnn.allow_tf32 = False  # the int8 graph's integer arithmetic needs exact fp32 sums
    torch.backends.cuda.matmul.allow_tf32 = False
    if fuse:
        fuse_kernels()  # the same bits, 2-3x faster steps on a CPU (benchmarks/int8_kernels.py)
    _DATA.update(load_data(Path(data_dir), device, protocol))


def _worker(job: dict) -> dict:
    return run(job, _DATA)


def load_data(data_dir: Path, device: str, p: dict) -> dict[str, torch.Tensor]:
    train = sorted(data_dir.glob("*train*.npz"))[0]
    test = sorted(data_dir.glob("*test*.npz"))[0]
    x, y = decode(train)
    with np.load(train) as z:  # a subset file carries the indices and labels of the whole split
        source = (z["source_index"], z["source_labels"]) if "source_index" in z.files else None
    if source is None:
        tr, va = subsets(y, p["train_per_class"], p["val_per_class"])
    else:
        tr, va = (np.searchsorted(source[0], i) for i in subsets(source[1], p["train_per_class"], p["val_per_class"]))
    xt, yt = decode(test)
    t = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    return {"x_train": t(x[tr]), "y_train": t(y[tr]), "x_val": t(x[va]), "y_val": t(y[va]),
            "x_test": t(xt), "y_test": t(yt)}  # fmt: skip
