"""The accounting: a plan's costs on a captured graph under an accounting mode
(:mod:`.engine`, ``compute``) and the strategy figures beyond per-layer costs (:mod:`.extras`).

It stands above ``memplan.modes`` (the per-op rules) and ``memplan.strategies`` (the plans),
which both stand on the costs core (``memplan.costs``: records, peak, FLOPs, observation,
workspaces) and ``memplan.nn``.
"""
