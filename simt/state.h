// state.h — what the parts of simt/ tell each other (not seen by kernels or host code).
#pragma once
#include "simt.h"

#include <string>

namespace simt {

// scheduler.cpp
void execute_launch(const LaunchSpec& spec);  // runs every block of a validated launch
int worker_count();                           // OS threads that run blocks
std::string describe_kernel(const void* kernel);

// runtime.cpp
void launch_refused(const LaunchSpec& spec, cudaError_t err, const char* why);  // the error cudaGetLastError reports
void report_kernel_fault(cudaError_t err, const char* what, const void* address, const void* kernel);

}  // namespace simt
