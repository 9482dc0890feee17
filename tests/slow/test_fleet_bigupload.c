/*
 * A model of several gigabytes uploaded to a real server on 127.0.0.1 (in
 * this process): it streams through in constant memory, is hashed on the
 * way (the digest is the file's), is kept as a sparse file where the
 * upload was zeros, and comes back byte for byte.  The file is sparse on
 * the client too, so the test needs little disk.  Slow: it moves 5 GiB.
 */
#include "px_test.h"

#include "plexus/fleet.h"

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define USER "user-token-for-the-big-upload-0123"

static long peak_rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6))
            v = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

static void test_five_gib_model_streams_through(void **state)
{
    (void)state;
    const char *dir = px_test_tmpdir();
    struct statvfs v;
    if (statvfs(dir, &v) != 0 || (double)v.f_bavail * (double)v.f_frsize < 2e9) {
        print_message("skipped: less than 2 GB free in %s (the server's reserve and work)\n", dir);
        skip();
    }
    char *path = px_asprintf("%s/model-5g.bin", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    const off_t size = (off_t)5 << 30;
    assert_int_equal(ftruncate(fd, size), 0);
    /* Data here and there, so the digest depends on where it lands. */
    for (off_t at = 0; at < size; at += (off_t)700 << 20) {
        char mark[64];
        int n = snprintf(mark, sizeof mark, "weights at %lld", (long long)at);
        assert_true(pwrite(fd, mark, (size_t)n, at) == n);
    }
    close(fd);
    px_digest want;
    px_assert_ok(px_sha256_file(path, &want, NULL), (px_err *)NULL);
    char hex[65];
    px_digest_hex(&want, hex);
    char *data = px_asprintf("%s/data", dir);
    px_fleet_server_options o = {
        .listen = "127.0.0.1:0", .data_dir = data, .api_token = USER, .disk_reserve = 256u << 20};
    px_fleet_server *srv;
    px_err err;
    px_assert_ok(px_fleet_server_start(&o, &srv, &err), &err);
    px_fleet_client *c;
    px_assert_ok(px_fleet_client_new(px_fleet_server_url(srv), USER, &c, &err), &err);
    px_fleet_client_set_timeout(c, 1200000);
    long before = peak_rss_kib();
    uint64_t t0 = px_now_ns();
    json_t *reply = NULL;
    px_assert_ok(px_fleet_client_send_file(c, "POST", "/v1/blobs", path, NULL, &reply, &err), &err);
    double secs = (double)(px_now_ns() - t0) / 1e9;
    long after = peak_rss_kib();
    assert_string_equal(json_string_value(json_object_get(reply, "digest")), hex);
    assert_int_equal(json_integer_value(json_object_get(reply, "size")), (json_int_t)size);
    json_decref(reply);
    print_message("5 GiB uploaded in %.1f s (%.0f MB/s); peak RSS of client and server %ld -> "
                  "%ld KiB\n",
                  secs, (double)size / secs / 1e6, before, after);
    assert_true(after - before < 128 * 1024);
    /* Stored sparse: the holes of the upload stay holes. */
    char *blob = px_asprintf("%s/blobs/%s", data, hex);
    struct stat sb;
    assert_int_equal(stat(blob, &sb), 0);
    assert_int_equal(sb.st_size, size);
    assert_true((off_t)sb.st_blocks * 512 < ((off_t)64 << 20));
    /* And it comes back whole. */
    char *copy = px_asprintf("%s/copy.bin", dir);
    char url[120];
    snprintf(url, sizeof url, "/v1/blobs/%s", hex);
    px_assert_ok(px_fleet_client_download(c, url, copy, NULL, &err), &err);
    px_digest got;
    px_assert_ok(px_sha256_file(copy, &got, NULL), (px_err *)NULL);
    assert_memory_equal(got.bytes, want.bytes, sizeof want.bytes);
    unlink(copy);
    unlink(path);
    px_fleet_client_free(c);
    px_fleet_server_stop(srv);
    free(copy);
    free(blob);
    free(data);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_five_gib_model_streams_through),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
