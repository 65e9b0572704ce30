// The decoder's activations with AVX-512 (this file alone is built with the AVX-512 flags): sixteen floats at a time.
#include "simd.h"

namespace ie {

const ActOps kActAvx512 = {silu_mul_simd<F32x16>, gelu_tanh_mul_simd<F32x16>, xielu_simd<F32x16>};

}  // namespace ie
