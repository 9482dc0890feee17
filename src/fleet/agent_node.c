/*
 * What the agent tells the server about its node: the description it
 * registers (from discovery, or from an inventory file for emulated
 * nodes) and the live figures it heartbeats.
 */
#include "base/common.h"

#include "fleet/agent_impl.h"
#include "plexus/hw.h"

#include <unistd.h>

static bool valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return false;
    for (const char *c = s; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '-' || *c == '.'))
            return false;
    return true;
}

static long online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

static bool read_meminfo(px_hw_meminfo *mi)
{
    char *text = NULL;
    size_t len = 0;
    bool ok = px_read_file("/proc/meminfo", 1u << 20, &text, &len, NULL) == PX_OK &&
              px_hw_parse_meminfo(text, len, mi, NULL) == PX_OK;
    free(text);
    return ok;
}

/* Links between two devices of the node, by local device ids, with
 * their kind, per-direction bandwidth, latency when known and whether
 * the declaration goes both ways: what the server's planner needs to
 * place stages on the node's devices. */
static json_t *node_links(const px_hw_view *v, uint32_t node_index)
{
    json_t *links = json_array();
    if (!links)
        return NULL;
    for (size_t i = 0; i < v->n_links; i++) {
        const px_hw_link *l = &v->links[i];
        if (l->reverse || l->from >= v->n_devices || l->to >= v->n_devices)
            continue;
        const px_hw_device *a = &v->devices[l->from], *b = &v->devices[l->to];
        if (a->node != node_index || b->node != node_index)
            continue;
        char bw[64], lat[64];
        px_qty_format(l->bandwidth.value, PX_DIM_BANDWIDTH, bw, sizeof bw);
        json_t *link = json_pack("{s:s, s:s, s:s, s:s, s:b}", "from", a->id, "to", b->id, "kind",
                                 px_hw_link_kind_name(l->kind), "bandwidth", bw, "bidirectional",
                                 l->bidirectional);
        if (link && px_hw_has(l->latency)) {
            px_qty_format(l->latency.value, PX_DIM_TIME, lat, sizeof lat);
            json_object_set_new(link, "latency", json_string(lat));
        }
        json_array_append_new(links, link);
    }
    return links;
}

/* Reads the graph from a document (an inventory or discovery's output),
 * picks the node and fills the registration. */
static px_status describe_from(px__agent *a, const json_t *doc, const char *source,
                               bool force_emulated, px_err *err)
{
    const px_fleet_agent_config *cfg = a->cfg;
    px_hw_graph *g = NULL;
    px_diags diags;
    px_diags_init(&diags);
    px_status st = px_hw_graph_from_value(doc, source, NULL, &g, &diags, err);
    if (st != PX_OK) {
        char *text = px_diags_format(&diags, source);
        if (text && text[0])
            px_log_error("%s", text);
        free(text);
        px_diags_release(&diags);
        return px_err_prefix(err, st, "%s: ", source);
    }
    px_diags_release(&diags);
    const px_hw_view *v = px_hw_graph_view(g);
    uint32_t ni = 0;
    if (cfg->name && px_hw_graph_find_node(g, cfg->name, &ni)) {
        /* the node of that id */
    } else if (v->n_nodes == 1 || !cfg->name) {
        ni = 0;
    } else {
        px_strbuf ids = PX_STRBUF_INIT;
        for (size_t i = 0; i < v->n_nodes; i++)
            px_strbuf_addf(&ids, "%s%s", i ? ", " : "", v->nodes[i].id);
        st = px_err_set(err, PX_EINVAL, "%s: no node \"%s\"; the inventory has %s; give --name",
                        source, cfg->name, ids.buf);
        px_strbuf_release(&ids);
        goto done;
    }
    json_t *exported = NULL;
    if ((st = px_hw_graph_to_json(g, &exported, err)) != PX_OK)
        goto done;
    const px_hw_node *node = &v->nodes[ni];
    json_t *nodes = json_object_get(exported, "nodes");
    json_t *node_json = NULL;
    size_t k;
    json_t *it;
    json_array_foreach(nodes, k, it)
    {
        const char *id = json_string_value(json_object_get(it, "id"));
        if (id && !strcmp(id, node->id))
            node_json = it;
    }
    if (!node_json) {
        json_decref(exported);
        st = px_err_set(err, PX_EINTERNAL, "%s: node \"%s\" missing from the export", source,
                        node->id);
        goto done;
    }
    const char *name = cfg->name ? cfg->name : node->id;
    if (!valid_name(name)) {
        json_decref(exported);
        st = px_err_set(err, PX_EINVAL,
                        "node name \"%s\" must be 1 to 64 of A-Z a-z 0-9 _ . -; give --name", name);
        goto done;
    }
    a->emulated = force_emulated || node->emulated || v->emulated;
    json_object_set_new(node_json, "emulated", json_boolean(a->emulated));
    double memory = 0;
    for (size_t i = 0; i < node->n_memory; i++)
        if (node->memory[i].kind == PX_HW_MEM_DDR)
            memory += node->memory[i].capacity.value;
    px_hw_meminfo mi;
    if (memory <= 0 && read_meminfo(&mi))
        memory = (double)mi.total;
    free(a->node_id);
    free(a->python);
    a->node_id = px_strdup(name);
    a->python = px_strdup(node->python_path ? node->python_path : "python3");
    json_t *reg = json_pack("{s:s, s:s, s:b, s:I, s:I, s:O, s:o}", "name", name, "address",
                            cfg->address ? cfg->address : "127.0.0.1", "emulated", a->emulated,
                            "cpus", (json_int_t)online_cpus(), "memory", (json_int_t)memory, "node",
                            node_json, "links", node_links(v, ni));
    json_decref(exported);
    if (!reg || !a->node_id || !a->python) {
        json_decref(reg);
        st = px_err_set(err, PX_ENOMEM, "out of memory describing the node");
        goto done;
    }
    json_decref(a->registration);
    a->registration = reg;
done:
    px_hw_graph_free(g);
    return st;
}

px_status px__agent_describe(px__agent *a, px_err *err)
{
    const px_fleet_agent_config *cfg = a->cfg;
    if (cfg->name && !valid_name(cfg->name))
        return px_err_set(err, PX_EINVAL,
                          "--name \"%s\": a node name is 1 to 64 of A-Z a-z 0-9 _ . -", cfg->name);
    json_t *doc = NULL;
    px_status st;
    if (cfg->inventory) {
        if ((st = px_json_load_file(cfg->inventory, NULL, &doc, err)) != PX_OK)
            return px_err_prefix(err, st, "--inventory: ");
        st = describe_from(a, doc, cfg->inventory, true, err);
    } else {
        px_hw_discover_options opt = {0};
        /* Discovery's node ids do not allow dots; the name is applied after. */
        px_diags report;
        px_diags_init(&report);
        st = px_hw_discover(&opt, &doc, &report, err);
        px_diags_release(&report);
        if (st != PX_OK)
            return px_err_prefix(err, st, "discovering the node: ");
        /* A discovered node is described under its own id, named as asked. */
        st = describe_from(a, doc, "discovery", false, err);
    }
    json_decref(doc);
    return st;
}

static double load_per_cpu(void)
{
    double l1 = 0;
    FILE *f = fopen("/proc/loadavg", "re");
    if (f) {
        if (fscanf(f, "%lf", &l1) != 1)
            l1 = 0;
        fclose(f);
    }
    return l1 / (double)online_cpus();
}

/* GPU figures from nvidia-smi, by the discovered device ids (gpu<index>). */
static json_t *nvidia_live(void)
{
    static int absent = -1;
    if (absent == 1)
        return NULL;
    const char *argv[] = {"nvidia-smi", "--query-gpu=" PX_HW_NVIDIA_SMI_QUERY,
                          "--format=csv,noheader,nounits", NULL};
    px__proc_spec spec = {.argv = (char *const *)argv};
    char *out = NULL;
    px__proc_exit ex = {0};
    if (px__proc_run_capture(&spec, 3000, 1u << 20, &out, &ex, NULL) != PX_OK || ex.code != 0) {
        free(out);
        absent = 1;
        return NULL;
    }
    absent = 0;
    px_hw_nvidia_gpu gpus[64];
    size_t n = 0;
    json_t *arr = NULL;
    if (px_hw_parse_nvidia_smi(out, strlen(out), gpus, PX_ARRAY_LEN(gpus), &n, NULL, NULL) ==
            PX_OK &&
        (arr = json_array())) {
        for (size_t i = 0; i < n; i++) {
            char id[32];
            snprintf(id, sizeof id, "gpu%d", gpus[i].index);
            json_t *d = json_pack("{s:s}", "id", id);
            if (!isnan(gpus[i].memory_free))
                json_object_set_new(d, "memory_free",
                                    json_integer((json_int_t)gpus[i].memory_free));
            if (!isnan(gpus[i].utilization))
                json_object_set_new(d, "utilization", json_real(gpus[i].utilization));
            json_array_append_new(arr, d);
        }
    }
    free(out);
    return arr;
}

json_t *px__agent_live(px__agent *a)
{
    json_t *live = json_object();
    if (!live)
        return NULL;
    px_hw_meminfo mi;
    if (read_meminfo(&mi))
        json_object_set_new(live, "memory_free", json_integer((json_int_t)mi.available));
    json_object_set_new(live, "load", json_real(load_per_cpu()));
    /* An emulated node's devices are not this machine's GPUs. */
    if (!a->emulated) {
        json_t *gpus = nvidia_live();
        if (gpus)
            json_object_set_new(live, "devices", gpus);
    }
    return live;
}
