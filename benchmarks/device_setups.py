"""Saved bytes of the setups users prepare to save memory, measured on a CUDA device against
memplan's ``pytorch``-mode prediction (eager PyTorch on the CPU) and the CPU's own measurement.

The setups: the setups corpus (``tests/setups_corpus.py``: activation checkpointing in its forms,
hand freezing, Hugging Face / timm switches; batch 4 at 3x64x64) in float32, five of them
(``AMP_SETUPS``) under ``torch.autocast`` in bfloat16 and float16 too, and peft's LoRA on a small
CNN (with and without autocast). Each runs one forward + cross-entropy + backward under
``saved_tensors_hooks`` (``memplan.verify.measure.saved_bytes``: unique storages, parameters and
buffers excluded) on the CPU and on CUDA, with autocast on that device's type. CUDA's autocast
lists and kernels are not the CPU's: the table says where the CPU rule holds there. Bytes, exact.

    python benchmarks/device_setups.py [--out FILE]   # on a machine with CUDA (the CPU column alone without)
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import memplan
from memplan.verify.measure import SavedMeasurement, saved_bytes
from tests import setups_corpus as C

AMP = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
AMP_SETUPS = (
    "rescnn-checkpoint",
    "hf-vit-gradient-checkpointing",
    "rescnn-checkpoint-reentrant",
    "sequential-4-segments",
    "hand-frozen-first-half",
)


def measure(build: Callable[[], nn.Module], shape: tuple[int, ...], amp: str, device: str) -> SavedMeasurement:
    """What one real step of a fresh model on ``device`` under autocast ``amp`` saves."""
    torch.manual_seed(0)
    model = build().to(device)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(shape, generator=g).to(device), torch.randint(0, C.CLASSES, (shape[0],), generator=g).to(device)
    dtype = AMP[amp]
    with torch.autocast(device.split(":")[0], dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        return saved_bytes(model, x, y, backward=True)


def peft_lora(rank: int = 8) -> nn.Module:
    """peft's LoRA model of the corpus' :class:`SmallCNN` (c1, c2 adapted; the classifier trained whole; the
    BatchNorm in eval mode, the frozen base's statistics)."""
    import peft

    torch.manual_seed(0)
    config = peft.LoraConfig(r=rank, lora_alpha=8, target_modules=["c1", "c2"], modules_to_save=["fc"])
    pm = peft.get_peft_model(copy.deepcopy(C.SmallCNN()), config).train()
    for m in pm.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
    return pm


def rows() -> list[tuple[str, str, Callable[[], int], Callable[[str], SavedMeasurement]]]:
    """(setup, amp, predicted bytes, what a step saves on a device)."""
    out = []
    for s in C.SETUPS:
        if s.name in C.MISSING:
            continue
        for amp in ("fp32", "bf16", "fp16") if s.name in AMP_SETUPS else ("fp32",):

            def predicted(s=s, amp=amp) -> int:
                p = memplan.profile(
                    s.build(),
                    s.method,
                    input_shape=C.SHAPE[1:],
                    batch=C.SHAPE[0],
                    calibration=None,
                    **({} if amp == "fp32" else {"amp": amp}),
                )
                return p.totals.saved_activation_bytes

            out.append((s.name, amp, predicted, lambda d, s=s, amp=amp: measure(s.build, C.SHAPE, amp, d)))
    for amp in ("fp32", "bf16", "fp16"):

        def lora_predicted(amp=amp) -> int:
            torch.manual_seed(0)
            p = memplan.profile(
                C.SmallCNN(),
                "lora",
                batch=2,
                input_shape=(3, 16, 16),
                targets="c1,c2",
                calibration=None,
                **({} if amp == "fp32" else {"amp": amp}),
            )
            return p.totals.saved_activation_bytes

        out.append(
            ("peft-lora-cnn", amp, lora_predicted, lambda d, amp=amp: measure(peft_lora, (2, 3, 16, 16), amp, d))
        )
    return out


def cell(f: Callable[..., Any], *args: str) -> Any:
    """``f(*args)``, or the one-line error of a setup that fails there (reported, not dropped)."""
    try:
        return f(*args)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"


def fmt(v: object) -> str:
    """A table cell: bytes with thousands separators, an error's line, or nothing."""
    return f"{v:,}" if isinstance(v, int) else "" if v is None else str(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="also write the table here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    name = torch.cuda.get_device_name() if cuda else "no CUDA"
    lines = [
        f"saved bytes, one step (forward + cross-entropy + backward); torch {torch.__version__}; CUDA: {name}",
        "| setup | amp | predicted (pytorch mode) | CPU measured | CUDA measured | CUDA - predicted |",
        "|---|---|---:|---:|---:|---:|",
    ]
    differ = []
    for setup, amp, predicted, measured in rows():
        p, c, g = cell(predicted), cell(measured, "cpu"), cell(measured, "cuda") if cuda else None
        c, g = (m.bytes if isinstance(m, SavedMeasurement) else m for m in (c, g))
        diff = g - p if isinstance(g, int) and isinstance(p, int) else None
        lines.append(f"| {setup} | {amp} | {fmt(p)} | {fmt(c)} | {fmt(g)} | {fmt(diff)} |")
        print(lines[-1], flush=True)
        if isinstance(c, int) and isinstance(g, int) and c != g:
            differ.append((setup, amp, measured))
    if differ:
        lines += ["", "Saved tensors that differ, (shape, dtype, storage bytes): count"]
    for setup, amp, measured in differ:
        on_cpu, on_cuda = (Counter(measured(d).tensors) for d in ("cpu", "cuda"))
        lines.append(f"- {setup} {amp}: CPU only {dict(on_cpu - on_cuda)}; CUDA only {dict(on_cuda - on_cpu)}")
    text = "\n".join(lines) + "\n"
    if a.out:
        a.out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
