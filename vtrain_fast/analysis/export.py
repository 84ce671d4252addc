"""Launch arguments for one plan: ``vtrain-fast export`` (issue 14).

A plan is one row of a results folder or of an evaluate-style table (the columns of
:data:`vtrain_fast.io.schema.SCHEMA`). :func:`megatron_args` writes the Megatron-LM
``pretrain_gpt.py`` command line that runs it (the settings' flags from their registry record,
:mod:`vtrain_fast.model.settings`). The flags are checked in the tests against the flags
Megatron-LM's parser accepts at the commit named in ``tests/data/megatron_lm_args.txt``
(written from its source by ``tests/data/make_framework_args.py``), and :func:`bridge_overrides`
the same plan as Megatron-Bridge / NeMo 2 ``ConfigContainer`` overrides, checked against the keys
in ``tests/data/megatron_bridge_keys.txt``. :func:`torchtitan_config` writes it as a torchtitan
recipe: a Python module whose function returns the ``Trainer.Config`` that runs the plan (torchtitan
configures a run in Python: ``--module`` names the module, ``--config`` the function), starting from
torchtitan's shipped llama3 recipe nearest to the plan; its attribute paths, imports, calls and
keywords are checked against the names in ``tests/data/torchtitan_names.txt``. Plans torchtitan
cannot run as priced (not Llama-shaped, MoE, ZeRO-1/2 data parallelism, FP8 delayed scaling, ring
context parallelism, ...) are refused with the setting to change.

What a plan holds that is not a framework argument (the assumed MoE load imbalance, the GPU
type, the cluster's price) is written as comments. Labels (a model or GPU name may hold quotes,
line breaks, ``$()``) are written through one rule per language (:func:`printable` in comments and
docstrings, :func:`_sh` for a shell word, :func:`_py` for a Python literal) and every text is read
back before it is returned; the launch line starts the priced world size (:func:`launch_geometry`).
Nothing here prices anything.
"""
from __future__ import annotations

import ast
import keyword
import math
import os
import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ..io.errors import InputError
from ..model.settings import BY_NAME as SETTINGS

# The Megatron-LM commit whose argument names the exports use (tests/data/megatron_lm_args.txt),
# and the Megatron-Bridge (NeMo 2's training library) commit of the override keys
# (tests/data/megatron_bridge_keys.txt).
MEGATRON_LM_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
MEGATRON_BRIDGE_COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
# The torchtitan commit whose names the torchtitan recipes use (tests/data/torchtitan_names.txt).
TORCHTITAN_COMMIT = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"
TARGETS = ("megatron", "bridge", "torchtitan")
# Megatron-LM flags whose Megatron-Bridge ConfigContainer key is not ``model.<flag's field>``: the
# key, or None where the override list leaves it out (a tokenizer setting; implied by another key).
# Bridge's own names: megatron/bridge/training/config.py (train, ddp, optimizer),
# training/comm_overlap.py (comm_overlap), models/gpt_provider.py (model).
BRIDGE_KEYS = {
    "--micro-batch-size": "train.micro_batch_size", "--global-batch-size": "train.global_batch_size",
    "--train-iters": "train.train_iters",
    "--overlap-grad-reduce": "ddp.overlap_grad_reduce", "--overlap-param-gather": "ddp.overlap_param_gather",
    "--use-precision-aware-optimizer": "optimizer.use_precision_aware_optimizer",
    "--exp-avg-dtype": "optimizer.exp_avg_dtype", "--exp-avg-sq-dtype": "optimizer.exp_avg_sq_dtype",
    "--optimizer-cpu-offload": "optimizer.optimizer_cpu_offload",
    "--optimizer-offload-fraction": "optimizer.optimizer_offload_fraction",
    "--overlap-cpu-optimizer-d2h-h2d": "optimizer.overlap_cpu_optimizer_d2h_h2d",
    "--use-megatron-fsdp": "ddp.use_megatron_fsdp",
    "--megatron-fsdp-main-grads-dtype": "ddp.megatron_fsdp_main_grads_dtype",
    "--data-parallel-sharding-strategy": "ddp.data_parallel_sharding_strategy",
    "--num-distributed-optimizer-instances": "ddp.num_distributed_optimizer_instances",
    "--tp-comm-overlap": "comm_overlap.tp_comm_overlap",
    "--overlap-moe-expert-parallel-comm": "comm_overlap.overlap_moe_expert_parallel_comm",
    "--num-experts": "model.num_moe_experts", "--swiglu": "model.gated_linear_unit",
    "--decoder-first-pipeline-num-layers": "model.num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "model.num_layers_in_last_pipeline_stage",
    "--tokenizer-type": None, "--max-position-embeddings": None, "--group-query-attention": None,
    "--bf16": None, "--fp16": None, "--fp8-format": None, "--fp8-recipe": None,   # the mixed_precision recipe says them
}
# The Megatron-Bridge mixed-precision recipe (training/mixed_precision.py, registered by name) of a
# plan's precision and FP8 recipe.
BRIDGE_PRECISION = {("bf16", None): "bf16_mixed", ("fp16", None): "fp16_mixed", ("fp8", "delayed"): "bf16_with_fp8_delayed_scaling_mixed",
                    ("fp8", "tensorwise"): "bf16_with_fp8_current_scaling_mixed",
                    ("fp8", "mxfp8"): "bf16_with_mxfp8_mixed"}


@dataclass(frozen=True)
class Export:
    """One plan's launch arguments.

    Attributes
    ----------
    target : str
        ``megatron`` (Megatron-LM flags), ``bridge`` (Megatron-Bridge / NeMo 2 overrides) or
        ``torchtitan`` (a torchtitan recipe module).
    args : tuple of str
        The arguments, in order: flags and their values (``megatron``), ``key=value`` overrides
        (``bridge``), the statements of the recipe function from the call of the recipe it starts
        from on (``torchtitan``: ``config = llama3_70b()``, ``config.parallelism.tensor_parallel_degree
        = 4``, ...).
    notes : tuple of str
        What the plan holds that no argument says (written as comments).
    launcher : str
        The ``torchrun`` line (nodes, GPUs per node) that starts it; for ``torchtitan`` with
        ``-m torchtitan.train --module M --config F``.
    source : str
        ``torchtitan``: the whole recipe module (what :meth:`text` returns); else empty.
    """

    target: str
    args: tuple[str, ...]
    notes: tuple[str, ...]
    launcher: str
    source: str = ""

    def text(self) -> str:
        """The export as a shell script (``megatron``: the notes as comments, then the launch line), an
        override list, one ``key=value`` a line after the notes (``bridge``), or a Python module
        (``torchtitan``: :attr:`source`). Every label is written through the escaping rule of its
        language (:func:`printable` in comments, :func:`_sh` in the shell line, :func:`_py` in Python)
        and the text is read back before it is returned (:func:`_checked_shell`,
        :func:`_checked_overrides`, :func:`_checked_python`).

        Raises
        ------
        InputError
            The text does not read back as written (a label that cannot be written safely).
        """
        if self.target == "torchtitan":
            return _checked_python(self.source, "torchtitan")
        notes = [line for n in self.notes for line in _comment(n, width=None)]
        if self.target == "bridge":
            return _checked_overrides("\n".join(notes + _comment(self.launcher, width=None) + list(self.args)) + "\n",
                                      self.args)
        lines = ["#!/bin/sh"] + notes
        pairs, i = [], 0
        while i < len(self.args):
            if i + 1 < len(self.args) and not self.args[i + 1].startswith("--"):
                pairs.append(f"{_sh(self.args[i])} {_sh(self.args[i + 1])}")
                i += 2
            else:
                pairs.append(_sh(self.args[i]))
                i += 1
        lines.append(" ".join(_sh(w) for w in self.launcher.split(" ")) + " pretrain_gpt.py \\")
        lines += [f"    {p} \\" for p in pairs[:-1]] + [f"    {pairs[-1]}"]
        argv = self.launcher.split(" ") + ["pretrain_gpt.py", *self.args]
        return _checked_shell("\n".join(lines) + "\n", argv)


# ---------------------------------------------------------------- writing values into files
# One escaping rule per language: printable (comments, docstrings and console lines), _sh (a shell
# word), _py (a Python literal); and each written text is read back before it is returned.

def printable(text) -> str:
    """``text`` with every character that is not printable (``str.isprintable``: line breaks,
    control characters, NUL, bidirectional overrides such as U+202E, ...) written as its Python
    escape (``\\n``, ``\\x00``, ``\\u202e``): one line that shows what the label holds and that
    a comment, a docstring or a terminal line can hold as it is."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


def _sh(value) -> str:
    """``value`` as one shell word (:func:`shlex.quote`)."""
    return shlex.quote(str(value))


def _py(value) -> str:
    """``value`` as Python source: strings as Python writes them (:func:`repr`; double-quoted where
    the string holds no ``"``, every character that is not printable escaped), lists of them, and
    other values by :func:`repr`."""
    if isinstance(value, str):
        text = repr(value)
        if text[0] == "'" and '"' not in value and "'" not in value:
            text = '"' + text[1:-1] + '"'
        return text
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    return repr(value)


def _comment(text: str, indent: str = "", width: int | None = 100) -> list[str]:
    """``text`` (:func:`printable`) as ``#`` comment lines under ``indent``, wrapped to ``width``
    characters (None: one line)."""
    text = printable(text)
    if width is None:
        return [f"{indent}# {text}"]
    return [indent + "# " + line for line in textwrap.wrap(text, width - len(indent) - 2, break_long_words=False,
                                                            break_on_hyphens=False)]


def _docstring(text: str, indent: str = "", width: int | None = 100) -> list[str]:
    """``text`` as a triple-quoted docstring under ``indent``, wrapped to ``width`` characters (None:
    one line): its labels :func:`printable`, ``\\`` and ``"`` escaped, so that no text ends it early."""
    body = '"""' + printable(text).replace("\\", "\\\\").replace('"', '\\"') + '"""'
    if width is None:
        return [indent + body]
    return [indent + line for line in textwrap.wrap(body, width - len(indent), break_long_words=False,
                                                     break_on_hyphens=False)]


def _unsafe(target: str, line: str, reason: str) -> InputError:
    """The refusal of a written text whose ``line`` does not read back (``reason``: what it must be)."""
    return InputError(f"--to {target}", "a line of the written file", line[:300], reason,
                      "rename the plan's model or GPU label (letters, digits, '-', '_', '.') and export again")


def _unprintable(text: str) -> str | None:
    """The first line of ``text`` that is not printable (:func:`printable`), else None."""
    return next((line for line in text.split("\n")[:-1] if not line.isprintable()), None)


def _checked_shell(text: str, argv: list[str]) -> str:
    """``text`` (the megatron script) if its comment lines are single printable lines and its
    command reads back (:func:`shlex.split`, the line continuations joined) as ``argv`` word by
    word; else an :class:`InputError`."""
    bad = _unprintable(text)
    if bad is not None:
        raise _unsafe("megatron", bad, "a line of printable characters (a comment holds one line)")
    command = [line for line in text.split("\n")[:-1] if not line.startswith("#")]
    joined = " ".join(line[:-2] if line.endswith(" \\") else line for line in command)
    if any(not line.endswith(" \\") for line in command[:-1]) or shlex.split(joined) != [str(a) for a in argv]:
        raise _unsafe("megatron", joined, "the command of the plan's arguments, each one shell word")
    return text


# A Megatron-Bridge override: a dotted key, then a value of letters, digits, _ . , + - and brackets.
_OVERRIDE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*=[A-Za-z0-9_.,+\-\[\]]+")


def _checked_overrides(text: str, overrides) -> str:
    """``text`` (the bridge override list) if its lines are printable, each ``#`` comment or one of
    ``overrides``, and every override a plain ``key=value`` (:data:`_OVERRIDE`); else an
    :class:`InputError`."""
    bad = _unprintable(text)
    if bad is not None:
        raise _unsafe("bridge", bad, "a line of printable characters (a comment holds one line)")
    body = [line for line in text.split("\n")[:-1] if not line.startswith("#")]
    wrong = [o for o in body if o not in overrides or not _OVERRIDE.fullmatch(o)]
    if wrong or body != list(overrides):
        raise _unsafe("bridge", (wrong or body or [""])[0], "one of the plan's overrides, key=value of letters, "
                      "digits and _ . , + - [ ]")
    return text


def _checked_python(source: str, target: str) -> str:
    """``source`` if it is one Python module (:func:`ast.parse`) of printable lines; else an
    :class:`InputError`."""
    bad = _unprintable(source)
    if bad is not None:
        raise _unsafe(target, bad, "a line of printable characters (a comment holds one line)")
    try:
        ast.parse(source)
    except SyntaxError as e:
        lines = source.split("\n")
        line = lines[e.lineno - 1] if e.lineno and e.lineno <= len(lines) else ""
        raise _unsafe(target, line, f"a line of a Python module (ast.parse: {e.msg}, line {e.lineno})") from None
    return source


def _get(row: dict, name: str):
    """``row[name]``, or the registry default of a setting the row's folder predates."""
    if name in row and row[name] is not None:
        return row[name]
    if name in SETTINGS:
        return SETTINGS[name].default
    return 0


def moe_layer_freq(num_layers: int, step: int, first_dense: int) -> str:
    """Megatron-LM's ``--moe-layer-freq`` for every ``step``-th layer from ``first_dense`` on: the int
    ``step`` when no layer is dense first, else the pattern text (``([0]*3+[1]*58)``)."""
    if first_dense == 0:
        return str(step)
    pattern = [1 if i >= first_dense and i % step == 0 else 0 for i in range(num_layers)]
    if step == 1:
        return f"([0]*{first_dense}+[1]*{num_layers - first_dense})"
    return "[" + ",".join(map(str, pattern)) + "]"


def _layers_per_virtual_stage(row: dict) -> int:
    """``--num-layers-per-virtual-pipeline-stage``: the layers (with the embedding and the loss where
    they count as layers) over pp x vpp chunks."""
    extra = int(bool(_get(row, "account_for_embedding_in_pipeline_split"))) + \
        int(bool(_get(row, "account_for_loss_in_pipeline_split")))
    return (int(row["num_layers"]) + extra) // (int(row["pp"]) * int(_get(row, "vpp")))


def launch_geometry(row: dict, gpus_per_node: int) -> tuple[int, int, tuple[str, ...]]:
    """The ``torchrun --nnodes N --nproc-per-node M`` that starts the plan's world size (tp x cp x pp
    x dp, the ranks it was priced with), and a note where it is not whole nodes; every export's
    launch line (Megatron-LM, Megatron-Bridge, torchtitan) is this one.

    torchrun starts ``M`` ranks on each of its ``N`` nodes, so ``N x M`` must be the world size. A
    world size of whole nodes runs as priced (``ceil(world / gpus_per_node)`` nodes of
    ``gpus_per_node``; one node of ``world`` ranks when it fits one). Another one runs on the nodes
    it was priced on, ``M = world / N`` ranks on each (12 ranks on 8-GPU nodes: 2 x 6), where ``N``
    divides it and every group the cost model kept inside a node (tp, tp x cp, tp x cp x dp, the
    expert group: consecutive ranks in Megatron-core's order) still fits whole in one node of ``M``;
    the note says so.

    Returns
    -------
    (int, int, tuple of str)
        Nodes, ranks per node, notes.

    Raises
    ------
    InputError
        ``num_gpus`` other than tp x cp x pp x dp; a world size that cannot be started as priced on
        the nodes it was priced on (naming a world size of whole nodes).
    """
    tp, cp, pp, dp = (int(row[k]) if row.get(k) is not None else 1 for k in ("tp", "cp", "pp", "dp"))
    world, gpn = tp * cp * pp * dp, int(gpus_per_node)
    given = row.get("num_gpus")
    if given is not None and int(given) != world:
        raise InputError("plan", "num_gpus", int(given), f"tp x cp x pp x dp = {world}", "fix num_gpus or tp, cp, pp, dp")
    if world <= gpn:
        return 1, world, ()
    nodes = -(-world // gpn)
    if world % gpn == 0:
        return nodes, gpn, ()
    groups = [("tp", tp), ("tp x cp", tp * cp), ("tp x cp x dp", tp * cp * dp)]
    if int(_get(row, "num_experts")) and int(_get(row, "ep")) > 1:
        groups.append(("etp x ep", (int(_get(row, "etp")) or tp) * int(_get(row, "ep"))))
    per = world // nodes
    split = [f"{name} = {span}" for name, span in groups if span <= gpn and per % span]
    if world % nodes or split:
        step = gpn // math.gcd(gpn, tp * cp * pp)
        whole = -(-dp // step) * step
        reason = (f"{world} ranks do not split evenly over the {nodes} nodes they were priced on" if world % nodes
                  else f"{world} ranks over {nodes} nodes are {per} a node, which splits the group of "
                       f"{split[0]} ranks the plan was priced with inside one node")
        raise InputError("plan", "world size (tp x cp x pp x dp)", world,
                         f"a multiple of the {gpn} GPUs per node, or one that runs as {nodes} nodes of equal "
                         "ranks (torchrun starts --nproc-per-node ranks on every node) keeping each group priced "
                         "inside a node inside one",
                         f"{reason}: price a world size of whole nodes, e.g. dp = {whole} "
                         f"({tp * cp * pp * whole} GPUs, with a global_batch_size that micro_batch_size x dp divides)")
    note = (f"launch: {world} ranks as priced, {nodes} nodes x {per} (torchrun starts the same number of ranks on "
            f"every node, and {world} is not a multiple of the {gpn} GPUs per node): {gpn - per} GPUs of each node "
            f"idle; the plan was priced with its ranks filling nodes of {gpn} in order ({nodes - 1} x {gpn} + "
            f"{world - (nodes - 1) * gpn}), so the traffic between its nodes is not exactly what was priced")
    return nodes, per, (note,)


def _priced_line(row: dict) -> str:
    """The header note every target starts with: the model label, the GPU and the predicted time (the label
    goes through the target's escaping rule like every other note)."""
    model = row.get("model")
    return (f"model {model}: " if model not in (None, "") else "") + (
        f"priced on {row.get('gpu', '?')}: {row.get('iteration_time_s', float('nan')):.4g} s per iteration predicted")


def megatron_args(row: dict, gpus_per_node: int, extra_notes=()) -> Export:
    """The Megatron-LM ``pretrain_gpt.py`` arguments of a plan.

    Parameters
    ----------
    row : dict
        One plan: column name -> value (a results folder's or evaluate's columns).
    gpus_per_node : int
        GPUs per node of its cluster (the ``torchrun --nproc-per-node``).
    extra_notes : sequence of str
        More comments (how the plan was picked: :func:`read_plan`).

    Returns
    -------
    Export
        Flags named as Megatron-LM names them at :data:`MEGATRON_LM_COMMIT`.
    """
    g = lambda k: _get(row, k)      # noqa: E731
    L, h, a, qg = int(row["num_layers"]), int(row["hidden_size"]), int(row["num_attention_heads"]), int(row["num_query_groups"])
    a_ = ["--num-layers", str(L), "--hidden-size", str(h), "--num-attention-heads", str(a),
          "--ffn-hidden-size", str(int(row["ffn_hidden_size"])), "--seq-length", str(int(row["seq_length"])),
          "--max-position-embeddings", str(int(row["seq_length"])),
          "--tokenizer-type", "NullTokenizer", "--vocab-size", str(int(row["vocab_size"]))]
    notes = [f"vtrain-fast export: the plan as Megatron-LM (NVIDIA/Megatron-LM {MEGATRON_LM_COMMIT[:8]}) runs it; "
             "add your data, tokenizer, optimizer and checkpoint arguments",
             _priced_line(row)]
    notes += list(extra_notes)
    mla = bool(g("multi_latent_attention"))
    if qg != a and not mla:
        a_ += ["--group-query-attention", "--num-query-groups", str(qg)]
    kv = int(g("kv_channels"))
    if kv and not mla and (h % a or kv != h // a):
        a_ += ["--kv-channels", str(kv)]
    if bool(g("gated_mlp")):
        a_ += ["--swiglu"]
    if g("normalization") == "RMSNorm":
        a_ += ["--normalization", "RMSNorm"]
    if g("position_embedding_type") == "rope":
        a_ += ["--position-embedding-type", "rope"]
    if not bool(row.get("add_bias_linear", True)):
        a_ += ["--disable-bias-linear"]
    if bool(g("untie_embeddings_and_output_weights")):
        a_ += ["--untie-embeddings-and-output-weights"]
    experts = int(g("num_experts"))
    if experts:
        a_ += ["--num-experts", str(experts), "--moe-router-topk", str(int(g("moe_router_topk"))), "--moe-grouped-gemm",
               "--moe-layer-freq", moe_layer_freq(L, int(g("moe_layer_step")) or 1, int(g("moe_first_dense_layers")))]
        if int(g("moe_ffn_hidden_size")):
            a_ += ["--moe-ffn-hidden-size", str(int(g("moe_ffn_hidden_size")))]
        if int(g("moe_shared_expert_intermediate_size")):
            a_ += ["--moe-shared-expert-intermediate-size", str(int(g("moe_shared_expert_intermediate_size")))]
        a_ += ["--moe-token-dispatcher-type", str(g("moe_token_dispatcher_type"))]
        if bool(g("overlap_moe_expert_parallel_comm")):
            a_ += ["--overlap-moe-expert-parallel-comm"]
        if float(g("moe_expert_capacity_factor")) > 0.0:
            a_ += ["--moe-expert-capacity-factor", f"{float(g('moe_expert_capacity_factor')):g}"]
            if bool(g("moe_pad_expert_input_to_capacity")):
                a_ += ["--moe-pad-expert-input-to-capacity"]
        if float(g("moe_load_imbalance")) != 1.0:
            notes.append(f"priced with the busiest expert at {float(g('moe_load_imbalance')):g} x the mean "
                         "(moe_load_imbalance, an assumption: no framework argument)")
    if mla:
        a_ += ["--multi-latent-attention"]
        if int(g("q_lora_rank")):
            a_ += ["--q-lora-rank", str(int(g("q_lora_rank")))]
        a_ += ["--kv-lora-rank", str(int(g("kv_lora_rank"))), "--qk-head-dim", str(int(g("qk_head_dim"))),
               "--qk-pos-emb-head-dim", str(int(g("qk_pos_emb_head_dim"))), "--v-head-dim", str(int(g("v_head_dim")))]
    # the plan
    tp, pp, cp = int(row["tp"]), int(row["pp"]), int(row["cp"]) if row.get("cp") is not None else 1
    a_ += ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
           "--context-parallel-size", str(cp)]
    if experts:
        a_ += ["--expert-model-parallel-size", str(int(g("ep")))]
        if int(g("etp")):
            a_ += ["--expert-tensor-parallel-size", str(int(g("etp")))]
    if pp > 1 and int(g("vpp")) > 1:
        a_ += ["--num-layers-per-virtual-pipeline-stage", str(_layers_per_virtual_stage(row))]
        if not bool(g("overlap_p2p_comm")):
            a_ += [SETTINGS["overlap_p2p_comm"].megatron]        # Megatron-core overlaps them by default
    for name in ("first_pipeline_num_layers", "last_pipeline_num_layers"):
        if pp > 1 and int(g(name)):
            a_ += [SETTINGS[name].megatron, str(int(g(name)))]
    for name in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if pp > 1 and bool(g(name)):
            a_ += [SETTINGS[name].megatron]
    if cp > 1:
        a_ += [SETTINGS["cp_comm_type"].megatron, str(g("cp_comm_type"))]
    steps = row.get("num_steps")
    a_ += ["--micro-batch-size", str(int(row["micro_batch_size"])), "--global-batch-size", str(int(row["global_batch_size"]))]
    if steps is not None and not (isinstance(steps, float) and math.isnan(steps)):
        a_ += ["--train-iters", str(int(steps))]
    # precision: Megatron-LM trains in fp32 without --bf16 / --fp16 (args.params_dtype = torch.float)
    prec = str(g("precision"))
    if prec in ("bf16", "fp8"):
        a_ += ["--bf16"]
    elif prec == "fp16":
        a_ += ["--fp16"]
        notes.append("precision fp16: Megatron-LM's dynamic loss scaler with its defaults (--initial-loss-scale 2^32, "
                     "--loss-scale-window 1000, --hysteresis 2); the price assumes 17 skipped steps at the start and "
                     "2 per 1,000 after, counted in --train-iters")
    elif prec == "fp32":
        notes.append("precision fp32: no --bf16 / --fp16 (fp32 weights); priced without TF32, PyTorch's default since "
                     "1.12: NVIDIA's PyTorch containers turn TF32 on (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1), so set "
                     "NVIDIA_TF32_OVERRIDE=0 there")
    else:
        notes.append("precision tf32: fp32 weights with TF32 GEMMs; Megatron-LM has no flag for it: run in NVIDIA's "
                     "PyTorch containers (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1) or export that variable")
    # gradients: Megatron-LM keeps fp32 main gradients under --bf16 unless --grad-reduce-in-bf16
    # (accumulate_allreduce_grads_in_fp32); fp16 keeps fp16 gradients, fp32 / tf32 fp32 ones
    bf16_grads = prec in ("bf16", "fp8") and bool(g("grad_reduce_in_bf16"))
    if bf16_grads:
        a_ += [SETTINGS["grad_reduce_in_bf16"].megatron]
    if prec == "fp8":
        a_ += [SETTINGS["precision"].megatron, "hybrid", SETTINGS["fp8_recipe"].megatron, str(g("fp8_recipe"))]
        start, end = int(g("num_layers_at_start_in_bf16")), int(g("num_layers_at_end_in_bf16"))
        if start or end:
            a_ += ["--first-last-layers-bf16", SETTINGS["num_layers_at_start_in_bf16"].megatron, str(start),
                   SETTINGS["num_layers_at_end_in_bf16"].megatron, str(end)]
    # attention kernel: TE's FlashAttention, or Megatron-core's own attention (the unfused path the
    # cost model times without use_flash_attn)
    # (FlashAttention takes 16-bit tensors only: under fp32 / tf32 the plan was priced unfused)
    flash = bool(g("use_flash_attn")) and prec not in ("fp32", "tf32")
    a_ += ["--attention-backend", "flash" if flash else "local"]
    # recomputation
    rc = str(row.get("recompute", "none"))
    if rc == "full":
        a_ += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif rc == "selective":
        a_ += ["--recompute-granularity", "selective"]     # Megatron-core's default modules: core_attn
    # switches named by their registry record
    for name in ("sequence_parallel", "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather"):
        if bool(g(name)) and not (name in ("sequence_parallel", "tp_comm_overlap") and tp == 1):
            a_ += [SETTINGS[name].megatron]
    zero = int(g("zero_stage"))
    if zero >= 2:
        a_ += ["--use-megatron-fsdp", SETTINGS["zero_stage"].megatron, ("optim_grads", "optim_grads_params")[zero - 2]]
        if prec in ("bf16", "fp8") and not bf16_grads:
            # Megatron-FSDP ignores accumulate_allreduce_grads_in_fp32: its main gradients follow the
            # parameters (bf16) unless told (megatron/core/distributed/fsdp/mcore_fsdp_adapter.py)
            a_ += ["--megatron-fsdp-main-grads-dtype", "fp32"]
    elif zero == 1 or bool(g("distributed_optimizer")):
        a_ += [SETTINGS["distributed_optimizer"].megatron]
    shard = int(g("dp_shard"))
    if shard and zero >= 1:
        a_ += [SETTINGS["dp_shard"].megatron, str(int(row["dp"]) * cp // shard)]
    if bool(g("use_precision_aware_optimizer")):
        a_ += [SETTINGS["use_precision_aware_optimizer"].megatron]
        for name in ("exp_avg_dtype", "exp_avg_sq_dtype"):
            if g(name) != SETTINGS[name].default:
                a_ += [SETTINGS[name].megatron, str(g(name))]
        if bool(g("optimizer_cpu_offload")):
            a_ += [SETTINGS["optimizer_cpu_offload"].megatron]
            if float(g("optimizer_offload_fraction")) != 1.0:
                a_ += [SETTINGS["optimizer_offload_fraction"].megatron, f"{float(g('optimizer_offload_fraction')):g}"]
            if bool(g("overlap_cpu_optimizer_d2h_h2d")):
                a_ += [SETTINGS["overlap_cpu_optimizer_d2h_h2d"].megatron]
    # activation offloading (Megatron-LM sets --cpu-offloading itself from the count)
    k_off = int(g("cpu_offloading_num_layers"))
    if k_off > 0:
        a_ += [SETTINGS["cpu_offloading_num_layers"].megatron, str(k_off)]
        notes.append(f"cpu_offloading_num_layers {k_off}: priced with Transformer Engine >= 2.10's offload schedule "
                     f"(activation memory of num_layers - {k_off} layers); older TE (cpu_offload_v1) keeps one layer "
                     "more in flight and spreads the copies differently")
    if bool(g("param_cpu_offload")):
        raise InputError("plan", "param_cpu_offload", True,
                         "false for --to megatron and --to bridge (Megatron-LM has no parameter offloading: its CPU "
                         "offloads are the optimizer's, --optimizer-cpu-offload, and the activations', "
                         "--cpu-offloading-num-layers)",
                         "export the plan with --to torchtitan (training.enable_cpu_offload: FSDP2's CPUOffloadPolicy, "
                         "what param_cpu_offload prices), or sweep param_cpu_offload = false")
    if tp > 1 and not bool(g("sequence_parallel")):
        notes.append("async_tensor_model_parallel_allreduce: no flag in Megatron-core, whose TP linears always overlap "
                     "the backward all-reduce; " + ("priced so" if bool(g("async_tensor_model_parallel_allreduce")) else
                                                    "priced without it (exposed), so this run may be faster than priced"))
    nodes, per_node, placed = launch_geometry(row, gpus_per_node)
    notes += placed
    launcher = f"torchrun --nnodes {nodes} --nproc-per-node {per_node}"
    return Export("megatron", tuple(a_), tuple(notes), launcher)


def _bridge_value(value: str) -> str:
    """A Megatron-LM flag value as a Hydra-style override value: Megatron-LM's ``--moe-layer-freq``
    pattern text as the list it evaluates to (``([0]*3+[1]*58)`` -> ``[0,0,0,1,...]``)."""
    from ..model.moe import parse_layer_pattern
    if value.startswith("(") or value.startswith("["):
        pattern = parse_layer_pattern(value)
        if pattern is not None:
            return "[" + ",".join(map(str, pattern)) + "]"
    return value


def bridge_overrides(row: dict, gpus_per_node: int, extra_notes=()) -> Export:
    """The plan as Megatron-Bridge (NeMo 2's training library) ``ConfigContainer`` overrides,
    ``section.field=value`` (Hydra style, as Megatron-Bridge's ``scripts/performance`` and recipes take
    them): each flag of :func:`megatron_args` under its Bridge key (:data:`BRIDGE_KEYS`, else
    ``model.<the flag's field>``, Megatron-core's ``TransformerConfig`` name), switches as ``=true``,
    ``--disable-bias-linear`` as ``model.add_bias_linear=false``, ``--untie-embeddings-and-output-weights``
    as ``model.share_embeddings_and_output_weights=false``, ``--no-overlap-p2p-communication`` as
    ``model.overlap_p2p_comm=false``, vpp as ``model.virtual_pipeline_model_parallel_size``, the distributed
    optimizer in ``ddp`` and ``optimizer``, and the precision as a ``mixed_precision`` recipe
    (:data:`BRIDGE_PRECISION`). Keys are Megatron-Bridge's at :data:`MEGATRON_BRIDGE_COMMIT`.

    Returns
    -------
    Export
        ``key=value`` strings; the notes say what an override cannot (the activation function of a
        SwiGLU model: start from a SwiGLU recipe; the tokenizer).
    """
    m = megatron_args(row, gpus_per_node, extra_notes)
    flags, i = [], 0
    while i < len(m.args):
        value = m.args[i + 1] if i + 1 < len(m.args) and not m.args[i + 1].startswith("--") else None
        flags.append((m.args[i], value))
        i += 2 if value is not None else 1
    out = []
    for flag, value in flags:
        if flag == "--disable-bias-linear":
            out.append("model.add_bias_linear=false")
        elif flag == "--untie-embeddings-and-output-weights":
            out.append("model.share_embeddings_and_output_weights=false")
        elif flag == "--no-overlap-p2p-communication":
            out.append("model.overlap_p2p_comm=false")
        elif flag == "--num-layers-per-virtual-pipeline-stage":
            out.append(f"model.virtual_pipeline_model_parallel_size={int(_get(row, 'vpp'))}")
        elif flag == "--grad-reduce-in-bf16":
            out.append("ddp.grad_reduce_in_fp32=false")
        elif flag == "--use-distributed-optimizer":
            out += ["ddp.use_distributed_optimizer=true", "optimizer.use_distributed_optimizer=true"]
        else:
            key = BRIDGE_KEYS.get(flag, "model." + flag[2:].replace("-", "_"))
            if key is not None:
                out.append(f"{key}={'true' if value is None else _bridge_value(value)}")
    prec = str(_get(row, "precision"))
    if prec not in ("bf16", "fp8", "fp16"):
        raise InputError("plan", "precision", prec, "bf16, fp16 or fp8 for --to bridge (Megatron-Bridge ships "
                         "mixed-precision recipes only, training/mixed_precision.py)",
                         "export this plan with --to megatron (Megatron-LM trains in fp32 without --bf16), or sweep "
                         "precision = \"bf16\"")
    fp8 = prec == "fp8"
    out.append("mixed_precision=" + BRIDGE_PRECISION[("fp8", str(_get(row, "fp8_recipe"))) if fp8 else (prec, None)])
    notes = [f"vtrain-fast export: the plan as Megatron-Bridge / NeMo 2 ConfigContainer overrides (NVIDIA-NeMo/"
             f"Megatron-Bridge {MEGATRON_BRIDGE_COMMIT[:8]}); start from your model's recipe and add these"]
    notes += [n for n in m.notes if not n.startswith("vtrain-fast export")]
    if ("--grad-reduce-in-bf16", None) in flags:
        notes.append("grad_reduce_in_bf16: Megatron-Bridge's mixed_precision recipe carries its own "
                     "grad_reduce_in_fp32 (bf16_mixed and the FP8 recipes: true) and copies it onto ddp when the "
                     "config is finalized (training/config.py, training/mixed_precision.py): build the recipe "
                     "object with grad_reduce_in_fp32=False, or ddp.grad_reduce_in_fp32=false is overwritten")
    if ("--swiglu", None) in flags:
        notes.append("SwiGLU: model.gated_linear_unit=true needs model.activation_func = silu, which an override "
                     "cannot set: start from a SwiGLU recipe (Llama, Qwen, Mixtral, DeepSeek)")
    notes.append("tokenizer: the plan is priced with vocab_size above; set your tokenizer in the recipe")
    return Export("bridge", tuple(out), tuple(notes), m.launcher)


# torchtitan's llama3 flavors (torchtitan/models/llama3/__init__.py, ``llama3_configs``): the numbers
# each flavor's function builds its model from (the FFN size through ``compute_ffn_hidden_dim``); the
# tests check them against tests/data/torchtitan_names.txt.
TORCHTITAN_FLAVORS = {
    "debugmodel": dict(dim=256, n_heads=16, n_kv_heads=16, n_layers=6, vocab_size=2048, multiple_of=256,
                       ffn_dim_multiplier=None, weight_tying=False),
    "1B": dict(dim=2048, n_heads=32, n_kv_heads=8, n_layers=16, vocab_size=128256, multiple_of=1024,
               ffn_dim_multiplier=1.5, weight_tying=True),
    "3B": dict(dim=3072, n_heads=24, n_kv_heads=8, n_layers=28, vocab_size=128256, multiple_of=1024,
               ffn_dim_multiplier=1.0, weight_tying=True),
    "8B": dict(dim=4096, n_heads=32, n_kv_heads=8, n_layers=32, vocab_size=128256, multiple_of=1024,
               ffn_dim_multiplier=1.3, weight_tying=False),
    "70B": dict(dim=8192, n_heads=64, n_kv_heads=8, n_layers=80, vocab_size=128256, multiple_of=4096,
                ffn_dim_multiplier=1.3, weight_tying=False),
    "405B": dict(dim=16384, n_heads=128, n_kv_heads=8, n_layers=126, vocab_size=128256, multiple_of=4096,
                 ffn_dim_multiplier=1.2, weight_tying=False),
}
# torchtitan's full-size llama3 recipes (torchtitan/models/llama3/config_registry.py) and the flavor
# each builds; an export starts from the one nearest to the plan.
TORCHTITAN_RECIPES = {"llama3_8b": "8B", "llama3_70b": "70B", "llama3_405b": "405B"}
# The RoPE every llama3 flavor builds (ComplexRoPE.Config): a model of the plan's own shape gets it too.
TORCHTITAN_ROPE = dict(max_context_length=131072, theta=500000, scaling="llama")
# The recipe function an export defines (torchtitan's --config) and the module name (--module) it
# is written for when no file name says another.
TORCHTITAN_FUNCTION = "vtrain_fast_plan"
TORCHTITAN_MODULE = "vtrain_fast_recipe"
# The flavor name under which a model of the plan's own shape is added to ``llama3_configs``.
TORCHTITAN_OWN_FLAVOR = "vtrain_fast"


def torchtitan_ffn_hidden_dim(dim: int, multiple_of: int, ffn_dim_multiplier: float | None = None) -> int:
    """The SwiGLU hidden size of a torchtitan llama3 flavor, by the rule of ``compute_ffn_hidden_dim``
    (torchtitan/models/common/feed_forward.py): two thirds of ``4 dim`` (truncated), times
    ``ffn_dim_multiplier`` (truncated), rounded up to a multiple of ``multiple_of``. The 8B, 70B and
    405B flavors give Llama 3's 14,336, 28,672 and 53,248."""
    hidden = int(8 * dim / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def torchtitan_flavor(row: dict) -> str | None:
    """The torchtitan llama3 flavor (:data:`TORCHTITAN_FLAVORS`) whose model is the plan's exactly:
    layers, dim, heads, KV heads, FFN size, vocabulary and weight tying; None if none is."""
    shape = (int(row["num_layers"]), int(row["hidden_size"]), int(row["num_attention_heads"]),
             int(row["num_query_groups"]), int(row["ffn_hidden_size"]), int(row["vocab_size"]),
             not bool(_get(row, "untie_embeddings_and_output_weights")))
    for name, f in TORCHTITAN_FLAVORS.items():
        if shape == (f["n_layers"], f["dim"], f["n_heads"], f["n_kv_heads"],
                     torchtitan_ffn_hidden_dim(f["dim"], f["multiple_of"], f["ffn_dim_multiplier"]),
                     f["vocab_size"], f["weight_tying"]):
            return name
    return None


def torchtitan_recipe(row: dict) -> str:
    """The torchtitan recipe (:data:`TORCHTITAN_RECIPES`) an export of the plan starts from: the one
    whose flavor is nearest in layers x dim^2 (a size measure; ratio, not difference)."""
    size = int(row["num_layers"]) * int(row["hidden_size"]) ** 2

    def distance(recipe):
        f = TORCHTITAN_FLAVORS[TORCHTITAN_RECIPES[recipe]]
        return abs(math.log(size / (f["n_layers"] * f["dim"] ** 2)))
    return min(TORCHTITAN_RECIPES, key=distance)


def pipeline_chunk_layers(row: dict) -> list[int]:
    """The transformer layers of each of the plan's pp x vpp model chunks, in virtual-stage order
    (chunk ``c`` of pipeline rank ``r`` is virtual stage ``c pp + r``, Megatron-core's interleaving),
    as the cost model splits them (:func:`vtrain_fast.model.layer_split.stage_layers`, ``chunks_split``):
    evenly; with ``first_pipeline_num_layers`` / ``last_pipeline_num_layers`` those stages take that
    many and the others split the rest, each stage's layers split evenly over its chunks; with the
    embedding / loss counted as layers, one fewer in the first / last chunk."""
    L, p = int(row["num_layers"]), int(row["pp"])
    v = int(_get(row, "vpp")) if p > 1 else 1
    e = int(bool(_get(row, "account_for_embedding_in_pipeline_split")))
    lo = int(bool(_get(row, "account_for_loss_in_pipeline_split")))
    if p == 1:
        return [L]
    if e or lo:
        out = [(L + e + lo) // (p * v)] * (p * v)
        out[0] -= e
        out[-1] -= lo
        return out
    first, last = int(_get(row, "first_pipeline_num_layers")), int(_get(row, "last_pipeline_num_layers"))
    if not first and not last:
        return [L // (p * v)] * (p * v)
    others = p - int(first > 0) - int(last > 0)
    mid = (L - first - last) // others if others else 0
    stage = [mid] * p
    if first:
        stage[0] = first
    if last:
        stage[-1] = last
    return [stage[k % p] // v for k in range(p * v)]


def torchtitan_pipeline_split(num_layers: int, num_stages: int, first_less: int, last_less: int) -> list[int]:
    """The transformer layers torchtitan gives each of ``num_stages`` pipeline stages from
    ``pipeline_parallel_first_stage_less_layers`` / ``last_stage_less_layers`` (the rule of
    ``_generate_llm_fqn_per_model_part``, torchtitan/distributed/pipeline_parallel.py): the
    embedding and the output layer count as that many layers, the layers and they together split
    evenly over the stages (the first stages one more where they do not divide), and the first and
    last stages hold that many fewer layers."""
    base, extra = divmod(num_layers + first_less + last_less, num_stages)
    out = [base + int(i < extra) for i in range(num_stages)]
    out[0] -= first_less
    out[-1] -= last_less
    return out


def _torchtitan_stage_fields(chunks: list[int]) -> tuple[int, int, int] | None:
    """``(pipeline_parallel_layers_per_stage, first_stage_less_layers, last_stage_less_layers)`` with
    which torchtitan splits the layers as ``chunks`` (one count per virtual stage), or None when
    those three numbers cannot say it (the middle stages unequal: an uneven first or last stage
    interleaved over several chunks)."""
    mids = chunks[1:-1]
    if mids and len(set(mids)) != 1:
        return None
    per = mids[0] if mids else max(chunks)
    first_less, last_less = per - chunks[0], per - chunks[-1]
    if first_less < 0 or last_less < 0:
        return None
    if torchtitan_pipeline_split(sum(chunks), len(chunks), first_less, last_less) != chunks:
        return None
    return per, first_less, last_less


def torchtitan_module_fqns(chunks: list[int]) -> list[list[str]]:
    """torchtitan's ``module_fqns_per_model_part`` for layer counts ``chunks``: each chunk's
    ``layers.<i>`` in order, ``tok_embeddings`` in the first and ``norm`` and ``lm_head`` in the
    last (the module names of torchtitan's ``Decoder``)."""
    out, start = [], 0
    for k, n in enumerate(chunks):
        names = [f"layers.{i}" for i in range(start, start + n)]
        if k == 0:
            names = ["tok_embeddings"] + names
        if k == len(chunks) - 1:
            names += ["norm", "lm_head"]
        out.append(names)
        start += n
    return out


def _titan_refuse(row: dict, key: str, value, allowed: str, fix: str):
    raise InputError(f"--to torchtitan ({printable(row.get('model', 'the plan'))})", key, value, allowed, fix)


def _torchtitan_check(row: dict) -> None:
    """Refuse a plan torchtitan cannot run as it was priced (:func:`torchtitan_config`)."""
    g = lambda k: _get(row, k)      # noqa: E731
    other = ("export it with --to megatron or --to bridge (torchtitan's other models, qwen3, deepseek_v3, "
             "gpt_oss, ..., are not mapped yet)")
    llama = "torchtitan's llama3 model: RMSNorm, SwiGLU, RoPE, linear layers without biases"
    if g("normalization") != "RMSNorm":
        _titan_refuse(row, "normalization", g("normalization"), f"'RMSNorm' ({llama})", other)
    if not bool(g("gated_mlp")):
        _titan_refuse(row, "gated_mlp", False, f"true, a SwiGLU MLP ({llama})", other)
    if g("position_embedding_type") != "rope":
        _titan_refuse(row, "position_embedding_type", g("position_embedding_type"), f"'rope' ({llama})", other)
    if bool(row.get("add_bias_linear", True)):
        _titan_refuse(row, "add_bias_linear", True, f"false ({llama})", other)
    if bool(g("multi_latent_attention")):
        _titan_refuse(row, "multi_latent_attention", True, "false (torchtitan's llama3 attention is GQA; its "
                      "deepseek_v3 model's MLA is not mapped yet)", "export it with --to megatron or --to bridge")
    if bool(g("use_precision_aware_optimizer")):
        _titan_refuse(row, "use_precision_aware_optimizer", True, "false (torchtitan keeps an fp32 master weight; "
                      "its only low-precision states, bf16 moments with optimizer.implementation = "
                      "'fused_opt_states_bf16', docs/bf16_optimizer_states.md, are not mapped yet)",
                      "export it with --to megatron or --to bridge, or sweep without the precision-aware optimizer")
    if str(g("precision")) not in ("bf16", "fp8"):
        _titan_refuse(row, "precision", g("precision"), "bf16 or fp8 (torchtitan trains in bf16 mixed precision, "
                      "training.mixed_precision_param; its fp16 has no loss scaler and its fp32 / tf32 runs are not "
                      "mapped yet)", "export it with --to megatron, or sweep precision = \"bf16\"")
    if bool(g("grad_reduce_in_bf16")):
        _titan_refuse(row, "grad_reduce_in_bf16", True, "false (torchtitan reduces the gradients in float32: "
                      "training.mixed_precision_reduce accepts only \"float32\", torchtitan/config/configs.py)",
                      "export it with --to megatron or --to bridge, or sweep grad_reduce_in_bf16 = false")
    if int(g("num_experts")):
        _titan_refuse(row, "num_experts", int(g("num_experts")), "0, a dense model (torchtitan's MoE models, "
                      "qwen3, deepseek_v3, gpt_oss, are not mapped yet)", "export it with --to megatron or --to bridge")
    h, a, qg = int(row["hidden_size"]), int(row["num_attention_heads"]), int(row["num_query_groups"])
    kv = int(g("kv_channels"))
    if h % a or (kv and kv != h // a):
        _titan_refuse(row, "kv_channels", kv, f"hidden_size / num_attention_heads = {h / a:g} (torchtitan's llama3 "
                      "flavors build heads of dim // n_heads)", "a model whose head size is hidden_size / heads")
    if a % qg:
        _titan_refuse(row, "num_query_groups", qg, f"a divisor of num_attention_heads ({a})",
                      "a model whose heads split evenly into its query groups")
    tp, cp, pp, dp = int(row["tp"]), int(row.get("cp") or 1), int(row["pp"]), int(row["dp"])
    if a % tp or qg % tp:
        _titan_refuse(row, "tp", tp, f"a divisor of the heads ({a}) and KV heads ({qg}) (torchtitan's "
                      "Decoder.Config.update_from_config)", "sweep a tp that divides both")
    if pp > 1 and not bool(g("untie_embeddings_and_output_weights")):
        _titan_refuse(row, "untie_embeddings_and_output_weights", False, "true with pp > 1 (torchtitan: weight "
                      "tying is not supported with pipeline parallelism, models/common/decoder.py)",
                      "sweep pp = 1 for this tied-embedding model")
    if cp > 1 and g("cp_comm_type") != "all_gather":
        _titan_refuse(row, "cp_comm_type", g("cp_comm_type"), "'all_gather' (torchtitan's context parallelism "
                      "all-gathers K and V over the cp ranks before the attention, models/common/decoder_sharding.py; "
                      "no ring attention)", "sweep with cp_comm_type = 'all_gather'")
    zero = int(g("zero_stage")) or (1 if bool(g("distributed_optimizer")) else 0)
    if dp * cp > 1 and zero in (1, 2):
        # distributed_optimizer is ZeRO-1 (a sweep may record it as zero_stage 1): name what the user set
        by_flag = zero == 1 and bool(g("distributed_optimizer"))
        key, value = ("distributed_optimizer", True) if by_flag else ("zero_stage", zero)
        _titan_refuse(row, key, value, "zero_stage 3 (FSDP2: parameters, gradients and optimizer states sharded) "
                      "or 0 (replicas, DDP) with dp x cp > 1: torchtitan's data parallelism is FSDP2's fully_shard, "
                      "which has no ZeRO-1 or ZeRO-2" + (" (distributed_optimizer = true is ZeRO-1: Megatron's "
                      "distributed optimizer shards the optimizer states)" if by_flag else ""),
                      "sweep with zero_stage = 3 (or [0, 3]) for FSDP2" + (", or distributed_optimizer = false for "
                      "replicas" if by_flag else ""))
    if zero == 0 and cp > 1:
        _titan_refuse(row, "zero_stage", 0, "3 with cp > 1 (torchtitan shards the parameters over the cp ranks: "
                      "FSDP2 over dp_shard x cp, distributed/parallel_dims.py)",
                      f"sweep with zero_stage = 3 and dp_shard = {cp} (the cp ranks; replicas over dp) to price that")
    shard = int(g("dp_shard"))
    if zero == 3 and shard and shard % cp:
        _titan_refuse(row, "dp_shard", shard, f"a multiple of cp = {cp} (torchtitan's FSDP2 shard group is "
                      "data_parallel_shard_degree x cp ranks)", f"sweep dp_shard = {cp * max(1, shard // cp)} "
                      f"or another multiple of {cp}")
    if g("precision") == "fp8" and g("fp8_recipe") == "delayed":
        _titan_refuse(row, "fp8_recipe", "delayed", "'tensorwise' (Float8LinearConverter, rowwise scaling) or "
                      "'mxfp8' (MXFP8LinearConverter): torchtitan has no delayed scaling (an amax history)",
                      "sweep with fp8_recipe = 'tensorwise' (current scaling), 'mxfp8' on Blackwell, or precision = 'bf16'")
    sp = tp > 1 and bool(g("sequence_parallel"))
    divisor = (tp if sp else 1) * (2 * cp if cp > 1 else 1)
    tokens = int(row["micro_batch_size"]) * int(row["seq_length"])
    if tokens % divisor:
        _titan_refuse(row, "micro_batch_size", int(row["micro_batch_size"]),
                      f"micro_batch_size x seq_length divisible by {divisor} (torchtitan: the tokens of a micro-batch "
                      "split over tp (sequence parallel) x 2 cp)", "sweep another micro_batch_size or seq_length")
    if int(g("cpu_offloading_num_layers")) > 0:
        _titan_refuse(row, "cpu_offloading_num_layers", int(g("cpu_offloading_num_layers")),
                      "0 (torchtitan has no layer-wise activation offloading; its CPU offload, "
                      "training.enable_cpu_offload, is FSDP2's parameter offloading: param_cpu_offload)",
                      "export it with --to megatron or --to bridge, or sweep cpu_offloading_num_layers = 0")
    chunks = pipeline_chunk_layers(row)
    if sum(chunks) != int(row["num_layers"]) or min(chunks) < 1:
        _titan_refuse(row, "pp", pp, "a pipeline split that gives every model chunk a layer",
                      "use a plan the cost model prices (status ok)")


def _py_list_block(items: list, indent: str) -> str:
    """A list as Python source, wrapped to lines of about 100 characters under ``indent``."""
    text = _py(items)
    if len(indent) + len(text) <= 100:
        return text
    body = textwrap.wrap(", ".join(_py(v) for v in items), 100 - len(indent) - 4, break_long_words=False,
                         break_on_hyphens=False)
    return "[\n" + "".join(f"{indent}    {line}\n" for line in body) + f"{indent}]"


def torchtitan_config(row: dict, gpus_per_node: int, extra_notes=(), module: str = TORCHTITAN_MODULE) -> Export:
    """The plan as a torchtitan recipe: a Python module defining :data:`TORCHTITAN_FUNCTION`, which
    returns the ``Trainer.Config`` that runs it (torchtitan at :data:`TORCHTITAN_COMMIT` configures a
    run in Python, torchtitan/config/README.md: ``torchrun ... -m torchtitan.train --module <module>
    --config <function>``).

    The function starts from torchtitan's llama3 recipe nearest to the plan (:func:`torchtitan_recipe`,
    ``llama3_8b`` / ``llama3_70b`` / ``llama3_405b``) and sets:

    - the model: ``model_registry(flavor)`` of the shipped flavor whose shape is the plan's exactly
      (:func:`torchtitan_flavor`), else a function building the plan's shape the way the flavor
      functions do (``_build_llama3_layers`` and the init dictionaries, private names of
      ``torchtitan.models.llama3``), added to ``llama3_configs``; FP8 as a converter
      (``tensorwise``: ``Float8LinearConverter`` rowwise, ``mxfp8``: ``MXFP8LinearConverter``; the
      LM head and the plan's bf16 layers left out) with ``torch.compile`` on;
    - the degrees: ``tensor_parallel_degree``, ``enable_sequence_parallel``,
      ``context_parallel_degree``, ``pipeline_parallel_degree``; data parallelism as FSDP2
      (``zero_stage`` 3: ``data_parallel_shard_degree = dp_shard / cp`` (all of dp with ``dp_shard`` 0),
      ``data_parallel_replicate_degree`` the rest, HSDP; ``fsdp_reshard_after_forward = "always"``, the
      re-gather in backward ZeRO-3 is priced with) or replicas (``zero_stage`` 0:
      ``data_parallel_replicate_degree = dp``);
    - the pipeline: ``1F1B``, or ``Interleaved1F1B`` over pp x vpp stages; every micro-batch of the
      iteration in one schedule (``num_pp_microbatches``); the layers per stage as
      ``pipeline_parallel_layers_per_stage`` with ``*_stage_less_layers`` where those say the plan's
      split exactly, else ``module_fqns_per_model_part`` (:func:`pipeline_chunk_layers`);
      CUDA graphs off (torchtitan refuses them with pipeline parallelism);
    - the batch: ``num_tokens_per_microbatch_per_dp_rank = micro_batch_size x seq_length``,
      ``num_tokens_per_train_step = global_batch_size x seq_length``, ``max_context_length``, ``steps
      = num_steps``;
    - recomputation (``FullAC``, ``SelectiveAC`` or none), bf16 mixed precision, and
      ``tp_comm_overlap`` as async TP (``compile.enable_async_tensor_parallel``, with compile).

    Parameters
    ----------
    row : dict
        One plan (a results folder's or evaluate's columns).
    gpus_per_node : int
        GPUs per node of its cluster (``torchrun --nproc-per-node``).
    extra_notes : sequence of str
        More comments (how the plan was picked: :func:`read_plan`).
    module : str
        The module name torchtitan imports the file as (``--module``; the file's name without ``.py``).

    Returns
    -------
    Export
        ``args``: the function's statements from ``config = <recipe>()`` on; ``source``: the module;
        ``notes``: what torchtitan runs differently from what was priced (comments in the module).

    Raises
    ------
    InputError
        A plan torchtitan cannot run as priced: not a Llama-shaped dense model (LayerNorm, GeLU,
        learned positions, biases, MLA, experts, a head size other than dim / heads), ZeRO-1/2 data
        parallelism, ZeRO-0 with context parallelism, a ``dp_shard`` that is not a multiple of cp, FP8
        delayed scaling, ring (p2p) context parallelism, tied embeddings with pipeline parallelism.
    """
    if not module.isidentifier() or keyword.iskeyword(module):
        raise InputError("command line", "module", module, "a Python module name (letters, digits, _)",
                         "name the -o file e.g. plan_70b.py")
    _torchtitan_check(row)
    g = lambda k: _get(row, k)      # noqa: E731
    L, h, a, qg = int(row["num_layers"]), int(row["hidden_size"]), int(row["num_attention_heads"]), int(row["num_query_groups"])
    ffn, vocab, seq = int(row["ffn_hidden_size"]), int(row["vocab_size"]), int(row["seq_length"])
    tied = not bool(g("untie_embeddings_and_output_weights"))
    tp, cp, pp, dp = int(row["tp"]), int(row.get("cp") or 1), int(row["pp"]), int(row["dp"])
    vpp = int(g("vpp")) if pp > 1 else 1
    mbs, gbs = int(row["micro_batch_size"]), int(row["global_batch_size"])
    micro_batches = gbs // (mbs * dp)
    recipe = torchtitan_recipe(row)
    flavor = torchtitan_flavor(row)
    fp8 = g("precision") == "fp8"
    async_tp = tp > 1 and bool(g("tp_comm_overlap"))
    compiled = fp8 or async_tp
    notes = [f"vtrain-fast export: the plan as torchtitan (pytorch/torchtitan {TORCHTITAN_COMMIT[:8]}) runs it, a "
             f"recipe module: torchtitan imports it (--module {module}) and calls {TORCHTITAN_FUNCTION}() (--config); "
             "add your data, tokenizer, optimizer and checkpoint settings",
             _priced_line(row)]
    notes += list(extra_notes)
    notes.append(f"starts from torchtitan's {recipe}() (torchtitan/models/llama3/config_registry.py): its AdamW "
                 "optimizer, LR schedule, c4 data, tokenizer (hf_assets_path), checkpointing, validation and "
                 "profiling are kept; the plan's price has none of the validation, checkpoint or profiler time")
    imports = {("torchtitan.models.llama3.config_registry", recipe), ("torchtitan.trainer", "Trainer"),
               ("torchtitan.models.llama3", "model_registry")}
    body, own_model = [f"config = {recipe}()"], []
    # the model
    converters = ""
    bf16_start, bf16_end = int(g("num_layers_at_start_in_bf16")), int(g("num_layers_at_end_in_bf16"))
    bf16_layers = [f"layers.{i}." for i in range(L) if i < bf16_start or i >= L - bf16_end]
    if fp8 and g("fp8_recipe") == "tensorwise":
        imports.add(("torchtitan.components.quantization", "Float8LinearConverter"))
        converters = ("Float8LinearConverter.Config(\n            recipe_name=\"rowwise\",\n            filter_fqns="
                      f"{_py_list_block(['lm_head'] + bf16_layers, '            ')},\n"
                      "            model_compile_enabled=True,\n        )")
        notes.append("fp8_recipe = tensorwise: torchtitan's Float8LinearConverter (torchao) scales rowwise, its only "
                     "recipes being rowwise and rowwise_with_gw_hp: current (just-in-time) scaling like the plan's, "
                     "with one scale per row instead of one per tensor, so its casts and GEMMs are not exactly the "
                     "ones priced; the LM head" + (" and the plan's bf16 layers" if bf16_layers else "")
                     + " left in bf16 (filter_fqns), as priced")
    elif fp8:
        imports.add(("torchtitan.components.quantization", "MXFP8LinearConverter"))
        fqns = ["layers."] if not bf16_layers else [f"layers.{i}." for i in range(bf16_start, L - bf16_end)]
        converters = (f"MXFP8LinearConverter.Config(\n            fqns={_py_list_block(fqns, '            ')},\n"
                      "            model_compile_enabled=True,\n        )")
        notes.append("fp8_recipe = mxfp8: torchtitan's MXFP8LinearConverter (torchao; SM100 or later) on the "
                     "decoder layers' linears (fqns), the LM head" + (" and the plan's bf16 layers" if bf16_layers
                                                                       else "") + " in bf16, as priced")
    if flavor is not None:
        name = flavor
        notes.append(f"model: torchtitan's llama3 flavor {flavor}, the plan's shape exactly ({L} layers, dim {h}, "
                     f"{a} heads, {qg} KV heads, FFN {ffn}, vocabulary {vocab}"
                     + (", tied embeddings)" if tied else ")"))
    else:
        name = TORCHTITAN_OWN_FLAVOR
        imports |= {("torchtitan.models.llama3", n) for n in (
            "Llama3Model", "llama3_configs", "_build_llama3_layers", "_NORM_INIT", "_output_linear_init",
            "_EMBEDDING_SKIP_INIT" if tied else "_EMBEDDING_INIT")}
        imports |= {("torchtitan.models.common", n) for n in ("ComplexRoPE", "Embedding", "Linear", "RMSNorm")}
        rope = dict(TORCHTITAN_ROPE, max_context_length=max(TORCHTITAN_ROPE["max_context_length"], seq))
        notes.append(f"model: the plan's own shape ({L} layers, dim {h}, {a} heads, {qg} KV heads, FFN {ffn}, "
                     f"vocabulary {vocab}{', tied embeddings' if tied else ''}; no torchtitan flavor has it), built "
                     f"as torchtitan's llama3 flavors are, with their RoPE (theta {rope['theta']}, Llama 3 scaling; "
                     "no effect on the cost): set your own")
        own_model = [
            "# A model of the plan's own shape, built as torchtitan's llama3 flavors build theirs",
            "# (torchtitan/models/llama3/__init__.py). _build_llama3_layers and the init dictionaries are private",
            f"# names of torchtitan.models.llama3 at {TORCHTITAN_COMMIT[:8]}: they may change without notice.",
            "def vtrain_fast_model(attn_backend: str, tp_gemm_backend: str = \"default\") -> Llama3Model.Config:",
            *_docstring(f"{row.get('model', 'the plan')}: {L} layers, dim {h}, {a} heads, {qg} KV heads, FFN {ffn}, "
                        f"vocabulary {vocab}.", "    ", None),
            f"    dim, n_heads, n_kv_heads, n_layers, vocab_size = {h}, {a}, {qg}, {L}, {vocab}",
            "    return Llama3Model.Config(",
            "        dim=dim,",
            "        vocab_size=vocab_size,",
            f"        enable_weight_tying={tied},",
            "        tok_embeddings=Embedding.Config(",
            "            num_embeddings=vocab_size, embedding_dim=dim, "
            f"param_init={'_EMBEDDING_SKIP_INIT' if tied else '_EMBEDDING_INIT'}",
            "        ),",
            "        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),",
            "        lm_head=Linear.Config(in_features=dim, out_features=vocab_size, param_init=_output_linear_init(dim)),",
            "        layers=_build_llama3_layers(",
            "            fuse_qkv=True,",
            "            n_layers=n_layers,",
            "            dim=dim,",
            "            n_heads=n_heads,",
            "            n_kv_heads=n_kv_heads,",
            f"            hidden_dim={ffn},",
            f"            rope=ComplexRoPE.Config(dim=dim // n_heads, max_context_length={rope['max_context_length']}, "
            f"theta={rope['theta']}, scaling={_py(rope['scaling'])}),",
            "            attn_backend=attn_backend,",
            "            tp_gemm_backend=tp_gemm_backend,",
            "        ),",
            "    )",
        ]
        body.append(f"llama3_configs[{_py(name)}] = vtrain_fast_model  # model_registry builds flavors from this dict")
    call = f"model_registry({_py(name)}" + (f", converters=[\n        {converters},\n    ]" if converters else "") + ")"
    if vocab != TORCHTITAN_FLAVORS[TORCHTITAN_RECIPES[recipe]]["vocab_size"]:
        imports |= {("torchtitan.components.loss", "ChunkedLossWrapper"), ("torchtitan.components.loss", "CrossEntropyLoss"),
                    ("torchtitan.models.common.config_utils", "decoder_vocab_size")}
        body.append(f"config.model_spec = {call}")
        body.append("config.loss = ChunkedLossWrapper.Config(  # the recipe's loss, for this vocabulary\n"
                    "        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec)),\n"
                    "    )")
        notes.append(f"tokenizer: the plan's vocabulary is {vocab}; point hf_assets_path at a tokenizer of that size")
    else:
        body.append(f"config.model_spec = {call}")
    if bool(g("use_flash_attn")):
        notes.append("attention: torchtitan's FlexAttention (model_registry's attn_backend 'flex'; 'flex_flash' "
                     "on Hopper and Blackwell), not the FlashAttention-2 kernels the plan was priced with")
    else:
        notes.append("attention: torchtitan's FlexAttention; the plan was priced with unfused attention "
                     "(use_flash_attn = false): this run's attention is faster and leaner than priced")
    # the degrees
    world = tp * cp * pp * dp
    zero = int(g("zero_stage")) or (1 if bool(g("distributed_optimizer")) else 0)
    if dp * cp == 1:
        shard, replicate = 1, 1
    elif zero == 3:
        group = int(g("dp_shard")) or dp * cp
        shard, replicate = group // cp, dp * cp // group
    else:
        shard, replicate = 1, dp
    if replicate * shard * cp != dp * cp:        # _torchtitan_check refuses such a dp_shard first
        _titan_refuse(row, "dp_shard", int(g("dp_shard")), f"a divisor of dp x cp = {dp * cp} that cp = {cp} divides",
                      "sweep a dp_shard that splits dp x cp into whole shard groups")
    P = "config.parallelism."
    body.append(f"{P}tensor_parallel_degree = {tp}")
    if tp > 1:
        body.append(f"{P}enable_sequence_parallel = {bool(g('sequence_parallel'))}")
    body.append(f"{P}context_parallel_degree = {cp}")
    body.append(f"{P}pipeline_parallel_degree = {pp}")
    body.append(f"{P}data_parallel_shard_degree = {shard}")
    body.append(f"{P}data_parallel_replicate_degree = {replicate}")
    if dp * cp > 1 and zero == 3:
        body.append(f'{P}fsdp_reshard_after_forward = "always"  # ZeRO-3: parameters gathered again in backward')
        kind = "FSDP2" if replicate == 1 else f"HSDP ({replicate} replicas of FSDP2 groups)"
        notes.append(f"data parallelism: {kind} over data_parallel_shard_degree x cp = {shard * cp} ranks "
                     f"(dp_shard = {int(g('dp_shard'))}{': all of dp x cp' if not int(g('dp_shard')) else ''}), "
                     "the parameters re-gathered in backward "
                     "(fsdp_reshard_after_forward = always) as ZeRO-3 was priced")
    elif dp * cp > 1:
        notes.append(f"data parallelism: {dp} replicas (data_parallel_replicate_degree; torchtitan applies FSDP2 "
                     "with a shard degree of 1, DDP's memory and an all-reduce of the gradients)")
        if not bool(g("overlap_grad_reduce")):
            notes.append("overlap_grad_reduce = false: FSDP2 reduces each block's gradients during backward, "
                         "overlapped; priced exposed, so this run may be faster than priced")
    if zero == 3 and dp * cp > 1:
        notes.append("FSDP2 keeps the fp32 shard as the master weight: 16 bytes per parameter over the shard "
                     "group, 2 fewer than priced (a bf16 weight + an fp32 gradient + fp32 master and Adam states)")
    if tp > 1 and not bool(g("sequence_parallel")):
        notes.append("async_tensor_model_parallel_allreduce: no torchtitan setting; " + (
            "priced overlapped" if bool(g("async_tensor_model_parallel_allreduce")) else
            "priced without it (exposed)"))
    if cp > 1:
        notes.append("context parallelism: torchtitan all-gathers K and V over the cp ranks (as cp_comm_type = "
                     "all_gather was priced), its load balancer headtail (the default)")
    if pp > 1:
        chunks = pipeline_chunk_layers(row)
        schedule = "Interleaved1F1B" if vpp > 1 else "1F1B"
        body.append(f"{P}pipeline_parallel_schedule = {_py(schedule)}")
        body.append(f"{P}num_pp_microbatches = {micro_batches}  # every micro-batch of the step in one schedule")
        fields = _torchtitan_stage_fields(chunks)
        if fields is not None:
            per, first_less, last_less = fields
            body.append(f"{P}pipeline_parallel_layers_per_stage = {per}")
            body.append(f"{P}pipeline_parallel_first_stage_less_layers = {first_less}")
            body.append(f"{P}pipeline_parallel_last_stage_less_layers = {last_less}")
        else:
            fqns = torchtitan_module_fqns(chunks)
            body.append(f"{P}module_fqns_per_model_part = [\n" + "".join(
                f"        {_py_list_block(names, '        ')},\n" for names in fqns) + "    ]")
            notes.append(f"pipeline: the plan's layers per model chunk ({', '.join(map(str, chunks))}) given as "
                         "module_fqns_per_model_part: torchtitan's layers_per_stage and *_stage_less_layers "
                         "cannot say an uneven stage split over several chunks")
        body.append("config.training.disable_cuda_graphs = True  # torchtitan: no CUDA graphs with pipeline parallelism")
        notes.append(f"pipeline: {schedule} over {pp * vpp} stages ({vpp} per rank), all {micro_batches} micro-batches "
                     "of a step in one schedule, as priced (no gradient accumulation)")
        if vpp > 1:
            notes.append("overlap_p2p_comm: no torchtitan setting (PyTorch's pipelining schedules run the sends)")
    # the batch
    T = "config.training."
    body.append(f"{T}num_tokens_per_microbatch_per_dp_rank = {mbs * seq}  # micro_batch_size {mbs} x seq_length {seq}")
    body.append(f"{T}num_tokens_per_train_step = {gbs * seq}  # global_batch_size {gbs} x seq_length {seq}")
    body.append(f"{T}max_context_length = {seq}")
    steps = row.get("num_steps")
    if steps is not None and not (isinstance(steps, float) and math.isnan(steps)):
        body.append(f"{T}steps = {int(steps)}")
    body.append(f'{T}mixed_precision_param = "bfloat16"')
    if bool(g("param_cpu_offload")) and int(g("zero_stage")) >= 3:
        body.append(f"{T}enable_cpu_offload = True  # FSDP2 CPUOffloadPolicy: parameters, gradients, optimizer on the CPU")
    # recomputation
    rc = str(row.get("recompute", "none"))
    if rc == "full":
        imports.add(("torchtitan.distributed.activation_checkpoint", "FullAC"))
        body.append("config.activation_checkpoint = FullAC.Config()  # every transformer block recomputed")
    elif rc == "selective":
        imports.add(("torchtitan.distributed.activation_checkpoint", "SelectiveAC"))
        body.append("config.activation_checkpoint = SelectiveAC.Config()")
        notes.append("recompute = selective: torchtitan's SelectiveAC is op-level (distributed/activation_checkpoint.py: "
                     "it saves the matmul, attention and reduce-scatter outputs, but recomputes every second matmul "
                     "and the element-wise ops), not Megatron-core's core-attention recomputation the plan was priced "
                     "with: expect more recompute time and less activation memory than priced")
    else:
        body.append("config.activation_checkpoint = None  # no recomputation")
    # compile, async TP
    body.append(f"config.compile.enable = {compiled}")
    body.append(f"config.compile.enable_async_tensor_parallel = {async_tp}")
    if async_tp:
        notes.append("tp_comm_overlap: torchtitan's async TP (compile.enable_async_tensor_parallel, Inductor's "
                     "micro-pipelined collective matmuls; needs torch.compile), not the Transformer Engine userbuffers "
                     "the plan was priced with (model_registry's tp_gemm_backend = 'dist_gemm' is torchtitan's eager "
                     "alternative)")
    if compiled:
        needs = [w for w, on in (("FP8", fp8), ("async TP", async_tp)) if on]
        notes.append(f"torch.compile is on ({' and '.join(needs)} need{'s' if len(needs) == 1 else ''} it): its "
                     "per-block fusion makes the element-wise kernels faster than priced")
    nodes, per_node, placed = launch_geometry(row, gpus_per_node)
    notes += placed
    launcher = (f"torchrun --nnodes {nodes} --nproc-per-node {per_node} "
                f"-m torchtitan.train --module {module} --config {TORCHTITAN_FUNCTION}")
    notes.append(f"run it from the folder that holds {module}.py (torchrun -m puts that folder on sys.path) or put "
                 "the folder on PYTHONPATH" + ("; on several nodes add --node-rank and --rdzv-backend c10d "
                                              "--rdzv-endpoint HOST:PORT, as torchtitan's multinode_trainer.slurm does"
                                              if nodes > 1 else ""))
    # the module
    lines = []
    for n in notes:
        lines += _comment(n)
    lines += ["#"] + _comment(f"run: {launcher}", width=None)
    lines += _docstring(f"vtrain-fast plan for {row.get('model', 'a model')} on {world} {row.get('gpu', 'GPUs')}: "
                        f"a torchtitan recipe (--module {module} --config {TORCHTITAN_FUNCTION}).")
    by_module = {}
    for mod, n in imports:
        by_module.setdefault(mod, []).append(n)
    for mod in sorted(by_module):
        names = sorted(by_module[mod], key=lambda n: (n.startswith("_"), n.lower()))
        one = f"from {mod} import {', '.join(names)}"
        lines.append(one if len(one) <= 100 else f"from {mod} import (\n" + "".join(f"    {n},\n" for n in names) + ")")
    lines += ["", ""]
    if own_model:
        lines += own_model + ["", ""]
    layout = f"tp {tp}, cp {cp}, pp {pp}" + (f" x vpp {vpp}" if vpp > 1 else "") + f", dp {dp}"
    lines.append(f"def {TORCHTITAN_FUNCTION}() -> Trainer.Config:")
    lines += _docstring(f"{row.get('model', 'the plan')} on {world} GPUs ({layout}); micro-batches of {mbs} x "
                        f"{seq} tokens, {micro_batches} per data-parallel rank a step.", "    ")
    lines += [f"    {st}" for st in body]
    lines.append("    return config")
    source = "\n".join(lines) + "\n"          # read back by Export.text (_checked_python)
    return Export("torchtitan", tuple(body), tuple(notes), launcher, source)


def recipe_module_problem(name: str) -> str | None:
    """Why ``name`` (``-o NAME.py`` of ``--to torchtitan``) cannot be the recipe module that
    ``torchrun -m torchtitan.train --module NAME`` imports, or None: not ``.py``; not a Python
    identifier, or a keyword; one Python reads as another name (identifiers are NFKC-normalised:
    ``ｆoo`` is imported as ``foo``); or a module the run itself imports (torchtitan, torch, a
    standard library module), which the file, first on the import path, would replace."""
    import sys
    import unicodedata
    stem, suffix = os.path.splitext(name)
    if suffix != ".py":
        return f"{name!r} does not end in .py"
    if not stem.isidentifier() or keyword.iskeyword(stem):
        return f"{stem!r} is not a Python module name"
    if unicodedata.normalize("NFKC", stem) != stem:
        return f"Python imports {stem!r} as {unicodedata.normalize('NFKC', stem)!r}, which is not this file"
    if stem in ("torchtitan", "torch", "__init__", "__main__") or stem in sys.stdlib_module_names:
        return f"{stem!r} is the name of a module the run imports (the file would replace it)"
    return None


def plan_gpus(source: str | Path, gpus: dict | None = None) -> dict:
    """The GPUs a plan of ``source`` may name: ``gpus`` (the presets and a ``--gpus`` file's, default
    the presets), and for a results folder the ``[gpus.<name>]`` tables of the spec its manifest
    records (:func:`~vtrain_fast.plan.spec.spec_gpus`; a ``--gpus`` file's GPUs are not in the spec:
    give the file again).

    Raises
    ------
    InputError
        The folder is not a finished results folder, or its spec's ``[gpus]`` tables are refused.
    """
    import tomllib

    from ..hardware.gpus import PRESETS
    from ..io.writer import read_manifest
    from ..plan.spec import spec_gpus
    known = dict(gpus or PRESETS)
    if not Path(source).is_dir():
        return known
    manifest = read_manifest(source)
    try:
        tables = tomllib.loads(manifest["spec"]).get("gpus")
    except tomllib.TOMLDecodeError:
        tables = None
    return with_recorded_machines(spec_gpus(f"{source}/manifest.json: spec", tables, known), manifest)


def with_recorded_machines(gpus: dict, manifest: dict) -> dict:
    """``gpus`` with each GPU a results folder priced on given the calibration and the cluster values
    (``gpus_per_node``, link bandwidths, price, PUE, reserve) its manifest records, so that a plan of
    the folder is shown and exported as the sweep priced it (a sweep run with ``--calibration`` or
    ``[cluster]`` overrides). The record was checked on reading the manifest
    (:func:`~vtrain_fast.io.writer.cluster_problem`); a calibration field it lacks keeps the GPU's."""
    import dataclasses

    from ..hardware.gpus import OVERRIDE_RANGES, Calibration, with_overrides
    out = dict(gpus)
    names = {f.name for f in dataclasses.fields(Calibration)}
    for name, record in (manifest.get("gpus") or {}).items():
        if name not in out or not isinstance(record, dict):
            continue
        base = out[name]
        cal = record.get("calibration")
        calibration = None
        if isinstance(cal, dict):
            values = {k: v for k, v in cal.items() if k in names and isinstance(v, (int, float))
                      and not isinstance(v, bool) and math.isfinite(v)}
            if values:
                calibration = dataclasses.replace(base.calibration, **values)
                if calibration == base.calibration:
                    calibration = None
        cluster = {k: record[k] for k in OVERRIDE_RANGES if k in record and record[k] != getattr(base, k)}
        if "gpus_per_node" in cluster:
            cluster["gpus_per_node"] = int(cluster["gpus_per_node"])
        out[name] = with_overrides(base, calibration, **cluster)
    return out


def read_plan(source: str | Path, where=(), row: int | None = None, models: dict | None = None,
              gpus: dict | None = None) -> tuple[dict, int, tuple]:
    """One plan from ``source``: a results folder (its feasible rows, :func:`~vtrain_fast.analysis.query.feasible_plans`,
    with ``where`` conditions), or a ``.csv`` / ``.parquet`` table of plans (evaluated first, so that
    every column is filled and checked, with the GPUs ``gpus``: name -> preset, default the presets).
    With several rows, ``row`` picks one of them in order of ``cost_usd`` (0: the cheapest); without
    ``row`` a single row is needed.

    Returns
    -------
    (dict, int, tuple of str)
        The plan's columns, the GPUs per node of its cluster, and a note when it was picked among
        several jobs (models or token budgets).

    Raises
    ------
    InputError
        Not a results folder or a table; no feasible row; several rows and no ``row``; ``row`` out
        of range.
    """
    from ..hardware.gpus import PRESETS
    from ..io.writer import read_manifest
    from .evaluate import evaluate_frame, read_csv, without_earlier_results
    from .query import DEFAULT_MEMORY_MARGIN, feasible_plans, where_filter, with_cluster_columns, with_memory_headroom
    path = Path(source)
    set_aside: list = []
    if not os.path.lexists(path):
        raise InputError(str(path), "PLAN", str(source), "an existing results folder, or an existing .csv / .parquet "
                         f"table of plans (nothing exists at {path})", f"check the path (relative to {Path.cwd()}); "
                         "`vtrain-fast sweep SPEC.toml -o DIR` writes a results folder, `pareto DIR -o plans.csv` a table")
    if path.is_dir():
        where_filter("command line", where)
        df = feasible_plans(path, where=list(where)).collect()
        manifest = read_manifest(path)
        df = with_cluster_columns(df, manifest)
        df = with_memory_headroom(df.lazy(), manifest, DEFAULT_MEMORY_MARGIN).collect()
    elif path.suffix.lower() in (".csv", ".parquet", ".pq"):
        # a table of earlier results (pareto -o, evaluate -o, plan -o, advise -o) is priced again from its
        # inputs; its memory marks too (recomputed below, not read: a label may be stale)
        plans, set_aside = without_earlier_results(read_csv(path))
        priced = evaluate_frame(plans, str(path), gpus=gpus, models=models)
        df = with_memory_headroom(priced.lazy(), {"gpus": {g: None for g in priced["gpu"].unique().to_list()}},
                                  DEFAULT_MEMORY_MARGIN).filter(pl.col("status") == "ok").collect()
        if df.height == 0:
            counts = ", ".join(f"{k} {v}" for k, v in priced["status"].value_counts().sort("status").rows())
            raise InputError(str(path), "plans", priced.height, "at least one plan of status ok",
                             f"its plans are {counts} (`vtrain-fast evaluate` shows why): change the plan "
                             "(more GPUs, recomputation, ...)")
        if where:
            raise InputError(str(path), "--where", list(where), "--where with a results folder only",
                             "pick the row with --row K (0 = the cheapest ok row)")
    else:
        raise InputError(str(path), "PLAN", str(source), "a results folder, or a .csv / .parquet table of plans",
                         "run `vtrain-fast sweep` first, or write the plan's columns as for `vtrain-fast evaluate`")
    if df.height == 0:
        raise InputError(str(path), "plans", 0, "at least one feasible plan (status ok)",
                         "relax --where" if where else "the folder has no feasible plan: sweep other plans")
    if "cost_usd" in df.columns:
        df = df.sort("cost_usd")
    if row is None and df.height > 1:
        raise InputError(str(path), "plans", df.height, "one plan",
                         ("narrow it with --where (e.g. 'tp==8', 'num_gpus==1024'), or pick one with --row K "
                          "(0 = the cheapest of them)") if path.is_dir() else
                         f"pick one with --row K (0 = the cheapest of its {df.height} ok plans; --where reads results "
                         "folders only)")
    k = row or 0
    if not 0 <= k < df.height:
        raise InputError(str(path), "--row", k, f"0 to {df.height - 1}", "pick a row that exists")
    plan = df.row(k, named=True)
    jobs = [c for c in ("model", "num_tokens") if c in df.columns and df[c].n_unique() > 1]
    notes = tuple(f"picked among plans of {' and '.join(f'{df[c].n_unique()} {c} values' for c in jobs)} "
                  f"(cheapest first); " + (f"narrow with --where, e.g. '{jobs[0]}=={plan[jobs[0]]}'" if path.is_dir()
                                           else "pick another with --row K") for _ in jobs[:1])
    if set_aside:
        notes += (f"{path} holds earlier results ({len(set_aside)} result columns, e.g. {set_aside[0]}); they are "
                  "recomputed from its plan columns, not read",)
    if plan.get("memory_tight"):
        notes += (f"memory: {plan['memory_per_gpu_GiB']:.1f} GiB per GPU, {plan['memory_headroom_GiB']:.1f} GiB left: "
                  f"within {DEFAULT_MEMORY_MARGIN:.0%} of the GPU's HBM (tight: allocator fragmentation or larger NCCL "
                  "buffers may not fit; pick a plan with more headroom, e.g. `vtrain-fast pareto --memory-margin`)",)
    gpu = plan.get("gpu")
    known = gpus or PRESETS             # a table's GPU of a --gpus file: its nodes, not a preset's
    gpn = int(plan.get("gpus_per_node") or (known[gpu].gpus_per_node if gpu in known else 8))
    return plan, gpn, notes


def export(source: str | Path, to: str, where=(), row: int | None = None, models: dict | None = None,
           module: str = TORCHTITAN_MODULE, gpus: dict | None = None) -> Export:
    """The launch arguments of one plan of ``source`` (:func:`read_plan`) for framework ``to``
    (:data:`TARGETS`); ``module``: the module name of a torchtitan recipe (``--module``); ``gpus``:
    the GPUs a table's plans may name (:func:`read_plan`).

    Raises
    ------
    InputError
        An unknown target, a plan torchtitan cannot run as priced (:func:`torchtitan_config`), or as
        :func:`read_plan`.
    """
    if to not in TARGETS:
        raise InputError("command line", "--to", to, " or ".join(TARGETS),
                         "megatron: Megatron-LM pretrain_gpt.py flags; bridge: Megatron-Bridge / NeMo 2 "
                         "ConfigContainer overrides; torchtitan: a torchtitan recipe module (Trainer.Config)")
    plan, gpn, notes = read_plan(source, where, row, models, gpus)
    if to == "torchtitan":
        return torchtitan_config(plan, gpn, notes, module)
    return (megatron_args if to == "megatron" else bridge_overrides)(plan, gpn, notes)
