"""``torch.distributed.tensor``: DTensor, ``distribute_tensor`` and the
placements, on spmdnet's process groups (see ``_api``)."""
from ..device_mesh import DeviceMesh, init_device_mesh
from ._api import DTensor, distribute_tensor
from ._placements import Partial, Placement, Replicate, Shard

__all__ = ["DTensor", "distribute_tensor", "Shard", "Replicate", "Partial", "Placement",
           "DeviceMesh", "init_device_mesh"]
