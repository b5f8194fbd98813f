"""``torch.distributed.fsdp.api``'s enums and configuration classes."""
import dataclasses
import enum


class ShardingStrategy(enum.Enum):
    FULL_SHARD = 1
    SHARD_GRAD_OP = 2
    NO_SHARD = 3
    HYBRID_SHARD = 4
    _HYBRID_SHARD_ZERO2 = 5


class BackwardPrefetch(enum.Enum):
    BACKWARD_PRE = 1
    BACKWARD_POST = 2


class StateDictType(enum.Enum):
    FULL_STATE_DICT = 1
    LOCAL_STATE_DICT = 2
    SHARDED_STATE_DICT = 3


@dataclasses.dataclass
class CPUOffload:
    offload_params: bool = False


@dataclasses.dataclass
class MixedPrecision:
    param_dtype: object = None
    reduce_dtype: object = None
    buffer_dtype: object = None
    keep_low_precision_grads: bool = False
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = True


@dataclasses.dataclass
class StateDictConfig:
    offload_to_cpu: bool = False


@dataclasses.dataclass
class FullStateDictConfig(StateDictConfig):
    rank0_only: bool = False


@dataclasses.dataclass
class ShardedStateDictConfig(StateDictConfig):
    _use_dtensor: bool = False


@dataclasses.dataclass
class OptimStateDictConfig:
    offload_to_cpu: bool = True


@dataclasses.dataclass
class FullOptimStateDictConfig(OptimStateDictConfig):
    rank0_only: bool = False
