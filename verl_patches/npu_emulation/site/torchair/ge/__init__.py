"""torchair.ge type names used in MindSpeed's converter signatures."""

import enum


class DataType(enum.IntEnum):
    DT_FLOAT = 0
    DT_FLOAT16 = 1
    DT_INT8 = 2
    DT_INT32 = 3
    DT_UINT8 = 4
    DT_INT16 = 6
    DT_UINT16 = 7
    DT_UINT32 = 8
    DT_INT64 = 9
    DT_UINT64 = 10
    DT_DOUBLE = 11
    DT_BOOL = 12
    DT_BF16 = 27


class Tensor:
    """A graph-mode tensor handle (never constructed on the CPU)."""


class TensorSpec:
    """A graph-mode tensor spec (never constructed on the CPU)."""


def _graph_only(name):
    def call(*args, **kwargs):
        raise RuntimeError(f"torchair.ge.{name}: Ascend graph mode is not available on a CPU host")

    return call


Const = _graph_only("Const")
Cast = _graph_only("Cast")
Fill = _graph_only("Fill")
custom_op = _graph_only("custom_op")


class attr:
    Int = _graph_only("attr.Int")
    Bool = _graph_only("attr.Bool")
    Float = _graph_only("attr.Float")
    Str = _graph_only("attr.Str")
