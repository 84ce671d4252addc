"""The registry of training settings: one record per setting (Megatron-LM's name, kind, default,
where it has no effect, what it needs, its label and documentation). Everything else reads it:
spec parsing (``plan.spec.TRAINING_FLAGS``), the sweep's setting axes, ``GPUPreset``'s setting
fields (``hardware.gpus``), the machine vector's setting fields (``model.records.HW_FIELDS``, one
per setting, of the same name), the columns and their documentation (``io.schema``), the
``repeat`` and ``refused`` statuses and the query-time expansion (:meth:`Setting.has_no_effect`,
:func:`unmet_requirements`), evaluate's columns, README's rules (:func:`rules_markdown`) and the
"not validated" notes.

Adding a setting: a record here (at the end of :data:`SETTINGS`), the formula that reads it
(in ``model``: ``hw[MACHINE.<name>]``, :data:`vtrain_fast.model.records.MACHINE`), its export
(``analysis.export``) and its tests.
"""
from __future__ import annotations

from dataclasses import dataclass

# The parallel sizes a setting's no-effect rule may name, in the order of the kernels' plan kinds
# (bit k of a plan kind: size k > 1; model.rules.plan_case). "dp" stands for the group that
# reduces the gradients and shards the optimizer, data parallelism with context parallelism
# (dp x cp ranks, Megatron-core's data-parallel group with context parallelism): a data-parallel
# setting acts on a dp = 1 plan whose cp > 1. "cp" is the context-parallel size (bit 3, added
# last so that the bits of the first three stay).
LAYOUT_SIZES = ("tp", "pp", "dp", "cp")
# How a rule names each size in the docs (README's rules, notes).
SIZE_LABELS = {"tp": "tp", "pp": "pp", "dp": "dp x cp", "cp": "cp"}


@dataclass(frozen=True)
class Setting:
    """One training setting.

    Attributes
    ----------
    name : str
        Spec key, column, ``GPUPreset`` field and machine-vector field (Megatron-LM's argument
        name).
    kind : type
        ``bool`` (a switch), ``int`` (``vpp``, ``zero_stage``, the pipeline-split counts), ``float``
        (a number: the MoE capacity factor and load imbalance) or ``str`` (a choice among
        :attr:`choices`: ``precision``, ``cp_comm_type``, ``fp8_recipe``).
    default : bool, int or str
        Value when a spec or CSV row leaves it out.
    label : str
        Readable name for notes.
    doc : str
        What ``true`` (or the value) does: the spec's and the column table's text.
    megatron : str
        The Megatron-LM command-line flag.
    inert_at : tuple of str
        Parallel sizes (:data:`LAYOUT_SIZES`) at which, when 1, the setting changes no cost.
    inert_with : tuple of (str, bool, int or str)
        Other settings' values with which it changes no cost (the asynchronous TP all-reduce with
        sequence parallelism, which overlaps regardless; the FP8 recipe at precision = bf16).
    requires : tuple of (str, bool)
        Other settings' values it needs: Megatron-LM refuses the flag without them. A spec that
        asks only for such a combination is refused; a sweep axis runs those machines with the
        flag off (labelled so, with a note); a plan where a needed setting is switched off
        (``off_at``) gets status ``refused``; evaluate refuses such a row. The cost model gives
        the flag no effect there.
    off_at : tuple of str
        Parallel sizes at which, when 1, Megatron-LM switches the setting off itself (sequence
        parallelism at tp = 1): a setting that requires it is then refused.
    validated : bool
        True when measurements the project validates against use it (none today: vTrain's runs
        use none of these settings).
    table : str
        The spec table that takes it (``training``; ``parallel`` for ``vpp``).
    int_range : tuple of (int, int)
        Allowed values of an ``int`` or ``float`` setting, both ends included (spec keys and evaluate
        columns).
    example : str
        For an ``int`` or ``float`` setting, what a fix shows (``vpp = 2 or vpp = [1, 2, 4]``).
    choices : tuple of str
        The values of a ``str`` setting (empty for the others); its machine-vector field holds
        the index of the value in this tuple (:meth:`encode`), its column the text.
    inert_models : str
        Models on which it changes no cost, in words (``ep``, ``etp``: dense models); README's rules
        say so. The sweep's repeat status does not see it (the kernels give such rows the same numbers).
    framework : str
        For a setting Megatron-LM lacks (:data:`NO_MEGATRON_FLAG`), the framework option it prices
        (``param_cpu_offload``: PyTorch FSDP2's CPUOffloadPolicy): what notes and errors name instead
        of a Megatron-LM flag (:meth:`owner`).
    refused_where : str
        Plans on which Megatron-LM refuses it, in words, where the kernels give those plans status
        ``refused`` themselves (``cpu_offloading_num_layers``: pipeline parallelism, recomputation);
        README's rules say so.
    priced_before : bool, int, float or str, optional
        The value rows written before the setting existed were priced with, where it is not
        :attr:`default` (``grad_reduce_in_bf16``: true, 16-bit gradients): a results folder
        without the setting's column is read with this value (:meth:`value_before`).
    """

    name: str
    kind: type
    default: bool | int
    label: str
    doc: str
    megatron: str
    inert_at: tuple[str, ...] = ()
    inert_with: tuple[tuple[str, bool], ...] = ()
    requires: tuple[tuple[str, bool], ...] = ()
    off_at: tuple[str, ...] = ()
    validated: bool = False
    table: str = "training"
    int_range: tuple[int, int] = (0, 0)
    example: str = ""
    choices: tuple[str, ...] = ()
    inert_models: str = ""
    refused_where: str = ""
    framework: str = ""
    priced_before: bool | int | float | str | None = None

    def value_before(self):
        """The value a row written before this setting existed was priced with
        (:attr:`priced_before`, else :attr:`default`)."""
        return self.default if self.priced_before is None else self.priced_before

    def owner(self) -> str:
        """Who refuses the setting without what it needs, for notes and errors: ``Megatron-LM
        --flag``, or the framework of a setting Megatron-LM lacks (:attr:`framework`)."""
        return self.framework if self.megatron == NO_MEGATRON_FLAG and self.framework else f"Megatron-LM {self.megatron}"

    def encode(self, value) -> float:
        """The machine-vector value of ``value``: the index of a choice (``str`` settings), 1.0 /
        0.0 for a switch, the number itself for ``vpp``."""
        return float(self.choices.index(value)) if self.kind is str else float(value)

    def decode(self, code: float):
        """The setting's value of a machine-vector value (the inverse of :meth:`encode`)."""
        if self.kind is str:
            return self.choices[int(code)]
        if self.kind is float:
            return float(code)
        return code != 0.0 if self.kind is bool else int(code)

    def has_no_effect(self, sizes_are_1: dict, values: dict) -> bool:
        """Whether the setting changes no cost of a plan whose parallel sizes equal 1 where
        ``sizes_are_1`` (:data:`LAYOUT_SIZES` -> bool) says so, on a machine with the other
        settings' ``values`` (name -> value)."""
        return (any(sizes_are_1[k] for k in self.inert_at)
                or any(values[k] == v for k, v in self.inert_with)
                or any(values[k] != v for k, v in self.requires))


# What a setting that is a modelling assumption, not a framework's argument, gives as its flag.
NO_FLAG = "no framework flag: an assumption"
# What a setting of another framework that Megatron-LM lacks gives as its flag (its doc names the
# framework's own setting).
NO_MEGATRON_FLAG = "no Megatron-LM flag: another framework's setting"

# The precisions other than fp8, at which the FP8 settings change no cost.
NOT_FP8 = tuple(("precision", p) for p in ("bf16", "fp16", "fp32", "tf32"))

# In the order of the sweep's machine axis (the last setting varies fastest): this order decides
# the row order of every sweep, so a new setting goes at the end.
SETTINGS: tuple[Setting, ...] = (
    Setting("overlap_grad_reduce", bool, False, "overlapped gradient reduction",
            "true overlaps the data-parallel all-reduce with backward (Megatron --overlap-grad-reduce; "
            "ZeRO-3 / FSDP always overlaps)",
            "--overlap-grad-reduce", inert_at=("dp",), inert_with=(("zero_stage", 3),)),
    Setting("distributed_optimizer", bool, False, "distributed optimizer",
            "true shards the Adam states over data-parallel ranks (Megatron --use-distributed-optimizer, ZeRO-1; "
            "the same as zero_stage = 1)",
            "--use-distributed-optimizer", inert_at=("dp",),
            inert_with=(("zero_stage", 1), ("zero_stage", 2), ("zero_stage", 3))),
    Setting("use_flash_attn", bool, False, "FlashAttention",
            "true runs the attention core as fused FlashAttention-2 kernels (Megatron --use-flash-attn); they take "
            "fp16 / bf16 only: under precision fp32 or tf32 the core runs unfused (Transformer Engine's "
            "DotProductAttention falls back to its unfused backend)",
            "--use-flash-attn", inert_with=(("precision", "fp32"), ("precision", "tf32"))),
    Setting("sequence_parallel", bool, False, "sequence parallelism",
            "true splits layer norms and dropouts over the tensor-parallel ranks (Megatron --sequence-parallel)",
            "--sequence-parallel", inert_at=("tp",), off_at=("tp",)),
    Setting("async_tensor_model_parallel_allreduce", bool, False, "asynchronous TP all-reduce",
            "true overlaps the backward tensor-parallel all-reduce (or, with sequence parallelism, "
            "reduce-scatter) of the column-parallel layers with their weight-gradient GEMMs (Megatron-LM's "
            "default; Megatron-DeepSpeed: false)",
            "--async-tensor-model-parallel-allreduce", inert_at=("tp",), inert_with=(("sequence_parallel", True),)),
    Setting("vpp", int, 1, "interleaved 1F1B (vpp > 1)",
            "model chunks per device (interleaved 1F1B when > 1; no effect at pp = 1)",
            "--num-layers-per-virtual-pipeline-stage", inert_at=("pp",), table="parallel", int_range=(1, 64),
            example="vpp = 2 or vpp = [1, 2, 4] (--num-layers-per-virtual-pipeline-stage = num_layers / (pp * vpp); "
                    "1 = not interleaved)"),
    Setting("tp_comm_overlap", bool, False, "TP communication overlap (userbuffers)",
            "true overlaps the sequence-parallel all-gathers and reduce-scatters of the tensor-parallel "
            "linears with the GEMMs that consume or produce them (Megatron-LM --tp-comm-overlap, "
            "Transformer Engine userbuffers; needs sequence_parallel)",
            "--tp-comm-overlap", inert_at=("tp",), requires=(("sequence_parallel", True),)),
    Setting("overlap_param_gather", bool, False, "overlapped parameter all-gather",
            "true overlaps the distributed optimizer's parameter all-gather with the next forward instead of "
            "running it after the step (Megatron --overlap-param-gather; needs distributed_optimizer and "
            "overlap_grad_reduce)",
            "--overlap-param-gather", inert_at=("dp",), inert_with=(("zero_stage", 3),),
            requires=(("distributed_optimizer", True), ("overlap_grad_reduce", True))),
    Setting("zero_stage", int, 0, "ZeRO stage",
            "what is sharded over the data-parallel ranks: 0 nothing (DDP), 1 the Adam states (the distributed "
            "optimizer), 2 also the gradients (reduce-scattered every micro-batch), 3 also the parameters "
            "(ZeRO-3 / FSDP full sharding: all-gathered per layer in forward and again in backward, the next "
            "layer's gather prefetched behind this layer's compute); Megatron-core FSDP "
            "--data-parallel-sharding-strategy no_shard, optim, optim_grads, optim_grads_params; DeepSpeed "
            "zero_optimization.stage; PyTorch FSDP FULL_SHARD is 3",
            "--data-parallel-sharding-strategy",
            inert_at=("dp",), int_range=(0, 3),
            example="zero_stage = 3 or zero_stage = [0, 1, 3] (1 = distributed_optimizer = true)"),
    Setting("dp_shard", int, 0, "hybrid sharding",
            "ranks one ZeRO shard group spans (0: all dp x cp ranks): hybrid sharding, the shards inside a "
            "group and the groups replicas of each other whose gradient shards are all-reduced once per "
            "iteration (PyTorch FSDP HYBRID_SHARD, Megatron-LM --num-distributed-optimizer-instances = "
            "dp x cp / dp_shard); must divide dp x cp",
            "--num-distributed-optimizer-instances", inert_at=("dp",), inert_with=(("zero_stage", 0),),
            int_range=(0, 100_000), example="dp_shard = 8 (shards within 8 ranks, e.g. a node) or dp_shard = [0, 8]"),
    Setting("first_pipeline_num_layers", int, 0, "uneven first pipeline stage",
            "transformer layers on the first pipeline stage (0: an even split); the stages without a set "
            "count split the rest evenly (Megatron-LM --decoder-first-pipeline-num-layers)",
            "--decoder-first-pipeline-num-layers", inert_at=("pp",), table="parallel", int_range=(0, 100_000),
            example="first_pipeline_num_layers = 6, or a list; 0 = even"),
    Setting("last_pipeline_num_layers", int, 0, "uneven last pipeline stage",
            "transformer layers on the last pipeline stage (0: an even split); the stages without a set "
            "count split the rest evenly (Megatron-LM --decoder-last-pipeline-num-layers)",
            "--decoder-last-pipeline-num-layers", inert_at=("pp",), table="parallel", int_range=(0, 100_000),
            example="last_pipeline_num_layers = 6, or a list; 0 = even"),
    Setting("account_for_embedding_in_pipeline_split", bool, False, "embedding counted as a pipeline layer",
            "true counts the input embedding as one layer of the first stage when splitting the layers over "
            "the pipeline: (num_layers + 1) / pp each, one fewer on the first stage (Megatron-LM "
            "--account-for-embedding-in-pipeline-split; Megatron-DeepSpeed's partition, BLOOM)",
            "--account-for-embedding-in-pipeline-split", inert_at=("pp",), table="parallel",
            requires=(("first_pipeline_num_layers", 0), ("last_pipeline_num_layers", 0))),
    Setting("account_for_loss_in_pipeline_split", bool, False, "loss counted as a pipeline layer",
            "true counts the output layer and loss as one layer of the last stage when splitting the layers "
            "over the pipeline (Megatron-LM --account-for-loss-in-pipeline-split; with the embedding flag "
            "(num_layers + 2) / pp each, one fewer on the first and last stage: BLOOM's 70 layers over 12 stages)",
            "--account-for-loss-in-pipeline-split", inert_at=("pp",), table="parallel",
            requires=(("first_pipeline_num_layers", 0), ("last_pipeline_num_layers", 0))),
    Setting("precision", str, "bf16", "training precision",
            "the number format of the weights, activations and GEMMs: bf16 (16-bit mixed precision: bf16 weights, "
            "activations and tensor-core GEMMs, fp32 master weights and optimizer; Megatron-LM --bf16), fp8 (bf16 "
            "mixed precision with the linear layers' GEMMs in FP8 through Transformer Engine, hybrid E4M3/E5M2, "
            "scaled per fp8_recipe; attention core, embeddings and LM head in bf16; --bf16 --fp8-format hybrid; "
            "needs a GPU with FP8 tensor cores), fp16 (as bf16 in fp16, with dynamic loss scaling: the gradients "
            "unscaled and checked for inf/nan every step and the steps that overflow skipped; --fp16), fp32 (no "
            "mixed precision: fp32 weights, activations, gradients and communication, GEMMs at the GPU's FP32 "
            "peak without TF32, PyTorch's default since 1.12; Megatron-LM without --bf16 / --fp16) or tf32 (fp32 "
            "training whose GEMMs run on TF32 tensor cores: torch.backends.cuda.matmul.allow_tf32 = True or "
            "NVIDIA's containers' TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1)",
            "--fp8-format", choices=("bf16", "fp8", "fp16", "fp32", "tf32")),
    Setting("cp_comm_type", str, "p2p", "context-parallel all-gather attention",
            "how context parallelism exchanges keys and values: p2p, ring attention (K/V blocks passed to the "
            "next rank of the cp group over cp - 1 steps, each overlapped with the attention block of the step; "
            "dK/dV passed back the same way), or all_gather (K/V all-gathered over the cp group before the "
            "attention, exposed; dK/dV reduce-scattered after it) (Megatron-LM --cp-comm-type; Transformer "
            "Engine AttnFuncWithCPAndKVP2P / AttnFuncWithCPAndKVAllGather)",
            "--cp-comm-type", inert_at=("cp",), table="parallel", choices=("p2p", "all_gather")),
    Setting("fp8_recipe", str, "delayed", "FP8 scaling recipe",
            "how Transformer Engine scales the FP8 tensors under precision = fp8: delayed (one scale per "
            "tensor from the amax history of earlier iterations, taken in the cast's own pass), tensorwise "
            "(current scaling: each tensor's amax computed right before its cast, one more read of it and "
            "two more kernels per cast), or mxfp8 (Blackwell block scaling: one E8M0 scale per 32 elements, "
            "rowwise and columnwise copies, no amax pass; needs a GPU with MXFP8 tensor cores) (Megatron-LM "
            "--fp8-recipe; TE DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling)",
            "--fp8-recipe", inert_with=NOT_FP8, choices=("delayed", "tensorwise", "mxfp8")),
    Setting("num_layers_at_start_in_bf16", int, 0, "first transformer layers kept in bf16",
            "under precision = fp8, this many of the first transformer layers (global layer index) run their "
            "linears in bf16: no FP8 casts or weight copies there, bf16 GEMMs and saved inputs (Megatron-core "
            "--first-last-layers-bf16 --num-layers-at-start-in-bf16, fp8_utils.is_first_last_bf16_layer; 0 = "
            "the flag off)",
            "--num-layers-at-start-in-bf16", inert_with=NOT_FP8, int_range=(0, 100_000),
            example="num_layers_at_start_in_bf16 = 1 or [0, 1, 2] (0 = every layer in FP8)"),
    Setting("num_layers_at_end_in_bf16", int, 0, "last transformer layers kept in bf16",
            "under precision = fp8, this many of the last transformer layers run their linears in bf16 "
            "(Megatron-core --first-last-layers-bf16 --num-layers-at-end-in-bf16; 0 = the flag off)",
            "--num-layers-at-end-in-bf16", inert_with=NOT_FP8, int_range=(0, 100_000),
            example="num_layers_at_end_in_bf16 = 1 or [0, 1, 4] (0 = every layer in FP8)"),
    Setting("overlap_p2p_comm", bool, False, "overlapped pipeline sends (interleaved 1F1B)",
            "true overlaps the interleaved schedule's pipeline sends and receives with the neighbouring "
            "model chunk's forward or backward instead of blocking on them (Megatron-core "
            "overlap_p2p_comm: on by default in Megatron-LM since 2023, --no-overlap-p2p-communication turns "
            "it off; NeMo's configs set it; only the interleaved schedule, vpp > 1)",
            "--no-overlap-p2p-communication", inert_at=("pp",), inert_with=(("vpp", 1),), table="parallel"),
    Setting("ep", int, 1, "expert parallelism",
            "expert-parallel size: each MoE layer's routed experts split over ep ranks (num_experts / ep each), "
            "tokens sent to their experts and back by all-to-all (Megatron-LM --expert-model-parallel-size); "
            "num_experts must divide by ep and tp x cp x dp by etp x ep; no effect on dense models",
            "--expert-model-parallel-size", table="parallel", int_range=(1, 100_000),
            inert_models="dense models (num_experts = 0)",
            example="ep = 8 or ep = [1, 2, 4, 8] (1 = no expert parallelism)"),
    Setting("etp", int, 0, "expert tensor parallelism",
            "expert-tensor-parallel size: each routed expert's MLP split over etp ranks (0: etp = tp, Megatron-core's "
            "default when --expert-tensor-parallel-size is unset); no effect on dense models",
            "--expert-tensor-parallel-size", table="parallel", int_range=(0, 100_000),
            inert_models="dense models (num_experts = 0)",
            example="etp = 1 or etp = [0, 1] (0 = the same as tp)"),
    Setting("moe_token_dispatcher_type", str, "alltoall", "MoE token dispatcher",
            "how an MoE layer's tokens reach their experts: alltoall (each rank sends its tokens' top-k copies to "
            "the ranks of the ep group that hold their experts and gets the outputs back the same way, then with "
            "etp > 1 all-gathers them over etp; Megatron-core MoEAlltoAllTokenDispatcher) or allgather (every "
            "rank all-gathers the tokens of its whole etp x ep group, bf16 activations with their fp32 routing "
            "probabilities and routing map, keeps those of its local experts, and the outputs are "
            "reduce-scattered back in fp32; MoEAllGatherTokenDispatcher). Megatron-core's own default is "
            "allgather; the default here is alltoall, which the published MoE recipes set. flex (DeepEP, HybridEP) "
            "is not modelled; no effect on dense models",
            "--moe-token-dispatcher-type", table="parallel", choices=("alltoall", "allgather"),
            inert_models="dense models (num_experts = 0)"),
    Setting("overlap_moe_expert_parallel_comm", bool, False, "MoE all-to-all overlapped (combined 1F1B)",
            "true runs one micro-batch's forward together with another's backward, layer by layer, so that each "
            "MoE layer's dispatch and combine all-to-all of the one hide behind the other's compute (Megatron-core "
            "combined_1f1b, --overlap-moe-expert-parallel-comm; the idea of DeepSeek-V3's DualPipe); the "
            "forwards of the warm-up and the backwards of the cool-down have no partner and expose theirs. "
            "Megatron-core refuses it at ep = 1, with full recomputation and at pp > 1 without vpp (status "
            "refused); no effect on dense models",
            "--overlap-moe-expert-parallel-comm", table="parallel",
            requires=(("moe_token_dispatcher_type", "alltoall"),),
            inert_models="dense models (num_experts = 0)"),
    Setting("moe_expert_capacity_factor", float, 0.0, "MoE expert capacity factor",
            "0: dropless routing (Megatron-core's default, None); else each expert takes at most this factor "
            "times its even share of the routed tokens and drops the rest, which caps the busiest expert's "
            "rows at the factor (Megatron-LM --moe-expert-capacity-factor, with the aux-loss router); no effect "
            "on dense models",
            "--moe-expert-capacity-factor", int_range=(0.0, 1000.0),
            example="moe_expert_capacity_factor = 1.25 or [0.0, 1.0, 1.25] (0 = dropless)",
            inert_models="dense models (num_experts = 0)"),
    Setting("moe_pad_expert_input_to_capacity", bool, False, "MoE expert inputs padded to capacity",
            "true pads every expert's tokens up to its capacity (moe_expert_capacity_factor times the even "
            "share): every expert computes and every rank receives exactly the capacity (Megatron-LM "
            "--moe-pad-expert-input-to-capacity); no effect on dense models",
            "--moe-pad-expert-input-to-capacity", inert_with=(("moe_expert_capacity_factor", 0.0),),
            inert_models="dense models (num_experts = 0)"),
    Setting("moe_load_imbalance", float, 1.0, "MoE load imbalance (assumed)",
            "the busiest expert-parallel rank's routed tokens (its local experts' together) over the mean "
            "(1.0: balanced, what the auxiliary load-balancing loss aims at and Megatron-Bridge's "
            "force-balanced benchmarks run); the slowest rank's expert GEMMs, their activations and the "
            "all-to-all it receives scale with it, at most ep (one rank gets at most every token), capped by "
            "the capacity factor (padded: the capacity itself); no effect at ep = 1 (every rank holds every "
            "expert). An assumption to vary, not a framework flag: nothing here measures it; no effect on "
            "dense models",
            NO_FLAG, int_range=(1.0, 1000.0),
            example="moe_load_imbalance = 1.2 or [1.0, 1.2, 1.5] (1 = balanced)",
            inert_models="dense models (num_experts = 0)"),
    Setting("use_precision_aware_optimizer", bool, False, "precision-aware optimizer",
            "true runs Adam as Transformer Engine's FusedAdam with lower-precision optimizer states "
            "(exp_avg_dtype, exp_avg_sq_dtype) and the fp32 master weight kept as the bf16 weight plus a "
            "16-bit remainder (Megatron-core's store_param_remainders, its default with TE >= 2.1): 2 bytes "
            "of master weight per parameter instead of 4 (Megatron-LM --use-precision-aware-optimizer; "
            "megatron/core/optimizer/distrib_optimizer.py)",
            "--use-precision-aware-optimizer"),
    Setting("exp_avg_dtype", str, "fp32", "Adam first moment's dtype",
            "the dtype Adam's first moment is stored in: fp32 (4 bytes per parameter), fp16 or bf16 (2), "
            "fp8 (1: uint8 with a scale, 8-bit optimizer states as bitsandbytes' Adam8bit keeps them); the "
            "Adam kernel reads and writes that many bytes (Megatron-LM --exp-avg-dtype; needs the "
            "precision-aware optimizer)",
            "--exp-avg-dtype", requires=(("use_precision_aware_optimizer", True),),
            choices=("fp32", "fp16", "bf16", "fp8")),
    Setting("exp_avg_sq_dtype", str, "fp32", "Adam second moment's dtype",
            "the dtype Adam's second moment is stored in, as exp_avg_dtype (Megatron-LM --exp-avg-sq-dtype; "
            "needs the precision-aware optimizer)",
            "--exp-avg-sq-dtype", requires=(("use_precision_aware_optimizer", True),),
            choices=("fp32", "fp16", "bf16", "fp8")),
    Setting("optimizer_cpu_offload", bool, False, "optimizer offloaded to the CPU",
            "true keeps optimizer_offload_fraction of the parameters' optimizer states (master weight, Adam "
            "moments) in host memory and steps them on the CPU (ZeRO-Offload, Ren et al. 2021; Megatron-core's "
            "HybridDeviceOptimizer, megatron/core/optimizer/cpu_offloading): their fp32 gradients go to the "
            "host and their fp32 parameters come back over the GPU's host link every step (Megatron-LM "
            "--optimizer-cpu-offload; needs the precision-aware optimizer)",
            "--optimizer-cpu-offload", requires=(("use_precision_aware_optimizer", True),)),
    Setting("optimizer_offload_fraction", float, 1.0, "share of the optimizer offloaded",
            "the share of the parameters whose optimizer runs on the CPU under optimizer_cpu_offload, 0-1 "
            "(Megatron-LM --optimizer-offload-fraction)",
            "--optimizer-offload-fraction", inert_with=(("optimizer_cpu_offload", False),), int_range=(0.0, 1.0),
            example="optimizer_offload_fraction = 0.5 or [0.25, 0.5, 1.0]"),
    Setting("overlap_cpu_optimizer_d2h_h2d", bool, False, "CPU optimizer step overlapped with its copies",
            "true pipelines the offloaded optimizer's gradient copies to the host, its CPU step and the "
            "parameter copies back (Megatron-LM --overlap-cpu-optimizer-d2h-h2d): the slowest of the three "
            "instead of their sum",
            "--overlap-cpu-optimizer-d2h-h2d", inert_with=(("optimizer_cpu_offload", False),)),
    Setting("cpu_offloading_num_layers", int, 0, "activations of the first layers offloaded to the CPU",
            "this many of a rank's first transformer layers keep their saved activations in host memory: each "
            "layer's are copied to the host after its forward and back before its backward, on their own CUDA "
            "stream under the other layers' compute (Megatron-LM --cpu-offloading-num-layers, Transformer "
            "Engine's get_cpu_offload_context: the activation memory is that of the other layers, (num_layers - "
            "k) layers); at most num_layers - 1; Megatron-core refuses it with pipeline parallelism (pp > 1) and "
            "with activation recomputation (status refused); 0 = off",
            "--cpu-offloading-num-layers", int_range=(0, 100_000),
            example="cpu_offloading_num_layers = 4 or [0, 2, 4] (0 = no activation offloading)",
            refused_where="at pp > 1, with recomputation (full or selective) and from num_layers on (status refused)"),
    Setting("param_cpu_offload", bool, False, "parameters offloaded to the CPU (FSDP2)",
            "true keeps the parameter shards, their gradients and the optimizer states in host memory under ZeRO-3 "
            "(PyTorch FSDP2 fully_shard with CPUOffloadPolicy, torchtitan training.enable_cpu_offload; ZeRO-Infinity "
            "/ DeepSpeed offload_param, Rajbhandari et al. 2021): each layer's fp32 shard is copied to the GPU "
            "before its all-gather in forward and again in backward, its gradient shard copied back after the "
            "reduce-scatter, and Adam steps on the CPU; no effect at dp x cp = 1, where nothing is sharded; Megatron-LM "
            "has no such flag (needs zero_stage = 3)",
            NO_MEGATRON_FLAG, inert_at=("dp",), requires=(("zero_stage", 3),),
            framework="PyTorch FSDP2's CPUOffloadPolicy, an option of fully_shard (ZeRO-3),"),
    Setting("grad_reduce_in_bf16", bool, False, "gradients kept and reduced in bf16",
            "true keeps the gradients in 16 bits: accumulated in bf16 and reduced over the data-parallel ranks "
            "in bf16 (Megatron-LM --grad-reduce-in-bf16; DeepSpeed's default). false is Megatron-LM's default "
            "under --bf16 (accumulate_allreduce_grads_in_fp32, megatron/training/arguments.py): fp32 main "
            "gradients, a 4-byte buffer per parameter that stays full size on every rank with the distributed "
            "optimizer (megatron/core/distributed/param_and_grad_buffer.py: the reduce-scatter writes into "
            "this rank's slice of it), the weight gradients accumulated into it (gradient_accumulation_fusion) "
            "and reduced in fp32: twice the bytes of the gradient reduce-scatter or all-reduce, while the "
            "parameter all-gather stays 16-bit; torchtitan reduces in fp32 too (training.mixed_precision_reduce). "
            "No effect under fp16 (Megatron-LM keeps fp16 gradients there) or fp32 / tf32 (4-byte gradients anyway)",
            "--grad-reduce-in-bf16",
            inert_with=(("precision", "fp16"), ("precision", "fp32"), ("precision", "tf32")),
            priced_before=True),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
# The switches (bool settings), in axis order.
SWITCHES: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.kind is bool)
# The integer settings (vpp, zero_stage), in axis order.
INT_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.kind is int)
# The number settings (the MoE capacity factor and load imbalance), in axis order.
FLOAT_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.kind is float)
# The choice (str) settings, in axis order.
CHOICES: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.kind is str)


def with_registry_fields(records, last: tuple[str, ...] = ()):
    """A class decorator: the class as a frozen dataclass with one field per record of ``records``
    (anything with ``name``, ``kind`` and ``default``: the training settings here, the architecture
    flags of :mod:`vtrain_fast.model.arch`) after its own fields, and its fields named in ``last``
    after those (they keep their defaults). ``GPUPreset`` and ``ModelShape`` take their registry's
    fields this way."""
    def decorate(cls):
        moved = {k: (cls.__annotations__.pop(k), cls.__dict__[k]) for k in last}
        for k in last:
            delattr(cls, k)
        for rec in records:
            cls.__annotations__[rec.name] = rec.kind.__name__
            setattr(cls, rec.name, rec.default)
        for k, (kind, default) in moved.items():
            cls.__annotations__[k] = kind
            setattr(cls, k, default)
        return dataclass(frozen=True)(cls)
    return decorate


# Settings that spell one plan two ways: ZeRO stage 1 is Megatron-LM's distributed optimizer.
SAME_PLAN = ("zero_stage", "distributed_optimizer")


def canonical_values(values: dict) -> dict:
    """``values`` (name -> value) with the settings of :data:`SAME_PLAN` in one spelling: a
    ZeRO stage of 1 or more shards the Adam states, so it says ``distributed_optimizer = true``;
    ``distributed_optimizer = true`` at stage 0 says ``zero_stage = 1``. Sweeps and evaluate
    read every machine's settings through it, so the two spellings are one machine (priced once)
    and what needs the distributed optimizer (``overlap_param_gather``) takes either."""
    out = dict(values)
    if out.get("zero_stage", 0) >= 1:
        out["distributed_optimizer"] = True
    elif out.get("distributed_optimizer", False):
        out["zero_stage"] = 1
    return out


def unmet_requirements(values: dict, sizes_are_1: dict | None = None) -> list[tuple[Setting, str, bool]]:
    """``(setting, needed setting, needed value)`` for each switched-on setting of ``values``
    (name -> value, every setting) whose requirement (:attr:`Setting.requires`) is not met; with
    ``sizes_are_1`` (:data:`LAYOUT_SIZES` -> bool, a plan's kind) a needed setting that
    Megatron-LM switches off on such plans (:attr:`Setting.off_at`) does not count as on."""
    def acting(k):
        off = sizes_are_1 is not None and any(sizes_are_1[s] for s in BY_NAME[k].off_at)
        return BY_NAME[k].default if off else values[k]
    return [(st, k, v) for st in SETTINGS if values[st.name] != st.default
            for k, v in st.requires if acting(k) != v]


def rules_markdown() -> str:
    """The no-effect and requirement rules of every setting as a Markdown list (README's copy is
    this text; a test checks it)."""
    def val(v):
        return str(v).lower()
    lines = []
    for st in SETTINGS:
        parts = [f"no effect at {' or '.join(f'{SIZE_LABELS[k]} = 1' for k in st.inert_at)}"] if st.inert_at else []
        parts += [f"Megatron-LM switches it off at {' or '.join(f'{k} = 1' for k in st.off_at)}"] if st.off_at else []
        with_values = {}
        for k, v in st.inert_with:
            with_values.setdefault(k, []).append(val(v))
        parts += [f"no effect with {k} = {' or '.join(vs)}" for k, vs in with_values.items()]
        parts += [f"needs {' and '.join(f'{k} = {val(v)}' for k, v in st.requires)}"] if st.requires else []
        parts += [f"no effect on {st.inert_models}"] if st.inert_models else []
        parts += [f"refused {st.refused_where}"] if st.refused_where else []
        values = f" [{' | '.join(st.choices)}]" if st.choices else ""
        lines.append(f"- `{st.name}`{values} ({st.megatron}): " + ("; ".join(parts) if parts else "acts on every plan"))
    return "\n".join(lines) + "\n"
