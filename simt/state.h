// state.h — what the parts of simt/ tell each other (not seen by kernels or host code).
#pragma once
#include "simt.h"

#include <string>

namespace simt {

// Why a GPU would refuse a call, or nothing (error == cudaSuccess).
struct Refusal {
  cudaError_t error = cudaSuccess;
  std::string why;
};

// scheduler.cpp
void execute_launch(const LaunchSpec& spec);  // runs every block of a validated launch
int worker_count();                           // OS threads that run blocks
std::string describe_kernel(const void* kernel);

// runtime.cpp
void launch_refused(const LaunchSpec& spec, cudaError_t err, const char* why);  // the error cudaGetLastError reports
void report_kernel_fault(cudaError_t err, const char* what, const void* address, const void* kernel);

// kernel_resources.cpp: the ptxas table's figures for a kernel (none when it has no rows, or no
// table is loaded).
size_t static_shared_memory(const void* kernel);  // the most over its architectures
Refusal check_launch_registers(const void* kernel, dim3 block);
Refusal check_max_dynamic_shared_memory(const void* kernel, size_t bytes);  // cudaFuncSetAttribute's opt-in

}  // namespace simt
