// safetensors.h — Hugging Face's safetensors files (docs/FORMATS.md, "safetensors"): an 8-byte
// little-endian header length, a JSON header (tensor name → dtype, shape, byte range of the data;
// an optional "__metadata__" of strings; padded with spaces to a multiple of 8 bytes), then the
// tensors' bytes, row-major, little-endian. Reading checks every number of the header against the
// file before a byte of data is read; writing streams the tensors through AtomicFileWriter.
#pragma once
#include "src/base/durable_file.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

// The element types train_gpt reads (F16 too) and writes (F32, BF16).
enum class SafetensorsDType { f32, bf16, f16 };

const char* safetensors_dtype_name(SafetensorsDType d);  // "F32", "BF16", "F16"
size_t safetensors_dtype_bytes(SafetensorsDType d);

// bf16's bits ↔ float (float → bf16 rounds to nearest even; NaN stays NaN).
float bf16_bits_to_float(uint16_t bits);
uint16_t float_to_bf16_bits(float value);

struct SafetensorsTensor {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // bytes from the start of the data (after the header)
  uint64_t elements() const;
};

// One safetensors file, its header read and checked on construction: a length within the file,
// JSON of one object, each tensor's dtype one of SafetensorsDType's, its shape non-negative, its
// byte range the shape's size, the ranges tiling the data exactly (no gap, no overlap, nothing
// after). Errors are one line starting with the path.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::string path);

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // The tensor `name`; throws "PATH: no tensor NAME" when it is missing.
  const SafetensorsTensor& tensor(const std::string& name) const;
  // Its values as float (bf16 and f16 widen exactly).
  std::vector<float> read_floats(const std::string& name) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::map<std::string, SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct SafetensorsEntry {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::f32;
  std::vector<int64_t> shape;
};

// The header bytes (length excluded) of a file holding `entries` in that order in the data, with
// `metadata` as "__metadata__": JSON padded with spaces to a multiple of 8 bytes, so the data
// starts 8-byte aligned.
std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata);

// Writes a safetensors file atomically: the header on construction, then each entry's values in
// order through write(); commit() once all are written (destroyed before: nothing appears at PATH).
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<SafetensorsEntry> entries,
                    const std::map<std::string, std::string>& metadata);
  // The next entry's values, converted to its dtype (bf16: rounded to nearest even).
  void write(const std::vector<float>& values);
  void commit();

 private:
  std::vector<SafetensorsEntry> entries_;
  size_t next_ = 0;
  AtomicFileWriter out_;
};
