"""The plugin's state on sglang's objects (attention backends, metadata objects, forward batches,
CUDA-graph buffer objects): one attribute per object, ``ATTR``, holding a dict of the plugin's
entries keyed by the fixes' names (each module's key constants, unique across modules).

``of(obj)`` is the object's state, made on first use; ``get(obj, key)`` reads an entry without
making the state. Both are a couple of dict lookups (they run on every decode step).

sglang shallow-copies some of these objects (``copy.copy``): the copy's ``ATTR`` is then the
original's dict. The state records its owner (``id``) so that ``of`` on a copy replaces that
shared dict by a shallow copy of it owned by the copy before anything is written: a write on
the copy never changes the original, as with attributes copied by value. ``get`` on a copy reads
the original's entries until the copy writes (unlike attributes copied by value, that includes
entries the original writes after the copy was made)."""

from __future__ import annotations

from typing import Any

ATTR = "_sglang_swa_plugin"  # the one attribute: a _State


class _State(dict):
    """The plugin's entries on one object, keyed by the plugin's names; ``owner``: the id of
    the object it belongs to (another id: it came along with a shallow copy)."""

    __slots__ = ("owner",)


def of(obj: Any) -> dict:
    """``obj``'s state (its own: a state that came with a shallow copy is copied first), made
    on first use."""
    d = obj.__dict__
    st = d.get(ATTR)
    if st is None or st.owner != id(obj):
        st = _State() if st is None else _State(st)
        st.owner = id(obj)
        d[ATTR] = st
    return st


def get(obj: Any, key: str, default: Any = None) -> Any:
    """The entry ``key`` of ``obj``'s state (``default`` if none), without making the state."""
    st = obj.__dict__.get(ATTR)
    return default if st is None else st.get(key, default)


def has(obj: Any, key: str) -> bool:
    """``obj``'s state holds ``key`` (the state is not made)."""
    st = obj.__dict__.get(ATTR)
    return st is not None and key in st
