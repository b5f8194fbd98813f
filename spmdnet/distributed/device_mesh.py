"""``torch.distributed.device_mesh``: ``init_device_mesh`` and ``DeviceMesh``
on spmdnet's process groups.

A mesh lays the world's ranks out row-major in ``mesh_shape`` (PyTorch's
order: the last dimension varies fastest). Each dimension's groups are
``dist.new_group`` groups, made collectively by every rank, so all of
spmdnet's communicator splitting stays in the runtime. ``device_type`` is
accepted for every name PyTorch takes ("cpu", "cuda", ...): the rank's device
is the one ``dist.init`` bound.
"""
import math

import numpy as np

from . import c10d, runtime


def _as_shape(mesh_shape):
    shape = (mesh_shape,) if isinstance(mesh_shape, int) else tuple(mesh_shape)
    if not shape or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in shape):
        raise ValueError(f"init_device_mesh: mesh_shape must be positive integers, "
                         f"got {mesh_shape!r}")
    return shape


class DeviceMesh:
    """A grid of global ranks with one process group per dimension for this rank."""

    def __init__(self, device_type, mesh, *, mesh_dim_names=None):
        self.device_type = device_type
        self.mesh = np.asarray(mesh, dtype=np.int64)
        if self.mesh.ndim == 0:
            self.mesh = self.mesh.reshape(1)
        names = None if mesh_dim_names is None else tuple(mesh_dim_names)
        if names is not None and len(names) != self.mesh.ndim:
            raise ValueError(f"DeviceMesh: {len(names)} mesh_dim_names {names} for a "
                             f"{self.mesh.ndim}-D mesh of shape {self.mesh.shape}")
        self.mesh_dim_names = names
        me = runtime.world().rank
        where = np.argwhere(self.mesh == me)
        self._coordinate = tuple(int(i) for i in where[0]) if len(where) else None
        self._groups = [self._dim_groups(dim, me) for dim in range(self.mesh.ndim)]

    def _dim_groups(self, dim, me):
        """Every rank calls new_group for every line of ``dim`` (in the same
        order), as process-group creation is collective; keeps its own."""
        mine = None
        lines = np.moveaxis(self.mesh, dim, -1).reshape(-1, self.mesh.shape[dim])
        for line in lines:
            ranks = [int(r) for r in line]
            if ranks == list(range(runtime.world().size)):
                group = c10d.default_group()
            else:
                group = c10d.new_group(ranks)
            if me in ranks:
                mine = group
        return mine

    @property
    def ndim(self):
        return self.mesh.ndim

    @property
    def shape(self):
        return tuple(self.mesh.shape)

    def _dim(self, mesh_dim):
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError(f"Found the DeviceMesh have {self.ndim} dimensions; "
                                   "name the mesh_dim")
            return 0
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"mesh dimension {mesh_dim!r} is not one of "
                               f"{self.mesh_dim_names}")
            return self.mesh_dim_names.index(mesh_dim)
        if not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"mesh_dim {mesh_dim} out of range for a {self.ndim}-D mesh")
        return mesh_dim % self.ndim

    def get_group(self, mesh_dim=None):
        """The ProcessGroup of this rank along ``mesh_dim`` (index or name)."""
        return self._groups[self._dim(mesh_dim)]

    def size(self, mesh_dim=None):
        return self.mesh.size if mesh_dim is None else self.mesh.shape[self._dim(mesh_dim)]

    def get_local_rank(self, mesh_dim=None):
        return self._coordinate[self._dim(mesh_dim)]

    def get_rank(self):
        return runtime.world().rank

    def get_coordinate(self):
        return None if self._coordinate is None else list(self._coordinate)

    def __getitem__(self, name):
        """The sub-mesh of the named dimensions (in the mesh's order) through
        this rank, e.g. ``mesh["dp_replicate", "dp_shard"]`` for HSDP."""
        names = (name,) if isinstance(name, str) else tuple(name)
        dims = [self._dim(n) for n in names]
        if not dims or sorted(set(dims)) != dims:
            raise KeyError(f"DeviceMesh[{name!r}]: name distinct dimensions of "
                           f"{self.mesh_dim_names} in the mesh's order")
        index = list(self._coordinate)
        for dim in dims:
            index[dim] = slice(None)
        sub = DeviceMesh.__new__(DeviceMesh)
        sub.device_type, sub.mesh = self.device_type, self.mesh[tuple(index)]
        sub.mesh_dim_names = names
        sub._coordinate = tuple(self._coordinate[dim] for dim in dims)
        sub._groups = [self._groups[dim] for dim in dims]
        return sub

    def __repr__(self):
        names = "" if self.mesh_dim_names is None else f", mesh_dim_names={self.mesh_dim_names}"
        return f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}{names})"


def init_device_mesh(device_type, mesh_shape, *, mesh_dim_names=None, backend_override=None):
    """A DeviceMesh over all ranks of the world, row-major in ``mesh_shape``."""
    if backend_override:
        raise NotImplementedError(f"init_device_mesh(backend_override={backend_override!r})"
                                  ": spmdnet runs every group over MPI")
    if not c10d.is_initialized():
        c10d.init_process_group()
    shape = _as_shape(mesh_shape)
    size = runtime.world().size
    if math.prod(shape) != size:
        raise RuntimeError(f"init_device_mesh: mesh_shape {shape} holds {math.prod(shape)} "
                           f"ranks, the world has {size}")
    return DeviceMesh(device_type, np.arange(size).reshape(shape), mesh_dim_names=mesh_dim_names)


__all__ = ["DeviceMesh", "init_device_mesh"]
