// The environment switches of the engine and its kernels (README's table). Host code.
#pragma once
#include <cstdlib>

namespace fp4moe {

// An on/off switch: unset or empty gives the switch's default, "0" turns it off, any other value on.
inline bool env_switch(const char* name, bool default_on) {
  const char* v = std::getenv(name);
  if (!v || !*v) return default_on;
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
