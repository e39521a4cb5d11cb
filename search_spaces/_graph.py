"""Small fx helpers the operators' graph rules (search_spaces/<op>/graph.py) are written with.

A captured graph is `torch.export.export(...).module()`: ATen ops, parameters as get_attr nodes, and
`node.meta["nn_module_stack"]` naming the module each node came from. `values` maps node names to their values
on the example inputs (the engine, autotune/torch/graph.py, computes them). Imports torch only where a function
needs it.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable, Sequence

from .template import WorkloadError

__all__ = ["ancestors_include", "attr", "fresh_attr", "has_op", "insertion_point", "is_call", "node_order",
           "register", "scalar_arg", "sole_user", "tensor_value", "where", "workload_error"]


def is_call(node: Any, *targets: Any) -> bool:
    """Whether `node` is a call_function of one of `targets` (ATen OpOverloads or Python callables)."""
    return getattr(node, "op", None) == "call_function" and node.target in targets


def sole_user(node: Any, *targets: Any) -> Any:
    """`node`'s only user when that is a call of one of `targets` (e.g. the ReLU a Linear feeds), else None."""
    users = list(node.users)
    return users[0] if len(users) == 1 and is_call(users[0], *targets) else None


def attr(gm: Any, target: str) -> Any:
    """The object a get_attr target names (dotted: `embs.0.weight`), or None."""
    try:
        return functools.reduce(getattr, target.split("."), gm)
    except AttributeError:
        return None


def tensor_value(gm: Any, values: dict[str, Any], node: Any) -> Any:
    """`node`'s value on the example inputs: from `values`, or the attribute a get_attr node names."""
    if not hasattr(node, "op"):
        return None
    if node.name in values:
        return values[node.name]
    return attr(gm, node.target) if node.op == "get_attr" else None


def scalar_arg(node: Any, index: int, name: str, default: Any) -> Any:
    """Argument `index` (or keyword `name`) of a call node, or `default` when left out."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def where(nodes: Iterable[Any]) -> str:
    """The module path(s) the nodes came from (the innermost nn_module_stack entry), for the report."""
    paths: list[str] = []
    for node in nodes:
        stack = node.meta.get("nn_module_stack") or {}
        entries = [v for v in stack.values() if isinstance(v, tuple) and v and not str(v[0]).startswith("_")]
        path = str(entries[-1][0]) if entries else ""
        path = path or "<model>"
        if path not in paths:
            paths.append(path)
    if len(paths) > 4:
        return f"{paths[0]}, {paths[1]}, ..., {paths[-1]} ({len(paths)} modules)"
    return ", ".join(paths)


def node_order(gm: Any) -> dict[Any, int]:
    """Each node's position in the graph (the graph is topologically ordered)."""
    return {n: i for i, n in enumerate(gm.graph.nodes)}


def insertion_point(gm: Any, inputs: Sequence[Any], outputs: Sequence[Any]) -> Any:
    """The node to insert a replacement before (`gm.graph.inserting_before`): the first user of any output,
    which must come after every input. Raises ValueError when no such place exists."""
    order = node_order(gm)
    users = [u for o in outputs for u in o.users]
    if not users:
        raise ValueError("the outputs have no users")
    first = min(users, key=order.__getitem__)
    late = [n for n in inputs if hasattr(n, "op") and order[n] >= order[first]]
    if late:
        raise ValueError(f"{late[0].name} is computed after {first.name}, which uses an output")
    return first


def fresh_attr(gm: Any, prefix: str) -> str:
    """A name `prefix_<k>` that `gm` has no attribute of yet."""
    k = 0
    while hasattr(gm, f"{prefix}_{k}"):
        k += 1
    return f"{prefix}_{k}"


def register(gm: Any, prefix: str, tensor: Any, trainable: bool = False) -> Any:
    """Register `tensor` as a new buffer of `gm` (a Parameter when `trainable`: the model's own tables it replaces
    took gradients) and return a get_attr node reading it (inserted at the graph's current insertion point)."""
    import torch

    name = fresh_attr(gm, prefix)
    if trainable:
        gm.register_parameter(name, torch.nn.Parameter(tensor, requires_grad=True))
    else:
        gm.register_buffer(name, tensor)
    return gm.graph.get_attr(name)


def ancestors_include(node: Any, op: str = "placeholder") -> bool:
    """Whether any node `node` is computed from has `node.op == op` (a placeholder: it depends on the inputs)."""
    seen: set[Any] = set()
    todo = [node]
    while todo:
        n = todo.pop()
        if n in seen or not hasattr(n, "op"):
            continue
        seen.add(n)
        if n.op == op:
            return True
        todo.extend(n.all_input_nodes)
    return False


def has_op(name: str) -> bool:
    """Whether `torch.ops.autotune.<name>` is registered (autotune.torch registers the ops)."""
    import torch

    try:
        getattr(torch.ops.autotune, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def workload_error(cls: Any, fields: dict[str, Any]) -> str:
    """Why these task fields are no workload of `cls` (its WorkloadError's message), or ""."""
    try:
        cls(**fields)
    except WorkloadError as err:
        return str(err)
    return ""


@functools.cache
def host_cpu_flags() -> frozenset[str]:
    """This machine's CPU feature flags (Linux's /proc/cpuinfo: "avx512_vnni", "avx512_bf16", ...): what a rule's
    kernels may rely on where it runs them; empty where unreadable."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return frozenset(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return frozenset()
