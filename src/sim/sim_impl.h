/*
 * Private declarations of the simulator: the event queue, processor-
 * sharing link domains and the thermal model, shared by the engine and
 * the tests.
 */
#ifndef PX_SIM_IMPL_H
#define PX_SIM_IMPL_H

#include "base/common.h"
#include "plexus/sim.h"

/* ---- the event queue ---- */

typedef struct px__sim_event {
    double t;
    uint64_t seq; /* insertion order: breaks ties so equal times pop FIFO */
    uint32_t type;
    uint32_t a;
    uint32_t b;
} px__sim_event;

/* A binary min-heap on (t, seq).  The array is sized up front; push grows
 * it only when full (geometric, so amortized and rare), never per event. */
typedef struct px__sim_queue {
    px__sim_event *heap;
    size_t n, cap;
    uint64_t next_seq;
} px__sim_queue;

px_status px__sim_queue_init(px__sim_queue *q, size_t cap);
void px__sim_queue_release(px__sim_queue *q);
px_status px__sim_queue_push(px__sim_queue *q, double t, uint32_t type, uint32_t a, uint32_t b);
/* Pops the earliest event; false when empty. */
bool px__sim_queue_pop(px__sim_queue *q, px__sim_event *out);

/* ---- processor sharing ---- */

/* One contention domain: every flow in it gets bandwidth / n_flows. */
typedef struct px__sim_ps {
    double bandwidth;  /* B/s, already scaled by any degradation factor */
    double t_last;     /* time remaining[] was last brought up to date */
    uint32_t *flow;    /* flow ids (cap entries) */
    double *remaining; /* bytes left per flow */
    uint32_t n, cap;
    uint32_t version; /* bumped on every change: stale completions are ignored */
} px__sim_ps;

px_status px__sim_ps_init(px__sim_ps *d, double bandwidth, uint32_t cap);
void px__sim_ps_release(px__sim_ps *d);
/* Brings the flows' remaining bytes up to time t. */
void px__sim_ps_advance(px__sim_ps *d, double t);
/* Adds a flow at time t (advance first).  PX_ELIMIT when full. */
px_status px__sim_ps_add(px__sim_ps *d, double t, uint32_t flow, double bytes);
/* Removes the flow with this id, if present (advance first). */
void px__sim_ps_remove(px__sim_ps *d, uint32_t flow);
/* Time of the next completion after the domain's t_last, and which flow;
 * false when no flow is in flight or the bandwidth is zero. */
bool px__sim_ps_next(const px__sim_ps *d, double *t, uint32_t *flow);
/* Changes the bandwidth at time t (degradation on or off). */
void px__sim_ps_set_bandwidth(px__sim_ps *d, double t, double bandwidth);

/* ---- thermal ---- */

typedef struct px__sim_thermal {
    double temp_k;
    double t_last;
    double power_w; /* the power drawn since t_last */
    double max_k;
    bool throttled;
} px__sim_thermal;

/* Advances the temperature to time t under constant power p over
 * [t_last, t]: T(t) = T_ss + (T0 - T_ss) exp(-dt / tau) with
 * T_ss = ambient + p * r, the exact solution of
 * dT/dt = (p * r - (T - ambient)) / tau. */
void px__sim_thermal_advance(px__sim_thermal *th, double t, double ambient_k, double r_k_per_w,
                             double tau_s);
/* The thermal resistance used for d: its own, or the one that puts the
 * steady state at full power 10 K under the limit at 25 C ambient. */
double px__sim_thermal_r(const px_sim_device *d);

/* ---- one replication ---- */

/* Runs one replication with the given seed into *m and devs (plan->
 * n_devices entries).  Internal to px_sim_run; tests call it directly. */
px_status px__sim_run_one(const px_sim_plan *plan, const px_sim_load *load,
                          const px_sim_faults *faults, const px_sim_options *opt, uint64_t seed,
                          px_sim_metrics *m, px_sim_device_stats *devs, px_err *err);
/* The same, telling version 2 hooks which replication this is. */
px_status px__sim_run_one_at(const px_sim_plan *plan, const px_sim_load *load,
                             const px_sim_faults *faults, const px_sim_options *opt,
                             uint32_t replication, uint64_t seed, px_sim_metrics *m,
                             px_sim_device_stats *devs, px_err *err);

/* Random streams, one per purpose, so that a new draw in one does not
 * shift the others. */
enum {
    PX__SIM_STREAM_ARRIVALS = 1,
    PX__SIM_STREAM_LENGTHS = 2,
    PX__SIM_STREAM_SERVICE = 3,
    PX__SIM_STREAM_FAILURES = 4,
    PX__SIM_STREAM_JITTER = 5, /* reserved for latency jitter */
    PX__SIM_STREAM_REPLICATION = 0x5eed0000u,
};

/* Draws a length from its distribution (at least 1). */
uint32_t px__sim_len_draw(const px_sim_len *len, px_rng *r);
/* Finds a device by id; PX_SIM_NONE when absent. */
uint32_t px__sim_find_device(const px_sim_plan *plan, const char *id);
uint32_t px__sim_find_domain(const px_sim_plan *plan, const char *id);

/* ---- engine state ---- */

enum px__sim_event_type {
    PX__SIM_EV_ARRIVAL = 0,
    PX__SIM_EV_STAGE_DONE,  /* a group, b generation */
    PX__SIM_EV_XFER_START,  /* a group, b generation: the hop's latency is over */
    PX__SIM_EV_PS_DONE,     /* a ps domain, b version */
    PX__SIM_EV_FAIL_DEVICE, /* a device */
    PX__SIM_EV_FAIL_DOMAIN, /* a domain */
    PX__SIM_EV_FAULT_START, /* a fault */
    PX__SIM_EV_FAULT_END,   /* a fault */
    PX__SIM_EV_LINK_TOGGLE, /* a fault, b 1 on / 0 off */
    PX__SIM_EV_SWITCH,      /* a plan (0 primary, k fallback k-1, then installed ones) */
    PX__SIM_EV_END,
    PX__SIM_EV_TICK, /* observation for version 2 hooks */
};

typedef struct px__sim_req {
    double t_arrival, t_first;
    uint32_t prompt, gen, done;
    uint32_t next_free;
} px__sim_req;

typedef struct px__sim_group {
    uint32_t plan, replica; /* replica: global replica index */
    uint32_t *members;
    uint32_t n, cap;
    uint32_t stage;
    uint32_t gen;
    bool idle;     /* waiting at the first stage for requests */
    bool in_stack; /* listed on the idle stack (maybe stale) */
    uint32_t n_decode, prefill_tokens;
    double sum_ctx, t_start;
    /* Observation (version 2 hooks only): the step's and the hop's
     * predicted times, and when the hop began. */
    double pred_s, t_xfer, xfer_pred_s;
} px__sim_group;

/* Per stage, the steps and transfers of the current tick (the last
 * PX__SIM_OBS_RING of each). */
#define PX__SIM_OBS_RING 32

typedef struct px__sim_stage_rt {
    uint32_t busy;     /* group computing, or PX_SIM_NONE */
    uint32_t *waiting; /* ring of groups */
    uint32_t head, n, cap;
    /* Observation (version 2 hooks only). */
    double step_s[PX__SIM_OBS_RING], step_ratio[PX__SIM_OBS_RING];
    double xfer_s[PX__SIM_OBS_RING], xfer_ratio[PX__SIM_OBS_RING];
    uint32_t n_steps, n_xfers;
    double last_step_t;
} px__sim_stage_rt;

typedef struct px__sim_replica_rt {
    uint32_t plan;
    const px_sim_replica *spec;
    uint32_t first_group, n_groups;
    px__sim_stage_rt *stages;
    uint32_t ps_base; /* the plan's first ps domain */
    bool alive;
} px__sim_replica_rt;

typedef struct px__sim_device_rt {
    px__sim_thermal th;
    double ambient_k, cap_w, r_th;
    double energy_j, busy_s, throttled_s, lost_at;
    uint32_t busy;
    bool dead, allocated;
} px__sim_device_rt;

typedef struct px__sim_ps_rt {
    px__sim_ps ps;
    double base_bw, factor, latency_add;
} px__sim_ps_rt;

struct px_sim {
    const px_sim_options *opt;
    const px_sim_plan *plans[1 + 64];
    uint32_t n_plans, active;
    const px_sim_load *load;
    const px_sim_faults *faults;
    double now, end;
    px__sim_queue q;
    px_rng rng_arrivals, rng_lengths, rng_service, rng_failures;
    /* arrivals */
    size_t next_trace;
    bool burst_on;
    double burst_phase_end;
    /* requests */
    px__sim_req *reqs;
    uint32_t n_reqs, free_head;
    uint32_t *fifo; /* ring of waiting requests */
    uint32_t fifo_head, fifo_n, fifo_cap;
    /* replicas and groups */
    px__sim_replica_rt *replicas;
    uint32_t n_replicas;
    px__sim_group *groups;
    uint32_t n_groups;
    uint32_t *idle_stack;
    uint32_t n_idle;
    px__sim_ps_rt *ps;
    uint32_t n_ps;
    px__sim_device_rt *dev;
    uint32_t *scratch; /* n_devices: the members of a lost domain */
    uint32_t pace;
    bool in_hook;
    /* Observation for version 2 hooks: on when on_tick is set. */
    bool observe;
    uint32_t replication;
    px_sim_obs_stage *obs_stages;
    uint32_t cap_obs_stages;
    px_sim_obs_device *obs_devices;
    px_sim_obs_link *obs_links;
    uint32_t cap_obs_links;
    double requeued, tokens_lost;
    /* measurements */
    double *ttft, *tpot;
    size_t n_ttft, cap_ttft, n_tpot, cap_tpot;
    double ttft_sum;
    double tokens, completed, arrivals, failed, dropped, losses, switches, events;
    double occ_area, cap_area, occ_t;
    uint32_t n_active, live_capacity;
};

/* Engine internals shared by engine.c (the pipeline and arrivals),
 * engine_faults.c (failures, faults, plan switches) and engine_run.c
 * (setup and the loop). */
void px__sim_occ_touch(px_sim *s);
void px__sim_dev_touch(px_sim *s, uint32_t d);
void px__sim_dev_set_power(px_sim *s, uint32_t d);
px_status px__sim_push(px_sim *s, double t, uint32_t type, uint32_t a, uint32_t b);
void px__sim_ps_reschedule(px_sim *s, uint32_t p);
void px__sim_free_req(px_sim *s, uint32_t id);
bool px__sim_fifo_push(px_sim *s, uint32_t id, bool front);
void px__sim_start_step(px_sim *s, uint32_t gi);
void px__sim_wake_idle(px_sim *s);
void px__sim_schedule_arrival(px_sim *s, double t);
void px__sim_arrival(px_sim *s);
void px__sim_stage_done(px_sim *s, uint32_t gi);
void px__sim_xfer_start(px_sim *s, uint32_t gi);
void px__sim_ps_done(px_sim *s, uint32_t p, uint32_t version);
void px__sim_replica_start(px_sim *s, uint32_t ri);
void px__sim_lose_devices(px_sim *s, const uint32_t *devs, uint32_t n, uint32_t domain,
                          bool injected);
void px__sim_lose_domain(px_sim *s, uint32_t domain, bool injected);
void px__sim_switch_plan(px_sim *s, uint32_t k);
void px__sim_fault_start(px_sim *s, uint32_t fi);
void px__sim_fault_end(px_sim *s, uint32_t fi);
void px__sim_link_toggle(px_sim *s, uint32_t fi, bool on);
void px__sim_apply_action(px_sim *s, const px_sim_action *act);
/* Version 2 hooks: the engine index of a plan, adding it (sized like the
 * plans set up at the start) when it is new.  PX_SIM_NONE when it cannot
 * (64 plans, another device table, out of memory). */
uint32_t px__sim_install_plan(px_sim *s, const px_sim_plan *plan);
/* Version 2 hooks: one observation tick. */
void px__sim_tick(px_sim *s);
/* Frees what observation allocated. */
void px__sim_observe_release(px_sim *s);
px_status px__sim_observe_init(px_sim *s);

#endif
