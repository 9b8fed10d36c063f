"""Machine-readable views: JSON documents and CSV tables (sizes in bytes, as in the records)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import asdict, fields

from ..costs.records import Costs, Profile

LAYER_CSV_FIELDS = ["name", "kind", "target", "output_shape", "block", "grad_input", "grad_weight", "grad_bias"] + [
    f.name for f in fields(Costs)
]


def to_json(profile: Profile) -> str:
    return json.dumps(profile.to_dict(), indent=2, default=str)


def many_to_json(profiles: Sequence[Profile]) -> str:
    return json.dumps([p.to_dict() for p in profiles], indent=2, default=str)


def layers_csv(profiles: Sequence[Profile]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["model", "method", "mode"] + LAYER_CSV_FIELDS)
    for p in profiles:
        for layer in p.layers:
            row = asdict(layer)
            w.writerow(
                [p.model, p.method, p.mode]
                + ["x".join(map(str, row[k])) if k == "output_shape" else row[k] for k in LAYER_CSV_FIELDS]
            )
    return buf.getvalue()


def totals_csv(profiles: Sequence[Profile]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    keys = list(asdict(profiles[0].totals))
    w.writerow(["model", "method", "options", "mode", "batch"] + keys)
    for p in profiles:
        t = asdict(p.totals)
        w.writerow([p.model, p.method, json.dumps(p.options), p.mode, p.batch] + [t[k] for k in keys])
    return buf.getvalue()
