"""PyTorch's ``nn.DataParallel``: one process driving several GPUs by
splitting each batch. That is not spmdnet's data parallelism (one MPI rank
per GPU: ``nn.parallel.DistributedDataParallel``). With no more than one
device to use it does what PyTorch's does there, call the wrapped module
(the state_dict keys keep PyTorch's ``module.`` prefix); asked to split over
several GPUs it raises, pointing to DistributedDataParallel."""
from ... import backend
from ..._device import device as as_device
from ..modules.module import Module


def _device_index(dev):
    return dev if isinstance(dev, int) and not isinstance(dev, bool) else as_device(dev).index


class DataParallel(Module):
    """``DataParallel(module, device_ids=None, output_device=None, dim=0)``."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        super().__init__()
        visible = backend.gpu_count()
        ids = list(range(visible)) if device_ids is None else [
            _device_index(d) for d in device_ids]
        if visible and len(ids) > 1:
            raise NotImplementedError(
                f"nn.DataParallel would split each batch over GPUs {ids} from one process; "
                "spmdnet runs one MPI rank per GPU instead: wrap the model in "
                "nn.parallel.DistributedDataParallel and launch with mpiexec -n "
                f"{len(ids)} (or spmdnet.run --nproc-per-node {len(ids)})")
        self.module = module
        self.device_ids, self.output_device, self.dim = ids, output_device, dim

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)
