// splitmix64's output function (Steele, Lea, Flood 2014): a bijection of 64-bit words whose every
// output bit depends on every input bit. The one mixer behind the project's derived seeds (image
// crops per sample, randomness per step and rank).
#pragma once

#include <cstdint>

namespace core {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace core
