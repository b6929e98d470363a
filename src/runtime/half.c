/*
 * half.c - fp16 and bf16 conversions on the host (round to nearest even;
 * subnormals, infinities and NaN handled), for the programs and the search
 * backend that make kernel inputs and read kernel outputs.
 */
#include "internal.h"

#include <string.h>

uint16_t stof__f32_to_half(float f, stof_dtype dt)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if (dt == STOF_DTYPE_BF16) {
        if ((x & 0x7fffffffu) > 0x7f800000u)
            return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
        return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
    }
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ex = (x >> 23) & 0xffu;
    uint32_t man = x & 0x7fffffu;
    if (ex == 0xffu)
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0u));
    const int e = (int)ex - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) { /* subnormal or zero in fp16 */
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        const uint32_t shift = (uint32_t)(14 - e);
        uint32_t h = man >> shift;
        const uint32_t rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    const uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* may carry into the exponent: that is the right rounding */
    return (uint16_t)(sign | h);
}

float stof__half_to_f32(uint16_t h, stof_dtype dt)
{
    uint32_t x;
    if (dt == STOF_DTYPE_BF16) {
        x = (uint32_t)h << 16;
    } else {
        const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
        uint32_t e = (h >> 10) & 0x1fu, man = h & 0x3ffu;
        if (e == 0 && man == 0) {
            x = sign;
        } else if (e == 0) { /* subnormal: normalise */
            e = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                e--;
            }
            x = sign | (e << 23) | ((man & 0x3ffu) << 13);
        } else if (e == 31) {
            x = sign | 0x7f800000u | (man << 13);
        } else {
            x = sign | ((e - 15 + 127) << 23) | (man << 13);
        }
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}
