/* SHA-256 content ids through OpenSSL's EVP interface. */
#include "base/common.h"

#include <openssl/evp.h>

struct px_sha256_ctx {
    EVP_MD_CTX *ctx;
};

px_status px_sha256_new(px_sha256_ctx **out, px_err *err)
{
    px_sha256_ctx *h = malloc(sizeof *h);
    if (!h)
        return px_err_set(err, PX_ENOMEM, "out of memory creating a hasher");
    h->ctx = EVP_MD_CTX_new();
    if (!h->ctx || EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(h->ctx);
        free(h);
        return px_err_set(err, PX_EINTERNAL, "OpenSSL could not start SHA-256");
    }
    *out = h;
    return PX_OK;
}

void px_sha256_update(px_sha256_ctx *h, const void *data, size_t len)
{
    EVP_DigestUpdate(h->ctx, data, len);
}

void px_sha256_final(px_sha256_ctx *h, px_digest *out)
{
    unsigned int n = 0;
    EVP_DigestFinal_ex(h->ctx, out->bytes, &n);
    PX_ASSERT(n == 32);
    EVP_MD_CTX_free(h->ctx);
    free(h);
}

void px_sha256(const void *data, size_t len, px_digest *out)
{
    unsigned int n = 0;
    int ok = EVP_Digest(data, len, out->bytes, &n, EVP_sha256(), NULL);
    PX_ASSERT(ok == 1 && n == 32);
}

px_status px_sha256_file(const char *path, px_digest *out, px_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return px_err_set(err, errno == ENOENT ? PX_ENOTFOUND : PX_EIO, "%s: cannot open: %s", path,
                          strerror(errno));
    px_sha256_ctx *h;
    px_status st = px_sha256_new(&h, err);
    if (st != PX_OK) {
        fclose(f);
        return st;
    }
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        px_sha256_update(h, buf, n);
    bool bad = ferror(f);
    fclose(f);
    px_sha256_final(h, out);
    if (bad)
        return px_err_set(err, PX_EIO, "%s: read failed", path);
    return PX_OK;
}

void px_digest_hex(const px_digest *d, char out[65])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hex[d->bytes[i] >> 4];
        out[2 * i + 1] = hex[d->bytes[i] & 15];
    }
    out[64] = '\0';
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

px_status px_digest_parse(const char *hex, px_digest *out)
{
    if (strlen(hex) != 64)
        return PX_EPARSE;
    for (int i = 0; i < 32; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return PX_EPARSE;
        out->bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    return PX_OK;
}

uint64_t px_hash64(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
