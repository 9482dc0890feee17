/*
 * A test fleet across network namespaces (tests/support/netns.h): this
 * process and the server in the hub namespace (the server on every
 * address of the hub: its loopback for the test's clients, the bridge for
 * the agents), and node i's agent in namespace i, at the hub's bridge
 * address, announcing its veth address (--address) to the other members
 * of its jobs and deployments.  Node i is named "n<i>".  Included by the
 * tests/integration/test_fleet_netns*.c files (static helpers).
 *
 *     static fh_netns_fleet nf;
 *     if (!fhn_start(&nf, "name", 3, 3.0)) { print_message("skipped: %s\n", nf.why); skip(); }
 *     fhn_start_agent(&nf, 0, inventory_path);  // ... for each node
 *     ...
 *     fhn_stop(&nf);
 */
#ifndef PX_FLEET_NETNS_HARNESS_H
#define PX_FLEET_NETNS_HARNESS_H

#include "fleet_harness.h"
#include "netns.h"

typedef struct fh_netns_fleet {
    px_netns net;
    fh_fleet fleet;
    char hub_url[64]; /* the server as the agents reach it */
    char names[PX_NETNS_MAX][16];
    int agent[PX_NETNS_MAX]; /* node i's index in fleet.agents, or -1 */
    bool up;
    char why[600]; /* why the namespaces could not be made */
} fh_netns_fleet;

/* The argument fh_spawn's child gets: which fleet, which node. */
static struct {
    fh_netns_fleet *nf;
    int node;
} fhn_child_arg;

static inline int fhn_child(void *arg)
{
    (void)arg;
    return px_netns_join(&fhn_child_arg.nf->net, fhn_child_arg.node);
}

/* Makes n namespaces and starts the server in the hub; false with
 * nf->why when this machine cannot make namespaces (the test skips). */
static inline bool fhn_start(fh_netns_fleet *nf, const char *name, int n, double lease_s)
{
    memset(nf, 0, sizeof *nf);
    fh_install_cleanup(); /* first: the namespaces' handlers chain to it */
    if (!px_netns_setup(&nf->net, n)) {
        snprintf(nf->why, sizeof nf->why, "%s", nf->net.why);
        return false;
    }
    if (!px_netns_enter_hub(&nf->net))
        fail_msg("%s", nf->net.why);
    for (int i = 0; i < n; i++) {
        snprintf(nf->names[i], sizeof nf->names[i], "n%d", i);
        nf->agent[i] = -1;
    }
    px_strlcpy(nf->fleet.listen_host, "0.0.0.0", sizeof nf->fleet.listen_host);
    fh_fleet_start(&nf->fleet, name, lease_s);
    snprintf(nf->hub_url, sizeof nf->hub_url, "http://%s:%d", nf->net.hub_addr, nf->fleet.port);
    nf->up = true;
    return true;
}

/* Starts (or starts again) node i's agent inside its namespace. */
static inline void fhn_start_agent(fh_netns_fleet *nf, int i, const char *inventory)
{
    const char *extra[] = {"--address", nf->net.addr[i], NULL};
    fhn_child_arg.nf = nf;
    fhn_child_arg.node = i;
    fh_child_setup = fhn_child;
    if (nf->agent[i] < 0) {
        nf->agent[i] = fh_start_agent_via(&nf->fleet, nf->names[i], inventory, nf->hub_url, extra);
    } else {
        fh_proc *p = &nf->fleet.agents[nf->agent[i]];
        p->pid = fh_spawn_agent(&nf->fleet, p, p->name, inventory, nf->hub_url, extra);
    }
    fh_child_setup = NULL;
}

/* Waits until the first n nodes are online. */
static inline void fhn_wait_online(fh_netns_fleet *nf, int n, int timeout_s)
{
    const char *names[PX_NETNS_MAX];
    for (int i = 0; i < n; i++)
        names[i] = nf->names[i];
    fh_wait_nodes_online(&nf->fleet, names, n, timeout_s);
}

/* Node i's number for a node name, or -1. */
static inline int fhn_node(const fh_netns_fleet *nf, const char *name)
{
    for (int i = 0; name && i < nf->net.n; i++)
        if (!strcmp(nf->names[i], name))
            return i;
    return -1;
}

/* Whether pid runs inside node i's namespace. */
static inline bool fhn_runs_in(const fh_netns_fleet *nf, int i, pid_t pid)
{
    pid_t pids[256];
    int n = px_netns_pids(&nf->net, i, pids, 256);
    for (int k = 0; k < n; k++)
        if (pids[k] == pid)
            return true;
    return false;
}

/* Node i dies as a machine does: every process in its namespace (its
 * agent and what the agent started) killed at once.  Returns how many. */
static inline int fhn_kill_node(fh_netns_fleet *nf, int i)
{
    pid_t pids[256];
    int n = px_netns_pids(&nf->net, i, pids, 256);
    for (int k = 0; k < n; k++)
        kill(pids[k], SIGKILL);
    if (nf->agent[i] >= 0) {
        fh_proc *p = &nf->fleet.agents[nf->agent[i]];
        waitpid(p->pid, NULL, 0);
        fh_forget(p->pid);
        p->pid = 0;
    }
    return n;
}

static inline void fhn_stop(fh_netns_fleet *nf)
{
    if (nf->up)
        fh_fleet_stop(&nf->fleet);
    nf->up = false;
    px_netns_teardown(&nf->net);
}

#endif
