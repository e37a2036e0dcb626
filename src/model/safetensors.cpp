// safetensors.cpp — reading and checking safetensors files, writing them atomically
#include "src/model/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <stdexcept>
#include <utility>

namespace {

// A header longer than this is not a model's (Llama 3.1 405B's is well under 1 MiB): refused
// before it is allocated.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File open_for_reading(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) throw file_error(path, "cannot open safetensors file", errno);
  return f;
}

bool dtype_named(const std::string& name, SafetensorsDType* d) {
  for (SafetensorsDType candidate : {SafetensorsDType::f32, SafetensorsDType::bf16, SafetensorsDType::f16})
    if (name == safetensors_dtype_name(candidate)) return *d = candidate, true;
  return false;
}

float f16_bits_to_float(uint16_t bits) {
  const uint32_t sign = (bits >> 15) & 1u, exponent = (bits >> 10) & 0x1Fu, mantissa = bits & 0x3FFu;
  float magnitude;
  if (exponent == 0) magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero, subnormal
  else if (exponent == 31) magnitude = mantissa == 0 ? std::numeric_limits<float>::infinity() : NAN;
  else magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  return sign ? -magnitude : magnitude;
}

// The tensor entry `name` of the header, checked; `data_bytes`: the bytes after the header.
SafetensorsTensor parse_entry(const std::string& path, const std::string& name, const nlohmann::json& value,
                              uint64_t data_bytes) {
  const auto bad = [&](const std::string& what) {
    return std::runtime_error(path + ": tensor " + name + ": " + what);
  };
  if (!value.is_object()) throw bad("expected an object with dtype, shape and data_offsets");
  SafetensorsTensor t;
  t.name = name;
  const auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) throw bad("no dtype string");
  if (!dtype_named(dtype->get<std::string>(), &t.dtype))
    throw bad("dtype " + dtype->get<std::string>() + " is not one train_gpt reads (F32, BF16, F16)");
  const auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) throw bad("no shape array");
  uint64_t elements = 1;
  for (const nlohmann::json& d : *shape) {
    if (!d.is_number_unsigned()) throw bad("shape " + shape->dump() + " is not a list of non-negative integers");
    const uint64_t n = d.get<uint64_t>();
    if (n != 0 && elements > (uint64_t{1} << 62) / n) throw bad("shape " + shape->dump() + " is too large");
    elements *= n;
    t.shape.push_back(static_cast<int64_t>(n));
  }
  const auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned())
    throw bad("expected data_offsets [begin, end] of non-negative integers");
  t.begin = (*offsets)[0].get<uint64_t>();
  t.end = (*offsets)[1].get<uint64_t>();
  if (t.begin > t.end || t.end > data_bytes)
    throw bad("data_offsets " + offsets->dump() + " outside the file's " + std::to_string(data_bytes) + " data bytes");
  if (t.end - t.begin != elements * safetensors_dtype_bytes(t.dtype))
    throw bad("data_offsets " + offsets->dump() + " hold " + std::to_string(t.end - t.begin) + " bytes, shape " +
              shape->dump() + " of " + dtype->get<std::string>() + " needs " +
              std::to_string(elements * safetensors_dtype_bytes(t.dtype)));
  return t;
}

}  // namespace

const char* safetensors_dtype_name(SafetensorsDType d) {
  return d == SafetensorsDType::f32 ? "F32" : d == SafetensorsDType::bf16 ? "BF16" : "F16";
}

size_t safetensors_dtype_bytes(SafetensorsDType d) { return d == SafetensorsDType::f32 ? 4 : 2; }

float bf16_bits_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

uint16_t float_to_bf16_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN, sign kept
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}

uint64_t SafetensorsTensor::elements() const { return (end - begin) / safetensors_dtype_bytes(dtype); }

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  File f = open_for_reading(path_);
  std::fseek(f.get(), 0, SEEK_END);
  const long size = std::ftell(f.get());
  std::fseek(f.get(), 0, SEEK_SET);
  unsigned char length_bytes[8];
  if (size < 8 || std::fread(length_bytes, 1, 8, f.get()) != 8)
    throw std::runtime_error(path_ + ": a " + std::to_string(size) +
                             "-byte file, too short for a safetensors header length (8 bytes)");
  uint64_t header_bytes = 0;
  for (int k = 7; k >= 0; --k) header_bytes = header_bytes << 8 | length_bytes[k];
  const uint64_t file_bytes = static_cast<uint64_t>(size);
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8)
    throw std::runtime_error(path_ + ": safetensors header length " + std::to_string(header_bytes) + " exceeds the " +
                             std::to_string(file_bytes) + "-byte file (not a safetensors file?)");
  std::string text(header_bytes, '\0');
  if (std::fread(&text[0], 1, header_bytes, f.get()) != header_bytes)
    throw file_error(path_, "cannot read the safetensors header", errno);
  data_start_ = 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - data_start_;

  std::set<std::string> keys;
  const auto unique_keys = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && !keys.insert(parsed.get<std::string>()).second)
      throw std::runtime_error(path_ + ": tensor " + parsed.get<std::string>() + " appears twice in the header");
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, unique_keys);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path_ + ": the safetensors header is not valid JSON (" + e.what() + ")");
  }
  if (!header.is_object()) throw std::runtime_error(path_ + ": the safetensors header is not a JSON object");
  for (const auto& item : header.items()) {
    if (item.key() == "__metadata__") {
      if (!item.value().is_object()) throw std::runtime_error(path_ + ": __metadata__ is not an object of strings");
      for (const auto& m : item.value().items()) {
        if (!m.value().is_string())
          throw std::runtime_error(path_ + ": __metadata__ value of " + m.key() + " is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    tensors_[item.key()] = parse_entry(path_, item.key(), item.value(), data_bytes);
  }
  // The byte ranges tile the data: sorted by start, each begins where the previous ended.
  std::vector<const SafetensorsTensor*> by_start;
  for (const auto& t : tensors_) by_start.push_back(&t.second);
  std::sort(by_start.begin(), by_start.end(), [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  for (const SafetensorsTensor* t : by_start) {
    if (t->begin != covered)
      throw std::runtime_error(path_ + ": tensor " + t->name + " starts at data byte " + std::to_string(t->begin) +
                               ", expected " + std::to_string(covered) + " (tensors overlap or leave a gap)");
    covered = t->end;
  }
  if (covered != data_bytes)
    throw std::runtime_error(path_ + ": the tensors hold " + std::to_string(covered) + " data bytes, the file " +
                             std::to_string(data_bytes) + " (truncated or trailing bytes)");
}

const SafetensorsTensor& SafetensorsReader::tensor(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw std::runtime_error(path_ + ": no tensor " + name);
  return it->second;
}

std::vector<float> SafetensorsReader::read_floats(const std::string& name) const {
  const SafetensorsTensor& t = tensor(name);
  File f = open_for_reading(path_);
  std::vector<unsigned char> raw(t.end - t.begin);
  if (std::fseek(f.get(), static_cast<long>(data_start_ + t.begin), SEEK_SET) != 0 ||
      std::fread(raw.data(), 1, raw.size(), f.get()) != raw.size())
    throw file_error(path_, "cannot read tensor " + name, errno);
  std::vector<float> values(t.elements());
  for (size_t k = 0; k < values.size(); ++k) {
    if (t.dtype == SafetensorsDType::f32) {
      std::memcpy(&values[k], &raw[4 * k], 4);
      continue;
    }
    const uint16_t bits = static_cast<uint16_t>(raw[2 * k] | raw[2 * k + 1] << 8);
    values[k] = t.dtype == SafetensorsDType::bf16 ? bf16_bits_to_float(bits) : f16_bits_to_float(bits);
  }
  return values;
}

std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    uint64_t elements = 1;
    for (int64_t d : e.shape) elements *= static_cast<uint64_t>(d);
    const uint64_t end = offset + elements * safetensors_dtype_bytes(e.dtype);
    header[e.name] = {{"dtype", safetensors_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<SafetensorsEntry> entries,
                                     const std::map<std::string, std::string>& metadata)
    : entries_(std::move(entries)), out_(path) {
  const std::string header = safetensors_header(entries_, metadata);
  unsigned char length_bytes[8];
  for (int k = 0; k < 8; ++k) length_bytes[k] = static_cast<unsigned char>(uint64_t{header.size()} >> (8 * k));
  out_.write(length_bytes, sizeof length_bytes);
  out_.write(header.data(), header.size());
}

void SafetensorsWriter::write(const std::vector<float>& values) {
  if (next_ == entries_.size())
    throw std::runtime_error(out_.path() + ": more tensors written than the header's " + std::to_string(entries_.size()));
  const SafetensorsEntry& e = entries_[next_++];
  uint64_t elements = 1;
  for (int64_t d : e.shape) elements *= static_cast<uint64_t>(d);
  if (values.size() != elements)
    throw std::runtime_error(out_.path() + ": tensor " + e.name + " given " + std::to_string(values.size()) +
                             " values, its shape holds " + std::to_string(elements));
  if (e.dtype == SafetensorsDType::f32) {
    out_.write(values.data(), values.size() * sizeof(float));
    return;
  }
  if (e.dtype != SafetensorsDType::bf16)
    throw std::runtime_error(out_.path() + ": tensor " + e.name + ": train_gpt writes F32 or BF16");
  std::vector<uint16_t> narrow(values.size());
  for (size_t k = 0; k < values.size(); ++k) narrow[k] = float_to_bf16_bits(values[k]);
  out_.write(narrow.data(), narrow.size() * sizeof(uint16_t));
}

void SafetensorsWriter::commit() {
  if (next_ != entries_.size())
    throw std::runtime_error(out_.path() + ": " + std::to_string(next_) + " of the header's " +
                             std::to_string(entries_.size()) + " tensors written");
  out_.commit();
}
