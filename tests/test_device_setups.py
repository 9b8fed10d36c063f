"""benchmarks/device_setups.py (the setups' saved bytes on a lent GPU) stays runnable: on the CPU,
its prediction and its measurement of a checkpointed CNN under bf16 autocast and of peft's LoRA
agree, as tests/test_amp_setups.py and tests/test_lora.py check them in full."""

import pytest

from .helpers import load_benchmark

pytest.importorskip("peft")


@pytest.mark.parametrize("setup,amp", [("rescnn-checkpoint", "bf16"), ("peft-lora-cnn", "fp16")])
def test_the_device_script_predicts_what_the_cpu_saves(setup, amp):
    ds = load_benchmark("device_setups")
    (row,) = [r for r in ds.rows() if r[:2] == (setup, amp)]
    predicted, measured = row[2], row[3]
    assert predicted() == measured("cpu").bytes > 0
