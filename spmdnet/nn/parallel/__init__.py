"""``torch.nn.parallel``'s path: ``DistributedDataParallel`` is spmdnet's
data parallelism (``spmdnet.parallel.data_parallel``) with PyTorch's
arguments, and ``DataParallel`` PyTorch's single-process wrapper
(``spmdnet.nn.data_parallel``); this module only names them here."""
from ...parallel.data_parallel import DistributedDataParallel
from ..data_parallel import DataParallel

__all__ = ["DistributedDataParallel", "DataParallel"]
