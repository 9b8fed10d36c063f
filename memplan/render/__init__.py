"""Views of memplan's plain-data results (nothing here computes a cost):

* :mod:`.tables`: rich views of profiles, comparisons, per-conv update costs, the zoo, methods;
* :mod:`.reports`: rich / JSON views of ``reproduce``, ``verify`` and ``search`` results;
* :mod:`.export`: JSON and CSV of profiles;
* :mod:`.figures`: matplotlib figures (Figures 5, 11a, 11b and 13 of the 256KB paper).

The CLI is a thin layer over these and the Python API. Import the module you need: each pulls
in only what its views show (``figures`` imports matplotlib on first use).
"""
