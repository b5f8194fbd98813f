"""One flat buffer holding many arrays: the flat-offset arithmetic, written once.

Every strategy packs parameters (or their gradients) one after the other
into one 1-D buffer: DataParallel's gradient buckets, ZeRO's parameter
buffer and its gradient buckets, FSDP's flat shards, ``allreduce_gradients``.
A ``FlatLayout`` is built whole from the arrays' shapes: each array's offset
and size, the total, and the padding to ``parts`` equal shards (ZeRO, FSDP:
rank r owns shard r). It makes views into a buffer and copies arrays in and
out; the buffers themselves belong to the strategies.

Parameters are grouped into layouts by ``dtype_groups`` (one per dtype)
and into buckets by ``assign_buckets`` (whole parameters, one dtype each,
at most a byte cap), shared by DataParallel and ZeRO-2.

``flatten_params`` copies each group's parameters into one flat array and
rebinds them to their views there (``flat_params``), except those that
``tied_params`` finds sharing storage (``shared_storage``: byte ranges that
overlap): copies would untie them.

``ChunkLayout`` is the per-parameter sharding's layout (``fully_shard``):
every array is cut along its own dimension into ``torch.chunk`` pieces, and
shard r holds piece r of each array, one after the other, every piece
padded to the first piece's size. Its arrays are not contiguous in it, so
it has no views: arrays are copied in (``put``) and pieces read out
(``piece``).
"""
import math
from itertools import accumulate

from ...backend import data_address, is_cupy_array, xp_of
from ...distributed.tensor._placements import chunk_bounds

MB = 1024 * 1024
FIRST_BUCKET_MB = 1.0  # DDP's default: a small first bucket starts communication early


class FlatLayout:
    """Where each of some arrays (``shapes``, in order) lives in one flat
    buffer, padded to a multiple of ``parts``."""

    viewable = True  # every array is one contiguous range (``views``)
    dtype = None     # the storage's dtype: the arrays' own

    def __init__(self, shapes, parts=1):
        if parts < 1:
            raise ValueError(f"FlatLayout: parts must be at least 1, got {parts}")
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.numels = [math.prod(s) for s in self.shapes]
        self.offsets = [0, *accumulate(self.numels)][:-1]
        self.numel = sum(self.numels)
        self.parts = parts
        self.shard_numel = -(-self.numel // parts)  # ceil: the last shard is padded
        self.padded_numel = self.shard_numel * parts

    def slices(self):
        """(offset, numel, shape) of each array, in order."""
        return zip(self.offsets, self.numels, self.shapes)

    def shard_range(self, rank):
        """(lo, hi): the flat positions shard ``rank`` holds."""
        return rank * self.shard_numel, (rank + 1) * self.shard_numel

    def shard_of(self, flat, rank):
        """Shard ``rank``'s part of the padded ``flat`` (a view)."""
        lo, hi = self.shard_range(rank)
        return flat[lo:hi]

    def views(self, flat):
        """Each array's view into ``flat`` (at least ``numel`` long), in its shape."""
        return [flat[off:off + n].reshape(shape) for off, n, shape in self.slices()]

    def pack(self, flat, arrays):
        """Copy ``arrays`` into their places in ``flat``; a None leaves its place as it is."""
        for (off, n, _), a in zip(self.slices(), arrays):
            if a is not None:
                flat[off:off + n] = a.reshape(-1)
        return flat

    def overlaps(self, lo, hi):
        """(index, start, stop) of each array's part inside flat[lo:hi], as
        positions within the array's flattened data (parts that are empty skipped)."""
        for i, (off, n, _) in enumerate(self.slices()):
            start, stop = max(off, lo), min(off + n, hi)
            if start < stop:
                yield i, start - off, stop - off


class ChunkLayout:
    """Arrays ``shapes`` each split along ``dims[i]`` into ``parts``
    ``torch.chunk`` pieces, laid out shard by shard (see the module
    docstring); ``dtype``: the storage's dtype (None: the arrays')."""

    viewable = False

    def __init__(self, shapes, dims, parts, dtype=None):
        if parts < 1:
            raise ValueError(f"ChunkLayout: parts must be at least 1, got {parts}")
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.dims, self.parts, self.dtype = list(dims), parts, dtype
        self.numels = [math.prod(s) for s in self.shapes]
        self.steps = [-(-s[d] // parts) if s[d] else 0 for s, d in zip(self.shapes, self.dims)]
        self.rows = [n // s[d] if s[d] else 0
                     for n, s, d in zip(self.numels, self.shapes, self.dims)]
        pieces = [step * row for step, row in zip(self.steps, self.rows)]
        self.offsets = [0, *accumulate(pieces)][:-1]  # each array's piece within a shard
        self.shard_numel = sum(pieces)
        self.numel = self.padded_numel = self.shard_numel * parts

    def shard_range(self, rank):
        return rank * self.shard_numel, (rank + 1) * self.shard_numel

    def _blocks(self, flat, i):
        """Array ``i``'s padded pieces in ``flat``: (parts, step, *other dims), a view."""
        shape, dim = self.shapes[i], self.dims[i]
        rest = shape[:dim] + shape[dim + 1:]
        at = self.offsets[i]
        shards = flat[:self.padded_numel].reshape(self.parts, self.shard_numel)
        return shards[:, at:at + self.steps[i] * self.rows[i]].reshape(
            (self.parts, self.steps[i]) + rest)

    def put(self, flat, i, array, add=False):
        """Copy (``add``: add) array ``i`` into its pieces in ``flat``."""
        if not self.numels[i]:
            return
        moved = xp_of(array).moveaxis(array.reshape(self.shapes[i]), self.dims[i], 0)
        blocks, step, length = self._blocks(flat, i), self.steps[i], moved.shape[0]
        full = length // step  # pieces of ``step`` rows; then at most one shorter
        parts = [(blocks[:full], moved[:full * step].reshape((full, step) + moved.shape[1:]))]
        if length > full * step:
            parts.append((blocks[full, :length - full * step], moved[full * step:]))
        for dst, src in parts:
            if add:
                dst += src
            else:
                dst[...] = src

    def piece(self, shard, i, rank):
        """Array ``i``'s piece ``rank`` (its ``torch.chunk`` piece, unpadded)
        read from ``shard``, that rank's shard of a flat (a view)."""
        start, stop = chunk_bounds(self.shapes[i][self.dims[i]], self.parts, rank)
        shape, dim = self.shapes[i], self.dims[i]
        rest = shape[:dim] + shape[dim + 1:]
        at = self.offsets[i]
        block = shard[at:at + (stop - start) * self.rows[i]].reshape((stop - start,) + rest)
        return xp_of(block).moveaxis(block, 0, dim)


def bucket_bytes(bucket_mb):
    """(first bucket, other buckets) caps in bytes for a ``bucket_mb`` option."""
    if bucket_mb <= 0:
        raise ValueError(f"bucket_mb must be positive, got {bucket_mb}")
    return min(FIRST_BUCKET_MB, bucket_mb) * MB, bucket_mb * MB


def assign_buckets(params, first_bytes, cap_bytes):
    """Split ``params`` (already in reverse registration order) into lists,
    each of one dtype and at most the cap (a larger parameter stands alone)."""
    groups, current, size = [], [], 0
    for p in params:
        cap = first_bytes if not groups else cap_bytes
        same_dtype = not current or current[0].array.dtype == p.array.dtype
        if current and (not same_dtype or size + p.array.nbytes > cap):
            groups.append(current)
            current, size = [], 0
        current.append(p)
        size += p.array.nbytes
    if current:
        groups.append(current)
    return groups


def dtype_groups(params, parts):
    """``[(dtype, params, FlatLayout)]``: one layout group per dtype, its
    parameters in registration order, padded to ``parts`` shards."""
    by_dtype = {}
    for p in params:
        by_dtype.setdefault(p.array.dtype, []).append(p)
    return [(dtype, group, FlatLayout([p.array.shape for p in group], parts))
            for dtype, group in by_dtype.items()]


def _byte_range(a):
    """(memory, lo, hi): the bytes ``a`` may touch, its elements' lowest
    address to past its highest (strides may be negative or zero)."""
    where, ptr = ("cuda", a.device.id) if is_cupy_array(a) else ("host", 0), data_address(a)
    lo = ptr + sum((n - 1) * st for n, st in zip(a.shape, a.strides) if st < 0)
    hi = ptr + sum((n - 1) * st for n, st in zip(a.shape, a.strides) if st > 0) + a.itemsize
    return where, lo, hi


def shared_storage(arrays):
    """``{i: j}``: for each array ``i`` whose byte range overlaps another's,
    one such ``j`` (both ways). Ranges, not elements (NumPy's
    ``may_share_memory``): interleaved views of one array count as shared.
    Sorted by start address, so n log n rather than every pair."""
    ranges = sorted((*_byte_range(a), i) for i, a in enumerate(arrays) if a.size)
    shared, reach = {}, None  # reach: (memory, highest end so far, its array)
    for where, lo, hi, i in ranges:
        if reach is not None and reach[0] == where and lo < reach[1]:
            shared.setdefault(i, reach[2])
            shared.setdefault(reach[2], i)
        if reach is None or reach[0] != where or hi > reach[1]:
            reach = (where, hi, i)
    return shared


def tied_params(params, names, who, refuse=False):
    """The ids of the parameters whose storage another of ``params`` shares
    (``refuse``: a ValueError naming the first such pair instead)."""
    shared = shared_storage([p.array for p in params])
    if refuse and shared:
        i = min(shared)
        raise ValueError(f"{who}: {names[i]} and {names[shared[i]]} share storage; each "
                         "would become its own view of the flat array, untying them "
                         "(give each parameter its own storage)")
    return {id(params[i]) for i in shared}


def flatten_params(groups, keep_out=()):
    """``{key: flat}`` for ``groups`` (``[(key, params, FlatLayout)]``): each
    group's parameters copied into one new zero-padded flat array, and each
    parameter's array rebound to its view there (those whose id is in
    ``keep_out`` keep their own array; their places stay zero)."""
    flats = {}
    for key, group, layout in groups:
        xp = xp_of(group[0].array)
        flats[key] = flat = layout.pack(
            xp.zeros(layout.padded_numel, group[0].array.dtype),
            [None if id(p) in keep_out else p.array for p in group])
        for p, view in zip(group, layout.views(flat)):
            if id(p) not in keep_out:
                p.array = view  # from now on updated in place (optimizer, all-gather)
    return flats
