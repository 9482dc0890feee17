/* The scenario packs under data/scenarios/: the good ones validate clean,
 * the lying and malicious ones are refused with the expected reason, and
 * every pack in the folder has an expectation here. */
#include "px_test.h"

#include <dirent.h>
#include <math.h>
#include <string.h>

#include "plexus/hw.h"

static const char *const good[] = {
    "homogeneous-8xh100.json",
    "hetero-pair-h100-l4.json",
    "irregular-4dev.json",
    "faulted-cluster.json",
    "adversarial-fast-behind-slow-link.json",
    "emu-small.json",
    "a100-l4-100gbe.json",
    "h100x2-l4x8.json",
    "home-lab-2x4090.json",
    "m2ultra-2x4090-10gbe.json",
    "sixteen-4-types.json",
    "v100x8-h200.json",
    "h200-local.json",
    "mi300x2-h100x2-100gbe.json",
    "3090x4-pcie3-l4x2-10gbe.json",
    "gaudi3-h200-epyc-400gbe.json",
};

typedef struct refusal {
    const char *file;    /* under data/scenarios/ */
    const char *pointer; /* of the expected error */
    const char *message; /* a part of it */
} refusal;

static const refusal refused[] = {
    {"lying-topology.json", "/links/0/kind", "the topology report lies"},
    {"malicious/nan-and-negative-via-strings.json", "/nodes/0/devices/0/compute/bf16",
     "\"NaN TFLOP/s\" does not start with a number"},
    {"malicious/nan-and-negative-via-strings.json", "/nodes/0/devices/0/memory/0/capacity",
     "\"capacity\" is negative"},
    {"malicious/hbm-5pb.json", "/nodes/0/devices/0/memory/0/capacity",
     "hbm capacity of 5 PB is implausible"},
    {"malicious/duplicate-ids.json", "/nodes/0/devices/1/id", "duplicate device id \"n1.gpu0\""},
    {"malicious/self-link.json", "/links/0/to", "link from \"n1.gpu0\" to itself"},
    {"malicious/link-to-undefined-device.json", "/links/0/to", "device \"n1.gpu9\" is not defined"},
    {"malicious/deeply-nested.json", "", "nesting deeper than 32 levels"},
    {"malicious/huge-string.json", "/description", "longer than the limit of 4096"},
    {"malicious/unknown-unit.json", "/nodes/0/devices/0/memory/0/bandwidth",
     "unknown unit \"furlongs/s\""},
    {"malicious/faster-than-catalog.json", "/nodes/0/devices/0/compute/bf16",
     "above the 1.009188 PFLOP/s that catalogue entry \"nvidia-h100-sxm5\" allows"},
};

static char *pack_path(const char *file)
{
    char *rel = px_asprintf("data/scenarios/%s", file);
    char *path = px_test_source_path(rel);
    free(rel);
    return path;
}

static px_hw_graph *load_clean(const char *file)
{
    char *path = pack_path(file);
    px_diags diags;
    px_diags_init(&diags);
    px_hw_graph *g = NULL;
    px_err err;
    px_hw_read_options opt = {.strict = true};
    if (px_hw_graph_load(path, &opt, &g, &diags, &err) != PX_OK || diags.n) {
        char *report = px_diags_format(&diags, file);
        fail_msg("%s does not validate clean: %s\n%s", file, err.msg, report ? report : "");
    }
    px_diags_release(&diags);
    free(path);
    return g;
}

static void test_scenarios_good_packs_validate_clean(void **state)
{
    (void)state;
    for (size_t i = 0; i < PX_ARRAY_LEN(good); i++) {
        px_hw_graph *g = load_clean(good[i]);
        px_err err;
        px_assert_ok(px_hw_graph_validate(g, NULL, NULL, &err), &err);
        const px_hw_view *v = px_hw_graph_view(g);
        assert_true(v->n_devices > 0);
        assert_non_null(v->name);
        assert_non_null(v->description);
        px_hw_graph_free(g);
    }
}

static void test_scenarios_bad_packs_are_refused_with_their_reason(void **state)
{
    (void)state;
    for (size_t i = 0; i < PX_ARRAY_LEN(refused); i++) {
        char *path = pack_path(refused[i].file);
        px_diags diags;
        px_diags_init(&diags);
        px_hw_graph *g = NULL;
        px_err err;
        px_status st = px_hw_graph_load(path, NULL, &g, &diags, &err);
        if (st == PX_OK)
            fail_msg("%s was accepted", refused[i].file);
        assert_null(g);
        bool found = false;
        for (size_t k = 0; k < diags.n && !found; k++)
            found = diags.items[k].severity == PX_SEV_ERROR &&
                    !strcmp(diags.items[k].pointer, refused[i].pointer) &&
                    strstr(diags.items[k].message, refused[i].message) && diags.items[k].fix;
        if (!found) {
            char *report = px_diags_format(&diags, refused[i].file);
            fail_msg("%s: no error at \"%s\" saying \"%s\"; got:\n%s", refused[i].file,
                     refused[i].pointer, refused[i].message, report ? report : "");
        }
        px_diags_release(&diags);
        free(path);
    }
}

static bool listed(const char *file)
{
    for (size_t i = 0; i < PX_ARRAY_LEN(good); i++)
        if (!strcmp(good[i], file))
            return true;
    for (size_t i = 0; i < PX_ARRAY_LEN(refused); i++)
        if (!strcmp(refused[i].file, file))
            return true;
    return false;
}

/* A pack added to the folder without an expectation here fails, so that
 * every pack stays checked. */
static void test_scenarios_every_pack_has_an_expectation(void **state)
{
    (void)state;
    static const char *const dirs[] = {"", "malicious/"};
    size_t seen = 0;
    for (size_t d = 0; d < PX_ARRAY_LEN(dirs); d++) {
        char *path = pack_path(dirs[d]);
        DIR *dir = opendir(path);
        assert_non_null(dir);
        struct dirent *e;
        while ((e = readdir(dir))) {
            if (!px_str_ends_with(e->d_name, ".json"))
                continue;
            char *file = px_asprintf("%s%s", dirs[d], e->d_name);
            if (!listed(file))
                fail_msg("data/scenarios/%s has no expectation in this test", file);
            free(file);
            seen++;
        }
        closedir(dir);
        free(path);
    }
    assert_int_equal(seen, PX_ARRAY_LEN(good) + PX_ARRAY_LEN(refused) - 1);
}

static void test_scenarios_packs_describe_what_they_say(void **state)
{
    (void)state;
    px_hw_graph *g = load_clean("homogeneous-8xh100.json");
    const px_hw_view *v = px_hw_graph_view(g);
    assert_int_equal(v->n_nodes, 1);
    assert_int_equal(v->n_devices, 8);
    size_t nvlink = 0;
    for (size_t i = 0; i < v->n_links; i++)
        nvlink += v->links[i].kind == PX_HW_LINK_NVLINK4;
    assert_int_equal(nvlink, 8 * 7);
    for (size_t i = 0; i < v->n_devices; i++)
        assert_string_equal(v->devices[i].catalog, "nvidia-h100-sxm5");
    px_hw_graph_free(g);

    g = load_clean("irregular-4dev.json");
    v = px_hw_graph_view(g);
    assert_int_equal(v->n_devices, 4);
    double lanes[3] = {0};
    for (size_t i = 0; i < v->n_links; i++)
        if (!v->links[i].reverse) {
            const char *id = v->links[i].id;
            size_t k = !strcmp(id, "ws1-x16") ? 0 : !strcmp(id, "ws1-x8") ? 1 : 2;
            lanes[k] = v->links[i].bandwidth.value;
        }
    assert_true(lanes[0] > lanes[1] && lanes[1] > lanes[2]);
    px_hw_graph_free(g);

    g = load_clean("faulted-cluster.json");
    v = px_hw_graph_view(g);
    assert_int_equal(v->n_nodes, 4);
    uint32_t rack_a, zone;
    assert_true(px_hw_graph_find_domain(g, "rack-a", &rack_a));
    assert_true(px_hw_graph_find_domain(g, "zone-1", &zone));
    assert_int_equal(v->domains[rack_a].parent, zone);
    size_t power = 0, racks = 0;
    for (size_t i = 0; i < v->n_domains; i++) {
        power += v->domains[i].kind == PX_HW_DOMAIN_POWER;
        racks += v->domains[i].kind == PX_HW_DOMAIN_RACK;
    }
    assert_int_equal(racks, 2);
    assert_true(power >= 2);
    /* Devices inherit their node's domains. */
    uint32_t dev;
    assert_true(px_hw_graph_find_device(g, "n3.gpu1", &dev));
    assert_int_equal(v->devices[dev].n_domains, 3);
    px_hw_graph_free(g);

    g = load_clean("emu-small.json");
    v = px_hw_graph_view(g);
    size_t emulated = 0;
    for (size_t i = 0; i < v->n_devices; i++) {
        const px_hw_device *d = &v->devices[i];
        if (!d->emulated) {
            assert_int_equal(d->cls, PX_HW_CLASS_CPU);
            continue;
        }
        emulated++;
        assert_string_equal(d->backend, "emu");
        double mem = px_hw_device_memory_capacity(d);
        assert_true(mem == 512.0 * 1048576 || mem == 256.0 * 1048576);
    }
    assert_int_equal(emulated, 2);
    for (size_t i = 0; i < v->n_links; i++)
        assert_int_equal(v->links[i].kind, PX_HW_LINK_LOOPBACK);
    px_hw_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scenarios_good_packs_validate_clean),
        cmocka_unit_test(test_scenarios_bad_packs_are_refused_with_their_reason),
        cmocka_unit_test(test_scenarios_every_pack_has_an_expectation),
        cmocka_unit_test(test_scenarios_packs_describe_what_they_say),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
