"""spmdnet's own exception types."""


class DistributedError(RuntimeError):
    """Ranks disagree (shapes, parameters, lengths); raised on every rank."""


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete, corrupt, or does not fit the model or world."""


class NonFiniteError(FloatingPointError):
    """A gradient or loss holds NaN or Inf; raised on every rank."""
