"""The registry of training settings: one record per setting (Megatron-LM's name, kind, default,
the machine-vector field that carries it to the kernels, where it has no effect, its label and
documentation). Spec parsing (``spec.TRAINING_FLAGS``), the sweep's setting axes, the columns and
their documentation (``schema``), the ``repeat`` status and the query-time expansion
(``schema.SETTING_NO_EFFECT``), evaluate's columns, the machine vector
(``hardware.machine_vector``) and the "not validated" notes all read it.

Adding a setting: a record here, a ``GPUPreset`` field of the same name and default, its field in
``kernels.params.HW_FIELDS``, the formula that reads it, and its tests.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """One training setting.

    Attributes
    ----------
    name : str
        Spec key, column and ``GPUPreset`` field (Megatron-LM's argument name).
    kind : type
        ``bool`` (a switch) or ``int`` (``vpp``).
    default : bool or int
        Value when a spec or CSV row leaves it out.
    field : str
        Machine-vector field (:data:`vtrain_fast.kernels.params.HW_FIELDS`) that carries it.
    no_effect : tuple of bool
        ``(tp == 1, pp == 1, dp == 1, with sequence parallelism)``: the plans where it changes no
        cost, so a sweep prices them once (status ``repeat``) and a query counts them for every
        value of the setting.
    label : str
        Readable name for notes.
    doc : str
        What ``true`` (or the value) does: the spec's and the column table's text.
    megatron : str
        The Megatron-LM command-line flag.
    validated : bool
        True when measurements the project validates against use it (none today: vTrain's runs
        use none of these settings).
    """

    name: str
    kind: type
    default: bool | int
    field: str
    no_effect: tuple[bool, bool, bool, bool]
    label: str
    doc: str
    megatron: str
    validated: bool = False


# In the order of the sweep's machine axis (the last setting varies fastest): this order decides
# the row order of every sweep, so a new setting goes at the end.
SETTINGS: tuple[Setting, ...] = (
    Setting("overlap_grad_reduce", bool, False, "dp_overlap", (False, False, True, False),
            "overlapped gradient reduction",
            "true overlaps the data-parallel all-reduce with backward (Megatron --overlap-grad-reduce)",
            "--overlap-grad-reduce"),
    Setting("distributed_optimizer", bool, False, "optimizer_sharding", (False, False, True, False),
            "distributed optimizer",
            "true shards the Adam states over data-parallel ranks (Megatron --use-distributed-optimizer, ZeRO-1)",
            "--use-distributed-optimizer"),
    Setting("use_flash_attn", bool, False, "flash_attn", (False, False, False, False), "FlashAttention",
            "true runs the attention core as fused FlashAttention-2 kernels (Megatron --use-flash-attn)",
            "--use-flash-attn"),
    Setting("sequence_parallel", bool, False, "sequence_parallel", (True, False, False, False),
            "sequence parallelism",
            "true splits layer norms and dropouts over the tensor-parallel ranks (Megatron --sequence-parallel)",
            "--sequence-parallel"),
    Setting("async_tensor_model_parallel_allreduce", bool, False, "tp_overlap", (True, False, False, True),
            "asynchronous TP all-reduce",
            "true overlaps the backward tensor-parallel all-reduce (or, with sequence parallelism, "
            "reduce-scatter) of the column-parallel layers with their weight-gradient GEMMs (Megatron-LM's "
            "default; Megatron-DeepSpeed: false)",
            "--async-tensor-model-parallel-allreduce"),
    Setting("vpp", int, 1, "vpp", (False, True, False, False), "interleaved 1F1B (vpp > 1)",
            "model chunks per device (interleaved 1F1B when > 1; no effect at pp = 1)",
            "--num-layers-per-virtual-pipeline-stage"),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
# The switches (bool settings), in axis order.
SWITCHES: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.kind is bool)
