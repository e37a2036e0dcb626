// error_context.h — with_context: an error rethrown as one line that starts with the flag or file
// it concerns.
#pragma once
#include <exception>
#include <stdexcept>
#include <string>

// Runs f; an exception from it is rethrown as one line prefixed with `context` (a flag name).
template <typename F>
auto with_context(const std::string& context, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    throw std::runtime_error(context + ": " + e.what());
  }
}
