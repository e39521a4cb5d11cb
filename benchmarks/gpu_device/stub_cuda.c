/* A stand-in for the CUDA driver (libcuda.so.1) and runtime (libcudart.so.13) on a machine without a GPU:
 * every call succeeds and does nothing, and the calls that load modules and launch kernels are written, one JSON
 * object a line, to the file $GPU_CHECK_STUB_LOG. Built twice from this one source (-DSTUB_RUNTIME for the
 * runtime). TVM's host code run against it shows how it launches each kernel (grid, block, arguments); the
 * fallback launcher run against it shows that it launches the same way. Never loaded on a GPU machine. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef STUB_RUNTIME
typedef struct { unsigned gx, gy, gz, bx, by, bz, shared; void* stream; void* attrs; unsigned nattrs; } LaunchConfig;
typedef struct { char name[256]; int nparams; } Function;
static Function functions[4096];
static int nfunctions;
static char expected_names[256][256];
static int expected_counts[256], nexpected;

static FILE* stub_log(void) {
  static FILE* f;
  const char* path = getenv("GPU_CHECK_STUB_LOG");
  if (!f && path) f = fopen(path, "a");
  return f;
}

/* How many parameters the kernel `name` takes (a driver reads it from the cubin; the stub is told). */
void stub_expect_params(const char* name, int count) {
  for (int i = 0; i < nexpected; ++i)
    if (!strcmp(expected_names[i], name)) { expected_counts[i] = count; return; }
  if (nexpected < 256) {
    snprintf(expected_names[nexpected], sizeof expected_names[0], "%s", name);
    expected_counts[nexpected++] = count;
  }
}

static uint64_t elf_size(const unsigned char* image) {  /* a 64-bit ELF's extent: its furthest table or section */
  if (memcmp(image, "\177ELF", 4) || image[4] != 2) return 0;
  uint64_t phoff, shoff, end;
  uint16_t phentsize, phnum, shentsize, shnum;
  memcpy(&phoff, image + 0x20, 8); memcpy(&shoff, image + 0x28, 8);
  memcpy(&phentsize, image + 0x36, 2); memcpy(&phnum, image + 0x38, 2);
  memcpy(&shentsize, image + 0x3A, 2); memcpy(&shnum, image + 0x3C, 2);
  end = shoff + (uint64_t)shentsize * shnum;
  if (phoff + (uint64_t)phentsize * phnum > end) end = phoff + (uint64_t)phentsize * phnum;
  for (uint16_t i = 0; i < shnum; ++i) {
    const unsigned char* sh = image + shoff + (uint64_t)i * shentsize;
    uint32_t type; uint64_t offset, size;
    memcpy(&type, sh + 4, 4); memcpy(&offset, sh + 0x18, 8); memcpy(&size, sh + 0x20, 8);
    if (type != 8 /* SHT_NOBITS: no bytes in the file */ && offset + size > end) end = offset + size;
  }
  return end;
}

int cuInit(unsigned flags) { return 0; }
int cuCtxGetCurrent(void** ctx) { *ctx = (void*)0x1; return 0; }
int cuCtxSetCurrent(void* ctx) { return 0; }
int cuDevicePrimaryCtxRetain(void** ctx, int dev) { *ctx = (void*)0x1; return 0; }
int cuModuleLoadData(void** module, const void* image) {  /* an image that is no ELF file: the driver's error */
  static uintptr_t next = 0x1000;
  uint64_t size = elf_size(image);
  if (!size) return 200;  /* CUDA_ERROR_INVALID_IMAGE */
  *module = (void*)(next += 0x10);
  FILE* f = stub_log();
  if (f) { fprintf(f, "{\"call\": \"load\", \"bytes\": %llu, \"address\": \"%llx\"}\n", (unsigned long long)size,
                   (unsigned long long)(uintptr_t)image); fflush(f); }
  return 0;
}
int cuModuleUnload(void* module) { return 0; }
int cuModuleGetFunction(Function** fn, void* module, const char* name) {
  if (nfunctions == 4096) return 999;
  Function* f = &functions[nfunctions++];
  snprintf(f->name, sizeof f->name, "%s", name);
  f->nparams = -1;
  for (int i = 0; i < nexpected; ++i)
    if (!strcmp(expected_names[i], name)) f->nparams = expected_counts[i];
  *fn = f;
  return 0;
}
int cuFuncSetAttribute(Function* fn, int attrib, int value) {
  FILE* f = stub_log();
  if (f) { fprintf(f, "{\"call\": \"attribute\", \"kernel\": \"%s\", \"attribute\": %d, \"value\": %d}\n", fn->name,
                   attrib, value); fflush(f); }
  return 0;
}
static int record_launch(const char* via, Function* fn, const LaunchConfig* c, void** params) {
  FILE* f = stub_log();
  if (!f) return 0;
  fprintf(f, "{\"call\": \"launch\", \"via\": \"%s\", \"kernel\": \"%s\", \"grid\": [%u, %u, %u], "
          "\"block\": [%u, %u, %u], \"shared\": %u, \"attributes\": %u, \"params\": [", via, fn->name, c->gx, c->gy,
          c->gz, c->bx, c->by, c->bz, c->shared, c->nattrs);
  for (int i = 0; i < fn->nparams; ++i) {  /* each parameter as the 8 bytes at its address (a driver reads the
                                              kernel's own sizes; TVM and the launcher keep 8-byte slots) */
    uint64_t v; memcpy(&v, params[i], 8);
    fprintf(f, "%s\"%016llx\"", i ? ", " : "", (unsigned long long)v);
  }
  fprintf(f, "], \"known_params\": %s}\n", fn->nparams < 0 ? "false" : "true");
  fflush(f);
  return 0;
}
int cuLaunchKernelEx(const LaunchConfig* c, Function* fn, void** params, void** extra) {
  return record_launch("cuLaunchKernelEx", fn, c, params);
}
int cuLaunchKernel(Function* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void* stream, void** params, void** extra) {
  LaunchConfig c = {gx, gy, gz, bx, by, bz, shared, stream, 0, 0};
  return record_launch("cuLaunchKernel", fn, &c, params);
}
int cuGetErrorName(int err, const char** s) { *s = err == 200 ? "CUDA_ERROR_INVALID_IMAGE" : "CUDA_STUB"; return 0; }
int cuGetErrorString(int err, const char** s) { *s = "the stub driver"; return 0; }
int cuDeviceGetName(char* name, int len, int dev) { snprintf(name, len, "stub"); return 0; }
int cuTensorMapEncodeTiled(void) { return 1; }  /* not supported: no template uses TMA */

#else  /* the CUDA runtime: TVM's device API calls these around a launch */
static char device_memory_next[1];
int cudaGetDevice(int* d) { *d = 0; return 0; }
int cudaSetDevice(int d) { return 0; }
int cudaGetDeviceCount(int* n) { *n = 1; return 0; }
int cudaDeviceGetAttribute(int* v, int attr, int dev) { *v = 0; return 0; }
int cudaGetDeviceProperties(void* p, int dev) { return 0; }
int cudaGetLastError(void) { return 0; }
int cudaPeekAtLastError(void) { return 0; }
const char* cudaGetErrorName(int e) { return "cudaStub"; }
const char* cudaGetErrorString(int e) { return "the stub runtime"; }
int cudaMalloc(void** p, size_t n) {  /* addresses of TVM's workspaces, recorded to be allocated alike */
  static uintptr_t next = 0x7e0000000000;
  *p = (void*)next;
  next += (n + 0xffff) & ~(uintptr_t)0xffff;
  const char* path = getenv("GPU_CHECK_STUB_LOG");
  FILE* f = path ? fopen(path, "a") : 0;
  if (f) { fprintf(f, "{\"call\": \"malloc\", \"bytes\": %zu, \"address\": \"%016llx\"}\n", n,
                   (unsigned long long)(uintptr_t)*p); fclose(f); }
  return 0;
}
int cudaFree(void* p) { return 0; }
int cudaMallocHost(void** p, size_t n) { *p = malloc(n); return 0; }
int cudaFreeHost(void* p) { free(p); return 0; }
int cudaMemGetInfo(size_t* free_, size_t* total) { *free_ = *total = 0; return 0; }
int cudaMemcpyAsync(void) { return 0; }
int cudaMemcpyPeerAsync(void) { return 0; }
int cudaStreamCreate(void** s) { *s = 0; return 0; }
int cudaStreamCreateWithFlags(void** s, unsigned f) { *s = 0; return 0; }
int cudaStreamDestroy(void* s) { return 0; }
int cudaStreamSynchronize(void* s) { return 0; }
int cudaStreamWaitEvent(void) { return 0; }
int cudaStreamBeginCapture(void) { return 0; }
int cudaStreamEndCapture(void) { return 0; }
int cudaEventCreate(void** e) { *e = 0; return 0; }
int cudaEventDestroy(void* e) { return 0; }
int cudaEventRecord(void) { return 0; }
int cudaEventSynchronize(void* e) { return 0; }
int cudaEventElapsedTime(float* ms, void* a, void* b) { *ms = 0; return 0; }
int cudaGraphInstantiate(void) { return 0; }
int cudaGraphLaunch(void) { return 0; }
int cudaGraphDestroy(void) { return 0; }
int cudaGraphExecDestroy(void) { return 0; }
#endif
