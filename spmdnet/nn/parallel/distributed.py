"""``torch.nn.parallel.distributed``'s path: ``DistributedDataParallel``, implemented
with the strategies (``spmdnet/parallel/data_parallel/ddp.py``, beside the
buffer it configures)."""
from ...parallel.data_parallel import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
