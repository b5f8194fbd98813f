"""``torch.distributed.optim``'s path: ``ZeroRedundancyOptimizer`` with
PyTorch's arguments on spmdnet's (``spmdnet.parallel.zero``, stage 1:
each rank updates its shard of the optimizer state and parameters, then
the parameters are all-gathered)."""
from ... import distributed as dist
from ...parallel.zero import ZeroRedundancyOptimizer as _Zero


class ZeroRedundancyOptimizer(_Zero):
    """``ZeroRedundancyOptimizer(params, optimizer_class, process_group=None,
    parameters_as_bucket_view=False, overlap_with_ddp=False, **defaults)``.
    ``process_group``: a ``dist.new_group`` group (None: the world);
    ``parameters_as_bucket_view`` is accepted (the shard is always one flat
    buffer); ``overlap_with_ddp=True`` raises NotImplementedError."""

    def __init__(self, params, optimizer_class, process_group=None,
                 parameters_as_bucket_view=False, overlap_with_ddp=False, **defaults):
        if overlap_with_ddp:
            raise NotImplementedError("ZeroRedundancyOptimizer(overlap_with_ddp=True) is not "
                                      "supported by spmdnet (use stage=2 of "
                                      "spmdnet.parallel.ZeroRedundancyOptimizer)")
        super().__init__(params, optimizer_class=optimizer_class,
                         comm=dist.comm_of(process_group, "ZeroRedundancyOptimizer"),
                         **defaults)
        self.process_group = process_group
        self.parameters_as_bucket_view = parameters_as_bucket_view


__all__ = ["ZeroRedundancyOptimizer"]
