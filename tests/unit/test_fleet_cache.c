/* The agent's content-addressed cache: digests, budget, LRU, recovery. */
#include "px_test.h"

#include "base/common.h"
#include "plexus/fleet.h"

#include <sys/stat.h>
#include <unistd.h>

static char *make_file(const char *name, size_t size, char fill)
{
    char *path = px_asprintf("%s/%s", px_test_tmpdir(), name);
    char *data = malloc(size ? size : 1);
    memset(data, fill, size);
    px_err err;
    px_assert_ok(px_write_file(path, data, size, &err), &err);
    free(data);
    return path;
}

static char *fresh_dir(const char *name)
{
    return px_asprintf("%s/%s", px_test_tmpdir(), name);
}

static void test_cache_names_objects_by_sha256(void **state)
{
    (void)state;
    char *dir = fresh_dir("c1");
    px_fleet_cache *c;
    px_err err;
    px_assert_ok(px_fleet_cache_open(dir, 1 << 20, &c, &err), &err);
    char *f = make_file("abc.txt", 0, 0);
    px_assert_ok(px_write_file(f, "abc", 3, &err), &err);
    char digest[65];
    px_assert_ok(px_fleet_cache_put_file(c, f, "abc.txt", NULL, digest, &err), &err);
    assert_string_equal(digest, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    assert_true(px_fleet_cache_contains(c, digest));
    char *path;
    px_assert_ok(px_fleet_cache_acquire(c, digest, &path, &err), &err);
    assert_true(px_str_ends_with(
        path, "/objects/ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    char *text;
    size_t len;
    px_assert_ok(px_read_file(path, 100, &text, &len, &err), &err);
    assert_string_equal(text, "abc");
    free(text);
    free(path);
    px_fleet_cache_release(c, digest);
    /* Adding it again keeps one copy. */
    px_assert_ok(px_fleet_cache_put_file(c, f, "again", NULL, NULL, &err), &err);
    assert_int_equal(px_fleet_cache_used(c), 3);
    json_t *list = px_fleet_cache_list(c);
    assert_int_equal(json_array_size(list), 1);
    json_decref(list);
    px_fleet_cache_free(c);
    free(f);
    free(dir);
}

static void test_cache_refuses_wrong_digest_and_bad_names(void **state)
{
    (void)state;
    char *dir = fresh_dir("c2");
    px_fleet_cache *c;
    px_err err;
    px_assert_ok(px_fleet_cache_open(dir, 1 << 20, &c, &err), &err);
    char *f = make_file("x.bin", 100, 'x');
    const char *wrong = "0000000000000000000000000000000000000000000000000000000000000000";
    assert_int_equal(px_fleet_cache_put_file(c, f, NULL, wrong, NULL, &err), PX_EVALIDATE);
    px_assert_contains(err.msg, "expected");
    assert_int_equal(px_fleet_cache_used(c), 0);
    assert_int_equal(px_fleet_cache_put_file(c, f, NULL, "../../etc", NULL, &err), PX_EINVAL);
    char *p;
    assert_int_equal(px_fleet_cache_acquire(c, "../../etc/passwd", &p, &err), PX_EINVAL);
    assert_int_equal(px_fleet_cache_acquire(c, wrong, &p, &err), PX_ENOTFOUND);
    assert_int_equal(px_fleet_cache_put_file(c, "/nonexistent/file", NULL, NULL, NULL, &err),
                     PX_ENOTFOUND);
    px_fleet_cache_free(c);
    assert_int_equal(px_fleet_cache_open(dir, 0, &c, &err), PX_EINVAL);
    assert_int_equal(px_fleet_cache_open("", 10, &c, &err), PX_EINVAL);
    free(f);
    free(dir);
}

static void test_cache_evicts_least_recently_used_within_budget(void **state)
{
    (void)state;
    char *dir = fresh_dir("c3");
    px_fleet_cache *c;
    px_err err;
    px_assert_ok(px_fleet_cache_open(dir, 3000, &c, &err), &err);
    char *fa = make_file("a", 1000, 'a'), *fb = make_file("b", 1000, 'b'),
         *fc = make_file("c", 1000, 'c'), *fd = make_file("d", 1000, 'd');
    char da[65], db[65], dc[65], dd[65];
    px_assert_ok(px_fleet_cache_put_file(c, fa, "a", NULL, da, &err), &err);
    px_assert_ok(px_fleet_cache_put_file(c, fb, "b", NULL, db, &err), &err);
    px_assert_ok(px_fleet_cache_put_file(c, fc, "c", NULL, dc, &err), &err);
    /* Using a makes b the least recently used. */
    char *path;
    px_assert_ok(px_fleet_cache_acquire(c, da, &path, &err), &err);
    free(path);
    px_fleet_cache_release(c, da);
    px_assert_ok(px_fleet_cache_put_file(c, fd, "d", NULL, dd, &err), &err);
    assert_true(px_fleet_cache_contains(c, da));
    assert_false(px_fleet_cache_contains(c, db));
    assert_true(px_fleet_cache_contains(c, dc));
    assert_true(px_fleet_cache_contains(c, dd));
    assert_int_equal(px_fleet_cache_used(c), 3000);
    char *bpath = px_asprintf("%s/objects/%s", dir, db);
    assert_int_not_equal(access(bpath, F_OK), 0);
    free(bpath);
    /* A held object is never evicted; when nothing can go, adding fails. */
    char *pc, *pd, *pa;
    px_assert_ok(px_fleet_cache_acquire(c, dc, &pc, &err), &err);
    px_assert_ok(px_fleet_cache_acquire(c, dd, &pd, &err), &err);
    px_assert_ok(px_fleet_cache_acquire(c, da, &pa, &err), &err);
    assert_int_equal(px_fleet_cache_put_file(c, fb, "b", NULL, NULL, &err), PX_ELIMIT);
    px_assert_contains(err.msg, "--cache-budget");
    px_fleet_cache_release(c, dc);
    px_assert_ok(px_fleet_cache_put_file(c, fb, "b", NULL, NULL, &err), &err);
    assert_false(px_fleet_cache_contains(c, dc));
    /* Bigger than the whole budget. */
    char *big = make_file("big", 4000, 'z');
    assert_int_equal(px_fleet_cache_put_file(c, big, "big", NULL, NULL, &err), PX_ELIMIT);
    free(pc), free(pd), free(pa);
    px_fleet_cache_free(c);
    free(fa), free(fb), free(fc), free(fd), free(big), free(dir);
}

static void test_cache_recovers_from_damaged_index_and_smaller_budget(void **state)
{
    (void)state;
    char *dir = fresh_dir("c4");
    px_fleet_cache *c;
    px_err err;
    px_assert_ok(px_fleet_cache_open(dir, 10000, &c, &err), &err);
    char *fa = make_file("ra", 1000, '1'), *fb = make_file("rb", 2000, '2');
    char da[65], db[65];
    px_assert_ok(px_fleet_cache_put_file(c, fa, "ra", NULL, da, &err), &err);
    px_assert_ok(px_fleet_cache_put_file(c, fb, "rb", NULL, db, &err), &err);
    px_fleet_cache_free(c);
    /* Reopening keeps both and their order. */
    px_assert_ok(px_fleet_cache_open(dir, 10000, &c, &err), &err);
    assert_int_equal(px_fleet_cache_used(c), 3000);
    px_fleet_cache_free(c);
    /* A damaged index is rebuilt from the objects; stray files go. */
    char *index = px_asprintf("%s/index.json", dir);
    px_assert_ok(px_write_file(index, "{not json", 9, &err), &err);
    char *stray = px_asprintf("%s/objects/.tmp-1-1", dir);
    px_assert_ok(px_write_file(stray, "partial", 7, &err), &err);
    px_assert_ok(px_fleet_cache_open(dir, 10000, &c, &err), &err);
    assert_true(px_fleet_cache_contains(c, da));
    assert_true(px_fleet_cache_contains(c, db));
    assert_int_equal(px_fleet_cache_used(c), 3000);
    px_fleet_cache_free(c);
    /* A smaller budget applies at open. */
    px_assert_ok(px_fleet_cache_open(dir, 2500, &c, &err), &err);
    assert_true(px_fleet_cache_used(c) <= 2500);
    px_fleet_cache_free(c);
    free(index), free(stray), free(fa), free(fb), free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_names_objects_by_sha256),
        cmocka_unit_test(test_cache_refuses_wrong_digest_and_bad_names),
        cmocka_unit_test(test_cache_evicts_least_recently_used_within_budget),
        cmocka_unit_test(test_cache_recovers_from_damaged_index_and_smaller_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
