/* Element types: names, block sizes, GGML ids, half-float conversions. */
#include "ir/ir_impl.h"

#include <strings.h>

typedef struct dtype_info {
    const char *name;
    uint32_t block_elems;
    uint32_t block_bytes;
    int ggml; /* -1: no GGML id */
} dtype_info;

/* Block sizes from ggml's type traits (ggml-common.h); GGML ids from
 * ggml.h.  Ids 4, 5 (removed Q4_2/Q4_3), 9 (Q8_1, never stored) and 15
 * (Q8_K is stored only as an intermediate, but has a fixed size) follow
 * upstream. */
static const dtype_info k_dtypes[PX_DTYPE_COUNT_] = {
    [PX_DTYPE_F32] = {"f32", 1, 4, 0},
    [PX_DTYPE_F16] = {"f16", 1, 2, 1},
    [PX_DTYPE_BF16] = {"bf16", 1, 2, 30},
    [PX_DTYPE_F64] = {"f64", 1, 8, 28},
    [PX_DTYPE_FP8_E4M3] = {"fp8_e4m3", 1, 1, -1},
    [PX_DTYPE_FP8_E5M2] = {"fp8_e5m2", 1, 1, -1},
    [PX_DTYPE_I8] = {"i8", 1, 1, 24},
    [PX_DTYPE_I16] = {"i16", 1, 2, 25},
    [PX_DTYPE_I32] = {"i32", 1, 4, 26},
    [PX_DTYPE_I64] = {"i64", 1, 8, 27},
    [PX_DTYPE_Q4_0] = {"q4_0", 32, 18, 2},
    [PX_DTYPE_Q4_1] = {"q4_1", 32, 20, 3},
    [PX_DTYPE_Q5_0] = {"q5_0", 32, 22, 6},
    [PX_DTYPE_Q5_1] = {"q5_1", 32, 24, 7},
    [PX_DTYPE_Q8_0] = {"q8_0", 32, 34, 8},
    [PX_DTYPE_Q2_K] = {"q2_k", 256, 84, 10},
    [PX_DTYPE_Q3_K] = {"q3_k", 256, 110, 11},
    [PX_DTYPE_Q4_K] = {"q4_k", 256, 144, 12},
    [PX_DTYPE_Q5_K] = {"q5_k", 256, 176, 13},
    [PX_DTYPE_Q6_K] = {"q6_k", 256, 210, 14},
    [PX_DTYPE_Q8_K] = {"q8_k", 256, 292, 15},
    [PX_DTYPE_IQ2_XXS] = {"iq2_xxs", 256, 66, 16},
    [PX_DTYPE_IQ2_XS] = {"iq2_xs", 256, 74, 17},
    [PX_DTYPE_IQ3_XXS] = {"iq3_xxs", 256, 98, 18},
    [PX_DTYPE_IQ1_S] = {"iq1_s", 256, 50, 19},
    [PX_DTYPE_IQ4_NL] = {"iq4_nl", 32, 18, 20},
    [PX_DTYPE_IQ3_S] = {"iq3_s", 256, 110, 21},
    [PX_DTYPE_IQ2_S] = {"iq2_s", 256, 82, 22},
    [PX_DTYPE_IQ4_XS] = {"iq4_xs", 256, 136, 23},
    [PX_DTYPE_IQ1_M] = {"iq1_m", 256, 56, 29},
    [PX_DTYPE_TQ1_0] = {"tq1_0", 256, 54, 34},
    [PX_DTYPE_TQ2_0] = {"tq2_0", 256, 66, 35},
};

static bool valid(px_dtype t)
{
    return (unsigned)t < PX_DTYPE_COUNT_;
}

const char *px_dtype_name(px_dtype t)
{
    return valid(t) ? k_dtypes[t].name : "?";
}

px_status px_dtype_parse(const char *name, px_dtype *out, px_err *err)
{
    if (name && !strcasecmp(name, "fp8")) {
        *out = PX_DTYPE_FP8_E4M3;
        return PX_OK;
    }
    for (int i = 0; i < PX_DTYPE_COUNT_; i++) {
        if (name && !strcasecmp(name, k_dtypes[i].name)) {
            *out = (px_dtype)i;
            return PX_OK;
        }
    }
    px_strbuf sb = PX_STRBUF_INIT;
    for (int i = 0; i < PX_DTYPE_COUNT_; i++)
        px_strbuf_addf(&sb, "%s%s", i ? ", " : "", k_dtypes[i].name);
    px_err_set(err, PX_EINVAL, "unknown dtype \"%.40s\"; known: %s", name ? name : "(null)",
               sb.buf);
    px_strbuf_release(&sb);
    return PX_EINVAL;
}

uint32_t px_dtype_block_elems(px_dtype t)
{
    return valid(t) ? k_dtypes[t].block_elems : 0;
}

uint32_t px_dtype_block_bytes(px_dtype t)
{
    return valid(t) ? k_dtypes[t].block_bytes : 0;
}

double px_dtype_bytes_per_elem(px_dtype t)
{
    if (!valid(t))
        return 0.0;
    return (double)k_dtypes[t].block_bytes / (double)k_dtypes[t].block_elems;
}

bool px_dtype_is_quantized(px_dtype t)
{
    return valid(t) && k_dtypes[t].block_elems > 1;
}

bool px_dtype_nbytes(px_dtype t, uint64_t n, uint64_t *out)
{
    if (!valid(t))
        return false;
    uint64_t be = k_dtypes[t].block_elems;
    if (n % be)
        return false;
    return !__builtin_mul_overflow(n / be, (uint64_t)k_dtypes[t].block_bytes, out);
}

int px_dtype_to_ggml(px_dtype t)
{
    return valid(t) ? k_dtypes[t].ggml : -1;
}

bool px_dtype_from_ggml(uint32_t ggml_type, px_dtype *out)
{
    for (int i = 0; i < PX_DTYPE_COUNT_; i++) {
        if (k_dtypes[i].ggml >= 0 && (uint32_t)k_dtypes[i].ggml == ggml_type) {
            *out = (px_dtype)i;
            return true;
        }
    }
    return false;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float px_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        /* Zero or subnormal: the value is man * 2^-24. */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (man << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t px_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) /* inf or nan: keep nan quiet */
        return (uint16_t)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
    if (abs >= 0x477ff000u) /* rounds to or past 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) {
        /* Result is subnormal (or zero): scale so that rounding the float
         * to an integer rounds to nearest even at 2^-24. */
        float v = bits_f32(abs) * 0x1p24f;
        float r = nearbyintf(v);
        return (uint16_t)(sign | (uint32_t)r);
    }
    /* Normal: round the 13 dropped mantissa bits to nearest even. */
    uint32_t mant_odd = (abs >> 13) & 1u;
    abs += 0xfffu + mant_odd;
    return (uint16_t)(sign | ((abs - 0x38000000u) >> 13));
}

float px_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t px_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* quiet nan */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
