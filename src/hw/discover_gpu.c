/* Discovery: NVIDIA GPUs, from nvidia-smi.  Each GPU becomes a device with
 * its memory, power limit, live load and a PCIe link to the host. */
#include "hw/discover_impl.h"

/* Bandwidth of one PCIe lane in one direction, after line encoding
 * (8b/10b for generations 1 and 2, 128b/130b for 3 to 5, FLIT for 6 and
 * 7), in B/s; indexed by generation. */
static const double pcie_lane_bw[] = {0,        250e6,    500e6,  984.6e6,
                                      1969.2e6, 3938.5e6, 7563e6, 15125e6};

/* HBM parts among NVIDIA's data-centre GPUs; the rest carry GDDR. */
static const char *memory_kind(const char *name)
{
    static const char *const hbm[] = {"H100",  "H200", "H800", "H20", "GH200", "B100", "B200",
                                      "GB200", "A100", "A800", "A30", "V100",  "P100"};
    for (size_t i = 0; i < PX_ARRAY_LEN(hbm); i++)
        if (strstr(name, hbm[i]))
            return "hbm";
    return "gddr";
}

/* Whether the built-in catalogue holds an entry; ids it lacks are left
 * out of the document, which must validate. */
static bool catalog_has(const px_hw_catalog *cat, const char *id)
{
    return cat && id && px_hw_catalog_find_device(cat, id);
}

static px_status set_qty(json_t *obj, const char *key, const px__disc *d, double v, px_dim dim,
                         const char *source)
{
    if (isnan(v))
        return PX_OK;
    return px_json_set(obj, key, px__disc_qty(d, v, dim, PX_PROV_DISCOVERED, source, 0));
}

static px_status add_gpu(px__disc *d, const px_hw_nvidia_gpu *g, const px_hw_catalog *cat,
                         const px_hw_mig_instance *mig, size_t n_mig)
{
    char id[32];
    snprintf(id, sizeof id, "gpu%d", g->index);
    json_t *dev = json_pack("{s:s, s:s, s:s, s:s, s:s}", "id", id, "class", "gpu", "vendor",
                            "nvidia", "model", g->name, "backend", "cuda");
    if (!dev || px_json_push(d->devices, dev) != PX_OK)
        return PX_ENOMEM;
    if (catalog_has(cat, g->catalog) && px_json_set(dev, "catalog", json_string(g->catalog)))
        return PX_ENOMEM;
    if (g->capability[0] && px_json_set(dev, "capability", json_string(g->capability)))
        return PX_ENOMEM;
    if (g->driver[0] && px_json_set(dev, "driver", json_string(g->driver)))
        return PX_ENOMEM;
    if (!isnan(g->memory_total)) {
        /* The tier takes the catalogue entry's id, so that it overrides
         * that tier rather than adding a second one. */
        const char *kind = memory_kind(g->name);
        const char *tier_id = strcmp(kind, "hbm") ? "vram" : "hbm";
        const px_hw_device *entry =
            catalog_has(cat, g->catalog) ? px_hw_catalog_find_device(cat, g->catalog) : NULL;
        if (entry && entry->n_memory) {
            tier_id = entry->memory[0].id;
            kind = px_hw_mem_kind_name(entry->memory[0].kind);
        }
        json_t *tier = json_pack("{s:s, s:s}", "id", tier_id, "kind", kind);
        json_t *mem = json_array();
        if (px_json_set(dev, "memory", mem) != PX_OK || px_json_push(mem, tier) != PX_OK ||
            set_qty(tier, "capacity", d, g->memory_total, PX_DIM_BYTES,
                    "nvidia-smi memory.total") != PX_OK)
            return PX_ENOMEM;
    }
    if (!isnan(g->power_limit)) {
        json_t *power = json_object();
        if (px_json_set(dev, "power", power) != PX_OK ||
            set_qty(power, "tdp", d, g->power_limit, PX_DIM_POWER,
                    "nvidia-smi power.limit (the enforced power limit)") != PX_OK)
            return PX_ENOMEM;
    }
    json_t *live = json_object();
    if (px_json_set(dev, "live", live) != PX_OK ||
        set_qty(live, "memory_free", d, g->memory_free, PX_DIM_BYTES, "nvidia-smi memory.free") ||
        set_qty(live, "temperature", d, g->temperature, PX_DIM_TEMPERATURE,
                "nvidia-smi temperature.gpu") ||
        (!isnan(g->utilization) &&
         px_json_set(live, "utilization", json_real(g->utilization)) != PX_OK))
        return PX_ENOMEM;

    /* What the format has no member for goes under x-nvidia. */
    json_t *x = json_pack("{s:i}", "index", (json_int_t)g->index);
    if (px_json_set(dev, "x-nvidia", x) != PX_OK ||
        (g->uuid[0] && px_json_set(x, "uuid", json_string(g->uuid)) != PX_OK) ||
        set_qty(x, "memory_used", d, g->memory_used, PX_DIM_BYTES, "nvidia-smi memory.used") ||
        set_qty(x, "power_draw", d, g->power_draw, PX_DIM_POWER, "nvidia-smi power.draw") ||
        set_qty(x, "clock_max_sm", d, g->clock_max_sm, PX_DIM_FREQUENCY,
                "nvidia-smi clocks.max.sm"))
        return PX_ENOMEM;
    if (g->catalog && !catalog_has(cat, g->catalog) &&
        px_json_set(x, "catalog_candidate", json_string(g->catalog)) != PX_OK)
        return PX_ENOMEM;
    if (g->pcie_gen && g->pcie_width &&
        px_json_set(x, "pcie",
                    json_pack("{s:i, s:i}", "gen", (json_int_t)g->pcie_gen, "width",
                              (json_int_t)g->pcie_width)) != PX_OK)
        return PX_ENOMEM;
    json_t *jm = NULL;
    for (size_t i = 0; i < n_mig; i++) {
        if (mig[i].gpu_index != g->index)
            continue;
        if (!jm && px_json_set(x, "mig", jm = json_array()) != PX_OK)
            return PX_ENOMEM;
        if (px_json_push(jm, json_pack("{s:s, s:i, s:s}", "profile", mig[i].profile, "device",
                                       (json_int_t)mig[i].device, "uuid", mig[i].uuid)) != PX_OK)
            return PX_ENOMEM;
    }

    if (!g->pcie_gen || !g->pcie_width)
        return PX_OK;
    char link_id[160], from[160], kind[16], src[200];
    snprintf(link_id, sizeof link_id, "%s-%s-pcie", d->node_id, id);
    snprintf(from, sizeof from, "%s.%s", d->node_id, id);
    if (g->pcie_gen >= 3 && g->pcie_gen <= 5)
        snprintf(kind, sizeof kind, "pcie%d", g->pcie_gen);
    else
        px_strlcpy(kind, "other", sizeof kind);
    double bw = pcie_lane_bw[g->pcie_gen] * g->pcie_width;
    snprintf(src, sizeof src,
             "nvidia-smi pcie.link.gen.max=%d, pcie.link.width.max=%d: %.4g GB/s per lane "
             "per direction x %d lanes, after encoding",
             g->pcie_gen, g->pcie_width, pcie_lane_bw[g->pcie_gen] * 1e-9, g->pcie_width);
    json_t *link = json_pack("{s:s, s:s, s:s, s:b, s:s}", "id", link_id, "from", from, "to",
                             d->node_id, "bidirectional", 1, "kind", kind);
    if (!link || px_json_push(d->links, link) != PX_OK ||
        px_json_set(link, "bandwidth",
                    px__disc_qty(d, bw, PX_DIM_BANDWIDTH, PX_PROV_DISCOVERED, src, 0)) != PX_OK)
        return PX_ENOMEM;
    return PX_OK;
}

/* Runs nvidia-smi -L for the MIG instances.  Problems are warnings only:
 * the GPUs are known already. */
static px_status list_mig(px__disc *d, const char *smi, px_hw_mig_instance *mig, size_t *n_mig)
{
    *n_mig = 0;
    char *argv[] = {(char *)smi, "-L", NULL};
    px__cmd_result res;
    px_err err;
    px_status st = px__disc_run(argv, d->timeout, PX__DISC_MAX_OUTPUT, &res, &err);
    if (st == PX_ENOMEM) {
        px__cmd_result_release(&res);
        return st;
    }
    if (st != PX_OK || res.exit_code != 0) {
        char how[256];
        px__cmd_describe(&res, how, sizeof how);
        px__cmd_result_release(&res);
        return px__disc_warn(d, "gpu", NULL, "nvidia-smi -L: %s; MIG instances unknown",
                             st != PX_OK ? err.msg : how);
    }
    px_diags w;
    px_diags_init(&w);
    px_err perr;
    st = px_hw_parse_nvidia_smi_list(res.out, res.len, mig, PX__DISC_MAX_MIG, n_mig, &w, &perr);
    px__cmd_result_release(&res);
    if (st != PX_OK) {
        px_diags_release(&w);
        *n_mig = 0;
        return px__disc_warn(d, "gpu", NULL, "nvidia-smi -L: %s; MIG instances unknown", perr.msg);
    }
    for (size_t i = 0; i < w.n && st == PX_OK; i++)
        st = px__disc_warn(d, "gpu", w.items[i].fix, "%s", w.items[i].message);
    px_diags_release(&w);
    return st;
}

px_status px__disc_probe_gpu(px__disc *d)
{
    uint64_t t0 = px_now_ns();
    d->nvidia_driver = px__disc_exists(d, "/proc/driver/nvidia/version");
    const char *want = d->opt->nvidia_smi;
    if (want && !want[0])
        return px__disc_record(d, "gpu", PX__PROBE_SKIPPED, NULL, t0, NULL,
                               "nvidia-smi not requested");
    char *smi = NULL;
    px_status st = px__disc_find_program(want ? want : "nvidia-smi", &smi);
    if (st == PX_ENOMEM)
        return st;
    if (st != PX_OK) {
        static const char fix[] = "install the NVIDIA driver or pass --nvidia-smi PATH; on a "
                                  "machine without NVIDIA GPUs this is expected";
        if (want)
            return px__disc_record(d, "gpu", PX__PROBE_FAILED, want, t0, fix,
                                   "nvidia-smi: %s is not an executable file", want);
        return px__disc_record(d, "gpu", PX__PROBE_FAILED, "nvidia-smi", t0, fix,
                               "nvidia-smi: not found on PATH");
    }

    char *argv[] = {smi, "--query-gpu=" PX_HW_NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits",
                    NULL};
    px__cmd_result res;
    px_err err;
    px_hw_nvidia_gpu *gpus = NULL;
    px_hw_mig_instance *mig = NULL;
    px_hw_catalog *cat = NULL;
    px_diags w;
    px_diags_init(&w);
    st = px__disc_run(argv, d->timeout, PX__DISC_MAX_OUTPUT, &res, &err);
    if (st == PX_ENOMEM)
        goto done;
    if (st != PX_OK) {
        st = px__disc_record(d, "gpu", PX__PROBE_FAILED, smi, t0,
                             "check that the NVIDIA driver responds (nvidia-smi -q)",
                             "nvidia-smi: %s", err.msg);
        goto done;
    }
    bool none = res.out && strstr(res.out, "No devices were found");
    if (res.exit_code != 0 && !none) {
        /* nvidia-smi prints its own failures on stdout. */
        char how[256];
        if (!res.err_text[0] && res.len) {
            free(res.err_text);
            res.err_text = px_strndup(res.out, PX_MIN(res.len, (size_t)PX__DISC_MAX_STDERR));
        }
        px__cmd_describe(&res, how, sizeof how);
        st = px__disc_record(d, "gpu", PX__PROBE_FAILED, smi, t0,
                             "check that the NVIDIA driver is loaded (nvidia-smi -q)",
                             "nvidia-smi %s", how);
        goto done;
    }
    d->nvidia_driver = true;
    gpus = calloc(PX__DISC_MAX_GPUS, sizeof *gpus);
    mig = calloc(PX__DISC_MAX_MIG, sizeof *mig);
    if (!gpus || !mig) {
        st = PX_ENOMEM;
        goto done;
    }
    size_t n = 0, n_mig = 0;
    st = px_hw_parse_nvidia_smi(res.out, res.len, gpus, PX__DISC_MAX_GPUS, &n, &w, &err);
    if (st != PX_OK) {
        st = px__disc_record(d, "gpu", PX__PROBE_FAILED, smi, t0, NULL, "%s", err.msg);
        goto done;
    }
    for (size_t i = 0; i < w.n && st == PX_OK; i++)
        st = px__disc_warn(d, "gpu", w.items[i].fix, "nvidia-smi output: %s", w.items[i].message);
    if (st == PX_OK && n)
        st = list_mig(d, smi, mig, &n_mig);
    if (st != PX_OK)
        goto done;
    if (n && px_hw_catalog_new_builtin(&cat, NULL) != PX_OK)
        cat = NULL; /* without it no catalogue ids are written */
    for (size_t i = 0; i < n && st == PX_OK; i++)
        st = add_gpu(d, &gpus[i], cat, mig, n_mig);
    if (st != PX_OK)
        goto done;
    char summary[256] = "";
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t same = 1;
        while (i + 1 < n && !strcmp(gpus[i + 1].name, gpus[i].name))
            i++, same++;
        int w_ = snprintf(summary + k, sizeof summary - k, "%s%s x%zu", k ? ", " : "", gpus[i].name,
                          same);
        if (w_ < 0 || (size_t)w_ >= sizeof summary - k)
            break;
        k += (size_t)w_;
    }
    st = px__disc_record(d, "gpu", w.n ? PX__PROBE_PARTIAL : PX__PROBE_OK, smi, t0, NULL,
                         "%zu GPUs%s%s%s", n, n ? " (" : "", summary, n ? ")" : "");

done:
    px_hw_catalog_free(cat);
    px_diags_release(&w);
    free(gpus);
    free(mig);
    px__cmd_result_release(&res);
    free(smi);
    return st;
}
