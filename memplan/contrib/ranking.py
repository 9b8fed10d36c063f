"""A ranked subset of convs for a grid's weight runs (``--rank-by``): a profile measured in seconds
(an estimator's: fisher, rgn, probe) ranks every conv, and the grid measures the top N. The grid's
profile lists the convs (``protocol.weight_convs``) and its description says what ranked them."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import BadOption
from .options import Protocol
from .profile import ContribProfile, load_profile


def rank_convs(profile: ContribProfile) -> list[int]:
    """The conv indices of ``profile``'s weight entries, highest first, by each conv's largest entry
    over its ratios (the profile's units); ties: the later conv first."""
    index = {layer.name: layer.conv_index for layer in profile.layers}
    score = {index[name]: max(by_ratio.values()) for name, by_ratio in profile.weight.items() if by_ratio}
    return sorted(score, key=lambda i: (-score[i], -i))


def read_ranking(rank_by: str | os.PathLike | None, protocol: Protocol) -> ContribProfile | None:
    """The profile that ranks the convs (None without ``rank_by``), read before any work: an
    unreadable file, or no ``weight_layers`` N to take from its ranking, is a one-line error."""
    if rank_by is None:
        return None
    if protocol.weight_layers is None:
        raise BadOption("rank_by needs weight_layers N: how many of the ranked convs get weight runs")
    return load_profile(rank_by)


def ranked_protocol(
    protocol: Protocol, rank_by: str | os.PathLike | None, ranking: ContribProfile | None, fingerprint: str
) -> tuple[Protocol, str | None]:
    """``protocol`` with ``weight_convs`` = the ``weight_layers`` convs ``ranking`` (read from
    ``rank_by`` by :func:`read_ranking`) ranks highest, and the words that say so (``protocol`` and
    None without a ranking). ``fingerprint``: the measured model's; a profile of another model is refused."""
    if ranking is None:
        return protocol, None
    if ranking.fingerprint != fingerprint:
        raise BadOption(f"rank_by {rank_by}: a profile of another model ({ranking.model})")
    top = rank_convs(ranking)[: protocol.weight_layers]
    if len(top) < protocol.weight_layers:
        raise BadOption(f"rank_by {rank_by} ranks {len(top)} convs, fewer than weight_layers {protocol.weight_layers}")
    words = (
        f"the {len(top)} convs that {Path(rank_by).name} ({ranking.estimator}) ranks highest by their largest "
        "entry over ratios"
    )
    return protocol.model_copy(update={"weight_layers": None, "weight_convs": tuple(sorted(top))}), words
