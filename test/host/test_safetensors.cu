// safetensors files (src/model/safetensors.h) and Hugging Face's q/k row order (src/model/hf_llama.h):
// a written file reads back value for value (F32 exactly, BF16 as host_from_float<bf16> rounds),
// its bytes are the format's (8-byte little-endian length, a JSON header padded with spaces to a
// multiple of 8, the tensors in order after it), F16 widens exactly, and a damaged header is refused
// in one line naming the file (and the tensor where one is at fault) — an unknown dtype, a length
// past the end, bytes that do not match the shape, gaps, overlaps, trailing bytes, repeated names.
// The rotate-half permutation matches a loop written from transformers' view/transpose and round-trips.
#include "src/base/device.h"
#include "src/model/hf_llama.h"
#include "src/model/safetensors.h"
#include "test/test_util.h"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string temp_dir() {
  char name[] = "/tmp/test_safetensors_XXXXXX";
  REQUIRE(::mkdtemp(name) != nullptr);
  return name;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A file of header `json` (padded as given) and `data_bytes` bytes of data.
std::string safetensors_file(const std::string& json, size_t data_bytes) {
  std::string bytes(8, '\0');
  for (int k = 0; k < 8; ++k) bytes[k] = static_cast<char>((uint64_t{json.size()} >> (8 * k)) & 0xFF);
  return bytes + json + std::string(data_bytes, '\x01');
}

std::string refusal(const std::string& path) {
  try {
    SafetensorsReader reader(path);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("safetensors: written F32 and BF16 tensors read back; the bytes are the format's", "[safetensors]") {
  const std::string dir = temp_dir(), path = dir + "/t.safetensors";
  std::vector<float> a(15), b(7);
  for (size_t k = 0; k < a.size(); ++k) a[k] = std::sin(0.37f * static_cast<float>(k) + 0.1f) * 3.0f;
  for (size_t k = 0; k < b.size(); ++k) b[k] = 1.0f + std::ldexp(static_cast<float>(k), -9);  // ties for bf16
  {
    SafetensorsWriter out(path, {{"a", SafetensorsDType::f32, {3, 5}}, {"b", SafetensorsDType::bf16, {7}}},
                          {{"format", "pt"}});
    out.write(a);
    out.write(b);
    out.commit();
  }
  const std::string bytes = file_bytes(path);
  uint64_t header = 0;
  for (int k = 7; k >= 0; --k) header = header << 8 | static_cast<unsigned char>(bytes[k]);
  CHECK(header % 8 == 0);
  CHECK(bytes[8] == '{');
  CHECK(bytes.size() == 8 + header + 15 * 4 + 7 * 2);
  const std::string json = bytes.substr(8, header);
  CHECK(json.find("\"__metadata__\":{\"format\":\"pt\"}") != std::string::npos);
  CHECK(json.find_last_not_of(' ') + 1 + (8 - (json.find_last_not_of(' ') + 1) % 8) % 8 == header);

  const SafetensorsReader reader(path);
  CHECK(reader.metadata().at("format") == "pt");
  CHECK(reader.tensor("a").shape == std::vector<int64_t>{3, 5});
  CHECK(reader.tensor("b").dtype == SafetensorsDType::bf16);
  CHECK(reader.read_floats("a") == a);
  const std::vector<float> b_read = reader.read_floats("b");
  for (size_t k = 0; k < b.size(); ++k) {
    CAPTURE(k, b[k]);
    CHECK(b_read[k] == host_to_float(host_from_float<bf16>(b[k])));
  }
  CHECK_THROWS_WITH(reader.tensor("c"), Catch::Contains(path + ": no tensor c"));
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("safetensors: the header pads with spaces to a multiple of 8 for every length", "[safetensors]") {
  for (size_t name_length = 1; name_length <= 9; ++name_length) {
    const std::string header = safetensors_header({{std::string(name_length, 'w'), SafetensorsDType::f32, {1}}}, {});
    CAPTURE(name_length, header);
    CHECK(header.size() % 8 == 0);
    const size_t json_end = header.find_last_not_of(' ') + 1;
    CHECK(header[json_end - 1] == '}');
    CHECK(header.size() - json_end < 8);
  }
}

TEST_CASE("safetensors: F16 widens exactly, bf16 rounds to nearest even like the device conversion", "[safetensors]") {
  const std::string dir = temp_dir(), path = dir + "/h.safetensors";
  // 1.0, -2.0, 65504 (largest), 2^-24 (smallest subnormal), infinity, 0.5 + 2^-11.
  const uint16_t halves[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00, 0x3801};
  const float expected[] = {1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24), INFINITY, 0.5f + std::ldexp(1.0f, -11)};
  std::string data(reinterpret_cast<const char*>(halves), sizeof halves);
  std::string file = safetensors_file("{\"h\":{\"dtype\":\"F16\",\"shape\":[6],\"data_offsets\":[0,12]}}", 0) + data;
  write_bytes(path, file);
  CHECK(SafetensorsReader(path).read_floats("h") == std::vector<float>(expected, expected + 6));
  for (float v : {1.0f, 1.00390625f, 1.01171875f, -3.3f, 1e-40f, 3.0e38f, -0.0f}) {
    CAPTURE(v);
    CHECK(bf16_bits_to_float(float_to_bf16_bits(v)) == host_to_float(host_from_float<bf16>(v)));
  }
  CHECK(std::isnan(bf16_bits_to_float(float_to_bf16_bits(NAN))));
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("safetensors: damaged headers are refused naming the file and tensor", "[safetensors]") {
  const std::string dir = temp_dir(), path = dir + "/bad.safetensors";
  const auto entry = [](const char* name, const char* dtype, const char* shape, int begin, int end) {
    return std::string("\"") + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
           std::to_string(begin) + "," + std::to_string(end) + "]}";
  };
  struct Case {
    const char* what;
    std::string file;
    const char* message;
  } cases[] = {
      {"short file", std::string("\x05\x00", 2), "too short"},
      {"length past the end", safetensors_file("{}", 0).substr(0, 8) + std::string("\xFF", 1), "exceeds"},
      {"not JSON", safetensors_file("{\"a\":", 0), "not valid JSON"},
      {"not an object", safetensors_file("[1,2]   ", 0), "not a JSON object"},
      {"unknown dtype", safetensors_file("{" + entry("w", "I64", "[2]", 0, 16) + "}", 16), "tensor w: dtype I64"},
      {"bytes not the shape's", safetensors_file("{" + entry("w", "F32", "[3]", 0, 8) + "}", 8), "tensor w: data_offsets"},
      {"range past the data", safetensors_file("{" + entry("w", "F32", "[2]", 0, 8) + "}", 4), "outside"},
      {"gap", safetensors_file("{" + entry("w", "F32", "[1]", 4, 8) + "}", 8), "tensor w starts at data byte 4"},
      {"overlap", safetensors_file("{" + entry("v", "F32", "[2]", 0, 8) + "," + entry("w", "F32", "[1]", 4, 8) + "}", 8),
       "tensor w starts at data byte 4"},
      {"trailing bytes", safetensors_file("{" + entry("w", "F32", "[1]", 0, 4) + "}", 6), "truncated or trailing"},
      {"repeated name", safetensors_file("{" + entry("w", "F32", "[1]", 0, 4) + "," + entry("w", "F32", "[1]", 4, 8) + "}", 8),
       "tensor w appears twice"},
      {"negative shape", safetensors_file("{" + entry("w", "F32", "[-1]", 0, 0) + "}", 0), "tensor w: shape"},
      {"metadata not strings", safetensors_file("{\"__metadata__\":{\"k\":1}}", 0), "__metadata__ value of k"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    write_bytes(path, c.file);
    const std::string message = refusal(path);
    CHECK(message.rfind(path + ": ", 0) == 0);
    CHECK(message.find(c.message) != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
  }
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("Hugging Face's rotate-half rows: transformers' view/transpose, and back", "[safetensors]") {
  const int heads = 3, head_size = 8, columns = 5;
  std::vector<float> meta(static_cast<size_t>(heads) * head_size * columns);
  for (size_t k = 0; k < meta.size(); ++k) meta[k] = static_cast<float>(k);
  const std::vector<float> hf = rotate_half_rows(meta, heads, head_size, columns);
  // w.view(heads, HS/2, 2, columns).transpose(1, 2): hf[h][j][i] = meta[h][i][j].
  for (int h = 0; h < heads; ++h)
    for (int j = 0; j < 2; ++j)
      for (int i = 0; i < head_size / 2; ++i)
        for (int c = 0; c < columns; ++c) {
          CAPTURE(h, j, i, c);
          const size_t hf_row = static_cast<size_t>(h) * head_size + j * (head_size / 2) + i;
          const size_t meta_row = static_cast<size_t>(h) * head_size + i * 2 + j;
          REQUIRE(hf[hf_row * columns + c] == meta[meta_row * columns + c]);
        }
  CHECK(adjacent_pair_rows(hf, heads, head_size, columns) == meta);
  CHECK(hf != meta);
}
