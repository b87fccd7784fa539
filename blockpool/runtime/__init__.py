"""The synchronous service core: a pool with its manager, columns, logs and
counters, applying typed operations (see runtime.py and observer.py)."""

from blockpool.runtime.columns import STATE_NAMES, BlockColumns
from blockpool.runtime.config import UNCAPPED, Caps, RuntimeConfig
from blockpool.runtime.counters import Counters
from blockpool.runtime.errors import (
    Conflict,
    InvalidInput,
    NotEnoughBlocks,
    NotFound,
    OperationError,
    ResetRefused,
    TooLarge,
    Unavailable,
)
from blockpool.runtime.observer import Change, ChangeKind, OpObserver
from blockpool.runtime.ops import OP_CLASSES, Op, op_from_fields
from blockpool.runtime.runtime import PoolRuntime
from blockpool.runtime.seqlog import SeqLog

__all__ = [
    "OP_CLASSES",
    "STATE_NAMES",
    "UNCAPPED",
    "BlockColumns",
    "Caps",
    "Change",
    "ChangeKind",
    "Conflict",
    "Counters",
    "InvalidInput",
    "NotEnoughBlocks",
    "NotFound",
    "Op",
    "OpObserver",
    "OperationError",
    "PoolRuntime",
    "ResetRefused",
    "RuntimeConfig",
    "SeqLog",
    "TooLarge",
    "Unavailable",
    "op_from_fields",
]
