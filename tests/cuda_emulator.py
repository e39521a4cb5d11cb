"""Runs TVM-generated CUDA C on the CPU, to check what GPU kernels compute on machines without a GPU.

`emulate_cuda(source, grid, block, args)` compiles the source's one kernel with g++ and runs each block of
the grid in turn, every CUDA thread of the block as a fiber (ucontext) that runs until it waits.

What it models:
- `threadIdx`, `blockIdx`, `blockDim`, `gridDim` (up to three dimensions; lanes and warps follow the linear
  thread index, as on the hardware), `__shared__` arrays (one copy, shared by the threads of the block);
- `__syncthreads()`: a barrier of the whole block (an error when some threads exited while others wait);
- warp-synchronous instructions wait only for the lanes they name, so divergent warps are modelled:
  `__shfl_sync`, `__shfl_up_sync`, `__shfl_down_sync`, `__shfl_xor_sync` (any width, lanes as PTX `shfl`
  computes them) and `__syncwarp` wait for every non-exited lane of their member mask to reach the same
  instruction with the same mask. A mask that leaves out the calling lane, a shuffle that reads a lane
  outside the mask (or one that exited), a lane that exits without joining a warp instruction that names
  it after taking part in others (a mask that names another group's lanes), and lanes that can never meet
  (a deadlock) are errors;
- inline PTX `ldmatrix.sync.aligned.m8n8.x4.shared.b16` and `mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32`
  computed lane by lane from the PTX ISA's fragment layouts (every lane of the warp must take part), and
  `__dp4a`: so layouts a kernel relies on are checked against the ISA, not against themselves.

What it cannot check:
- timing, occupancy, coalescing, bank conflicts, resource limits (registers, shared memory: see gpu_build);
- the memory model beyond barrier semantics: threads run one at a time, in order, each until it waits, and
  blocks one after another, so a race (a missing `__syncthreads`, blocks that write the same data) can go
  unnoticed; out-of-bounds accesses are not detected unless they crash;
- warp convergence: `__activemask()` reports every lane, and a warp instruction is matched by kind and
  mask, not by its place in the code (as on sm_70 and newer, not as on older GPUs);
- bit-exact floating point: g++ arithmetic (no fused multiply-adds where nvcc contracts them);
- anything else: other inline PTX and intrinsics fail to compile or are refused, loudly.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import tempfile
from typing import Any

import torch

_PRELUDE = r"""
// C headers only, and math functions declared here: C++ headers would double the time g++ takes.
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
extern "C" {
float expf(float); double exp(double); float logf(float); double log(double); float sqrtf(float);
double sqrt(double); float fabsf(float); double fabs(double); float fmaxf(float, float); float fminf(float, float);
double fmax(double, double); double fmin(double, double); float tanhf(float); float powf(float, float);
float floorf(float); float ceilf(float); float erff(float); float nearbyintf(float); float rintf(float);
}
static float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static float __expf(float x) { return expf(x); }
static float __logf(float x) { return logf(x); }
template <class T> static T max(T a, T b) { return a < b ? b : a; }
template <class T> static T min(T a, T b) { return b < a ? b : a; }
struct uint3 { unsigned int x, y, z; };
typedef uint3 dim3;
static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static const int warpSize = 32;
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
static float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static float2 make_float2(float x, float y) { return {x, y}; }
static int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
static int2 make_int2(int x, int y) { return {x, y}; }
template <class T> static T __ldg(const T* p) { return *p; }
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__
#define uint unsigned int
#define uchar unsigned char
#define ushort unsigned short

enum { EMU_RUN, EMU_BARRIER, EMU_WARP, EMU_DONE, EMU_FAILED };
// `mask` and `op`: the warp instruction the thread waits at, or last waited at; `since`: when it began to wait.
struct EmuThread { int state; unsigned mask; const char* op; unsigned long since; };
static ucontext_t emu_scheduler;
static ucontext_t* emu_fibers;
static EmuThread* emu_threads;
static uint32_t* emu_slots;  // 16 words a thread: the operands of warp-wide instructions
static const char** emu_ptrs;
static int emu_current, emu_block;
static unsigned long emu_clock;  // counts the waits at warp instructions
static char emu_message[1024];

static void emu_yield() { swapcontext(&emu_fibers[emu_current], &emu_scheduler); }
static void emu_fail(const char* fmt, ...) {
  int n = snprintf(emu_message, sizeof emu_message, "block (%u, %u, %u) thread %d (warp %d lane %d): ",
                   blockIdx.x, blockIdx.y, blockIdx.z, emu_current, emu_current / 32, emu_current % 32);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(emu_message + n, sizeof emu_message - n, fmt, ap);
  va_end(ap);
  emu_threads[emu_current].state = EMU_FAILED;
  emu_yield();  // never resumed
}
static uint32_t* emu_slot(int t) { return &emu_slots[16 * t]; }
static bool emu_live(int t) { return t < emu_block && emu_threads[t].state != EMU_DONE; }
static void __syncthreads() { emu_threads[emu_current].state = EMU_BARRIER; emu_yield(); }
// Wait until every non-exited lane of `mask` (in this warp) waits at `op` with the same mask.
static void emu_warp_wait(unsigned mask, const char* op) {
  if (!(mask >> (emu_current % 32) & 1))
    emu_fail("%s with member mask 0x%08x, which leaves out the lane itself", op, mask);
  EmuThread& self = emu_threads[emu_current];
  self.state = EMU_WARP; self.mask = mask; self.op = op; self.since = ++emu_clock;
  emu_yield();
}
// A warp instruction: post the operands, meet, compute from the posted operands, meet again (so that no lane
// posts its next operands before all have read these).
#define EMU_MEET(mask, op) emu_warp_wait(mask, op)
#define EMU_DONE_READING(mask, op) emu_warp_wait(mask, op " (read)")
static void __syncwarp(unsigned mask = 0xffffffffu) { emu_warp_wait(mask, "__syncwarp"); }
static unsigned __activemask() { return 0xffffffffu; }

// shfl.sync as the PTX ISA defines it: c = clamp | segment mask ((32 - width) << 8); `j` the source lane.
template <class T> static T emu_shfl(const char* op, unsigned mask, T v, int b, int width, int mode) {
  static_assert(sizeof(T) <= 16 * 4, "shuffled type too large");
  int t = emu_current, lane = t % 32, base = t - lane;
  if (width < 1 || width > 32 || (width & (width - 1))) emu_fail("%s with width %d", op, width);
  memcpy(emu_slot(t), &v, sizeof(T));
  EMU_MEET(mask, op);
  int segmask = (32 - width) & 31, minLane = lane & segmask;
  int maxLane = minLane | ((mode == 1 ? 0 : 31) & ~segmask), j = lane;
  bool in_range = true;
  if (mode == 0) { j = minLane | (b & 31 & ~segmask); in_range = j <= maxLane; }       // idx: b[4:0], as PTX
  else if (mode == 1) { j = lane - b; in_range = j >= maxLane; }                       // up
  else if (mode == 2) { j = lane + b; in_range = j <= maxLane; }                       // down
  else { j = lane ^ b; in_range = j <= maxLane; }                                      // bfly (xor)
  T r = v;
  if (in_range) {
    if (j < 0 || j > 31 || !(mask >> j & 1)) emu_fail("%s reads lane %d, outside its member mask 0x%08x", op, j, mask);
    if (!emu_live(base + j)) emu_fail("%s reads lane %d, which has exited", op, j);
    memcpy(&r, emu_slot(base + j), sizeof(T));
  }
  EMU_DONE_READING(mask, "shfl");
  return r;
}
template <class T> static T __shfl_sync(unsigned mask, T v, int lane, int width = 32) {
  return emu_shfl("__shfl_sync", mask, v, lane, width, 0);
}
template <class T> static T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return emu_shfl("__shfl_up_sync", mask, v, int(delta), width, 1);
}
template <class T> static T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return emu_shfl("__shfl_down_sync", mask, v, int(delta), width, 2);
}
template <class T> static T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return emu_shfl("__shfl_xor_sync", mask, v, lane_mask, width, 3);
}
static int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += int(int8_t(a >> (8 * i))) * int(int8_t(b >> (8 * i)));
  return c;
}
// .aligned warp instructions: every lane of the warp takes part.
static void emu_whole_warp(const char* op) {
  for (int l = 0, base = emu_current - emu_current % 32; l < 32; ++l)
    if (!emu_live(base + l)) emu_fail("%s: lane %d of the warp does not take part", op, l);
}
// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lanes 8q..8q+7 give the row addresses of matrix q; lane l
// receives, in register q, the 4 bytes at column pair (l % 4) of row l / 4 of matrix q.
static void emu_ldmatrix_x4(uint32_t* r0, uint32_t* r1, uint32_t* r2, uint32_t* r3, const char* addr) {
  static const char* op = "ldmatrix.sync.aligned.m8n8.x4";
  int t = emu_current, lane = t % 32, base = t - lane;
  emu_ptrs[t] = addr;
  EMU_MEET(0xffffffffu, op);
  emu_whole_warp(op);
  uint32_t* r[4] = {r0, r1, r2, r3};
  for (int q = 0; q < 4; ++q) memcpy(r[q], emu_ptrs[base + 8 * q + lane / 4] + 4 * (lane % 4), 4);
  EMU_DONE_READING(0xffffffffu, "ldmatrix");
}
// mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 (PTX ISA fragment layouts; g = lane / 4, q = lane % 4):
// a0..a3: A rows g, g+8, g, g+8 at k 4q..4q+3 (a0, a1) or 16+4q.. (a2, a3); b0, b1: B column g at k 4q..
// or 16+4q..; c0..c3 and d0..d3: rows g, g, g+8, g+8 at columns 2q, 2q+1.
static int8_t emu_byte(int lane_base, int lane, int reg, int k) {
  return int8_t(emu_slot(lane_base + lane)[reg] >> (8 * (k % 4)));
}
static void emu_mma_m16n8k32(uint32_t* d0, uint32_t* d1, uint32_t* d2, uint32_t* d3, uint32_t a0, uint32_t a1,
                             uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1, int c0, int c1, int c2, int c3) {
  static const char* op = "mma.sync.aligned.m16n8k32";
  int t = emu_current, lane = t % 32, base = t - lane, g = lane / 4, q = lane % 4;
  uint32_t in[10] = {a0, a1, a2, a3, b0, b1, uint32_t(c0), uint32_t(c1), uint32_t(c2), uint32_t(c3)};
  memcpy(emu_slot(t), in, sizeof(in));
  EMU_MEET(0xffffffffu, op);
  emu_whole_warp(op);
  int d[4];
  for (int i = 0; i < 4; ++i) {
    int row = g + 8 * (i / 2), col = 2 * q + i % 2, acc = int(emu_slot(t)[6 + i]);
    for (int k = 0; k < 32; ++k) {
      int a = emu_byte(base, 4 * (row % 8) + (k % 16) / 4, (row / 8) + 2 * (k / 16), k);
      int b = emu_byte(base, 4 * col + (k % 16) / 4, 4 + k / 16, k);
      acc += a * b;
    }
    d[i] = acc;
  }
  EMU_DONE_READING(0xffffffffu, "mma");
  *d0 = uint32_t(d[0]); *d1 = uint32_t(d[1]); *d2 = uint32_t(d[2]); *d3 = uint32_t(d[3]);
}
"""

_LAUNCHER = r"""
// A thread that exits while lanes wait for it at a warp instruction, which it did not join but answered with
// warp instructions of other masks or kinds: the mask names a lane that never takes part.
static void emu_check_exit(int t) {
  const EmuThread& self = emu_threads[t];
  for (int l = 0, base = t - t % 32; l < 32 && self.op; ++l) {
    const EmuThread& w = emu_threads[base + l];
    if (base + l < emu_block && w.state == EMU_WARP && (w.mask >> (t % 32) & 1) && self.since > w.since)
      emu_fail("exits without joining the %s with mask 0x%08x that lane %d waits at (its last warp instruction: "
               "%s with mask 0x%08x)", w.op, w.mask, l, self.op, self.mask);
  }
}
static void emu_fiber(int t) { emu_kernel(); emu_check_exit(t); emu_threads[t].state = EMU_DONE; }
// Lanes waiting at warp instructions whose every non-exited member lane is there, with the same mask: released.
static bool emu_release_warps() {
  bool released = false;
  for (int t = 0; t < emu_block; ++t) {
    const EmuThread& w = emu_threads[t];
    if (w.state != EMU_WARP) continue;
    int base = t - t % 32;
    bool ready = true;
    for (int l = 0; l < 32 && ready; ++l) {
      int u = base + l;
      if (!(w.mask >> l & 1) || !emu_live(u)) continue;
      const EmuThread& o = emu_threads[u];
      ready = o.state == EMU_WARP && o.mask == w.mask && !strcmp(o.op, w.op);
    }
    if (!ready) continue;
    unsigned mask = w.mask;
    for (int l = 0; l < 32; ++l)
      if ((mask >> l & 1) && emu_live(base + l)) emu_threads[base + l].state = EMU_RUN;
    released = true;
  }
  return released;
}
static void emu_describe(int t, char* text, size_t size) {
  const EmuThread& w = emu_threads[t];
  if (w.state == EMU_WARP) snprintf(text, size, "wait at %s with mask 0x%08x", w.op, w.mask);
  else if (w.state == EMU_BARRIER) snprintf(text, size, "wait at __syncthreads");
  else snprintf(text, size, "exited");
}
// Runs of threads in the same state: "threads 0-15 wait at __shfl_sync with mask 0xffffffff; ...".
static void emu_describe_deadlock() {
  size_t n = snprintf(emu_message, sizeof emu_message, "block (%u, %u, %u): no thread can go on:", blockIdx.x,
                      blockIdx.y, blockIdx.z);
  char what[128], next[128];
  for (int t = 0, first = 0; t < emu_block && n < sizeof emu_message - 1; ++t) {
    emu_describe(t, what, sizeof what);
    if (t + 1 < emu_block) emu_describe(t + 1, next, sizeof next);
    if (t + 1 < emu_block && !strcmp(what, next)) continue;
    n += snprintf(emu_message + n, sizeof emu_message - n, " threads %d-%d %s;", first, t, what);
    first = t + 1;
  }
}
extern "C" const char* emu_error() { return emu_message; }
extern "C" int emu_launch(int gx, int gy, int gz, int bx, int by, int bz) {
  const size_t stack = 256 << 10;
  emu_block = bx * by * bz;
  char* stacks = (char*)malloc(stack * emu_block);  // not touched: pages are committed as stacks grow
  emu_fibers = (ucontext_t*)malloc(sizeof(ucontext_t) * emu_block);
  emu_threads = (EmuThread*)malloc(sizeof(EmuThread) * emu_block);
  emu_slots = (uint32_t*)calloc(16 * emu_block, sizeof(uint32_t));
  emu_ptrs = (const char**)calloc(emu_block, sizeof(const char*));
  blockDim = {unsigned(bx), unsigned(by), unsigned(bz)};
  gridDim = {unsigned(gx), unsigned(gy), unsigned(gz)};
  int status = 0;
  for (int b = 0; b < gx * gy * gz && !status; ++b) {
    blockIdx = {unsigned(b % gx), unsigned(b / gx % gy), unsigned(b / gx / gy)};
    for (int t = 0; t < emu_block; ++t) {
      getcontext(&emu_fibers[t]);
      emu_fibers[t].uc_stack.ss_sp = stacks + stack * t;
      emu_fibers[t].uc_stack.ss_size = stack;
      emu_fibers[t].uc_link = &emu_scheduler;
      makecontext(&emu_fibers[t], (void (*)())emu_fiber, 1, t);
      emu_threads[t] = {EMU_RUN, 0, nullptr, 0};
    }
    for (;;) {
      for (int t = 0; t < emu_block && !status; ++t) {
        if (emu_threads[t].state != EMU_RUN) continue;
        emu_current = t;
        threadIdx = {unsigned(t % bx), unsigned(t / bx % by), unsigned(t / bx / by)};
        swapcontext(&emu_scheduler, &emu_fibers[t]);
        if (emu_threads[t].state == EMU_FAILED) status = 1;
      }
      if (status) break;
      if (emu_release_warps()) continue;
      int done = 0, waiting = 0;
      for (int t = 0; t < emu_block; ++t) {
        done += emu_threads[t].state == EMU_DONE;
        waiting += emu_threads[t].state == EMU_BARRIER;
      }
      if (done == emu_block) break;
      if (waiting + done == emu_block && !done) {
        for (int t = 0; t < emu_block; ++t) emu_threads[t].state = EMU_RUN;
        continue;
      }
      if (waiting + done == emu_block)
        snprintf(emu_message, sizeof emu_message, "block (%u, %u, %u): %d threads wait at __syncthreads, "
                 "which %d threads of the block exited without reaching", blockIdx.x, blockIdx.y, blockIdx.z,
                 waiting, done);
      else
        emu_describe_deadlock();
      status = 2;
    }
  }
  free(stacks); free(emu_fibers); free(emu_threads); free(emu_slots); free(emu_ptrs);
  return status;
}
"""

_DTYPES = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "signed char": torch.int8,
           "int8_t": torch.int8, "char": torch.int8, "unsigned char": torch.uint8, "uint8_t": torch.uint8,
           "short": torch.int16, "int16_t": torch.int16, "int": torch.int32, "int32_t": torch.int32,
           "int64_t": torch.int64, "long long": torch.int64, "bool": torch.bool}


def cuda_source(task: Any, cfg: Any, *, header: bool = True) -> str:
    """The CUDA C TVM generates for a config's kernel, in this process (no nvcc, no driver: where there is no
    CUDA runtime, TVM keeps the device module as source). `header=False`: the kernel without TVM's helper
    header (the header declares intrinsics such as `__dp4a` whether the kernel uses them or not)."""
    import tvm

    (device_module,) = tvm.compile(task.lower(cfg), target=task.device.target()).mod.imports
    source = device_module.inspect_source("")
    return source if header else kernel_text(source)


def kernel_text(source: str) -> str:
    """CUDA C from its first `extern "C" __global__` on: TVM's kernels without its helper header."""
    return source[source.index('extern "C" __global__'):]


def launch_dims(mod: Any) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) of the one kernel of a scheduled IRModule, from its thread bindings (TVM's launch extents
    are constants of the TIR: the host code launches exactly these)."""
    extents: dict[str, set[int]] = {}
    binding = r'T\.(?:thread_binding|launch_thread)\((?:T\.int\d+\()?(\d+)\)?, thread="(\w+\.[xyz])"'
    for n, tag in re.findall(binding, mod.script()):
        extents.setdefault(tag, set()).add(int(n))
    assert all(len(v) == 1 for v in extents.values()), f"several extents for one thread axis: {extents}"
    assert any(tag.startswith("threadIdx.") for tag in extents), "no thread bindings found"

    def dims(kind: str) -> tuple[int, int, int]:
        return tuple(next(iter(extents.get(f"{kind}.{a}", {1}))) for a in "xyz")  # type: ignore[return-value]

    return dims("blockIdx"), dims("threadIdx")


def _split_top(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


_PTX_CALLS = {"ldmatrix.sync.aligned.m8n8.x4.shared.b16": "emu_ldmatrix_x4",
              "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32": "emu_mma_m16n8k32"}


def _emulated_asm(source: str) -> str:
    """Inline PTX -> calls of the emulator's functions (operands as they are: outputs by address)."""
    out, pos = [], 0
    for m in re.finditer(r"__asm__ __volatile__\(", source):
        end, depth = m.end(), 1
        while depth:
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            end += 1
        template, outputs, inputs = (_split_top(source[m.end():end - 1], ":") + [""])[:3]
        found = [name for name in _PTX_CALLS if name in template]
        assert len(found) == 1, f"inline PTX the emulator does not know: {template.strip()}"
        operand = re.compile(r'"=?r"\((.*)\)', re.S)
        args = [f"(uint32_t*)&({operand.match(o.strip()).group(1)})" for o in _split_top(outputs, ",")]
        args += [operand.match(i.strip()).group(1) for i in _split_top(inputs, ",") if i.strip()]
        out += [source[pos:m.start()], f"{_PTX_CALLS[found[0]]}({', '.join(args)})"]
        pos = end
    return "".join(out + [source[pos:]])


_compiled: dict[str, tuple[ctypes.CDLL, list[tuple[str, str, bool]]]] = {}


def _compile(source: str) -> tuple[ctypes.CDLL, list[tuple[str, str, bool]], int]:
    """The emulation library of a kernel (cached by source: a kernel run twice is compiled once), its
    parameters as (name, C type, is a pointer), and its __launch_bounds__."""
    kernel = kernel_text(source)
    found = re.findall(r'extern "C" __global__ void __launch_bounds__\((\d+)\) (\w+)\(([^)]*)\)\s*\{', kernel)
    assert len(found) == 1, f"expected one kernel, found {len(found)}"
    (bound, name, params), = found
    if source not in _compiled:
        params = [p.strip().replace("__restrict__ ", "") for p in params.split(",") if p.strip()]
        typed = [(p.rsplit(" ", 1)[1], p.rsplit(" ", 1)[0].strip()) for p in params]
        names = [n.removesuffix("_ptr") if t.endswith("*") else n for n, t in typed]
        assert "extern __shared__" not in kernel, "dynamic shared memory is not emulated"
        body = re.sub(r"__shared__ (alignas\(\d+\) )?", r"\1static ", _emulated_asm(kernel))
        body = body.replace("unsigned int addr = __cvta_generic_to_shared(", "const char* addr = (const char*)(")
        globals_ = "".join(f"static {t} emu_{n};\n" for n, (_, t) in zip(names, typed))
        setters = "".join(f'extern "C" void emu_set_{n}(void* p) {{ emu_{n} = ({t})p; }}\n' if t.endswith("*")
                          else f'extern "C" void emu_set_{n}(long long v) {{ emu_{n} = ({t})v; }}\n'
                          for n, (_, t) in zip(names, typed))
        code = (_PRELUDE + body + globals_ + f"static void emu_kernel() {{ {name}("
                + ", ".join(f"emu_{n}" for n in names) + "); }\n" + _LAUNCHER + setters)
        with tempfile.TemporaryDirectory(prefix="cuda-emu-") as tmp:
            src, lib = f"{tmp}/kernel.cc", f"{tmp}/kernel.so"
            with open(src, "w") as f:
                f.write(code)
            subprocess.run(["g++", "-std=c++17", "-O1", "-w", "-shared", "-fPIC", "-o", lib, src], check=True)
            so = ctypes.CDLL(lib)  # stays mapped once the file is gone
        so.emu_error.restype = ctypes.c_char_p
        _compiled[source] = so, [(n, t, t.endswith("*")) for n, (_, t) in zip(names, typed)]
    so, params_ = _compiled[source]
    return so, params_, int(bound)


def _dims(d: int | tuple[int, ...]) -> tuple[int, int, int]:
    d = (d,) if isinstance(d, int) else tuple(d)
    assert 1 <= len(d) <= 3 and all(n >= 1 for n in d), d
    return tuple(d) + (1,) * (3 - len(d))  # type: ignore[return-value]


def emulate_cuda(source: str, grid: int | tuple[int, ...], block: int | tuple[int, ...] | None = None,
                 args: dict[str, Any] | None = None) -> None:
    """Run the one kernel of TVM-generated CUDA C (`cuda_source`, with or without its header) on the CPU.

    `grid` and `block`: launch dimensions, an int or up to three (x, y, z); `block=None` takes the kernel's
    `__launch_bounds__` as a 1-d block. `args`: a value for every kernel parameter, by name (`W` for a
    pointer `W_ptr`): contiguous CPU tensors of the parameter's element type for pointers, ints for the
    scalars TVM's host code would pass (shapes such as a symbolic batch). Raises AssertionError where the
    emulated kernel breaks a rule of the model (see the module's docstring)."""
    so, params, bound = _compile(source)
    block3 = _dims(bound if block is None else block)
    assert block3[0] * block3[1] * block3[2] == bound, f"block {block3} is not the kernel's {bound} threads"
    args = dict(args or {})
    names = [n for n, _, _ in params]
    assert set(names) == set(args), f"kernel parameters {names}, given {sorted(args)}"
    for n, ctype, pointer in params:
        value = args[n]
        if pointer:
            element = ctype.removesuffix("*").strip()
            assert isinstance(value, torch.Tensor), f"{n}: a tensor for {ctype}"
            assert value.device.type == "cpu" and value.is_contiguous(), f"{n}: a contiguous CPU tensor"
            assert _DTYPES.get(element) == value.dtype, f"{n}: {value.dtype} for a {ctype} parameter"
            getattr(so, f"emu_set_{n}")(ctypes.c_void_p(value.data_ptr()))
        else:
            assert not isinstance(value, torch.Tensor), f"{n}: a number for {ctype}"
            getattr(so, f"emu_set_{n}")(ctypes.c_longlong(int(value)))
    status = so.emu_launch(*_dims(grid), *block3)
    assert status == 0, so.emu_error().decode()
