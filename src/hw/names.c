/* The format's spellings of the hw enumerations. */
#include "hw/hw_impl.h"

static const char *const dtype_names[PX_HW_DTYPE_COUNT] = {
    "f64", "f32", "tf32", "bf16", "f16", "fp8", "int8", "int4",
};
static const char *const class_names[PX_HW_CLASS_COUNT] = {
    "gpu", "cpu", "npu", "tpu", "fpga",
};
static const char *const mem_names[PX_HW_MEM_COUNT] = {
    "hbm", "gddr", "ddr", "sram", "cxl", "nvme", "remote",
};
static const char *const link_names[PX_HW_LINK_COUNT] = {
    "nvlink3",    "nvlink4", "nvlink5", "infinity-fabric", "pcie3", "pcie4", "pcie5", "ethernet",
    "infiniband", "ici",     "cxl",     "loopback",        "other",
};
static const char *const domain_names[PX_HW_DOMAIN_COUNT] = {
    "power", "cooling", "rack", "zone", "region",
};
static const char *const trust_names[PX_HW_TRUST_COUNT] = {
    "trusted",
    "encrypted",
    "untrusted",
};

static const char *name_of(const char *const *names, size_t n, int v)
{
    return v >= 0 && (size_t)v < n ? names[v] : "unknown";
}

static px_status parse_in(const char *const *names, size_t n, const char *text, int *out)
{
    if (!text)
        return PX_ENOTFOUND;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(names[i], text)) {
            *out = (int)i;
            return PX_OK;
        }
    return PX_ENOTFOUND;
}

#define PX__HW_NAMES(fn, type, table)                                  \
    const char *px_hw_##fn##_name(type v)                              \
    {                                                                  \
        return name_of(table, PX_ARRAY_LEN(table), (int)v);            \
    }                                                                  \
    px_status px_hw_##fn##_parse(const char *text, type *out)          \
    {                                                                  \
        int v;                                                         \
        px_status st = parse_in(table, PX_ARRAY_LEN(table), text, &v); \
        if (st == PX_OK)                                               \
            *out = (type)v;                                            \
        return st;                                                     \
    }

PX__HW_NAMES(dtype, px_hw_dtype, dtype_names)
PX__HW_NAMES(class, px_hw_class, class_names)
PX__HW_NAMES(mem_kind, px_hw_mem_kind, mem_names)
PX__HW_NAMES(link_kind, px_hw_link_kind, link_names)
PX__HW_NAMES(domain_kind, px_hw_domain_kind, domain_names)
PX__HW_NAMES(trust, px_hw_trust, trust_names)

bool px_hw_link_kind_is_nvlink(px_hw_link_kind k)
{
    return k == PX_HW_LINK_NVLINK3 || k == PX_HW_LINK_NVLINK4 || k == PX_HW_LINK_NVLINK5;
}

int px__hw_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}
