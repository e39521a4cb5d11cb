"""A tuning task: one operator, one workload, one device. What the build and measure workers receive."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import search_spaces
from search_spaces import Config, Space, Template

from . import records
from .runtime import BoundKernel
from .targets import Device


@dataclass(frozen=True)
class Task:
    op: str  # registry name, or a dotted module path for an out-of-tree template
    workload: Any  # the template's frozen Workload dataclass
    device: Device

    @property
    def template(self) -> Template:
        return search_spaces.get(self.op)

    @cached_property
    def space(self) -> Space:
        """The template's space for this workload and device, made once per Task: what a space finds once (its
        code paths, a path's valid configs where rejection sampling fails, its size) stays found for every
        proposer, pick and share of the task (a fused embedding space enumerates millions of combinations)."""
        return self.template.space(self.workload, self.device.target())

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (to build and measure workers) without the cached space: a worker makes its own if it needs one,
        where the space's caches would cost a pickle of up to millions of configs per job."""
        state = dict(self.__dict__)
        state.pop("space", None)
        return state

    @property
    def workload_key(self) -> str:
        return self.workload.key()

    @property
    def key(self) -> records.TaskKey:
        """(op, workload key, device name): the task's identity in records, logs and caches."""
        return records.TaskKey(self.op, self.workload_key, self.device.name)

    def lower(self, cfg: Config) -> Any:
        return self.template.lower(self.workload, cfg, self.device.target())

    def bind(self, cfg: Config, func: Any = None) -> BoundKernel:
        """The config's kernel `func` callable on reference-order tensors, as users call it (weights packed once).

        `func=None`: a binding whose `arguments(*tensors)` gives the kernel's argument list (to run it elsewhere)."""
        return BoundKernel(self.template, self.workload, cfg, func, self.device.is_gpu)

    @property
    def template_version(self) -> str:
        """The version of the template code that generates this task's kernels (records carry it)."""
        from search_spaces.version import template_version

        return template_version(self.template, self.device.name)

    def kernel_args(self, cfg: Config, packed: Sequence[Any], tensors: Sequence[Any]) -> tuple[Sequence[Any], Any]:
        return self.template.kernel_args(self.workload, cfg, packed, *tensors)

    def record(self, cfg: Config, **fields: Any) -> records.Record:
        import tvm

        return records.Record(op=self.op, workload=self.workload.to_json(), workload_key=self.workload_key,
                              device=self.device.name, target=self.device.to_json(), config=cfg.to_json(),
                              config_key=cfg.key(), tvm_version=tvm.__version__,
                              **{"template_version": self.template_version, **fields})


def make_task(op: str, device: str | Device, workload: Any = None, shape: str | None = None,
              **fields: Any) -> Task:
    """A task from an operator name, a device name and either a workload, a `--shape` text or fields."""
    from .targets import resolve

    template = search_spaces.get(op)
    if workload is None:
        workload = template.Workload.from_shape(shape) if shape is not None else template.Workload(**fields)
    dev = device if isinstance(device, Device) else resolve(device)
    return Task(op=op, workload=workload, device=dev)
