"""``python -m spmdnet.run``: the short spelling of ``python -m spmdnet.distributed.run``
(torchrun's command line; PyTorch's home of it is ``torch.distributed.run``)."""
import sys

from .distributed.run import main

if __name__ == "__main__":
    sys.exit(main())
