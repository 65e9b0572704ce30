// The decoder's activations with AVX2/FMA (this file alone is built with -mavx2 -mfma): eight floats at a time.
#include "simd.h"

namespace ie {

const ActOps kActAvx2 = {silu_mul_simd<F32x8>, gelu_tanh_mul_simd<F32x8>, xielu_simd<F32x8>};

}  // namespace ie
