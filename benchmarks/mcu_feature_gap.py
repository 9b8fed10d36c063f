"""Why int8 SGD-M + QAS stays under fp32 SGD-M in Table 1 (benchmarks/mcu_transfer.py): a linear
probe on each form's frozen features.

The int8 graph rounds and clamps every activation; the fp32 form computes the same network without
that rounding. If the fp32 form's frozen features alone separate CIFAR-10 better, by about the
1.3 points between the two rows, the gap is the forward quantization, not the optimizer.

Same data as the benchmark's protocol (its seeded 500 train / 100 validation images per class, the
whole test split), 128 px, no augmentation; the features are each backbone's pooled output (the
head's input, dequantized for the int8 graph). The probe is a multinomial logistic regression
(full-batch L-BFGS, deterministic), its L2 weight chosen on the validation split from a grid; test
accuracy in %. Writes ``feature_gap.json`` in ``--out``.

    python benchmarks/mcu_feature_gap.py --out benchmarks/mcu_results
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mcu_protocol import PROTOCOL
from mcu_runs import build, load_data, model_input, resize

from memplan.io import write_text
from memplan.models.int8.ops import fuse_kernels
from memplan.models.int8.updates import Update

L2_GRID = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def features(form: str, x: torch.Tensor, res: int) -> torch.Tensor:
    """The head's input of ``form`` for uint8 images ``x`` (N x 3 x 32 x 32), float32 N x C."""
    model = build(form, Update(), "cpu").eval()
    head = model.classifier
    kept: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda m, inp, out: kept.append(inp[0].detach().flatten(1)))
    with torch.no_grad():
        for i in range(0, len(x), 250):
            model(model_input(resize(x[i : i + 250], res), form))
    hook.remove()
    return torch.cat(kept)


def probe(tr: torch.Tensor, ytr: torch.Tensor, te: torch.Tensor, yte: torch.Tensor, l2: float) -> float:
    """Test accuracy (%) of a logistic regression fit on standardised features."""
    mu, sd = tr.mean(0), tr.std(0) + 1e-6
    tr, te = (tr - mu) / sd, (te - mu) / sd
    w = torch.zeros(tr.shape[1], 10, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(10, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500, line_search_fn="strong_wolfe")
    trd, ted = tr.double(), te.double()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(trd @ w + b, ytr) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return 100.0 * float(((ted @ w + b).argmax(1) == yte).double().mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared/datasets/cifar10")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    fuse_kernels()
    p = PROTOCOL
    data = load_data(args.data, "cpu", p)
    rows = {}
    for form in ("fp32", "int8"):
        f = {s: features(form, data[f"x_{s}"], p["resolution"]) for s in ("train", "val", "test")}
        val = {l2: probe(f["train"], data["y_train"], f["val"], data["y_val"], l2) for l2 in L2_GRID}
        l2 = max(L2_GRID, key=lambda v: (val[v], -v))  # ties: the smaller weight
        rows[form] = {"l2": l2, "val": val, "test": probe(f["train"], data["y_train"], f["test"], data["y_test"], l2)}
        print(f"{form}: validation {val}, chosen l2 {l2}: test {rows[form]['test']:.2f}%", flush=True)
    rows["fp32_minus_int8_points"] = rows["fp32"]["test"] - rows["int8"]["test"]
    write_text(args.out / "feature_gap.json", json.dumps(rows, indent=1) + "\n")
    print(f"fp32 - int8 frozen-feature probe: {rows['fp32_minus_int8_points']:+.2f} points (test)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
