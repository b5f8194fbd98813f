"""Tensors whose storage a wrapper owns, kept outside ``Tensor``.

FSDP and ZeRO make parameters views into their flat buffers and go on
reading and writing those buffers; rebinding such a tensor's array
(``p.data = t``, ``load_state_dict(assign=True)``) would leave the wrapper
using the old one. A wrapper ``claim``s the tensors it owns (with a short
description for the error) and ``release``s them when it lets go;
``owner_of`` is what ``Tensor.data``'s setter and ``Module`` consult. The
registry holds weak references: a claim ends with its tensor.
"""
import weakref

_owners = {}  # id(tensor) -> (weak reference to the tensor, description)


def claim(tensor, owner):
    """Mark ``tensor``'s storage as owned by ``owner`` (a description such as
    "parameter 'fc.weight' of FullyShardedDataParallel")."""
    key = id(tensor)
    _owners[key] = (weakref.ref(tensor, lambda _, key=key: _owners.pop(key, None)), owner)


def release(tensor):
    """``tensor``'s storage is its own again."""
    _owners.pop(id(tensor), None)


def owner_of(tensor):
    """The description of the wrapper owning ``tensor``'s storage, or None."""
    entry = _owners.get(id(tensor))
    return entry[1] if entry is not None and entry[0]() is tensor else None
