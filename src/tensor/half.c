/* IEEE binary16 and bfloat16 <-> binary32, by bit manipulation so that the result
 * does not depend on the compiler's or CPU's half-precision support. */
#include <string.h>

#include "tensor/quant.h"

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float lm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) /* inf, or NaN with its payload kept */
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        /* subnormal: mant * 2^-24; shift the leading 1 up to the implicit bit */
        uint32_t e = 127 - 15 + 1;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e--;
        }
        return bits_f32(sign | (e << 23) | ((mant & 0x3ffu) << 13));
    }
    return bits_f32(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

/* Shifts `v` right by `shift` (1..31) rounding to nearest, ties to even. */
static uint32_t shift_rne(uint32_t v, unsigned shift) {
    uint32_t q = v >> shift;
    uint32_t rem = v & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return q;
}

uint16_t lm_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: keep the top payload bits, force quiet (never inf) */
        return (uint16_t)(sign | 0x7c00u | 0x200u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 rounds to inf (65504 has an odd mantissa) */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal in f16: >= 2^-14 */
        uint32_t e = (a >> 23) - 127 + 15;
        /* a carry out of the mantissa correctly bumps the exponent */
        return (uint16_t)(sign | shift_rne((e << 10 << 13) | (a & 0x7fffffu), 13));
    }
    /* subnormal or zero in f16: value = full * 2^(e-150), result = value / 2^-24 */
    uint32_t e = a >> 23;
    if (e < 101) return sign; /* below 2^-26: certainly rounds to zero */
    uint32_t full = (a & 0x7fffffu) | 0x800000u;
    return (uint16_t)(sign | shift_rne(full, 126 - e));
}

float lm_bf16_to_f32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

uint16_t lm_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: truncate and force quiet */
        return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
