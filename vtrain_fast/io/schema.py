"""Every output column once: name, Arrow type, unit and meaning.

The README's column table and the Parquet schema are both built from :data:`COLUMNS`.
Kernel row layouts (``model.records.OUTPUT_NAMES``, ``model.records.INPUT_NAMES``) are checked
against it by the tests.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from .errors import InputError, did_you_mean
from ..model import records     # the output layout; no Numba
from ..model.arch import ARCH_FLAGS, BY_NAME as ARCH_BY_NAME
from ..model.moe import KERNEL_DOCS, KERNEL_NAMES
from ..model.settings import BY_NAME, SETTINGS


@dataclass(frozen=True)
class Column:
    """One output column: name, Arrow type, unit (empty when dimensionless) and meaning."""

    name: str
    type: pa.DataType
    unit: str
    doc: str


_dict = pa.dictionary(pa.int32(), pa.string())

INPUT_COLUMNS = (
    Column("model", _dict, "", "model preset or shape name"),
    Column("num_layers", pa.int64(), "", "transformer layers"),
    Column("hidden_size", pa.int64(), "", "model width h"),
    Column("num_attention_heads", pa.int64(), "", "attention heads a"),
    Column("num_query_groups", pa.int64(), "", "key/value head groups (= heads: multi-head attention)"),
    Column("ffn_hidden_size", pa.int64(), "", "MLP inner width"),
    Column("vocab_size", pa.int64(), "", "vocabulary size"),
    Column("seq_length", pa.int64(), "tokens", "sequence length s"),
    # the architecture flags, from their registry (vtrain_fast.model.arch), in its order
    *(Column(fl.name, pa.bool_() if fl.kind is bool else _dict, "",
             f"{fl.doc} (Megatron-LM {fl.megatron})" + (f": {' | '.join(fl.choices)}" if fl.choices else ""))
      for fl in ARCH_FLAGS),
    # the MoE columns of the kernels' model table (vtrain_fast.model.moe.KERNEL_NAMES; a dense model's values)
    *(Column(name, pa.int64(), "", KERNEL_DOCS[name]) for name in KERNEL_NAMES),
    Column("num_tokens", pa.float64(), "tokens", "tokens to train on"),
    Column("gpu", _dict, "", "GPU preset"),
    Column("num_gpus", pa.int64(), "", "GPUs in the job (tp x cp x pp x dp)"),
    Column("num_nodes", pa.int64(), "", "nodes used (ceil(num_gpus / gpus_per_node))"),
    Column("tp", pa.int64(), "", "tensor-parallel size"),
    Column("cp", pa.int64(), "", "context-parallel size: each sequence split over cp ranks (Megatron --context-parallel-size)"),
    Column("pp", pa.int64(), "", "pipeline-parallel size"),
    Column("dp", pa.int64(), "", "data-parallel size"),
    Column("micro_batch_size", pa.int64(), "sequences", "micro-batch size b"),
    Column("global_batch_size", pa.int64(), "sequences", "global batch size B"),
    Column("recompute", _dict, "", "activation recomputation: none | full | selective"),
    # the training settings, from their registry (vtrain_fast.model.settings), in its order
    *(Column(st.name, pa.int64() if st.kind is int else pa.float64() if st.kind is float
             else _dict if st.kind is str else pa.bool_(), "",
             st.doc + (" (" + " | ".join(st.choices) + ")" if st.choices else "")) for st in SETTINGS),
)
# Training-setting columns (a value or a list per sweep, stored with each gpu-axis machine, whose
# machine-vector field of the same name carries it), in registry order. Sweeps and evaluate write
# them so that combined results stay labelled. Where each has no effect on the cost model, what it
# needs, and so where sweeps price a plan once (status repeat, spec.repeat_cases) and pareto counts
# it for every value (query), is its registry record's rule (Setting.inert_at, inert_with,
# requires); tests/test_setting_axes.py checks the rules against the kernels.
SETTING_COLUMNS = tuple(st.name for st in SETTINGS)


def setting_values(column: str, field_values):
    """A setting column's values from its machine-vector field's (``float64`` array): ``int64``
    for the integer settings (``vpp``, ``zero_stage``, ...), ``bool`` (non-zero) for the switches, the choices' text (a list of ``str``) for
    a ``str`` setting (:meth:`~vtrain_fast.model.settings.Setting.decode`)."""
    st = BY_NAME[column]
    if st.kind is str:
        return [st.decode(v) for v in field_values]
    if st.kind is float:
        return field_values.astype("float64")
    return field_values.astype("int64") if st.kind is int else field_values != 0.0


def arch_array(column: str, codes) -> pa.Array:
    """The Arrow column of architecture flag ``column`` from its model-table codes (``int`` array,
    ``ArchFlag.encode``): booleans, or a dictionary over a ``str`` flag's choices."""
    fl = ARCH_BY_NAME[column]
    if fl.kind is str:
        return pa.DictionaryArray.from_arrays(pa.array(codes.astype("int32")), pa.array(fl.choices, pa.string()),
                                              safe=False)
    return pa.array(codes != 0)


def setting_array(column: str, field_values, rows) -> pa.Array:
    """The Arrow column of setting ``column`` for sweep rows whose gpu-axis values are ``rows``
    (``int`` array), from the per-machine field values ``field_values`` (``float64``, one per
    gpu-axis value): a dictionary over the choices for a ``str`` setting (its codes are the
    field values), else :func:`setting_values` taken at ``rows``."""
    st = BY_NAME[column]
    if st.kind is str:
        codes = field_values.astype("int32")[rows]
        return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(st.choices, pa.string()), safe=False)
    return pa.array(setting_values(column, field_values)[rows])

STATUS_LABELS = ("ok", "bad_input", "bad_num_gpus", "bad_heads", "bad_layers", "bad_batch",
                 "out_of_memory", "repeat", "refused", "bad_seq_length")
STATUS_COLUMN = Column("status", _dict, "",
                       "ok | out_of_memory | bad_num_gpus (also: tp x cp x dp not divisible by etp x ep, MoE) | "
                       "bad_heads (also: num_experts not divisible by ep, MoE) | bad_layers | bad_batch | bad_input | "
                       "repeat (the plan of an earlier row: a setting that differs has no effect here) | "
                       "refused (Megatron-LM refuses these settings on this plan: tp_comm_overlap at tp = 1, "
                       "cp > 1 without use_flash_attn, ep > 1 at tp > 1 without sequence_parallel, "
                       "overlap_moe_expert_parallel_comm at ep = 1, at pp > 1 without vpp or with full recomputation, cpu_offloading_num_layers at pp > 1, with recomputation or from num_layers on) | bad_seq_length (seq_length not divisible by 2 x cp)")

_OUT_DOCS = {
    "iteration_time_s": ("s", "one optimizer step over the global batch"),
    "tokens_per_s": ("tokens/s", "global_batch_size x seq_length / iteration_time_s"),
    "model_tflops_per_gpu": ("TFLOP/s", "model FLOPs (3 x forward, no recompute) per GPU per second"),
    "mfu": ("", "model FLOPs utilisation (PaLM, Chowdhery et al. 2022, App. B)"),
    "hfu": ("", "hardware FLOPs utilisation, counting recomputation (Megatron, Korthikanti et al. 2022)"),
    "memory_per_gpu_GiB": ("GiB", "peak memory of the fullest GPU: states + activations + reserved"),
    "model_states_GiB": ("GiB", "weights, gradients and Adam states (16 bytes/parameter; 18 with fp32 main gradients)"),
    "activations_GiB": ("GiB", "activations kept for backward (Korthikanti et al. 2022)"),
    "compute_s": ("s", "slowest stage's compute, all micro-batches"),
    "tp_comm_s": ("s", "slowest stage's tensor-parallel all-reduces"),
    "pp_comm_s": ("s", "slowest stage's pipeline send/recv"),
    "dp_comm_s": ("s", "data-parallel gradient all-reduce after the flush"),
    "bubble_s": ("s", "pipeline fill and drain (1F1B)"),
    "optimizer_s": ("s", "Adam step"),
    "overhead_s": ("s", "fixed host time per iteration (fitted; 0 in the shipped A100 calibration)"),
    "num_parameters": ("", "total parameters (a tied LM head counted once: model.memory.model_params)"),
    "num_micro_batches": ("", "micro-batches per pipeline per step"),
    "num_steps": ("", "optimizer steps to consume num_tokens"),
    "train_days": ("days", "wall-clock training time"),
    "gpu_hours": ("GPU-h", "num_gpus x training hours"),
    "cost_usd": ("USD", "gpu_hours x usd_per_gpu_hour"),
    "energy_kWh": ("kWh", "gpu_hours x TDP x PUE (an upper bound)"),
    "loss": ("nats/token", "Chinchilla L(N, D) = E + A/N^a + B/D^b (Hoffmann et al. 2022, Eq. 10)"),
    "cp_comm_s": ("s", "slowest stage's exposed context-parallel K/V exchange (ring steps beyond their attention "
                       "blocks, or the all-gathers and reduce-scatters)"),
    "ep_comm_s": ("s", "slowest stage's exposed MoE token dispatch and combine (all-to-all over ep, all-gather and "
                       "reduce-scatter over etp), forward, recomputed forward and backward; 0 for a dense model or "
                       "at ep = etp = 1"),
    "offload_s": ("s", "slowest stage's exposed GPU<->host copies beyond the compute they hide under: offloaded "
                       "activations (cpu_offloading_num_layers) and parameter shards and gradients "
                       "(param_cpu_offload); 0 with both off"),
}
INTEGER_OUTPUTS = ("num_parameters", "num_micro_batches", "num_steps")

OUTPUT_COLUMNS = tuple(
    Column(name, pa.int64() if name in INTEGER_OUTPUTS else pa.float64(), *_OUT_DOCS[name])
    for name in records.OUTPUT_NAMES
)
COLUMNS = INPUT_COLUMNS + (STATUS_COLUMN,) + OUTPUT_COLUMNS
SCHEMA = pa.schema([pa.field(c.name, c.type) for c in COLUMNS])
OUTPUT_NAMES = tuple(c.name for c in OUTPUT_COLUMNS)


# Columns the queries derive from a folder's rows and its GPU records (not stored in the part
# files; pareto -o and plan -o write them): vtrain_fast.analysis.query.with_memory_headroom.
DERIVED_COLUMNS = (
    Column("memory_headroom_GiB", pa.float64(), "GiB",
           "HBM capacity of the plan's GPU (the sweep's GPU record) minus memory_per_gpu_GiB; negative: out of memory"),
    Column("memory_tight", pa.bool_(), "",
           "memory_headroom_GiB below the memory margin (a fraction of the GPU's capacity, --memory-margin; "
           "default 0.05 for the tables' 'tight' mark)"),
)
DERIVED_NAMES = tuple(c.name for c in DERIVED_COLUMNS)
# The columns that only vtrain-fast writes, its results (evaluate -o, pareto -o, plan -o, optimal -o,
# advise -o; schedule's jobs.parquet some of them): a table of plans that holds one is read as
# earlier results, whose results are recomputed from the plan columns, never read as inputs.
RESULT_COLUMNS = ("status",) + OUTPUT_NAMES + DERIVED_NAMES


# Short headers of the printed tables (the Parquet files keep the full names); accepted wherever
# a column is named on the command line (resolve_column).
SHORT_NAMES = {
    "micro_batch_size": "mbs", "global_batch_size": "gbs", "num_tokens": "tokens",
    "memory_per_gpu_GiB": "mem_GiB", "iteration_time_s": "iter_s", "num_gpus": "gpus",
    "recompute": "recomp", "num_layers": "layers", "hidden_size": "hidden",
    "model_tflops_per_gpu": "TFLOPs/gpu", "measured_iteration_time_s": "measured_s",
    "memory_headroom_GiB": "free_GiB",
}
_FULL_NAMES = {short: full for full, short in SHORT_NAMES.items()}


def resolve_column(name: str) -> str:
    """The column a command-line name means: a table header's short form (``iter_s``,
    ``mem_GiB``, ``mbs``, ...) gives the full column name; other names are returned unchanged."""
    return _FULL_NAMES.get(name, name)


def markdown_table() -> str:
    """The README's column table."""
    lines = ["| column | unit | meaning |", "|---|---|---|"]
    for c in COLUMNS:
        lines.append(f"| `{c.name}` | {c.unit} | {c.doc} |")
    return "\n".join(lines)


# Numeric columns: the ones a frontier can rank and --where can compare with numbers.
NUMERIC_COLUMNS = tuple(c.name for c in COLUMNS if c.type in (pa.int64(), pa.float64()))
# A GPU's cluster values (presets with the spec's [cluster] overrides) that evaluate accepts as
# columns and pareto -o writes, so that a written plan evaluates to the same row.
CLUSTER_COLUMNS = ("gpus_per_node", "intra_node_GBps", "inter_node_Gbps", "usd_per_gpu_hour", "pue", "reserved_GiB")


def resolve_objectives(where: str, minimize, option: str = "--minimize") -> list[str]:
    """``--minimize`` values with full column names (a table header's short name is accepted,
    a leading ``-`` kept).

    Raises
    ------
    InputError
        A value that is not a numeric column, with the closest name as the fix; a column given
        twice (also as its short and its full name, or as ``COL`` and ``-COL``).
    """
    out = []
    for m in minimize:
        sign = "-" if m.startswith("-") else ""
        name = resolve_column(m[len(sign):])
        if name not in NUMERIC_COLUMNS:
            raise InputError(where, option, m, "numeric columns: " + ", ".join(NUMERIC_COLUMNS),
                             did_you_mean(name, NUMERIC_COLUMNS, "prefix a column with '-' to maximise it, e.g. -mfu"))
        twice = [o for o in out if o.lstrip("-") == name]
        if twice:
            raise InputError(where, option, m, "each column once (short and full names name the same column: "
                             f"{m!r} is {name}, given already as {twice[0]!r})",
                             f"drop the second {option} {m}")
        out.append(sign + name)
    return out


# The machine labels of a results folder (the keys of its manifest's machine_vectors).
def variant_label(preset, axes) -> str:
    """``name`` of a gpu-axis machine, followed by its values of the settings ``axes`` (those
    that vary in the sweep, :attr:`vtrain_fast.plan.spec.SweepSpec.setting_axes`), e.g.
    ``a100-sxm4-80gb sequence_parallel=true vpp=2``."""
    return " ".join([preset.name] + [f"{k}={str(getattr(preset, k)).lower()}" for k in axes])


def gpu_of_label(label: str, axes) -> str:
    """The GPU name of a :func:`variant_label` (``label`` without its values of the ``axes``): a
    GPU's own name may hold spaces (``a100-sxm4-40gb big``), so the label is read from its end."""
    return label.rsplit(" ", len(axes))[0] if axes else label
