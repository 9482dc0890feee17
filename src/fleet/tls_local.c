/* A local certificate authority for `plexus up --tls`: a CA and a server
 * certificate it signs, made with OpenSSL's libcrypto (ECDSA P-256,
 * SHA-256).  Clients pin the CA (--ca, PLEXUS_CA); the server's
 * certificate names the loopback addresses, localhost and the listen
 * address.  Existing files are kept, so a restart keeps the same CA. */
#include "base/common.h"

#include "fleet/secret_impl.h"
#include "plexus/fleet.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

static EVP_PKEY *new_key(void)
{
    return EVP_EC_gen("P-256");
}

static bool add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    bool ok = ext && X509_add_ext(cert, ext, -1) == 1;
    X509_EXTENSION_free(ext);
    return ok;
}

/* A certificate for key, named cn, signed by issuer_key (issuer NULL:
 * self-signed), valid for `days`. */
static X509 *make_cert(EVP_PKEY *key, const char *cn, X509 *issuer, EVP_PKEY *issuer_key, long days,
                       bool ca, const char *san)
{
    X509 *c = X509_new();
    BIGNUM *serial = BN_new();
    bool ok = c && serial && X509_set_version(c, 2) == 1 && BN_rand(serial, 127, 0, 0) == 1 &&
              BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(c)) &&
              X509_gmtime_adj(X509_getm_notBefore(c), -3600) &&
              X509_gmtime_adj(X509_getm_notAfter(c), days * 86400L) && X509_set_pubkey(c, key) == 1;
    X509_NAME *name = ok ? X509_get_subject_name(c) : NULL;
    ok = ok && name &&
         X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"plexus", -1,
                                    -1, 0) == 1 &&
         X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1,
                                    0) == 1;
    ok = ok && X509_set_issuer_name(c, issuer ? X509_get_subject_name(issuer) : name) == 1;
    X509 *iss = issuer ? issuer : c;
    if (ca)
        ok = ok && add_ext(c, iss, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") &&
             add_ext(c, iss, NID_key_usage, "critical,keyCertSign,cRLSign") &&
             add_ext(c, iss, NID_subject_key_identifier, "hash");
    else
        ok = ok && add_ext(c, iss, NID_basic_constraints, "critical,CA:FALSE") &&
             add_ext(c, iss, NID_key_usage, "critical,digitalSignature,keyAgreement") &&
             add_ext(c, iss, NID_ext_key_usage, "serverAuth") &&
             add_ext(c, iss, NID_subject_alt_name, san) &&
             add_ext(c, iss, NID_authority_key_identifier, "keyid:always");
    ok = ok && X509_sign(c, issuer_key ? issuer_key : key, EVP_sha256()) > 0;
    BN_free(serial);
    if (!ok) {
        X509_free(c);
        return NULL;
    }
    return c;
}

static px_status write_pem(const char *path, X509 *cert, EVP_PKEY *key, px_err *err)
{
    BIO *b = BIO_new(BIO_s_mem());
    bool ok = b && (cert ? PEM_write_bio_X509(b, cert)
                         : PEM_write_bio_PrivateKey(b, key, NULL, NULL, 0, NULL, NULL)) == 1;
    char *data = NULL;
    long len = ok ? BIO_get_mem_data(b, &data) : 0;
    px_status st = ok && len > 0 ? px__secret_write_file(path, data, (size_t)len, err)
                                 : px_err_set(err, PX_EIO, "%s: cannot encode the PEM", path);
    if (data && len > 0)
        OPENSSL_cleanse(data, (size_t)len);
    BIO_free(b);
    /* A certificate is public: clients of any user read the CA's. */
    if (st == PX_OK && cert)
        chmod(path, 0644);
    return st;
}

static X509 *read_cert(const char *path)
{
    FILE *f = fopen(path, "re");
    X509 *c = f ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
    if (f)
        fclose(f);
    return c;
}

static EVP_PKEY *read_key(const char *path)
{
    FILE *f = fopen(path, "re");
    EVP_PKEY *k = f ? PEM_read_PrivateKey(f, NULL, NULL, NULL) : NULL;
    if (f)
        fclose(f);
    return k;
}

px_status px_fleet_tls_make_local(const char *dir, const char *host, px_err *err)
{
    px_status st = px__private_dir(dir, err);
    if (st != PX_OK)
        return st;
    char ca_path[PATH_MAX], ca_key_path[PATH_MAX], srv_path[PATH_MAX], srv_key_path[PATH_MAX];
    snprintf(ca_path, sizeof ca_path, "%s/ca.pem", dir);
    snprintf(ca_key_path, sizeof ca_key_path, "%s/ca-key.pem", dir);
    snprintf(srv_path, sizeof srv_path, "%s/server.pem", dir);
    snprintf(srv_key_path, sizeof srv_key_path, "%s/server-key.pem", dir);
    if (access(srv_path, F_OK) == 0 && access(srv_key_path, F_OK) == 0 &&
        access(ca_path, F_OK) == 0)
        return PX_OK;
    EVP_PKEY *ca_key = NULL, *srv_key = NULL;
    X509 *ca = NULL, *srv = NULL;
    if (access(ca_path, F_OK) == 0 && access(ca_key_path, F_OK) == 0) {
        ca = read_cert(ca_path);
        ca_key = read_key(ca_key_path);
        if (!ca || !ca_key) {
            st = px_err_set(err, PX_EIO, "%s: the CA files there cannot be read; remove them", dir);
            goto done;
        }
    } else {
        ca_key = new_key();
        ca = ca_key ? make_cert(ca_key, "plexus local CA", NULL, NULL, 3650, true, NULL) : NULL;
        if (!ca) {
            st = px_err_set(err, PX_EIO, "cannot make the local CA (OpenSSL)");
            goto done;
        }
        if ((st = write_pem(ca_key_path, NULL, ca_key, err)) != PX_OK ||
            (st = write_pem(ca_path, ca, NULL, err)) != PX_OK)
            goto done;
    }
    char san[600];
    bool ip = host && host[0] && strspn(host, "0123456789.") == strlen(host);
    snprintf(san, sizeof san, "IP:127.0.0.1,IP:::1,DNS:localhost%s%s",
             host && host[0] && strcmp(host, "localhost") ? (ip ? ",IP:" : ",DNS:") : "",
             host && host[0] && strcmp(host, "localhost") ? host : "");
    srv_key = new_key();
    srv = srv_key ? make_cert(srv_key, "plexus server", ca, ca_key, 825, false, san) : NULL;
    if (!srv) {
        st = px_err_set(err, PX_EIO, "cannot make the server certificate (OpenSSL)");
        goto done;
    }
    if ((st = write_pem(srv_key_path, NULL, srv_key, err)) == PX_OK)
        st = write_pem(srv_path, srv, NULL, err);
    if (st == PX_OK)
        px_log_info("fleet: made a local CA and a server certificate in %s (clients trust %s)", dir,
                    ca_path);
done:
    X509_free(ca);
    X509_free(srv);
    EVP_PKEY_free(ca_key);
    EVP_PKEY_free(srv_key);
    return st;
}
