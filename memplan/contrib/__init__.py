"""Contribution analysis (Lin et al., "On-Device Training Under 256KB Memory", NeurIPS 2022,
Section 2.2 / Figure 5): short fine-tuning runs that measure the accuracy gain of updating
the biases of the last k convs and the weight of each conv at channel ratios 1/8 .. 1, with a
feature cache (Cache-and-Reuse), a resumable checkpoint and local / Ray parallelism. Runs are
measured on a validation split carved from the training data; :mod:`.final` trains schemes end
to end from a profile's setup and measures them on the test split.

    >>> from memplan.contrib import run_contrib
    >>> from memplan.render.figures import plot_contrib
    >>> prof = run_contrib("mbv2-w0.35", data="digits", out="profiles/mbv2.json", workers=2)
    >>> real = run_contrib("efficientnet-lite0", weights="zoo", data="fashion-mnist", resolution=32, validation=50)
    >>> plot_contrib(prof, "profiles/mbv2.png")
"""

from ..registry import lazy_exports

#: public name -> the module of this package that defines it (imported on first use, so that the
#: command line reads :mod:`.options` without torch)
EXPORTS = {
    "run_contrib": "analysis",
    "ContribOptions": "options",
    "ContribProfile": "profile",
    "load_profile": "profile",
    "Protocol": "options",
    "Data": "data",
    "load_data": "data",
}


__getattr__ = lazy_exports(__name__, EXPORTS, globals())

__all__ = list(EXPORTS)
