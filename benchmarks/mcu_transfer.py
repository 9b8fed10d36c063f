"""The 256KB paper's own setting: the int8 mcunet-5fps (ImageNet weights) fine-tuned on CIFAR-10.

Two experiments, each a list of methods (a model form, what trains, an optimizer):

* ``table1``: Table 1's CIFAR-10 column, the last two blocks of mcunet-5fps (+ the new head):
  fp32 SGD-M, int8 SGD-M, int8 Adam, int8 SGD-M + QAS (paper: 86.0 / 75.4 / 84.5 / 86.9);
* ``fig9``: Figure 9's baselines on the int8 graph with SGD + QAS (no momentum, the paper's main
  setting): classifier only, biases of the last k convs, weights and biases of the last k convs
  (the full update included), the paper's own 100 KB scheme.

Protocol (``PROTOCOL``, written into the results): a seeded training subset of CIFAR-10's train
split, a disjoint validation subset of it for choosing the rate, the whole test split for test
accuracy; 128 px; the paper's augmentation (random-resized crop, scale 0.08-1, aspect 3/4-4/3,
horizontal flip, colour jitter 0.4 on brightness / contrast / saturation), the MCU transform
(``pixel - 127.5``; the fp32 form takes the same input times ``2/255``, its real scale); batch
64; linear warm-up then cosine; no weight decay. Rates are chosen per method on the selection
seed (100: never a test seed) from one grid per optimizer family, widened until the
choice is interior; ties go to the smaller rate. Test seeds 0-4 (mean ± 95% CI, Student t).

Every finished run is one line of ``runs.jsonl`` in ``--out`` (resume skips them); the report
(``report.json`` and a Markdown table on stdout) is rebuilt from it. ``--device cuda`` and
``--workers`` (processes; several share one GPU) make it fast where a GPU is lent; the numbers
then say which device gave them.

    python benchmarks/mcu_transfer.py --out benchmarks/mcu_results --experiments table1 fig9
"""

from __future__ import annotations

import argparse
import io
import json
import math
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from memplan.io import write_text
from memplan.models.int8 import fp32_model, int8_model
from memplan.models.int8.ops import fuse_kernels
from memplan.models.int8.updates import PAPER_SCHEMES, Update, apply_update, backward_config, last_k_weights, trained
from memplan.optim import make_optimizer

MODEL = "mcunet-5fps"
N_CONVS = 42
CHANCE = 10.0  # CIFAR-10 chance accuracy, %
PROTOCOL = {
    "model": MODEL,
    "data": "CIFAR-10 (JPEG copy, ../shared/datasets/cifar10)",
    "train_per_class": 500,
    "val_per_class": 100,
    "resolution": 128,
    "epochs": 12,
    "warmup_epochs": 1,
    "batch": 64,
    "augment": "random-resized crop (0.08-1, 3/4-4/3), flip, colour jitter 0.4",
    "selection_seeds": [100],
    "test_seeds": [0, 1, 2, 3, 4],
    "grids": {
        "sgd": [0.01, 0.03, 0.1],
        "adam": [0.0003, 0.001, 0.003],
    },
    "grid_step": 3.0,
    "max_widen": 6,
    "tie_rule": "the smaller rate",
    "divergence_rule": (
        "a run diverged when its loss is not finite or it ends at chance (10%); a test seed that diverged at "
        "a row's chosen rate marks the rate unstable for that row: the rate is chosen again on validation among "
        "the rates below it (widening downwards while the choice is the lowest), every test seed trains at it, "
        "and the report lists the rate given up"
    ),
    # the contribution profile (experiment ``profile``): one run per entry at one rate on the
    # selection seed, validation split; a reduced grid (expand convs of the last 7 blocks, ratios
    # 1/4 and 1), what two CPU cores afford
    "profile": {
        "lr": 0.03,
        "bias_ks": [3, 6, 9, 12, 15, 18, 21, 22, 42],
        "weight_convs": [21, 24, 27, 30, 33, 36, 39],
        "ratios": [0.25, 1.0],
    },
}


def methods(p: dict | None = None) -> dict[str, dict[str, tuple[str, Update, str]]]:
    """experiment -> method name -> (form, update, optimizer) under protocol ``p`` (its profile grid;
    default :data:`PROTOCOL`)."""
    last2 = Update(blocks=2, description="last two blocks")
    fig9: dict[str, tuple[str, Update, str]] = {"classifier only": ("int8", Update(), "sgd-qas")}
    for k in (6, 12, 22, N_CONVS):
        fig9[f"biases of the last {k} convs"] = ("int8", Update(bias_last=k), "sgd-qas")
    for k in (2, 4, 6, 12, 22):
        fig9[f"weights+biases of the last {k} convs"] = (
            "int8",
            Update(bias_last=k, weights=last_k_weights(N_CONVS, k)),
            "sgd-qas",
        )
    fig9["full update"] = ("int8", Update(full=True), "sgd-qas")
    fig9["paper's 100 KB scheme"] = ("int8", PAPER_SCHEMES["mcunet-5fps-paper-100KB"], "sgd-qas")
    for name, (update, optimizer) in searched_schemes().items():
        fig9[name] = ("int8", update, optimizer)
    return {
        "profile": {name: ("int8", u, "sgd-qas") for name, u in profile_entries((p or PROTOCOL)["profile"]).items()},
        "table1": {
            "fp32 SGD-M": ("fp32", last2, "sgd-momentum"),
            "int8 SGD-M": ("int8", last2, "sgd-momentum"),
            "int8 Adam": ("int8", last2, "adam"),
            "int8 SGD-M + QAS": ("int8", last2, "sgd-momentum-qas"),
        },
        "fig9": fig9,
    }


#: the schemes ``memplan search`` found from this benchmark's profile (package data), trained as rows
SCHEME_GLOB = "mcunet-5fps-int8-cifar10-*.json"


def searched_schemes() -> dict[str, tuple[Update, str]]:
    """Row name ("memplan 100 kB") -> (update, optimizer) of every shipped scheme searched from the profile."""
    from memplan.io import shipped
    from memplan.plan.scheme import load_scheme

    out = {}
    for path in sorted(shipped("schemes").glob(SCHEME_GLOB), key=lambda f: load_scheme(f).budget_bytes or 0):
        scheme = load_scheme(path)
        update = Update(
            bias_last=scheme.bias_update,
            weights=tuple((w.conv_index, w.ratio) for w in scheme.weight_updates),
            description=path.name,
        )
        out[f"memplan {scheme.budget_bytes / 1000:g} kB"] = (update, scheme.optimizer or "sgd-qas")
    return out


def profile_entries(q: dict) -> dict[str, Update]:
    """The contribution profile's runs (``memplan.contrib.protocol``'s grid): the classifier,
    biases of the last k convs, and the weight of conv i at ratio r with the biases of convs
    i..L-1 (its reference: biases of the last L - i)."""
    out = {"classifier": Update()}
    ks = sorted(set(q["bias_ks"]) | {N_CONVS - i for i in q["weight_convs"]})
    out.update({f"bias {k}": Update(bias_last=k) for k in ks})
    for i in q["weight_convs"]:
        for r in q["ratios"]:
            out[f"weight {i}@{r:g}"] = Update(bias_last=N_CONVS - i, weights=((i, r),))
    return out


def reuse(runs: dict[str, dict], log: Path, table: dict) -> None:
    """Profile runs that another experiment already made (the same form, update, optimizer, rate
    and seed; ``table``: :func:`methods`) are copied into ``log`` under the profile's id, marked
    ``reused_from``."""
    made = {
        (spec_of(table[r["experiment"]][r["method"]]), r["lr"], r["seed"]): r
        for r in runs.values()
        if r["experiment"] != "profile" and r["method"] in table.get(r["experiment"], {})
    }
    for name, spec in table["profile"].items():
        for (key, lr, seed), r in made.items():
            new = job_id("profile", name, lr, seed)
            if key == spec_of(spec) and new not in runs:
                runs[new] = {**r, "id": new, "experiment": "profile", "method": name, "reused_from": r["id"]}
                with open(log, "a") as f:
                    f.write(json.dumps(runs[new]) + "\n")


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


# ----------------------------------------------------------------------------- memory
STM32F746 = "stm32f746"


def memory(update: Update, optimizer: str) -> dict:
    """The int8 graph's training memory at batch 1, 128 px: ``tinytraining`` (the paper's analytic
    extra memory, with the optimizer's real state) and the ``mcu`` mode's peak SRAM, and whether
    the STM32F746 holds it (SRAM less its runtime; the int8 model in its 1 MiB flash). Bytes."""
    import memplan
    from memplan.accounting.devices import fit, load_device
    from memplan.models.int8 import int8_model

    cfg = backward_config(update, N_CONVS)
    kw = {"method": "sparse", "scheme": cfg, "batch": 1, "classes": 10, "optimizer": optimizer}
    tt = memplan.profile(f"{MODEL}-int8", mode="tinytraining", **kw)
    mcu = memplan.profile(f"{MODEL}-int8", mode="mcu", **kw)
    dev = load_device(STM32F746)
    flash = int8_model(MODEL, 10).flash_bytes()
    return {"tinytraining_bytes": tt.totals.total_bytes, "mcu_peak_bytes": mcu.totals.peak_bytes,
            "sram_fits": fit(mcu, dev)["margin_bytes"] >= 0, "flash_bytes": flash,
            "flash_fits": flash <= dev.flash_bytes}  # fmt: skip


# ----------------------------------------------------------------------------- the profile
PROFILE_MODEL = f"{MODEL}-int8"


def finished_entries(runs: dict[str, dict], p: dict) -> dict | None:
    """The protocol's profile grid cut to what has run on every selection seed: its bias depths, and
    the weight convs whose every ratio and reference ran; None before the classifier, one bias
    depth and one weight conv."""
    q = p["profile"]

    def ran(name: str) -> bool:
        return all(job_id("profile", name, q["lr"], s) in runs for s in p["selection_seeds"])

    ks = [k for k in q["bias_ks"] if ran(f"bias {k}")]
    convs = [i for i in q["weight_convs"]
             if ran(f"bias {N_CONVS - i}") and all(ran(f"weight {i}@{r:g}") for r in q["ratios"])]  # fmt: skip
    if not ran("classifier") or not ks or not convs:
        return None
    return {**q, "bias_ks": ks, "weight_convs": convs}


def profile_document(runs: dict[str, dict], p: dict) -> dict | None:
    """The ``profile`` experiment's runs as a memplan contribution profile (the JSON ``memplan
    search`` reads: Δacc in accuracy points on the validation split, one selection seed), over the
    entries finished so far (:func:`finished_entries`); None before any weight conv has finished."""
    from memplan.api import capture
    from memplan.contrib.options import Protocol
    from memplan.contrib.profile import ContribProfile, Resolution, from_runs
    from memplan.contrib.protocol import grid
    from memplan.graph.conv import conv_table
    from memplan.plan import fingerprint

    q, res = finished_entries(runs, p), p["resolution"]
    if q is None:
        return None
    graph = capture(PROFILE_MODEL, resolution=res, classes=10).graph
    layers = conv_table(graph)
    protocol = Protocol(
        seeds=tuple(p["selection_seeds"]), epochs=p["epochs"], batch_size=p["batch"], lr_classifier=q["lr"],
        lr_bias=q["lr"], lr_weight=q["lr"], optimizer="sgd-qas", probe_epochs=1, probe_lr=q["lr"],
        ratios=tuple(q["ratios"]), bias_ks=tuple(q["bias_ks"]), weight_convs=tuple(q["weight_convs"]),
    )  # fmt: skip
    specs = grid(layers, protocol)
    raw = {}
    for spec in specs:
        name = "classifier" if spec.kind == "classifier" else f"bias {spec.k}" if spec.kind == "bias" else (
            f"weight {spec.conv_index}@{spec.ratio:g}")  # fmt: skip
        rows = [runs.get(job_id("profile", name, q["lr"], s)) for s in protocol.seeds]
        if any(r is None for r in rows):
            return None
        model = build("int8", methods(p)["profile"][name][1], "cpu")
        raw[spec.id] = {**spec.to_dict(), "id": spec.id, "seeds": list(protocol.seeds),
                        "accuracy": [r["acc"] for r in rows], "trainable_params": trained_elements(model),
                        "train_s": sum(r["seconds"] for r in rows), "eval_s": 0.0, "cache_s": 0.0,
                        "cpu_s": sum(r["seconds"] for r in rows)}  # fmt: skip
    entries = from_runs(specs, raw, layers)
    clf = raw["classifier"]["accuracy"][0]
    devices = sorted({runs[job_id("profile", n, q["lr"], s)]["device"] for n in methods(p)["profile"]
                      for s in protocol.seeds if job_id("profile", n, q["lr"], s) in runs})  # fmt: skip
    doc = ContribProfile(
        model=PROFILE_MODEL, fingerprint=fingerprint(graph), input_shape=[3, res, res],
        weights={"source": "the 256KB paper's int8 ImageNet backbone (tiny-training, MIT), memplan/data/int8",
                 "form": "int8 training graph (memplan.models.int8), QAS"},
        dataset={"name": "cifar10", "classes": 10, "train": 10 * p["train_per_class"],
                 "validation": 10 * p["val_per_class"], "resolution": res, "augment": p["augment"],
                 "description": f"CIFAR-10 train split: {p['train_per_class']} train and {p['val_per_class']} "
                 "validation images per class (seeded, disjoint), 128 px, the MCU transform (pixel - 127.5)"},
        protocol=protocol,
        description=(
            f"Contribution analysis of int8 {MODEL} + QAS on CIFAR-10 under benchmarks/mcu_transfer.py's protocol "
            f"(the rows of its Figure 9 train with it): {p['epochs']} epochs ({p['warmup_epochs']} warm-up, then "
            f"cosine), batch {p['batch']}, {p['augment']}, SGD + QAS at lr {q['lr']} for every tensor, seed "
            f"{protocol.seeds[0]}, accuracy on the validation split. No linear probe: every run trains the head "
            f"from its seeded initialisation (probe_epochs is not used; probe_accuracy holds the classifier-only "
            f"run's accuracy). A reduced grid: biases of the last k convs for k in {list(protocol.bias_ks)}, "
            f"weights of convs {list(protocol.weight_convs)} at ratios {list(protocol.ratios)} (magnitude+)"
            + (f", the finished part of the planned convs {p['profile']['weight_convs']}. "
               if list(protocol.weight_convs) != p["profile"]["weight_convs"] else ". ")
            + f"Device: {' + '.join(devices)}."
        ),
        probe_accuracy=clf, layers=layers, resolution=Resolution(runs=res, costing=res), evaluated_on="validation",
        timing={"run_seconds": round(sum(r["train_s"] for r in raw.values()), 1), "runs": len(raw),
                "executor": "benchmarks/mcu_transfer.py"},
        **entries,
    )  # fmt: skip
    return json.loads(doc.model_dump_json())


def record_evidence(runs: dict[str, dict], p: dict) -> list[str]:
    """Write into each shipped searched scheme how its row trained (``training``) and validated
    (``validation``: the rate chosen on the selection seed, the other rates as runners-up, the
    test seeds' accuracy), once its row has every test seed. Returns the files written."""
    from memplan.io import shipped
    from memplan.plan import TestAccuracy, Training, Validation, load_scheme

    rep = report(runs, ["fig9"], p)["experiments"]["fig9"]
    written = []
    for path in sorted(shipped("schemes").glob(SCHEME_GLOB)):
        scheme = load_scheme(path)
        name = f"memplan {scheme.budget_bytes / 1000:g} kB"
        row = rep.get(name)
        if row is None or len(row["test"]) < len(p["test_seeds"]):
            continue
        val = {lr: runs[job_id("fig9", name, lr, p["selection_seeds"][0])]["acc"] for lr in row["grid"]}
        given_up = {a["lr"]: a["diverged_seeds"] for a in row["abandoned"]}  # the divergence rule's
        data = f"CIFAR-10, benchmarks/mcu_transfer.py protocol ({p['epochs']} epochs, {p['augment']})"
        devices = row["device"]
        scheme = scheme.model_copy(
            update={
                "training": Training(
                    optimizer=row["optimizer"], lr=row["lr"], epochs=p["epochs"], batch_size=p["batch"]
                ),
                "validation": Validation(
                    name=name, accuracy=val[row["lr"]], se=0.0, seeds=list(p["selection_seeds"]),
                    data=f"{data}: validation split, {10 * p['val_per_class']} images",
                    runners_up=[{"name": name, "lr": lr, "accuracy": a, "seeds": list(p["selection_seeds"]),
                                 **({"diverged_test_seeds": given_up[lr]} if lr in given_up else {})}
                                for lr, a in val.items() if lr != row["lr"]],
                    test=TestAccuracy(accuracy=row["mean"], ci95=row["ci95"], seeds=list(p["test_seeds"]),
                                      per_seed=row["test"], diverged=row["diverged_seeds"],
                                      data="the CIFAR-10 test split (10,000 images)",
                                      where=f"benchmarks/mcu_transfer.py fig9 row {name!r} ({devices})"),
                ),
            }
        )  # fmt: skip
        scheme.save(path)
        written.append(str(path))
    return written


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


def grid_of(optimizer: str, p: dict) -> list[float]:
    return list(p["grids"]["adam" if optimizer.startswith("adam") else "sgd"])


def spec_of(spec: tuple[str, Update, str]) -> str:
    """What a row trains, beyond its name: the form, the update and the optimizer (a job carries it
    and its run records it, so that a row whose definition changed, such as a re-searched scheme, is
    trained again, and a worker never reads the scheme files while they change)."""
    form, u, optimizer = spec
    return json.dumps([form, u.bias_last, [list(w) for w in u.weights], u.blocks, u.full, optimizer])


def from_spec(spec: str) -> tuple[str, Update, str]:
    """The (form, update, optimizer) a :func:`spec_of` string describes."""
    form, bias_last, weights, blocks, full, optimizer = json.loads(spec)
    return form, Update(bias_last=bias_last, weights=tuple(map(tuple, weights)), blocks=blocks, full=full), optimizer


def read_runs(path: Path, table: dict) -> dict[str, dict]:
    """Finished runs by id. A run that recorded another definition of its row than ``table``'s
    (:func:`methods`, :func:`spec_of`) is left out: it is trained again."""
    runs = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
                want = table.get(r["experiment"], {}).get(r["method"])
                if want is None or r.get("spec", spec_of(want)) == spec_of(want):
                    runs[r["id"]] = r
            except (json.JSONDecodeError, KeyError):
                continue  # a torn last line: that run is redone
    return runs


def job_id(experiment: str, method: str, lr: float, seed: int) -> str:
    return f"{experiment}|{method}|{lr:g}|{seed}"


def choose(runs: dict[str, dict], experiment: str, method: str, grid: list[float], p: dict) -> float | None:
    """The rate with the best mean validation accuracy over the selection seeds (ties: the smaller)."""
    means = []
    for lr in grid:
        accs = [runs.get(job_id(experiment, method, lr, s)) for s in p["selection_seeds"]]
        if any(a is None for a in accs):
            return None
        means.append((np.mean([a["acc"] for a in accs]), -lr))
    return -max(means)[1]


def collapsed(run: dict) -> bool:
    """A diverged run: its loss is not finite, or it ended at chance accuracy (CIFAR-10: 10%)."""
    return run["diverged"] or run["acc"] <= CHANCE


@dataclass
class Selection:
    """A row's rate and the runs it still needs (:func:`select`)."""

    grid: list[float]  # every rate trained on the selection seeds
    lr: float | None  # the chosen rate; None while selection runs are missing (or no rate is stable)
    missing: list[tuple[float, int]]  # (rate, seed) runs still to train
    abandoned: list[dict] = field(default_factory=list)  # {"lr", "diverged_seeds"}: rates given up


def select(runs: dict[str, dict], experiment: str, method: str, optimizer: str, p: dict) -> Selection:
    """The protocol's rate for one row. The grid is widened (at most ``max_widen`` times) while the
    choice sits on an edge. A test seed that diverged at the chosen rate (``divergence_rule``) marks
    that rate unstable for the row: the rate is chosen again among the rates below it, widening
    downwards while the choice is the lowest, and every test seed trains at the new rate."""

    def unrun(rates: list[float], seeds: list[int]) -> list[tuple[float, int]]:
        return [(lr, s) for lr in rates for s in seeds if job_id(experiment, method, lr, s) not in runs]

    if experiment == "profile":  # one rate, the selection seeds
        lr = p["profile"]["lr"]
        return Selection([lr], lr, unrun([lr], p["selection_seeds"]))
    grid, cap, abandoned, widened = grid_of(optimizer, p), math.inf, [], 0
    while True:
        stable = [lr for lr in grid if lr < cap]
        missing = unrun(stable, p["selection_seeds"])
        if missing or not stable:
            return Selection(grid, None, missing, abandoned)
        best = choose(runs, experiment, method, stable, p)
        low, high = best == stable[0], best == stable[-1] and cap == math.inf
        if widened < p["max_widen"] and (low or high):
            grid = [grid[0] / p["grid_step"], *grid] if low else [*grid, grid[-1] * p["grid_step"]]
            widened += 1
            continue
        tests = {s: runs.get(job_id(experiment, method, best, s)) for s in p["test_seeds"]}
        bad = [s for s, r in tests.items() if r is not None and collapsed(r)]
        if bad and p.get("divergence_rule"):
            abandoned.append({"lr": best, "diverged_seeds": bad})
            cap = best
            continue
        return Selection(grid, best, [(best, s) for s, r in tests.items() if r is None], abandoned)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared/datasets/cifar10")
    ap.add_argument("--experiments", nargs="+", default=["table1", "fig9"])
    ap.add_argument("--methods", nargs="*", default=None, help="only these methods")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--set", nargs="*", default=[], help="protocol overrides KEY=JSON (cheap forms)")
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="start no run after this many seconds")
    ap.add_argument("--report-only", action="store_true", help="rebuild the report from runs.jsonl, train nothing")
    ap.add_argument("--write-profile", type=Path, help="write the profile experiment's runs as a contribution profile")
    ap.add_argument("--record-evidence", action="store_true", help="write searched rows' results into their schemes")
    ap.add_argument("--eager", action="store_true", help="do not compile the int8 kernels (same bits; no compile wait)")
    return ap


def offline(args: argparse.Namespace, log: Path) -> int | None:
    """The commands that train nothing (the profile, the evidence, the report); None for a training run."""
    if not (args.write_profile or args.record_evidence or args.report_only):
        return None
    p = json.loads((args.out / "protocol.json").read_text())
    runs = read_runs(log, methods(p))
    if args.write_profile:
        doc = profile_document(runs, p)
        if doc is None:
            sys.exit("the profile experiment has not finished: run --experiments profile first")
        write_text(args.write_profile, json.dumps(doc, indent=1) + "\n")
    elif args.record_evidence:
        for path in record_evidence(runs, p):
            print(f"evidence written to {path}")
    else:
        return write_report(args.out, report(runs, [e for e in args.experiments if e != "profile"], p))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    p = dict(PROTOCOL)
    for kv in args.set:
        k, v = kv.split("=", 1)
        p[k] = json.loads(v)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "runs.jsonl"
    done = offline(args, log)
    if done is not None:
        return done
    (args.out / "protocol.json").write_text(json.dumps(p, indent=1))
    t0 = time.time()
    ctx = mp.get_context("spawn" if args.device == "cuda" or os.environ.get("MCU_SPAWN") else "fork")
    init = (str(args.data), args.device, p, not args.eager)
    with ProcessPoolExecutor(args.workers, mp_context=ctx, initializer=_init_worker, initargs=init) as ex:
        while time.time() - t0 < args.budget_s:
            table = methods(p)
            runs = read_runs(log, table)
            reuse(runs, log, table)
            jobs = [
                {
                    "id": job_id(e, m, lr, s),
                    "experiment": e,
                    "method": m,
                    "lr": lr,
                    "seed": s,
                    "spec": spec_of(table[e][m]),
                    "device": args.device,
                    "protocol": p,
                    "deadline": t0 + args.budget_s,
                }  # fmt: skip
                for e in args.experiments
                for m, (_, _, opt) in table[e].items()
                if args.methods is None or m in args.methods
                for lr, s in select(runs, e, m, opt, p).missing
            ]
            if args.methods:  # in the order asked for
                jobs.sort(key=lambda j: args.methods.index(j["method"]))
            if not jobs:
                break
            for r in ex.map(_worker, jobs):
                if r is None:
                    continue
                with open(log, "a") as f:
                    f.write(json.dumps(r) + "\n")
                print(f"{time.time() - t0:6.0f}s {r['experiment']:6} {r['method'][:38]:38} lr {r['lr']:<8g} "
                      f"seed {r['seed']:<3} "
                      f"{r['split']:4} {r['acc']:6.2f}% {r['seconds']:6.1f}s", flush=True)  # fmt: skip
    runs = read_runs(log, methods(p))
    return write_report(args.out, report(runs, [e for e in args.experiments if e != "profile"], p))


def write_report(out: Path, rep: dict) -> int:
    """``report.json`` (atomic), ``fig9.png`` (the memory-accuracy plot) and the Markdown tables on stdout."""
    tmp = out / ".report.json.tmp"
    tmp.write_text(json.dumps(rep, indent=1))
    os.replace(tmp, out / "report.json")
    if rep["experiments"].get("fig9"):
        plot(rep["experiments"]["fig9"], out / "fig9.png")
    print(markdown(rep))
    return 0


def plot(rows: dict, path: Path) -> None:
    """Test accuracy (mean, 95% CI) against the ``tinytraining`` memory (log scale, kB), one
    series per kind of update; the STM32F746's budget as a line."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from memplan.accounting.devices import load_device
    from memplan.io import save_figure

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for kind, marker in (("biases of the last", "o"), ("weights+biases of the last", "s"), ("", "*")):
        pts = [(r["memory"]["tinytraining_bytes"] / 1000, r["mean"], r["ci95"], m) for m, r in rows.items()
               if (m.startswith(kind) if kind else not m.startswith(("biases", "weights")))]  # fmt: skip
        if not pts:
            continue
        pts.sort()
        xs, ys, es, names = zip(*pts)
        es = [0 if math.isnan(e) else e for e in es]
        ax.errorbar(xs, ys, yerr=es, marker=marker, ms=9 if marker == "*" else 5, capsize=3,
                    ls="-" if kind else "none", label=f"{kind} k convs" if kind else "other")  # fmt: skip
        for x, y, name in zip(xs, ys, names):
            if not kind:
                ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, -10), fontsize=7)
    dev = load_device(STM32F746)
    ax.axvline(dev.budget_for("tinytraining") / 1000, color="grey", ls=":", label="STM32F746 training budget")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("training memory, tinytraining mode (kB, batch 1, 128 px)")
    ax.set_ylabel("CIFAR-10 test accuracy (%)")
    ax.set_title("int8 mcunet-5fps + QAS on CIFAR-10 (256KB paper's setting)", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def markdown(rep: dict) -> str:
    lines = []
    for e, rows in rep["experiments"].items():
        head = "| method | optimizer | tinytraining (B) | mcu peak (B) | STM32F746 | test acc % | seeds | lr | device |"
        lines += [f"### {e}", "", head, "|---|---|---:|---:|---|---:|---:|---:|---|"]
        for m, r in rows.items():
            mem = r["memory"]
            fits = "fits" if mem["sram_fits"] and mem["flash_fits"] else "no (SRAM)" if mem["flash_fits"] else "no"
            acc = f"{r['mean']:.2f} ± {r['ci95']:.2f}" if len(r["test"]) > 1 else f"{r['mean']:.2f} (1 seed)"
            if r["diverged_seeds"]:
                acc += f" ({r['diverged_seeds']} diverged)"
            lines.append(f"| {m} | {r['optimizer']} | {mem['tinytraining_bytes']:,} | {mem['mcu_peak_bytes']:,} | "
                         f"{fits} | {acc} | {len(r['test'])} | {r['lr']:.3g} | {r['device']} |")  # fmt: skip
        lines.append("")
        for m, r in rows.items():
            for a in r["abandoned"]:
                seeds = ", ".join(map(str, a["diverged_seeds"]))
                lines.append(f"- {m}: lr {a['lr']:.3g} given up (test seed {seeds} diverged there; the divergence "
                             f"rule), its test seeds retrained at {r['lr']:.3g}")  # fmt: skip
        if any(r["abandoned"] for r in rows.values()):
            lines.append("")
        if e == "fig9":
            lines += claim_lines(claims(rows))
    return "\n".join(lines)


def claim_lines(c: dict) -> list[str]:
    lines = []
    for m, b in c["budgets"].items():
        lines.append(f"- {m}: chosen on validation among it and the hand-made rows within the budget: "
                     f"{b['validated']}; best hand-made row on test: {b['best_baseline']}; beats it with CIs apart: "
                     f"{b['beats_best']}; hand-made rows above it, CIs apart: {b['loses_to'] or 'none'}; against the "
                     f"paper's 100 KB scheme: {b['vs_paper_scheme']}")  # fmt: skip
    for s in c["smaller"].values():
        ratio = "none" if s["row"] is None else f"{s['row']}, its memory / that row's = 1 / {s['ratio']:.2f}"
        lines.append(f"- best last-k row {s['best_last_k']!r}: the memplan row of least memory within 1 point of it "
                     f"(and no more memory): {ratio} "
                     "(the paper: 1 / 4.5 to 1 / 7.5)")  # fmt: skip
    return [*lines, ""]


def apart(a: dict, b: dict) -> bool:
    """Row ``a`` above row ``b`` with their 95% CIs apart."""
    return a["mean"] - a["ci95"] > b["mean"] + b["ci95"]


def claims(rows: dict) -> dict:
    """Figure 9's acceptance claims from its rows: per memplan row, the row ``memplan search
    --validate`` would pick on the selection seed among it and the hand-made rows within its budget,
    the best hand-made row within the budget on test (the paper's scheme listed too) and whether
    memplan beats it / loses to one, CIs apart; and the paper's "4.5-7.5x smaller": the best
    last-k row against the least memory of a memplan row within 1 point of it and with no more
    memory (None where there is none). Bytes are
    ``tinytraining`` bytes."""
    mem = {m: r["memory"]["tinytraining_bytes"] for m, r in rows.items()}
    hand = {m: r for m, r in rows.items() if not m.startswith("memplan")}
    out: dict = {"budgets": {}}
    for m, r in rows.items():
        if not m.startswith("memplan"):
            continue
        budget = float(m.split()[1]) * 1000
        within = {b: h for b, h in hand.items() if mem[b] <= budget}
        best = max(within, key=lambda b: within[b]["mean"]) if within else None
        pool = {m: r, **within}  # what memplan search --validate compares: the searched scheme and the baselines
        out["budgets"][m] = {
            "validated": max(pool, key=lambda c: (pool[c]["val"], -mem[c])),
            "best_baseline": best,
            "beats_best": best is not None and apart(r, within[best]),
            "loses_to": [b for b, h in within.items() if apart(h, r)],
            "vs_paper_scheme": None if "paper's 100 KB scheme" not in rows else (
                "above" if apart(r, rows["paper's 100 KB scheme"]) else
                "below" if apart(rows["paper's 100 KB scheme"], r) else "within the CIs"),
        }  # fmt: skip
    out["smaller"] = {}
    for family in ("weights+biases of the last", "biases of the last"):
        last_k = {m: r for m, r in rows.items() if m.startswith(family)}
        if not last_k:
            continue
        top = max(last_k, key=lambda m: last_k[m]["mean"])
        near = [m for m, r in rows.items()
                if m.startswith("memplan") and r["mean"] >= last_k[top]["mean"] - 1 and mem[m] <= mem[top]]  # fmt: skip
        cheapest = min(near, key=lambda m: mem[m]) if near else None
        out["smaller"][family] = {"best_last_k": top, "row": cheapest,
                                  "ratio": None if cheapest is None else mem[top] / mem[cheapest]}  # fmt: skip
    return out


def mean_ci(values: list[float]) -> tuple[float, float]:
    from scipy import stats

    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), float("nan")
    return float(v.mean()), float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


def report(runs: dict[str, dict], experiments: list[str], p: dict) -> dict:
    out: dict = {"protocol": p, "experiments": {}}
    for e in experiments:
        rows = {}
        for m, (_, _, opt) in methods(p)[e].items():
            sel = select(runs, e, m, opt, p)
            best = sel.lr
            if best is None:
                continue
            tests = [runs[job_id(e, m, best, s)] for s in p["test_seeds"] if job_id(e, m, best, s) in runs]
            if not tests:
                continue
            mean, ci = mean_ci([r["acc"] for r in tests])
            _, update, _ = methods(p)[e][m]
            devices = sorted({r["device"] for r in tests})
            val = float(np.mean([runs[job_id(e, m, best, s)]["acc"] for s in p["selection_seeds"]]))
            rows[m] = {"optimizer": opt, "lr": best, "grid": sel.grid, "val": val, "test": [r["acc"] for r in tests],
                       "mean": mean, "abandoned": sel.abandoned,
                       "ci95": ci, "diverged_seeds": sum(map(collapsed, tests)),
                       "device": " + ".join(devices), "memory": memory(update, opt)}  # fmt: skip
        out["experiments"][e] = rows
    return out


if __name__ == "__main__":
    sys.exit(main())
