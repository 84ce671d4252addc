"""Write ``megatron_lm_args.txt``: the command-line flags Megatron-LM's ``pretrain_gpt.py`` accepts,
read from a Megatron-LM source tree without importing it (no torch needed); and
``megatron_bridge_keys.txt``: the ``ConfigContainer`` override keys of Megatron-Bridge (NeMo 2's
training library) that ``vtrain-fast export --to bridge`` may write.

Two sources, as ``megatron/training/arguments.py`` builds its parser: the flags it adds itself
(``add_argument('--flag', ...)``, aliases included), and the flags ``ArgumentGroupFactory``
(``megatron/training/argument_utils.py``) derives from config dataclasses: one ``--field-name``
per field, ``--no-field-name`` and ``--disable-field-name`` for a bool field whose default is True,
the field's ``argparse_meta`` ``arg_names`` where given, less the ``exclude`` list of the call.
Only the dataclasses whose flags ``vtrain-fast export`` writes are read: ``TransformerConfig``
(with its base ``ModelParallelConfig``), ``TrainingConfig``, ``TokenizerConfig`` and
``DistributedInitConfig``.

Bridge keys: ``section.field`` for the dataclass fields of the sections an export sets: ``model``
(Megatron-core ``ModelParallelConfig``, ``TransformerConfig``, ``MLATransformerConfig`` and
Megatron-Bridge's ``GPTModelProvider``), ``train`` (Megatron-LM's and Megatron-Bridge's
``TrainingConfig``), ``ddp`` (Megatron-core's and Megatron-Bridge's ``DistributedDataParallelConfig``),
``optimizer`` (both ``OptimizerConfig``), ``comm_overlap`` (``CommOverlapConfig``), and
``mixed_precision=<name>`` for every recipe ``mixed_precision.py`` registers.

torchtitan names (``torchtitan_names.txt``): what a recipe module from ``vtrain-fast export --to
torchtitan`` may name, read from a torchtitan source tree with :mod:`ast` (no torch needed), one
``KIND ...`` line each:

- ``attr PATH``: a field of ``Trainer.Config`` (``torchtitan/trainer.py``), and ``SECTION.FIELD``
  for the fields of the dataclasses its ``training``, ``parallelism`` and ``compile`` fields are
  annotated with (``TrainingConfig``, ``ParallelismConfig``, ``CompileConfig``): what
  ``config.PATH = ...`` may assign;
- ``literal KEY VALUE``: the values a ``Literal[...]``-typed field takes (``KEY`` an attribute
  path, or ``MODULE:CALLABLE.KEYWORD``);
- ``import MODULE:NAME``: every top-level name (definitions, assignments, imports) of the modules an
  export imports from (:data:`TORCHTITAN_MODULES`);
- ``call MODULE:CALLABLE`` and ``kwarg MODULE:CALLABLE NAME``: the callables an export calls and
  their parameters (a function's, or for ``X.Config`` the dataclass fields of the nested ``Config``
  class with those of its bases, followed through the imports), :data:`TORCHTITAN_CALLABLES` and
  every recipe function of ``torchtitan/models/llama3/config_registry.py``;
- ``schedule NAME``: the pipeline schedules torchtitan names (string values given to
  ``pipeline_parallel_schedule`` anywhere in ``torchtitan/`` and ``torchtitan_recipes/``, and the
  field's default; PyTorch's ``get_schedule_class`` resolves them);
- ``flavor NAME k=v ...``: each entry of ``llama3_configs`` (``torchtitan/models/llama3/__init__.py``)
  with the numbers its function builds the model from (dim, heads, KV heads, layers, vocabulary,
  ``compute_ffn_hidden_dim``'s ``multiple_of`` and ``ffn_dim_multiplier``, weight tying, RoPE);
- ``recipe NAME FLAVOR``: each recipe function of the llama3 ``config_registry`` and the flavor it
  passes to ``model_registry``.

Run: ``python tests/data/make_framework_args.py megatron MEGATRON_LM_DIR COMMIT > tests/data/megatron_lm_args.txt``,
``python tests/data/make_framework_args.py bridge MEGATRON_LM_DIR BRIDGE_DIR COMMIT >
tests/data/megatron_bridge_keys.txt`` and ``python tests/data/make_framework_args.py torchtitan
TORCHTITAN_DIR COMMIT > tests/data/torchtitan_names.txt`` (a checkout, or ``git archive COMMIT torchtitan
torchtitan_recipes | tar -x -C DIR`` of a bare mirror; the files in the repository: the commits in
their first lines). Not run by the tests: the tests read the files it wrote.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path


def _literal_flags(arguments_py: str) -> set[str]:
    out = set()
    for m in re.finditer(r"add_argument\(((?:\s*['\"]--?[A-Za-z0-9_-]+['\"]\s*,)+)", arguments_py):
        out.update(re.findall(r"['\"](--[A-Za-z0-9_-]+)['\"]", m.group(1)))
    return out


def _exclude(arguments_py: str, cls: str) -> set[str]:
    """The exclude list of ``ArgumentGroupFactory(cls, exclude=...)``: a literal list in the call, or the
    list assigned to the name it passes."""
    tree = ast.parse(arguments_py)
    lists = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            local = {}
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.List) and len(sub.targets) == 1 \
                        and isinstance(sub.targets[0], ast.Name):
                    local[sub.targets[0].id] = [e.value for e in sub.value.elts if isinstance(e, ast.Constant)]
                if isinstance(sub, ast.Call) and getattr(sub.func, "id", "") == "ArgumentGroupFactory" \
                        and sub.args and getattr(sub.args[0], "id", "") == cls:
                    for kw in sub.keywords:
                        if kw.arg == "exclude":
                            if isinstance(kw.value, ast.List):
                                lists[cls] = [e.value for e in kw.value.elts if isinstance(e, ast.Constant)]
                            elif isinstance(kw.value, ast.Name):
                                lists[cls] = local.get(kw.value.id, [])
    return set(lists.get(cls, []))


def _dataclass_fields(path: Path, cls: str) -> list[tuple[str, object, list[str] | None]]:
    """(name, default or None, argparse_meta arg_names or None) of the annotated fields of ``cls``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            out = []
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    default, names = None, None
                    v = st.value
                    if isinstance(v, ast.Constant):
                        default = v.value
                    elif isinstance(v, ast.Call) and getattr(v.func, "id", "") == "field":
                        for kw in v.keywords:
                            if kw.arg == "default" and isinstance(kw.value, ast.Constant):
                                default = kw.value.value
                            if kw.arg == "metadata":
                                src = ast.unparse(kw.value)
                                m = re.search(r"['\"]arg_names['\"]\s*:\s*\[([^\]]*)\]", src)
                                if m:
                                    names = re.findall(r"['\"](--[A-Za-z0-9_-]+)['\"]", m.group(1))
                    out.append((st.target.id, default, names))
            return out
    raise SystemExit(f"{cls} not found in {path}")


def _factory_flags(path: Path, cls: str, excluded: set[str]) -> set[str]:
    """The flags ``ArgumentGroupFactory`` derives from dataclass ``cls`` of ``path``."""
    out = set()
    for fname, default, names in _dataclass_fields(path, cls):
        if fname in excluded or fname.startswith("_"):
            continue
        if names:
            out.update(names)
        elif default is True:
            out.update({"--no-" + fname.replace("_", "-"), "--disable-" + fname.replace("_", "-")})
        else:
            out.add("--" + fname.replace("_", "-"))
    return out


def main(root: str, commit: str) -> None:
    root = Path(root)
    arguments_py = (root / "megatron/training/arguments.py").read_text(encoding="utf-8")
    flags = _literal_flags(arguments_py)
    transformer = _exclude(arguments_py, "TransformerConfig")
    flags |= _factory_flags(root / "megatron/core/model_parallel_config.py", "ModelParallelConfig", transformer)
    flags |= _factory_flags(root / "megatron/core/transformer/transformer_config.py", "TransformerConfig", transformer)
    for rel, cls in (("megatron/training/config/training_config.py", "TrainingConfig"),
                     ("megatron/training/config/training_config.py", "TokenizerConfig"),
                     ("megatron/training/config/common_config.py", "DistributedInitConfig")):
        flags |= _factory_flags(root / rel, cls, _exclude(arguments_py, cls))
    print(f"# NVIDIA/Megatron-LM {commit}: flags of megatron/training/arguments.py (tests/data/make_framework_args.py)")
    for f in sorted(flags):
        print(f)


def _all_fields(path: Path, cls: str) -> set[str]:
    return {name for name, _, _ in _dataclass_fields(path, cls) if not name.startswith("_")}


def bridge(mroot: str, broot: str, commit: str) -> None:
    m, b = Path(mroot), Path(broot) / "src/megatron/bridge"
    sections = {
        "model": [(m / "megatron/core/model_parallel_config.py", "ModelParallelConfig"),
                  (m / "megatron/core/transformer/transformer_config.py", "TransformerConfig"),
                  (m / "megatron/core/transformer/transformer_config.py", "MLATransformerConfig"),
                  (b / "models/gpt_provider.py", "GPTModelProvider")],
        "train": [(m / "megatron/training/config/training_config.py", "TrainingConfig"),
                  (b / "training/config.py", "TrainingConfig")],
        "ddp": [(m / "megatron/core/distributed/distributed_data_parallel_config.py", "DistributedDataParallelConfig"),
                (b / "training/config.py", "DistributedDataParallelConfig")],
        "optimizer": [(m / "megatron/core/optimizer/optimizer_config.py", "OptimizerConfig"),
                      (b / "training/config.py", "OptimizerConfig")],
        "comm_overlap": [(b / "training/comm_overlap.py", "CommOverlapConfig")],
    }
    keys = {f"{sec}.{name}" for sec, classes in sections.items() for path, cls in classes
            for name in _all_fields(path, cls)}
    recipes = re.findall(r"@register\s*\ndef\s+([a-z0-9_]+)\s*\(", (b / "training/mixed_precision.py").read_text())
    keys |= {f"mixed_precision={r}" for r in recipes}
    print(f"# NVIDIA-NeMo/Megatron-Bridge {commit} (with Megatron-LM's core): ConfigContainer override keys "
          "(tests/data/make_framework_args.py)")
    for k in sorted(keys):
        print(k)


# The modules a torchtitan export imports from (``import`` lines: all their top-level names).
TORCHTITAN_MODULES = (
    "torchtitan.trainer", "torchtitan.config", "torchtitan.models.llama3", "torchtitan.models.llama3.config_registry",
    "torchtitan.models.common", "torchtitan.models.common.config_utils", "torchtitan.components.quantization",
    "torchtitan.components.loss", "torchtitan.distributed.activation_checkpoint",
)
# The callables a torchtitan export calls (``call`` / ``kwarg`` lines), as MODULE:NAME or MODULE:CLASS.Config.
TORCHTITAN_CALLABLES = (
    "torchtitan.trainer:Trainer.Config", "torchtitan.models.llama3:model_registry", "torchtitan.models.llama3:_build_llama3_layers",
    "torchtitan.models.llama3:_output_linear_init", "torchtitan.models.llama3:Llama3Model.Config",
    "torchtitan.models.common:Embedding.Config", "torchtitan.models.common:RMSNorm.Config",
    "torchtitan.models.common:Linear.Config", "torchtitan.models.common:ComplexRoPE.Config",
    "torchtitan.models.common.config_utils:decoder_vocab_size",
    "torchtitan.components.quantization:Float8LinearConverter.Config",
    "torchtitan.components.quantization:MXFP8LinearConverter.Config",
    "torchtitan.components.loss:ChunkedLossWrapper.Config", "torchtitan.components.loss:CrossEntropyLoss.Config",
    "torchtitan.distributed.activation_checkpoint:FullAC.Config",
    "torchtitan.distributed.activation_checkpoint:SelectiveAC.Config",
)
# Trainer.Config fields whose dataclass's own fields an export sets (``attr SECTION.FIELD``).
TORCHTITAN_SECTIONS = ("training", "parallelism", "compile")


class _Tree:
    """A Python source tree read with :mod:`ast`: modules by dotted name, names followed through
    ``from ... import`` to where they are defined."""

    def __init__(self, root: Path):
        self.root, self._trees = root, {}

    def tree(self, module: str) -> tuple[ast.Module, bool]:
        """The parsed module and whether it is a package (``__init__.py``)."""
        if module not in self._trees:
            base = self.root / module.replace(".", "/")
            path, package = (base / "__init__.py", True) if (base / "__init__.py").exists() else (
                base.with_suffix(".py"), False)
            if not path.exists():
                raise SystemExit(f"{module}: no {path}")
            self._trees[module] = (ast.parse(path.read_text(encoding="utf-8")), package)
        return self._trees[module]

    def top_names(self, module: str) -> set[str]:
        """Names bound at the top level of ``module``."""
        out = set()
        for st in self.tree(module)[0].body:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(st.name)
            elif isinstance(st, ast.Assign):
                out |= {t.id for t in st.targets if isinstance(t, ast.Name)}
            elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                out.add(st.target.id)
            elif isinstance(st, ast.ImportFrom):
                out |= {a.asname or a.name for a in st.names if a.name != "*"}
            elif isinstance(st, ast.Import):
                out |= {(a.asname or a.name).split(".")[0] for a in st.names}
        return out

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module
        package = module if self.tree(module)[1] else module.rsplit(".", 1)[0]
        for _ in range(node.level - 1):
            package = package.rsplit(".", 1)[0]
        return f"{package}.{node.module}" if node.module else package

    def resolve(self, module: str, name: str):
        """``(module, node)`` of the definition ``name`` refers to in ``module`` (imports followed),
        or None outside the tree."""
        for st in self.tree(module)[0].body:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and st.name == name:
                return module, st
            if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in st.targets):
                return module, st
        for st in self.tree(module)[0].body:
            if isinstance(st, ast.ImportFrom):
                for a in st.names:
                    if (a.asname or a.name) == name:
                        src = self._absolute(module, st)
                        try:
                            self.tree(src)
                        except SystemExit:
                            return None         # outside the tree (torch, torchao)
                        return self.resolve(src, a.name)
        return None

    def dataclass_fields(self, module: str, cls: ast.ClassDef) -> dict[str, ast.expr]:
        """name -> annotation of the fields of ``cls`` and of its bases (bases first; ClassVar left out)."""
        out = {}
        for base in cls.bases:
            found = self.resolve_expr(module, base)
            if found is not None and isinstance(found[1], ast.ClassDef):
                out.update(self.dataclass_fields(*found))
        for st in cls.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) \
                    and "ClassVar" not in ast.unparse(st.annotation):
                out[st.target.id] = st.annotation
        return out

    def resolve_expr(self, module: str, expr: ast.expr):
        """``(module, node)`` of ``Name`` or ``Name.Nested`` (a class nested in a class)."""
        if isinstance(expr, ast.Name):
            return self.resolve(module, expr.id)
        if isinstance(expr, ast.Attribute):
            outer = self.resolve_expr(module, expr.value)
            if outer is not None and isinstance(outer[1], ast.ClassDef):
                for st in outer[1].body:
                    if isinstance(st, ast.ClassDef) and st.name == expr.attr:
                        return outer[0], st
        return None

    def callable_params(self, target: str) -> tuple[dict[str, ast.expr | None], str]:
        """The keyword names ``MODULE:NAME`` or ``MODULE:CLASS.Config`` takes (name -> annotation) and
        the module it is defined in."""
        module, dotted = target.split(":")
        expr = ast.parse(dotted, mode="eval").body
        found = self.resolve_expr(module, expr)
        if found is None:
            raise SystemExit(f"{target}: not found")
        where, node = found
        if isinstance(node, ast.ClassDef):
            return self.dataclass_fields(where, node), where
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            return {p.arg: p.annotation for p in a.posonlyargs + a.args + a.kwonlyargs}, where
        raise SystemExit(f"{target}: not a function or class")


def _literal_values(annotation) -> list[str]:
    """The string values of a ``Literal[...]`` annotation (also inside ``X | None``), else []."""
    out = []
    for node in ast.walk(annotation) if annotation is not None else ():
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "Literal":
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            out += [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return out


def _flavor_numbers(fn: ast.FunctionDef) -> dict:
    """The numbers a llama3 flavor function builds its model from: its constant assignments and the
    keywords of the calls in it (``Llama3Model.Config``, ``_build_llama3_layers``,
    ``compute_ffn_hidden_dim``, ``ComplexRoPE.Config``)."""
    env = {}
    for st in fn.body:
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant) and len(st.targets) == 1 \
                and isinstance(st.targets[0], ast.Name):
            env[st.targets[0].id] = st.value.value

    def value(expr):
        if isinstance(expr, ast.Constant):
            return expr.value
        if isinstance(expr, ast.Name):
            return env.get(expr.id)
        return None

    out = {"weight_tying": False, "ffn_dim_multiplier": None}
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        callee = ast.unparse(node.func)
        kw = {k.arg: k.value for k in node.keywords}
        if callee == "Llama3Model.Config":
            out["dim"], out["vocab_size"] = value(kw["dim"]), value(kw["vocab_size"])
            if "enable_weight_tying" in kw:
                out["weight_tying"] = bool(value(kw["enable_weight_tying"]))
        elif callee == "_build_llama3_layers":
            out["n_layers"], out["n_heads"] = value(kw["n_layers"]), value(kw["n_heads"])
            out["n_kv_heads"] = value(kw["n_kv_heads"]) if "n_kv_heads" in kw else out["n_heads"]
        elif callee == "compute_ffn_hidden_dim":
            out["multiple_of"] = value(kw["multiple_of"])
            if "ffn_dim_multiplier" in kw:
                out["ffn_dim_multiplier"] = value(kw["ffn_dim_multiplier"])
        elif callee == "ComplexRoPE.Config":
            out["rope_theta"], out["rope_max_context_length"] = value(kw["theta"]), value(kw["max_context_length"])
            out["rope_scaling"] = value(kw["scaling"])
    return out


def torchtitan(root: str, commit: str) -> None:
    src = _Tree(Path(root))
    lines = set()
    # attribute paths: Trainer.Config's fields, and the fields of its sections' dataclasses
    trainer = src.resolve_expr("torchtitan.trainer", ast.parse("Trainer.Config", mode="eval").body)
    fields = src.dataclass_fields(*trainer)
    for name, annotation in fields.items():
        lines.add(f"attr {name}")
        if name in TORCHTITAN_SECTIONS:
            section = src.resolve_expr(trainer[0], annotation)
            for field_name, field_annotation in src.dataclass_fields(*section).items():
                lines.add(f"attr {name}.{field_name}")
                lines |= {f"literal {name}.{field_name} {v}" for v in _literal_values(field_annotation)}
    # importable names
    for module in TORCHTITAN_MODULES:
        lines |= {f"import {module}:{n}" for n in src.top_names(module)}
    # callables and their keywords
    registry = "torchtitan.models.llama3.config_registry"
    recipes = [st for st in src.tree(registry)[0].body if isinstance(st, ast.FunctionDef)]
    for target in TORCHTITAN_CALLABLES + tuple(f"{registry}:{fn.name}" for fn in recipes):
        params, _ = src.callable_params(target)
        lines.add(f"call {target}")
        for name, annotation in params.items():
            lines.add(f"kwarg {target} {name}")
            lines |= {f"literal {target}.{name} {v}" for v in _literal_values(annotation)}
    # pipeline schedules torchtitan names
    for base in ("torchtitan", "torchtitan_recipes"):
        for path in sorted((Path(root) / base).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and any(
                        isinstance(t, ast.Attribute) and t.attr == "pipeline_parallel_schedule" for t in node.targets):
                    lines.add(f"schedule {node.value.value}")
                if isinstance(node, ast.keyword) and node.arg == "pipeline_parallel_schedule" \
                        and isinstance(node.value, ast.Constant):
                    lines.add(f"schedule {node.value.value}")
                if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "pipeline_parallel_schedule" \
                        and isinstance(node.value, ast.Constant):
                    lines.add(f"schedule {node.value.value}")
    # flavors and the recipes' flavors
    llama3, _ = src.tree("torchtitan.models.llama3")
    functions = {st.name: st for st in llama3.body if isinstance(st, ast.FunctionDef)}
    for st in llama3.body:
        if isinstance(st, ast.Assign) and getattr(st.targets[0], "id", "") == "llama3_configs":
            for key, fn in zip(st.value.keys, st.value.values):
                numbers = _flavor_numbers(functions[fn.id])
                lines.add(f"flavor {key.value} " + " ".join(f"{k}={numbers[k]}" for k in sorted(numbers)))
    for fn in recipes:
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "model_registry" and node.args:
                lines.add(f"recipe {fn.name} {node.args[0].value}")
                break
    print(f"# pytorch/torchtitan {commit}: names a torchtitan recipe from vtrain-fast export may use "
          "(tests/data/make_framework_args.py)")
    for line in sorted(lines):
        print(line)


if __name__ == "__main__":
    if sys.argv[1] == "bridge":
        bridge(*sys.argv[2:5])
    elif sys.argv[1] == "torchtitan":
        torchtitan(*sys.argv[2:4])
    else:
        main(*sys.argv[2:4])
