"""``torch.distributed.checkpoint``: the ``state_dict`` helpers (``state_dict``)."""
