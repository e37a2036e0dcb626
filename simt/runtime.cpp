// runtime.cpp — the CUDA runtime API, answered on the CPU: device memory is host memory,
// streams and events are synchronous (streams.cpp checks the order a GPU would give their work),
// launches are validated as a GPU would validate them and then executed by scheduler.cpp.
// Signatures are the toolkit's own declarations.
#include "simt.h"
#include "state.h"
#include "streams.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <dlfcn.h>
#include <unistd.h>

namespace simt {
namespace {

constexpr size_t kDefaultDynamicSmem = 48 * 1024;   // without cudaFuncSetAttribute
constexpr size_t kMaxDynamicSmem = 227 * 1024;      // opt-in limit of sm_90
constexpr size_t kAllocationAlignment = 256;        // what cudaMalloc guarantees

// The error the next cudaGetLastError reports (cleared by it), and a sticky error: a fault
// inside a kernel, which on a GPU corrupts the context and is reported by every later call.
std::atomic<cudaError_t> last_error{cudaSuccess};
std::atomic<cudaError_t> sticky_error{cudaSuccess};

std::mutex attribute_mutex;
std::map<const void*, int> max_dynamic_smem;  // per kernel, set by cudaFuncSetAttribute

cudaError_t fail(cudaError_t err) {
  last_error.store(err);
  return err;
}

cudaError_t sticky_or(cudaError_t err) {
  cudaError_t s = sticky_error.load();
  return s != cudaSuccess ? s : err;
}

size_t physical_memory() {
  return static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGE_SIZE));
}

// The host's memory available to a new allocation without swapping (/proc/meminfo's MemAvailable,
// which counts reclaimable page cache, unlike _SC_AVPHYS_PAGES); the physical memory if unreadable.
size_t available_memory() {
  FILE* meminfo = std::fopen("/proc/meminfo", "r");
  if (meminfo == nullptr) return physical_memory();
  char line[128];
  unsigned long long kib = 0;
  bool found = false;
  while (!found && std::fgets(line, sizeof line, meminfo) != nullptr)
    found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
  std::fclose(meminfo);
  return found ? static_cast<size_t>(kib) * 1024 : physical_memory();
}

struct Event {
  std::chrono::steady_clock::time_point recorded;
  bool has_time = false;
};


// Pinned host allocations (start → size): a copy into them does not block the host.
std::mutex pinned_mutex;
std::map<const char*, size_t> pinned;

// Device allocations (start → size), for the device-bytes counters.
std::mutex device_mutex;
std::map<const void*, size_t> device_allocations;

void* allocate(size_t size) {
  return ::operator new(size ? size : 1, std::align_val_t(kAllocationAlignment), std::nothrow);
}

bool is_pinned(const void* p) {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(pinned_mutex);
  auto it = pinned.upper_bound(c);
  if (it == pinned.begin()) return false;
  --it;
  return c < it->first + it->second;
}

cudaError_t copy(void* dst, const void* src, size_t count) {
  if (count && (!dst || !src)) return fail(cudaErrorInvalidValue);
  if (count) std::memmove(dst, src, count);
  return sticky_or(cudaSuccess);
}
}  // namespace

void launch_refused(const LaunchSpec& spec, cudaError_t err, const char* why) {
  if (std::getenv("SIMT_VERBOSE"))
    std::fprintf(stderr, "simt: launch of %s refused: %s\n", describe_kernel(spec.kernel).c_str(), why);
  fail(err);
}

void report_kernel_fault(cudaError_t err, const char* what, const void* address, const void* kernel) {
  cudaError_t expected = cudaSuccess;
  if (sticky_error.compare_exchange_strong(expected, err)) {
    std::fprintf(stderr, "simt: %s at address %p in kernel %s: %s\n", what, address,
                 kernel ? describe_kernel(kernel).c_str() : "?", cudaGetErrorString(err));
  }
}

void run_launch(const LaunchSpec& spec) {
  const dim3 g = spec.grid, b = spec.block;
  if (sticky_error.load() != cudaSuccess) return;
  if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0)
    return launch_refused(spec, cudaErrorInvalidConfiguration, "a zero grid or block dimension");
  if (static_cast<unsigned long long>(b.x) * b.y * b.z > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64)
    return launch_refused(spec, cudaErrorInvalidConfiguration, "more than 1024 threads per block (or x,y>1024, z>64)");
  if (g.x > 2147483647u || g.y > 65535u || g.z > 65535u)
    return launch_refused(spec, cudaErrorInvalidConfiguration, "grid dimensions over 2^31-1 x 65535 x 65535");
  // The kernel's maxDynamicSharedSizeBytes (cudaFuncAttributes): what cudaFuncSetAttribute set, else
  // 48 KB less its static shared memory (known from the ptxas table, kernel_resources.cpp).
  const size_t static_smem = static_shared_memory(spec.kernel);
  size_t allowed = static_smem < kDefaultDynamicSmem ? kDefaultDynamicSmem - static_smem : 0;
  {
    std::lock_guard<std::mutex> lock(attribute_mutex);
    auto it = max_dynamic_smem.find(spec.kernel);
    if (it != max_dynamic_smem.end()) allowed = static_cast<size_t>(it->second);
  }
  if (spec.dynamic_smem > allowed) {
    char why[256];
    std::snprintf(why, sizeof why,
                  "%zu bytes of dynamic shared memory over the kernel's limit of %zu (48 KB less its %zu bytes of "
                  "static shared memory, unless raised by cudaFuncSetAttribute)",
                  spec.dynamic_smem, allowed, static_smem);
    return launch_refused(spec, cudaErrorInvalidValue, why);
  }
  const Refusal registers = check_launch_registers(spec.kernel, b);
  if (registers.error != cudaSuccess) return launch_refused(spec, registers.error, registers.why.c_str());
  kernel_operation(spec.stream, spec.kernel, spec.accesses, spec.access_count);
  execute_launch(spec);
}

Counters& counters() {
  static Counters c;
  return c;
}

}  // namespace simt

using namespace simt;

// ---- errors
cudaError_t cudaGetLastError(void) { return sticky_or(last_error.exchange(cudaSuccess)); }
cudaError_t cudaPeekAtLastError(void) { return sticky_or(last_error.load()); }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unknown error";
  }
}

// ---- device
cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) {
  ++simt::counters().host_syncs;
  simt::host_waits_for_device();
  return sticky_or(cudaSuccess);
}
cudaError_t cudaDriverGetVersion(int* version) {
  if (!version) return fail(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) { return cudaDriverGetVersion(version); }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "simt (CUDA emulated on %d CPU threads)", worker_count());
  prop->totalGlobalMem = physical_memory();
  prop->sharedMemPerBlock = kDefaultDynamicSmem;
  prop->sharedMemPerBlockOptin = kMaxDynamicSmem;
  prop->sharedMemPerMultiprocessor = 228 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = kWarpSize;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = worker_count();
  prop->l2CacheSize = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = worker_count(); return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = static_cast<int>(kMaxDynamicSmem); return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(kDefaultDynamicSmem); return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    case cudaDevAttrWarpSize: *value = kWarpSize; return cudaSuccess;
    default: return fail(cudaErrorInvalidValue);  // not emulated: say so rather than invent a value
  }
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (!func) return fail(cudaErrorInvalidDeviceFunction);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return fail(cudaErrorInvalidValue);
  if (value < 0 || static_cast<size_t>(value) > kMaxDynamicSmem) return fail(cudaErrorInvalidValue);
  const Refusal refusal = check_max_dynamic_shared_memory(func, static_cast<size_t>(value));
  if (refusal.error != cudaSuccess) {
    if (std::getenv("SIMT_VERBOSE"))
      std::fprintf(stderr, "simt: cudaFuncSetAttribute of %s refused: %s\n", describe_kernel(func).c_str(),
                   refusal.why.c_str());
    return fail(refusal.error);
  }
  std::lock_guard<std::mutex> lock(attribute_mutex);
  max_dynamic_smem[func] = value;
  return cudaSuccess;
}

// The kernel's symbol, mangled for C++ functions as the GPU runtime may return it: from the
// executable's dynamic symbol table (the binaries link with -rdynamic).
cudaError_t cudaFuncGetName(const char** name, const void* func) {
  if (!name || !func) return fail(cudaErrorInvalidValue);
  Dl_info info;
  if (dladdr(func, &info) == 0 || info.dli_sname == nullptr || info.dli_saddr != func)
    return fail(cudaErrorInvalidDeviceFunction);
  *name = info.dli_sname;
  return cudaSuccess;
}

// ---- memory
cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  *ptr = simt::allocate(size);
  if (!*ptr) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(simt::device_mutex);
  simt::device_allocations[*ptr] = size;
  simt::track_allocation(*ptr, size);
  Counters& c = simt::counters();
  c.device_bytes += static_cast<long long>(size);
  c.peak_device_bytes = std::max(c.peak_device_bytes, c.device_bytes);
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(simt::device_mutex);
    const auto it = simt::device_allocations.find(ptr);
    if (it != simt::device_allocations.end()) {
      simt::counters().device_bytes -= static_cast<long long>(it->second);
      simt::device_allocations.erase(it);
      simt::untrack_allocation(ptr);
    }
  }
  ::operator delete(ptr, std::align_val_t(kAllocationAlignment));
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  *ptr = simt::allocate(size);
  if (!*ptr) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(simt::pinned_mutex);
  simt::pinned[static_cast<const char*>(*ptr)] = size;
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) { return cudaMallocHost(ptr, size); }
cudaError_t cudaFreeHost(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(simt::pinned_mutex);
    simt::pinned.erase(static_cast<const char*>(ptr));
  }
  return cudaFree(ptr);
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (!free_bytes || !total_bytes) return fail(cudaErrorInvalidValue);
  *total_bytes = physical_memory();
  *free_bytes = available_memory();
  return cudaSuccess;
}
// Copies and memsets are stream operations for the ordering checker (streams.h); which of them
// the host waits for follows the CUDA Runtime API's "API synchronization behavior" page
// (docs.nvidia.com/cuda/cuda-runtime-api/api-sync-behavior.html). The direction comes from the
// pointers, as with unified addressing.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind) {
  ++simt::counters().host_syncs;
  const bool from_device = simt::is_device_memory(src), to_device = simt::is_device_memory(dst);
  if (count && dst && src && (from_device || to_device)) {
    const bool from_pinned = !from_device && simt::is_pinned(src);
    // "For transfers from pageable host memory to device memory, a stream sync is performed
    // before the copy is initiated" — and the call returns once the data is staged, not copied.
    if (!from_device && !from_pinned) simt::host_waits_for(nullptr);
    simt::stream_operation(nullptr, !from_device ? "cudaMemcpy (host to device)"
                                    : to_device  ? "cudaMemcpy (device to device)"
                                                 : "cudaMemcpy (device to host)",
                           {{src, count, false}, {dst, count, true}});
    // Device to host: "returns only once the copy has completed"; pinned host to device:
    // "synchronous with respect to the host"; device to device: "no host-side synchronization".
    if (!to_device || from_pinned) simt::host_waits_for(nullptr);
  }
  return simt::copy(dst, src, count);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  // Pageable host memory on either side: the copy may wait for the stream's earlier work. The
  // documentation promises no more ("might be synchronous"), so the checker's host learns nothing.
  if ((kind == cudaMemcpyDeviceToHost && !simt::is_pinned(dst)) || (kind == cudaMemcpyHostToDevice && !simt::is_pinned(src)))
    ++simt::counters().host_syncs;
  if (count && dst && src) simt::stream_operation(stream, "cudaMemcpyAsync", {{src, count, false}, {dst, count, true}});
  return simt::copy(dst, src, count);
}
namespace simt {
namespace {
// "The memset functions are asynchronous with respect to the host except when the target memory
// is pinned host memory" (device memory here): the host learns nothing from either variant.
cudaError_t memset_on(cudaStream_t stream, const char* what, void* ptr, int value, size_t count) {
  if (count && !ptr) return fail(cudaErrorInvalidValue);
  if (count) {
    stream_operation(stream, what, {{ptr, count, true}});
    std::memset(ptr, value, count);
  }
  return sticky_or(cudaSuccess);
}
}  // namespace
}  // namespace simt
cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  return simt::memset_on(nullptr, "cudaMemset", ptr, value, count);
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  return simt::memset_on(stream, "cudaMemsetAsync", ptr, value, count);
}

// ---- streams and events: work is done when it is issued, so they keep time and the order the
// checker (streams.h) holds every access to.
namespace simt {
namespace {
cudaError_t create_stream_for(cudaStream_t* stream, unsigned int flags, const void* caller) {
  if (!stream) return fail(cudaErrorInvalidValue);
  *stream = create_stream(flags, caller);
  return cudaSuccess;
}
}  // namespace
}  // namespace simt
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return simt::create_stream_for(stream, cudaStreamDefault, __builtin_return_address(0));
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return simt::create_stream_for(stream, flags, __builtin_return_address(0));
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  simt::destroy_stream(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  ++simt::counters().host_syncs;
  simt::host_waits_for(stream);
  return sticky_or(cudaSuccess);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  simt::stream_waits_for_event(stream, event);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  if (!event) return fail(cudaErrorInvalidValue);
  *event = reinterpret_cast<cudaEvent_t>(new Event);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  simt::forget_event(event);
  delete reinterpret_cast<Event*>(event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  simt::record_event(event, stream);
  Event* e = reinterpret_cast<Event*>(event);
  e->recorded = std::chrono::steady_clock::now();
  e->has_time = true;
  return cudaSuccess;
}
// Work is done when it is issued: a recorded event has always completed, and a host that saw it
// complete has waited for its work.
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  simt::host_waits_for_event(event);
  return sticky_or(cudaSuccess);
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  ++simt::counters().host_syncs;
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  simt::host_waits_for_event(event);
  return sticky_or(cudaSuccess);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms || !start || !end) return fail(cudaErrorInvalidValue);
  const Event* a = reinterpret_cast<const Event*>(start);
  const Event* b = reinterpret_cast<const Event*>(end);
  if (!a->has_time || !b->has_time) return fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(b->recorded - a->recorded).count();
  return cudaSuccess;
}
