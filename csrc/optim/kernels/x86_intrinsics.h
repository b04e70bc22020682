// <immintrin.h> for the AVX translation units.
//
// GCC 12 (before 12.3) warns "'__Y' is used uninitialized" inside its own AVX-512 headers:
// the _mm*_undefined_* helpers self-initialise on purpose (GCC bug 105593). The warning
// is located in the system header, so silencing it around the include hides nothing of
// ours.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
