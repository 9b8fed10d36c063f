"""Models: the zoo of seed-paper backbones (:mod:`.zoo`) and the resolution of a model spec
(zoo name, ``package.module:attr`` or ``file.py:attr``) into a built module (:mod:`.loading`)."""

from . import zoo
from .loading import ModelSpec, recorded_shape, resolve, sample_shape

__all__ = ["zoo", "ModelSpec", "recorded_shape", "resolve", "sample_shape"]
