// What NCCL's C interface fixes, as the emulator's NCCL (nccl*.cpp) uses
// it: the result codes, data types and reduction ops under nccl.h's names
// and values (this library includes no nccl.h), the unique id's and the
// config's layout, and the encodings of the 16-bit data types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace {

using ncclResult_t = int;
constexpr ncclResult_t ncclSuccess = 0;
constexpr ncclResult_t ncclSystemError = 2;
constexpr ncclResult_t ncclInvalidArgument = 4;
constexpr ncclResult_t ncclInvalidUsage = 5;
constexpr ncclResult_t ncclRemoteError = 6;
constexpr ncclResult_t ncclInProgress = 7;

constexpr int ncclInt64 = 4;
constexpr int ncclFloat16 = 6;
constexpr int ncclFloat32 = 7;
constexpr int ncclBfloat16 = 9;
constexpr int ncclSum = 0;
constexpr int ncclMax = 2;
constexpr int ncclAvg = 4;

// The bytes of one element of `datatype` (0: a type this collective does
// not take): float32 everywhere, and in an all-reduce (`all_reduce`) the
// 16-bit floats and int64 too.
std::size_t element_bytes(int datatype, bool all_reduce) {
    if (datatype == ncclFloat32) return 4;
    if (!all_reduce) return 0;
    if (datatype == ncclFloat16 || datatype == ncclBfloat16) return 2;
    if (datatype == ncclInt64) return 8;
    return 0;
}

struct UniqueId {
    unsigned char bytes[128];
};

// The prefix of ncclConfig_t that matters here.
struct Config {
    std::size_t size;
    unsigned magic;
    unsigned version;
    int blocking;
};

// 16-bit floats to and from float: bfloat16 is float's top half (rounded
// to nearest even, a NaN kept quiet), float16 the compiler's _Float16.
float bf16_to_float(std::uint16_t h) {
    const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

std::uint16_t float_to_bf16(float f) {
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
    return static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

float fp16_to_float(std::uint16_t h) {
    _Float16 x;
    std::memcpy(&x, &h, 2);
    return static_cast<float>(x);
}

std::uint16_t float_to_fp16(float f) {
    const _Float16 x = static_cast<_Float16>(f);
    std::uint16_t h;
    std::memcpy(&h, &x, 2);
    return h;
}

}  // namespace
