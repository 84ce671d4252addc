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

Run: ``python tests/data/make_framework_args.py megatron MEGATRON_LM_DIR COMMIT > tests/data/megatron_lm_args.txt``
and ``python tests/data/make_framework_args.py bridge MEGATRON_LM_DIR BRIDGE_DIR COMMIT >
tests/data/megatron_bridge_keys.txt`` (the files in the repository: the commits in their first
lines). Not run by the tests: the tests read the files it wrote.
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


if __name__ == "__main__":
    if sys.argv[1] == "bridge":
        bridge(*sys.argv[2:5])
    else:
        main(*sys.argv[2:4])
