"""CPU scenario of ``fa3_local_attn_pages``: the block tables FA3's own local-attention
metadata code builds for a chunked layer over a real SWAKVPool mapping."""

from __future__ import annotations

from ..hooks.fa3_local_attn_pages import CLASS, MODULE, probe
from ..fix import ScenarioUnavailable
from ..probe import optional_module, target_class
from . import Outcome


def scenario() -> Outcome:
    """FA3's own local-attention metadata methods at page size 16, chunk 32, over a real
    SWAKVPool mapping whose full and SWA pages differ: do the eager and CUDA-graph block tables
    start each chunk on the request's SWA page. Where the methods moved (0.5.22+), upstream's
    ``LocalAttentionMetadataBuilder`` is run instead. ``seen``: per half, whether it is right."""
    if optional_module(MODULE) is None:
        raise ScenarioUnavailable(f"no FA3 backend: {MODULE}")
    seen = probe(target_class(CLASS), peel=False)
    return Outcome(not all(seen.values()), seen)


def reproduce() -> bool:
    return scenario().bug
