// utf8_text.cpp — the UTF-8 well-formedness check of utf8_text.h
#include "src/base/utf8_text.h"

#include <string>

size_t invalid_utf8_offset(const std::string& text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = byte(i);
    size_t length = 1;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong forms
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      if (c == 0xF0) lo = 0x90;  // no overlong forms
      if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else if (c >= 0x80) {
      return i;  // a continuation byte, an overlong lead (0xC0, 0xC1) or 0xF5..0xFF
    }
    if (i + length > text.size()) return i;
    for (size_t k = 1; k < length; ++k) {
      const unsigned char next = byte(i + k);
      if (k == 1 ? next < lo || next > hi : next < 0x80 || next > 0xBF) return i;
    }
    i += length;
  }
  return std::string::npos;
}

