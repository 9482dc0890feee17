/* `plexus plan --svg` as a person sees it: the picture is rendered to PNG
 * by librsvg (rsvg-convert) and its layout checked on the pixels.  Each
 * text is rendered alone on a canvas with a wide margin, and its ink must
 * lie inside the box it names (data-in) and inside the canvas: no text
 * overflows its box or is clipped.  The whole picture is rendered once and
 * every device box is found at its place in its stage's colour; every
 * device of the inventory, every replica's stages and the key figures are
 * there. */
#include "px_test.h"

#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MARGIN_PX 200 /* around a lone text: ink past the canvas shows here */

typedef struct rect {
    char id[32], device[128], fill[16];
    double x, y, w, h;
    int stage, replica;
} rect;

typedef struct text {
    const char *start; /* "<text" in the SVG */
    size_t len;        /* through "</text>" */
    char in[32], body[600];
} text;

typedef struct svg {
    char *src;
    double w, h;
    rect *rects;
    size_t n_rects;
    text *texts;
    size_t n_texts;
} svg;

/* The value of attribute name in the element that starts at el (up to its
 * first '>'), or "" (static buffer, copied by the caller). */
static const char *attr(const char *el, const char *name, char *out, size_t n)
{
    const char *end = strchr(el, '>');
    char key[64];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *a = strstr(el, key);
    out[0] = '\0';
    if (!a || (end && a > end))
        return out;
    a += strlen(key);
    const char *q = strchr(a, '"');
    if (!q)
        return out;
    snprintf(out, n, "%.*s", (int)(q - a), a);
    return out;
}

static double attr_num(const char *el, const char *name)
{
    char buf[64];
    attr(el, name, buf, sizeof buf);
    return atof(buf);
}

static void parse_svg(svg *s, char *src)
{
    s->src = src;
    assert_true(!strncmp(src, "<svg", 4));
    s->w = attr_num(src, "width");
    s->h = attr_num(src, "height");
    assert_true(s->w > 0 && s->h > 0);
    size_t cap_r = 0, cap_t = 0;
    for (const char *p = strstr(src, "<rect "); p; p = strstr(p + 1, "<rect ")) {
        if (s->n_rects == cap_r) {
            cap_r = cap_r ? 2 * cap_r : 64;
            s->rects = realloc(s->rects, cap_r * sizeof *s->rects);
            assert_non_null(s->rects);
        }
        rect *r = &s->rects[s->n_rects++];
        memset(r, 0, sizeof *r);
        attr(p, "id", r->id, sizeof r->id);
        attr(p, "data-device", r->device, sizeof r->device);
        attr(p, "fill", r->fill, sizeof r->fill);
        r->x = attr_num(p, "x");
        r->y = attr_num(p, "y");
        r->w = attr_num(p, "width");
        r->h = attr_num(p, "height");
        r->stage = (int)attr_num(p, "data-stage");
        r->replica = (int)attr_num(p, "data-replica");
    }
    for (const char *p = strstr(src, "<text "); p; p = strstr(p + 1, "<text ")) {
        if (s->n_texts == cap_t) {
            cap_t = cap_t ? 2 * cap_t : 64;
            s->texts = realloc(s->texts, cap_t * sizeof *s->texts);
            assert_non_null(s->texts);
        }
        text *t = &s->texts[s->n_texts++];
        const char *end = strstr(p, "</text>");
        assert_non_null(end);
        t->start = p;
        t->len = (size_t)(end - p) + strlen("</text>");
        attr(p, "data-in", t->in, sizeof t->in);
        const char *body = strchr(p, '>') + 1;
        snprintf(t->body, sizeof t->body, "%.*s", (int)(end - body), body);
    }
}

static const rect *find_rect(const svg *s, const char *id)
{
    for (size_t i = 0; i < s->n_rects; i++)
        if (!strcmp(s->rects[i].id, id))
            return &s->rects[i];
    return NULL;
}

static const text *find_text(const svg *s, const char *prefix)
{
    for (size_t i = 0; i < s->n_texts; i++)
        if (!strncmp(s->texts[i].body, prefix, strlen(prefix)))
            return &s->texts[i];
    return NULL;
}

typedef struct image {
    uint8_t *px; /* RGB */
    int w, h;
} image;

static void render(const char *svg_path, const char *png_path, image *im)
{
    char *argv[] = {"rsvg-convert", "-o", (char *)png_path, (char *)svg_path, NULL};
    char *err = NULL;
    int rc = px_test_run(argv, 60, NULL, &err);
    if (rc != 0)
        fail_msg("rsvg-convert %s: exit %d: %s", svg_path, rc, err);
    free(err);
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, png_path))
        fail_msg("%s: %s", png_path, img.message);
    img.format = PNG_FORMAT_RGB;
    im->px = malloc(PNG_IMAGE_SIZE(img));
    assert_non_null(im->px);
    png_color white = {.red = 0xff, .green = 0xff, .blue = 0xff};
    if (!png_image_finish_read(&img, &white, im->px, 0, NULL))
        fail_msg("%s: %s", png_path, img.message);
    im->w = (int)img.width;
    im->h = (int)img.height;
}

static const uint8_t *pixel(const image *im, int x, int y)
{
    assert_true(x >= 0 && y >= 0 && x < im->w && y < im->h);
    return im->px + 3 * ((size_t)y * (size_t)im->w + (size_t)x);
}

/* The texts t[0..n-1] of one box alone, on the canvas grown by MARGIN_PX
 * on every side: their ink (any pixel not near white) must lie inside
 * the box and the canvas.  Returns a message, or NULL. */
static char *ink_outside(const svg *s, const text *const *t, size_t n, const char *dir)
{
    const rect *box = find_rect(s, t[0]->in);
    if (!box)
        return px_asprintf("text \"%s\" names no box (data-in=\"%s\")", t[0]->body, t[0]->in);
    px_strbuf sb = PX_STRBUF_INIT;
    char family[128], size[16];
    attr(s->src, "font-family", family, sizeof family);
    attr(s->src, "font-size", size, sizeof size);
    assert_int_equal(
        px_strbuf_addf(&sb,
                       "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                       "font-family=\"%s\" font-size=\"%s\"><rect width=\"100%%\" "
                       "height=\"100%%\" fill=\"white\"/><g transform=\"translate(%d,%d)\">\n",
                       (int)s->w + 2 * MARGIN_PX, (int)s->h + 2 * MARGIN_PX, family, size,
                       MARGIN_PX, MARGIN_PX),
        PX_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(px_strbuf_addf(&sb, "%.*s\n", (int)t[i]->len, t[i]->start), PX_OK);
    assert_int_equal(px_strbuf_adds(&sb, "</g></svg>\n"), PX_OK);
    char *in = px_asprintf("%s/one.svg", dir), *out = px_asprintf("%s/one.png", dir);
    px_err err;
    px_assert_ok(px_write_file(in, sb.buf, sb.len, &err), &err);
    px_strbuf_release(&sb);
    image im;
    render(in, out, &im);
    free(in);
    free(out);
    int x0 = im.w, y0 = im.h, x1 = -1, y1 = -1;
    for (int y = 0; y < im.h; y++)
        for (int x = 0; x < im.w; x++) {
            const uint8_t *c = pixel(&im, x, y);
            if (c[0] < 235 || c[1] < 235 || c[2] < 235) {
                x0 = x < x0 ? x : x0;
                y0 = y < y0 ? y : y0;
                x1 = x > x1 ? x : x1;
                y1 = y > y1 ? y : y1;
            }
        }
    free(im.px);
    if (x1 < 0)
        return px_asprintf("text \"%s\" draws nothing", t[0]->body);
    double ix0 = x0 - MARGIN_PX, iy0 = y0 - MARGIN_PX, ix1 = x1 + 1 - MARGIN_PX,
           iy1 = y1 + 1 - MARGIN_PX;
    if (ix0 < box->x + 1 || iy0 < box->y + 1 || ix1 > box->x + box->w - 1 ||
        iy1 > box->y + box->h - 1)
        return px_asprintf("text \"%s\"%s spills out of its box %s: ink [%g,%g]-[%g,%g], box "
                           "[%g,%g]-[%g,%g]",
                           t[0]->body, n > 1 ? " or another of its box" : "", box->id, ix0, iy0,
                           ix1, iy1, box->x, box->y, box->x + box->w, box->y + box->h);
    if (ix0 < 0 || iy0 < 0 || ix1 > s->w || iy1 > s->h)
        return px_asprintf("text \"%s\" is clipped by the canvas (%gx%g)", t[0]->body, s->w, s->h);
    return NULL;
}

/* Every text inside its box: the texts of each box rendered together,
 * and one by one where they fail, to name the one that spills. */
static void check_texts_inside(const svg *s, const char *dir)
{
    const text **group = calloc(s->n_texts + 1, sizeof *group);
    bool *done = calloc(s->n_texts + 1, sizeof *done);
    assert_true(group && done);
    for (size_t i = 0; i < s->n_texts; i++) {
        if (done[i])
            continue;
        size_t n = 0;
        for (size_t j = i; j < s->n_texts; j++)
            if (!done[j] && !strcmp(s->texts[j].in, s->texts[i].in)) {
                group[n++] = &s->texts[j];
                done[j] = true;
            }
        char *why = ink_outside(s, group, n, dir);
        for (size_t k = 0; why && n > 1 && k < n; k++) {
            char *one = ink_outside(s, &group[k], 1, dir);
            if (one) {
                free(why);
                why = one;
                break;
            }
        }
        if (why)
            fail_msg("%s", why);
    }
    free(group);
    free(done);
}

static bool have_rsvg(void)
{
    char *argv[] = {"rsvg-convert", "--version", NULL};
    return px_test_run(argv, 30, NULL, NULL) == 0;
}

static void check_layout(const svg *sv, const char *svg_path, const char *png_path);

/* Plans model on the scenario inventory, draws it, and checks the picture;
 * returns the plan document. */
static json_t *check_picture(const char *model, const char *scenario, const char *objective,
                             const char *tag)
{
    char *inv = px_test_source_path(scenario);
    char *plan_path = px_asprintf("%s/%s.json", px_test_tmpdir(), tag);
    char *svg_path = px_asprintf("%s/%s.svg", px_test_tmpdir(), tag);
    char *png_path = px_asprintf("%s/%s.png", px_test_tmpdir(), tag);
    char *argv[] = {(char *)px_test_plexus_bin(),
                    "plan",
                    "--model",
                    (char *)model,
                    "--inventory",
                    inv,
                    "--objective",
                    (char *)objective,
                    "--out",
                    plan_path,
                    "--svg",
                    svg_path,
                    NULL};
    char *err = NULL;
    int rc = px_test_run(argv, 300, NULL, &err);
    if (rc != 0)
        fail_msg("plan: exit %d: %s", rc, err);
    free(err);
    px_err perr;
    char *file;
    size_t len;
    px_assert_ok(px_read_file(plan_path, 1 << 26, &file, &len, &perr), &perr);
    json_t *doc;
    px_assert_ok(px_json_parse(file, len, plan_path, NULL, &doc, &perr), &perr);
    free(file);
    px_assert_ok(px_read_file(svg_path, 1 << 26, &file, &len, &perr), &perr);
    svg s = {0};
    parse_svg(&s, file);

    /* The title whole, and the key figures. */
    char want[128];
    snprintf(want, sizeof want, "plan %.12s: policy ",
             json_string_value(json_object_get(doc, "id")));
    const text *title = find_text(&s, want);
    if (!title)
        fail_msg("no title \"%s...\" in %s", want, svg_path);
    assert_null(strstr(title->body, "..."));
    const char *figures[] = {"time per token: p50 ", "time to first token: p50 ",
                             "throughput: ", "bound by: ", "lower bound: "};
    for (size_t i = 0; i < sizeof figures / sizeof *figures; i++) {
        const text *t = find_text(&s, figures[i]);
        if (!t)
            fail_msg("no \"%s\" in %s", figures[i], svg_path);
        assert_string_equal(t->in, "figures");
    }

    /* Every device of the inventory is drawn; every stage of every replica
     * is on its devices. */
    size_t n_dev = 0, n_unused = 0;
    for (size_t i = 0; i < s.n_rects; i++)
        if (s.rects[i].device[0]) {
            n_dev++;
            n_unused += s.rects[i].stage < 0;
        }
    assert_int_equal(
        n_dev, json_integer_value(json_object_get(json_object_get(doc, "inventory"), "devices")));
    const json_t *rep, *st, *d;
    size_t r, k, j;
    size_t n_used = 0;
    json_array_foreach(json_object_get(doc, "replicas"), r, rep)
        json_array_foreach(json_object_get(rep, "stages"), k, st)
            json_array_foreach(json_object_get(st, "devices"), j, d)
    {
        const rect *box = NULL;
        for (size_t i = 0; i < s.n_rects; i++)
            if (!strcmp(s.rects[i].device, json_string_value(d)))
                box = &s.rects[i];
        if (!box)
            fail_msg("device %s of replica %zu is not drawn", json_string_value(d), r);
        assert_int_equal(box->stage, (int)k);
        assert_int_equal(box->replica, (int)r);
        n_used++;
    }
    assert_int_equal(n_used + n_unused, n_dev);

    check_layout(&s, svg_path, png_path);
    free(s.rects);
    free(s.texts);
    free(file);
    free(inv);
    free(plan_path);
    free(svg_path);
    free(png_path);
    return doc;
}

/* The whole picture: each device box is where the SVG says, in its
 * colour (a point between its border and its first line); every text
 * inside its box and the canvas. */
static void check_layout(const svg *sv, const char *svg_path, const char *png_path)
{
    const svg s = *sv;
    image im;
    render(svg_path, png_path, &im);
    assert_int_equal(im.w, (int)s.w);
    assert_int_equal(im.h, (int)s.h);
    for (size_t i = 0; i < s.n_rects; i++) {
        const rect *b = &s.rects[i];
        if (!b->device[0])
            continue;
        unsigned rgb[3];
        assert_int_equal(sscanf(b->fill, "#%02x%02x%02x", &rgb[0], &rgb[1], &rgb[2]), 3);
        const uint8_t *c = pixel(&im, (int)(b->x + b->w / 2), (int)b->y + 4);
        for (int q = 0; q < 3; q++)
            if (abs((int)c[q] - (int)rgb[q]) > 3)
                fail_msg("device %s: pixel %02x%02x%02x where its box is %s", b->device, c[0], c[1],
                         c[2], b->fill);
    }
    free(im.px);

    check_texts_inside(&s, px_test_tmpdir());
}

static bool rsvg_or_skip(void)
{
    if (have_rsvg())
        return true;
    print_message("rsvg-convert (librsvg2-bin) is missing: scripts/install-deps installs it\n");
    return false;
}

/* Two replicas, one a four-stage pipeline across two nodes. */
static void test_plan_svg_draws_every_replica(void **state)
{
    (void)state;
    if (!rsvg_or_skip())
        skip();
    json_t *doc =
        check_picture("llama-3-8b", "data/scenarios/v100x8-h200.json", "throughput", "replicas");
    assert_int_equal(json_array_size(json_object_get(doc, "replicas")), 2);
    json_decref(doc);
}

/* One stage on one node of four: three nodes and twelve devices unused. */
static void test_plan_svg_draws_the_unused_nodes(void **state)
{
    (void)state;
    if (!rsvg_or_skip())
        skip();
    json_t *doc =
        check_picture("llama-3-8b", "data/scenarios/sixteen-4-types.json", "latency", "unused");
    json_decref(doc);
}

/* The inventory's picture, drawn without Graphviz: every node and device,
 * every text inside its box. */
static void test_inventory_svg_draws_every_device(void **state)
{
    (void)state;
    if (!rsvg_or_skip())
        skip();
    char *inv = px_test_source_path("data/scenarios/sixteen-4-types.json");
    char *svg_path = px_asprintf("%s/inv.svg", px_test_tmpdir());
    char *png_path = px_asprintf("%s/inv.png", px_test_tmpdir());
    char *argv[] = {(char *)px_test_plexus_bin(), "inventory", "svg", inv, NULL};
    char *out = NULL, *err = NULL;
    int rc = px_test_run(argv, 60, &out, &err);
    if (rc != 0)
        fail_msg("inventory svg: exit %d: %s", rc, err);
    px_err perr;
    px_assert_ok(px_write_file(svg_path, out, strlen(out), &perr), &perr);
    svg s = {0};
    parse_svg(&s, out);
    size_t n_dev = 0, n_node = 0;
    for (size_t i = 0; i < s.n_rects; i++) {
        n_dev += s.rects[i].device[0] != '\0';
        n_node += !strncmp(s.rects[i].id, "node", 4);
    }
    assert_int_equal(n_dev, 16);
    assert_int_equal(n_node, 4);
    assert_non_null(find_text(&s, "inventory sixteen-4-types: 16 device(s) on 4 node(s)"));
    check_layout(&s, svg_path, png_path);
    free(s.rects);
    free(s.texts);
    free(out);
    free(err);
    free(inv);
    free(svg_path);
    free(png_path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_svg_draws_every_replica),
        cmocka_unit_test(test_plan_svg_draws_the_unused_nodes),
        cmocka_unit_test(test_inventory_svg_draws_every_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
