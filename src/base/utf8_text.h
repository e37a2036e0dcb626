// utf8_text.h — whether bytes are well-formed UTF-8 text (RFC 3629), the one form JSON files hold.
#pragma once
#include <cstddef>
#include <string>

// The offset of the first byte that is not part of well-formed UTF-8 (no overlong forms, no
// surrogates, nothing above U+10FFFF), or npos.
size_t invalid_utf8_offset(const std::string& text);
