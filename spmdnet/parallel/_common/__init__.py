"""What the parallel strategies share, so none reads another's state:

- ``flat``: ``FlatLayout`` (the flat-offset arithmetic: offsets, padding to
  equal shards, views), ``ChunkLayout`` (per-parameter ``torch.chunk``
  pieces, shard by shard: ``fully_shard``) and the grouping of parameters
  into buckets;
- ``wrapping``: the same-model check at wrap time, the backward sentinel,
  ``no_sync`` and the ``nonfinite=`` check agreed by all ranks;
- ``grad_buffer``: ``ParamAndGradBuffer``, the flat parameter and gradient
  storage and gradient buckets (``bucket``) under DataParallel, ZeRO, FSDP
  and ``fully_shard`` (its collectives in ``distributed.bucket_collectives``), with
  ``reductions`` its comm hooks and the one averaging rule;
- ``norm``: the one cross-rank gradient norm behind every sharded
  ``clip_grad_norm_`` and ``parallel.clip_grad_norm_``.
"""
