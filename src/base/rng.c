/* xoshiro256** seeded with splitmix64: the same stream on every machine. */
#include "base/common.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void px_rng_seed(px_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

px_rng px_rng_derive(uint64_t seed, uint64_t stream)
{
    px_rng r;
    uint64_t x = seed ^ (stream * 0xd1342543de82ef95ULL + 0x2545f4914f6cdd1dULL);
    px_rng_seed(&r, splitmix64(&x));
    return r;
}

uint64_t px_rng_next(px_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double px_rng_uniform(px_rng *r)
{
    return (double)(px_rng_next(r) >> 11) * 0x1.0p-53;
}

uint64_t px_rng_below(px_rng *r, uint64_t n)
{
    PX_ASSERT(n > 0);
    /* Rejection sampling over the largest multiple of n. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
        x = px_rng_next(r);
    } while (x >= limit);
    return x % n;
}

double px_rng_normal(px_rng *r)
{
    double u1;
    do {
        u1 = px_rng_uniform(r);
    } while (u1 <= 0.0);
    double u2 = px_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

double px_rng_exponential(px_rng *r, double rate)
{
    double u;
    do {
        u = px_rng_uniform(r);
    } while (u <= 0.0);
    return -log(u) / rate;
}
