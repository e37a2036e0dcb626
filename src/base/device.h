// device.h — host-side helpers for device memory: the RAII device allocation and stream every
// host file uses, copies to the host, and conversions between the storage types and float. (The one CUDA error
// check, cuda_check / CUDA_CHECK, lives in kernels/common.cuh, which kernels share.)
#pragma once
#include "kernels/common.cuh"

#include <string>
#include <utility>
#include <vector>

// The properties of device 0 (the rank's device once the communicator has chosen it).
inline cudaDeviceProp device_properties() {
  cudaDeviceProp prop;
  cuda_check(cudaGetDeviceProperties(&prop, 0), "querying the device");
  return prop;
}

// A device allocation that frees itself. `what` names the buffer in the out-of-memory error.
template <typename Elem>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(size_t count, const char* what) : count_(count) {
    if (count == 0) return;
    const cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&ptr_), bytes());
    if (err != cudaSuccess)
      cuda_fail(err, (std::string("allocating ") + what + " (" + std::to_string(bytes() >> 20) + " MiB of device memory)")
                         .c_str());
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), count_(o.count_) {
    o.ptr_ = nullptr;
    o.count_ = 0;
  }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(count_, o.count_);
    return *this;
  }
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  Elem* get() const { return ptr_; }
  size_t count() const { return count_; }
  size_t bytes() const { return count_ * sizeof(Elem); }

 private:
  Elem* ptr_ = nullptr;
  size_t count_ = 0;
};

// Host conversions between storage types and float (common.cuh's to_float/from_float are
// device functions). float → bf16 rounds to nearest even.
inline float host_to_float(float x) { return x; }
inline float host_to_float(bf16 x) { return __bfloat162float(x); }
template <typename Elem> Elem host_from_float(float x);
template <> inline float host_from_float<float>(float x) { return x; }
template <> inline bf16 host_from_float<bf16>(float x) { return __float2bfloat16_rn(x); }

// A CUDA stream destroyed with its owner (which synchronizes it first if work may be in flight).
class CudaStream {
 public:
  explicit CudaStream(const char* what) { cuda_check(cudaStreamCreate(&stream_), what); }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream() { cudaStreamDestroy(stream_); }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Copies `bytes` from the device once the work queued on `stream` is done.
inline void copy_to_host(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream), "copying to the host");
  cuda_check(cudaStreamSynchronize(stream), "copying to the host");
}

// `count` device elements as float values on the host.
template <typename Elem>
std::vector<float> copy_floats_to_host(const Elem* src, size_t count, cudaStream_t stream) {
  std::vector<Elem> raw(count);
  copy_to_host(raw.data(), src, count * sizeof(Elem), stream);
  std::vector<float> values(count);
  for (size_t k = 0; k < count; ++k) values[k] = host_to_float(raw[k]);
  return values;
}

// `values` converted to Elem (rounded to nearest for bf16) and copied to `count = values.size()`
// device elements at dst; `what` names the tensor in the error.
template <typename Elem>
void upload_floats(Elem* dst, const std::vector<float>& values, const std::string& what) {
  std::vector<Elem> stored(values.size());
  for (size_t k = 0; k < values.size(); ++k) stored[k] = host_from_float<Elem>(values[k]);
  cuda_check(cudaMemcpy(dst, stored.data(), stored.size() * sizeof(Elem), cudaMemcpyHostToDevice),
             ("uploading " + what).c_str());
}

// Page-locked host memory that frees itself: copies from the device into it do not block the host
// (a copy into pageable memory returns only once it is done).
template <typename Elem>
class PinnedArray {
 public:
  PinnedArray(size_t count, const char* what) {
    cuda_check(cudaMallocHost(reinterpret_cast<void**>(&ptr_), count * sizeof(Elem)), what);
  }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  ~PinnedArray() { cudaFreeHost(ptr_); }
  Elem* get() const { return ptr_; }

 private:
  Elem* ptr_ = nullptr;
};
