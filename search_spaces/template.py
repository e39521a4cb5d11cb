"""What every operator template provides, and the small shared pieces templates are built from.

A template is a package of `search_spaces` that defines `NAME` and the names of `Template` below; the registry
(`search_spaces.get`) finds it, so adding an operator touches no other file.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Protocol, Sequence

__all__ = ["DEVICE_KINDS", "GraphMatch", "GraphRule", "IndexOutOfRange", "InvalidDtype", "InvalidInput", "Kept",
           "ModuleRule", "PRECISIONS", "Reduced", "Route", "Template", "TorchBinding", "Traffic", "Workload",
           "WorkloadError", "by_device", "device_kinds", "finer", "is_gpu", "parse_shape", "target_from_json"]


class WorkloadError(ValueError):
    """A workload the operator cannot take (bad shape text, unknown key, out-of-range value)."""


@dataclass(frozen=True)
class Traffic:
    """Work one call does: bytes that must cross the memory bus and arithmetic ops, for % of roofline."""

    bytes: float
    ops: float = 0.0
    unit: str = "GB/s"  # the figure of merit the bench prints: "GB/s" or "GFLOPS"/"GOPS"

    def rate(self, seconds: float) -> float:
        return (self.bytes if self.unit == "GB/s" else self.ops) / seconds / 1e9


def parse_shape(text: str) -> dict[str, str]:
    """`rows=1000,dim=64` -> {"rows": "1000", "dim": "64"}; raises WorkloadError on malformed text."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise WorkloadError(f"malformed shape item {part!r}: expected key=value")
        if key.strip() in out:
            raise WorkloadError(f"shape key {key.strip()!r} given twice")
        out[key.strip()] = value.strip()
    if not out:
        raise WorkloadError("empty shape: expected key=value[,key=value...]")
    return out


def _convert(name: str, hint: Any, raw: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        if raw.lower() in ("none", ""):
            return None
        return _convert(name, next(a for a in args if a is not type(None)), raw)
    try:
        if hint is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if hint is int:
            return int(raw)
        if hint is float:
            return float(raw)
        if hint is str:
            return raw
    except ValueError:
        raise WorkloadError(f"{name}={raw!r}: expected {getattr(hint, '__name__', hint)}") from None
    raise TypeError(f"no shape parser for field {name} of type {hint}")


class Workload:
    """Base of the frozen dataclasses that describe one operator instance (shapes, dtypes, data).

    Subclasses list `SHAPE_ALIASES` (short `--shape` keys -> field names) and may define
    `parse_<field>(raw)` classmethods for fields whose text form is special (e.g. `pooling=20-80`).
    `__post_init__` of a subclass validates and raises WorkloadError.
    """

    SHAPE_ALIASES: ClassVar[dict[str, str]] = {}
    # Fields added after records of the workload were logged, with the value the older records meant: left out
    # of the JSON (and so of the key) while they hold it, so those records keep their identity.
    KEY_DEFAULTS: ClassVar[dict[str, Any]] = {}

    @classmethod
    def from_shape(cls, text: str) -> "Workload":
        raw = parse_shape(text)
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        kwargs: dict[str, Any] = {}
        for key, value in raw.items():
            name = cls.SHAPE_ALIASES.get(key, key)
            if name not in names:
                raise WorkloadError(f"unknown shape key {key!r}; known: {', '.join(cls.shape_keys())}")
            parser = getattr(cls, f"parse_{name}", None)
            kwargs[name] = parser(value) if parser else _convert(key, hints[name], value)
        try:
            return cls(**kwargs)
        except TypeError as err:  # a required field is missing
            missing = [f.name for f in dataclasses.fields(cls) if f.name not in kwargs  # type: ignore[arg-type]
                       and f.default is dataclasses.MISSING]
            raise WorkloadError(f"shape is missing {', '.join(missing) or err}") from None

    @classmethod
    def shape_keys(cls) -> list[str]:
        inverse = {v: k for k, v in cls.SHAPE_ALIASES.items()}
        return [inverse.get(f.name, f.name) for f in dataclasses.fields(cls)]  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if f.name in self.KEY_DEFAULTS and v == self.KEY_DEFAULTS[f.name]:
                continue
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "Workload":
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for name, value in raw.items():
            kwargs[name] = tuple(value) if isinstance(value, list) and "tuple" in str(hints[name]) else value
        return cls(**kwargs)

    def key(self) -> str:
        """Stable, human-readable identity used in records and kernel names."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    def numeric_features(self) -> dict[str, float]:
        """Numbers the cost model sees, so one model can rank configs across shapes."""
        out: dict[str, float] = {}
        for name, value in self.to_json().items():
            if isinstance(value, bool):
                out[name] = float(value)
            elif isinstance(value, (int, float)):
                out[name] = float(value)
            elif isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
                for i, v in enumerate(value):
                    out[f"{name}.{i}"] = float(v)
        return out


def is_gpu(target: Any) -> bool:
    """Whether a tvm Target (or its kind name) is a GPU one: templates pick their CUDA or CPU module by it."""
    kind = target if isinstance(target, str) else getattr(getattr(target, "kind", None), "name", "")
    return kind.split(":")[0] in ("cuda", "nvptx", "rocm")


def target_from_json(spec: dict[str, Any]) -> Any:
    """A tvm Target from its JSON as devices and records hold it (a "host" entry is the host target): here, below
    autotune, because the cost model rebuilds the targets of the records it learns from (autotune.targets
    re-exports it)."""
    import tvm

    spec = dict(spec)
    host = spec.pop("host", None)
    return tvm.target.Target(spec, host=host) if host else tvm.target.Target(spec)


DEVICE_KINDS = ("cpu", "cuda")  # the kinds of device a template may generate kernels for


def device_kinds(template: Any) -> tuple[str, ...]:
    """The kinds of device ("cpu", "cuda") a template has kernels for: its DEVICE_KINDS, both where it names none."""
    return tuple(getattr(template, "DEVICE_KINDS", DEVICE_KINDS))


def by_device(cpu: Any, cuda: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """`space(w, target)` and `lower(w, cfg, target)` of a template whose cpu and cuda modules each define
    them: the target picks the module. `cuda` None: a CPU-only template (it declares DEVICE_KINDS = ("cpu",)),
    whose space and lower refuse a GPU target with an InvalidConfig that says so."""
    from .space import InvalidConfig

    def module(target: Any) -> Any:
        if not is_gpu(target):
            return cpu
        if cuda is None:
            raise InvalidConfig(f"{cpu.__name__.rpartition('.')[0]} runs on CPUs only: it has no CUDA template")
        return cuda

    def space(w: Any, target: Any) -> Any:
        return module(target).space(w, target)

    def lower(w: Any, cfg: Any, target: Any) -> Any:
        return module(target).lower(w, cfg, target)

    return space, lower


# ---- errors a call's tensors can raise (PyTorch raises RuntimeError for all of them; ours are both) ----------
class InvalidInput(ValueError, RuntimeError):
    """A tensor of the wrong shape, device or layout, or malformed offsets."""


class InvalidDtype(TypeError, RuntimeError):
    """A tensor of the wrong dtype."""


class IndexOutOfRange(IndexError, RuntimeError):
    """An index outside the embedding table."""


# ---- how an operator appears in PyTorch (read by autotune.torch; see TorchBinding) ---------------------------
@dataclass(frozen=True)
class Route:
    """Where a torch-op call goes: the kernels compiled for `signature`, at `size` along the dimension a kernel
    may serve at any size (`TorchBinding.any_size`) or must be padded/split to (fixed-size kernels). A size
    below 1 (an empty call: nothing to compute) runs PyTorch's implementation, without a warning."""

    signature: tuple[Any, ...]
    size: int


@dataclass(frozen=True)
class ModuleRule:
    """How `autotune.torch.optimize` swaps one kind of PyTorch module for a module running the operator.

    `swap(module, next_module, has_kernel, validate)` returns None when the rule does not apply to `module`
    (optimize then looks inside it), a reason string when it applies but the module is kept, or
    `(new_module, fuses_next)`: `fuses_next` says the new module also does `next_module`'s work (a ReLU after a
    Linear), which optimize then replaces by nn.Identity. `has_kernel(match)` tells whether a loaded kernel of
    this operator, on the module's device, has a workload for which `match(workload)` is true.
    """

    name: str  # e.g. "nn.EmbeddingBag -> EmbeddingBag", shown in reports
    swap: Callable[..., Any]
    quantizes: bool = False  # the new module changes numerics (int8): skipped by optimize(quantize=False)


@dataclass(frozen=True)
class TorchBinding:
    """`torch.ops.autotune.<NAME>`: everything the torch layer needs to know about an operator, declared by its
    template (in its package's torch_op.py) so that the torch layer holds no operator knowledge.

    The call functions (`op`, `fake`, `check`, `route`, `run`) all take the op's own arguments, as `op` declares
    them (fully annotated: the custom op's schema is inferred from it, and its last parameter is
    `validate: bool = True`).
    """

    op: Callable[..., Any]  # the op's signature and docstring; its body runs PyTorch's implementation (fallback)
    fake: Callable[..., Any]  # an empty output of the right shape, dtype and device (torch.compile, meta)
    check: Callable[..., None]  # raise InvalidInput/InvalidDtype/IndexOutOfRange where PyTorch would raise
    route: Callable[..., Any]  # -> Route, or a str saying why PyTorch's implementation must run (not an error)
    run: Callable[..., Any]  # (chunks, *args) -> output; chunks: objects with .kernel (callable on the
    #                          reference-order tensors, .kernel.size its tuned size), .start, .stop
    compiled: Callable[[Any], tuple[Any, ...]]  # workload -> the Route.signature of the calls its kernel serves
    size: Callable[[Any], int]  # workload -> its tuned size along the routed dimension
    any_size: bool | Callable[[str], bool]  # True: one kernel serves any size; False: exactly its tuned size
    #   (calls are padded/split); or (device key, "cpu" or "cuda:0") -> either, where devices' kernels differ
    describe: Callable[[tuple[Any, ...]], str]  # signature -> "dim=64 mode=sum ..." for warnings and reports
    cases: Callable[[Any, int, int], Iterable[tuple[str, tuple[Any, ...], dict[str, Any]]]]
    #   (workload, seed, count) -> (case name, args, kwargs) of op calls that a kernel of this workload must
    #   serve and get right: several batch sizes and the operator's edge cases (`autotune check` runs them)
    replayable: bool | Callable[..., bool] = False  # whether a CPU call's validity and kernel rest on the
    #   arguments' metadata alone (dtypes, shapes, strides, alignment, scalars: `check` reads no data, the kernel
    #   checks it), so the compiled call path (autotune/torch/callpath.py) may replay the decision made for a
    #   call of the same metadata: True (always), False (never) or (*args) -> bool where it depends on the call
    backward: Callable[..., Any] | None = None  # torch.library.register_autograd's backward and setup_context
    setup_context: Callable[..., Any] | None = None
    rules: tuple[ModuleRule, ...] = ()
    exports: tuple[tuple[str, Any], ...] = ()  # public names re-exported by autotune.torch (drop-in modules)


# ---- how an operator appears in a captured PyTorch graph (read by autotune.torch.tune_model) ----------------
# The precisions a layer may run in, coarsest first: tune_model's accuracy contract moves a layer that breaks
# it one step up this ladder at a time (a quantizing rule of that precision takes it, if one can), up to fp32.
# "bf16" is the 16-bit rung: bf16 GEMMs for Linears, fp16 rows for embedding tables.
PRECISIONS = ("int8", "bf16", "fp32")


def finer(precision: str) -> str:
    """The next precision up the ladder (fp32 stays fp32)."""
    return PRECISIONS[min(PRECISIONS.index(precision) + 1, len(PRECISIONS) - 1)]


@dataclass(frozen=True)
class Reduced:
    """One layer a quantizing match runs in reduced precision (`precision`, of PRECISIONS), which tune_model's
    accuracy contract may move to a finer one on its own: `node` names the model's node that computes it (e.g.
    its `aten.linear`); a quantizing rule leaves a node alone when it finds it among `claimed`. `simulate`
    computes that node eagerly with the layer's reduced numerics, called with the node's own arguments in its
    place, so each layer's share of the model's output error is measured without kernels (before anything is
    tuned)."""

    node: str
    where: str  # the model's module path, for the report
    what: str  # e.g. "Linear(415, 512) + ReLU, int8 (8-bit activations)"
    simulate: Callable[..., Any]
    precision: str = "int8"


@dataclass
class GraphMatch:
    """One place in a captured graph (a torch.export'ed fx.GraphModule, ATen ops) where an operator can run,
    found by structure (`GraphRule.find`). The engine calls `replace`, runs the graph on the example inputs and
    rewires the outputs' users to the new nodes only if the new values agree with the old within `tolerance`;
    otherwise it erases the new nodes and the model keeps its code (the report says why)."""

    rule: str  # the GraphRule's name
    nodes: tuple[Any, ...]  # fx nodes of the model's code this match covers: no later match may claim them
    outputs: tuple[Any, ...]  # nodes whose values the replacement reproduces (their users are rewired)
    tasks: tuple[tuple[str, dict[str, Any]], ...]  # (template NAME, workload fields) its kernels need tuned
    replace: Callable[[Any], tuple[Any, ...]]  # (GraphModule) -> new nodes, one per output, inserted, not wired
    tolerance: tuple[float, float] = (1e-4, 1e-5)  # (rtol, atol) of the check by numbers
    where: str = ""  # the model's module path(s) it came from (node.meta["nn_module_stack"]), for the report
    what: str = ""  # e.g. "26 embedding bags -> one batched_embedding_bag (26 tables, dim 64)"
    reduced: tuple[Reduced, ...] = ()  # its layers in reduced precision (a quantizing rule's), each of which
    #                                    may stay in full precision alone


@dataclass(frozen=True)
class Kept:
    """A look-alike a rule refused by structure: the model keeps its code, and the report says why."""

    rule: str
    where: str
    why: str
    slower: bool = False  # it agreed by numbers but lost the speed check (tune_model asks the whole model too)


@dataclass(frozen=True)
class GraphRule:
    """How tune_model finds an operator in a captured graph: `find(gm, values, claimed)` yields GraphMatch or
    Kept for each candidate site. `values` maps node names to their values on the example inputs (concrete
    shapes, pooling, constant index tensors); `claimed` holds nodes earlier rules' matches took. Rules run in
    the one order autotune/torch/rules.py gives them and see the graph as earlier rules rewrote it."""

    name: str
    find: Callable[[Any, dict[str, Any], set[Any]], Iterable[GraphMatch | Kept]]
    quantizes: bool = False  # changes numerics (int8): skipped by tune_model(quantize=False)
    precision: str = "int8"  # a quantizing rule's: the PRECISIONS step it runs layers in (a node whose floor,
    #                          set by tune_model's accuracy contract, is finer is not its to take)
    fuses: tuple[str, ...] = ()  # names of the rules whose sites its matches take together (e.g. the embedding
    #   bags and the interaction they feed): tune_model tunes those rules' tasks too, and keeps this rule's
    #   replacements only where the whole model runs faster with them than with those rules' instead


class Template(Protocol):
    """What the engine, the runners and the torch layer call on an operator template, and nothing else.

    A template is a package `search_spaces/<op>/` (workload.py: fields, parsing, inputs, reference, traffic, no
    torch at import; checks.py: input checks that import torch, built on workload.py, which never imports them;
    cpu.py and cuda.py: each device's space and schedule; torch_op.py: its TorchBinding) whose `__init__`
    exposes these names; `search_spaces.get` finds it, so adding an operator edits no other file.
    """

    NAME: str
    DOC: str
    EXAMPLE_SHAPE: str  # a typical `--shape`, shown by `autotune list`
    TEST_SHAPE: str  # a small `--shape` whose kernels build in seconds: the contract test and smoke checks
    WEIGHTS: tuple[int, ...]  # positions of model weights among the reference's arguments (packed once)
    Workload: type[Workload]

    def space(self, w: Any, target: Any) -> Any:
        """The knob space for this workload on this tvm Target (the CPU or the CUDA one)."""

    def lower(self, w: Any, cfg: Any, target: Any) -> Any:
        """The scheduled IRModule of one config for this target; raise InvalidConfig if it cannot apply."""

    def inputs(self, w: Any, seed: int) -> tuple[Any, ...]:
        """Realistic torch input tensors, in the reference's argument order."""

    def reference(self, w: Any, *tensors: Any) -> Any:
        """The PyTorch semantics the kernel must reproduce."""

    def baselines(self, w: Any, *tensors: Any) -> dict[str, Callable[[], Any]]:
        """PyTorch's fastest ways to compute the op on these tensors, prepared, for the bench to time."""

    def check_inputs(self, w: Any, *tensors: Any) -> None:
        """Raise InvalidInput/InvalidDtype/IndexOutOfRange with a clear message when tensors do not fit."""

    def pack(self, w: Any, cfg: Any, *weights: Any) -> tuple[Any, ...]:
        """The weights (arguments at WEIGHTS) in the layout the config's kernel reads; called once per weight."""

    def kernel_args(self, w: Any, cfg: Any, packed: Sequence[Any], *tensors: Any) -> tuple[Sequence[Any], Any]:
        """The kernel's argument list for reference-order tensors and packed weights (outputs allocated and
        included), and the output to return."""

    def traffic(self, w: Any, *tensors: Any) -> Traffic:
        """Bytes and ops of one call on these inputs."""

    def tolerance(self, w: Any) -> tuple[float, float]:
        """(rtol, atol) of the bound a kernel's output is judged within (`autotune.runtime.judge`): atol + rtol
        times |PyTorch's output|, or times the magnitude of the terms under REFERENCE_PRECISION "float64"."""

    def torch_binding(self) -> TorchBinding | None:
        """How the operator appears in PyTorch (imports torch), or None if it has no torch op."""

    def graph_rules(self) -> tuple[GraphRule, ...]:
        """How the operator is found in a captured PyTorch graph (its package's graph.py; imports torch)."""


# Optional members (the engine uses them where a template defines them):
#   REFERENCE_PRECISION: "native" (the default) or "float64": what `autotune.runtime.judge`, the one rule every
#       check of a kernel uses, judges its output against. "float64": the reference run on the inputs cast to
#       float64, within atol + rtol * magnitude, the magnitude being the reference run on the inputs' absolute
#       values; PyTorch's own output is judged by the same bound. Sound for a reference that sums products of
#       its floating-point inputs (integer inputs being indices or counts): sums, means, dot products, where
#       terms that cancel make a bound relative to the output fail good kernels. The reference and the torch
#       op's PyTorch path must then compute in float64 on float64 tensors. "native": PyTorch's output in its own
#       dtype, |out - ref| <= atol + rtol |ref| (torch.isclose): for exact and integer results (rows quantized
#       bit for bit, int32 accumulations, one rounding step) and inputs the float64 rule does not fit (integer
#       values, whose absolute values it does not take; tables too large to copy in float64).
#   magnitude_args(w, args) -> args: under REFERENCE_PRECISION "float64", the reference-order (or torch op) arguments
#       whose reference on absolute values is the magnitude: the runtime takes absolute values of floating-point
#       tensors only, so values stored as integers (int8 rows with their scales and biases) are given as floats.
#   after_call(w, args, out) -> None: runs after every kernel call, with the kernel_args list; raises what the
#       kernel flagged in its arguments (e.g. an index out of range the gather saw and skipped), so inputs are
#       checked without an extra pass over them. The flag is the kernel's last argument: an int32 zero on entry,
#       nonzero where the call must raise (the compiled call path reads it so, and hands such calls to Python).
#   DEVICE_KINDS: the kinds of device it has kernels for, ("cpu",) for a CPU-only template (`by_device` with no
#       cuda module); ("cpu", "cuda") where it names none (`device_kinds`).
#   timed_inputs(w, seed, inputs, cache_bytes) -> tuple of input tuples, `inputs` first: the sets a CPU timing
#       cycles through, one per call, where a model's calls never see the same data twice and one set would stay
#       in a cache of `cache_bytes` (the measuring CPU's largest): an embedding bag's batches gather new rows.
#       Without it every timed call gets `inputs`, as a matmul's weights and activations are hot in a model.
#   gathered_rows(w, *tensors) -> numpy int64 array: the rows of its table (the largest input) one call gathers, in
#       order, for a gather-bound (GB/s) template: `autotune bench`'s roof then gathers the same rows (a Zipf
#       stream's hot rows hit in cache for the roof as for the kernel) rather than uniformly random ones.
