// The environment switches of the engine and its kernels (README's table). Host code.
#pragma once
#include <cstdlib>

namespace fp4moe {

// Whether a switch is set: not unset or empty (either gives the switch's default).
inline bool env_is_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

// An on/off switch: unset or empty gives the switch's default, "0" turns it off, any other value on.
inline bool env_switch(const char* name, bool default_on) {
  if (!env_is_set(name)) return default_on;
  const char* v = std::getenv(name);
  return !(v[0] == '0' && v[1] == '\0');
}

// A switch's value read as a whole decimal integer in [lo, hi] (strtol's syntax); false for anything else,
// which the caller refuses with its own message naming the switch and what it takes.
inline bool env_integer_in(const char* v, long lo, long hi, long* n) {
  char* end = nullptr;
  *n = std::strtol(v, &end, 10);
  return end != v && *end == '\0' && *n >= lo && *n <= hi;
}

}  // namespace fp4moe
