// The on/off environment switches of the engine and its kernels (README's table): unset or empty gives
// the switch's default, "0" turns it off, any other value on. Host code.
#pragma once
#include <cstdlib>

namespace fp4moe {

inline bool env_switch(const char* name, bool default_on) {
  const char* v = std::getenv(name);
  if (!v || !*v) return default_on;
  return !(v[0] == '0' && v[1] == '\0');
}

}  // namespace fp4moe
