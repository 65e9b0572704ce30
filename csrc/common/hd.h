// Functions compiled for both the CPU and, in a CUDA build's .cu files, the
// device: the one definition of each element conversion and block decoder
// (weight_decode.h). IE_HD marks them; IE_UNROLL asks nvcc to unroll a loop
// (g++ would warn about an unknown pragma).
#pragma once

#ifdef __CUDACC__
#define IE_HD __host__ __device__ __forceinline__
#define IE_UNROLL _Pragma("unroll")
#else
#define IE_HD inline
#define IE_UNROLL
#endif
