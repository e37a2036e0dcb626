// sha256.h — SHA-256 (FIPS 180-4) of a byte string, as lowercase hex. Used to make sure the
// vocabulary files are the standard ones (GPT-2's, Llama 3's) before any token id depends on them.
#pragma once
#include <string>
#include <string_view>

std::string sha256_hex(std::string_view data);
