// streams.h — the stream ordering checker's interface for the rest of simt/: device allocations it
// watches, and the device-memory accesses of each stream operation (kernel launch, copy, memset,
// cuBLASLt and NCCL call), checked against the happens-before order a GPU would give them
// (streams.cpp; docs/SIMT.md describes the rules).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace simt {

// One device-memory access of an operation: `bytes` from `address` (kWholeRest: from there to the
// end of the allocation it points into, for kernel pointers whose extent is unknown).
struct MemoryAccess {
  const void* address;
  size_t bytes;
  bool write;
};
constexpr size_t kWholeRest = SIZE_MAX;

// Issues an operation named `what` (e.g. "ncclAllReduce") on `stream` and checks its accesses: one
// that a GPU would leave unordered with an earlier access on another stream ends the process with
// a "simt: stream hazard:" line. Accesses outside device allocations (host memory) are not checked.
void stream_operation(cudaStream_t stream, const char* what, const MemoryAccess* accesses, size_t count);
inline void stream_operation(cudaStream_t stream, const char* what, std::initializer_list<MemoryAccess> accesses) {
  stream_operation(stream, what, accesses.begin(), accesses.size());
}
// The same for an NCCL operation of communicator `comm` (tracked, below) issued in group `group`
// (the outermost ncclGroupStart's number; 0 outside any group), also checked against the
// operations of the other communicators: one that may run at once with an earlier one of another
// communicator, outside their common group, ends the process with a "simt: stream hazard:" line.
void nccl_operation(cudaStream_t stream, const char* what, const void* comm, unsigned long long group,
                    std::initializer_list<MemoryAccess> accesses);
// A communicator from its creation to its destruction or abort; `name` names it in reports.
void track_communicator(const void* comm, std::string name);
void untrack_communicator(const void* comm);
// The same for a kernel launch: `kernel` names it in a report.
void kernel_operation(cudaStream_t stream, const void* kernel, const MemoryAccess* accesses, size_t count);

// cudaMalloc / cudaFree: the allocations whose accesses are checked.
void track_allocation(const void* start, size_t bytes);
void untrack_allocation(const void* start);
bool is_device_memory(const void* address);

// Streams and events, as runtime.cpp's cudaStream*/cudaEvent* calls report them. `creator` (a
// return address) names a stream in reports.
cudaStream_t create_stream(unsigned flags, const void* creator);
void destroy_stream(cudaStream_t stream);
void record_event(const void* event, cudaStream_t stream);
void forget_event(const void* event);
void stream_waits_for_event(cudaStream_t stream, const void* event);
// The calling host thread has waited for: an event's work, everything queued on `stream` so far
// (a stream synchronization or a synchronous copy), or all device work.
void host_waits_for_event(const void* event);
void host_waits_for(cudaStream_t stream);
void host_waits_for_device();

}  // namespace simt
