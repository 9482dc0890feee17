/*
 * Real network boundaries for tests: N network namespaces ("nodes") and a
 * hub namespace, joined by veth pairs to a bridge in the hub, with
 * addresses of 10.77.0.0/24 that exist only inside those namespaces (the
 * hub 10.77.0.1, node i 10.77.0.(10+i), each namespace with its own
 * loopback).  Nothing is added to the namespace the test starts in.
 *
 * Typical use (a fleet test):
 *
 *     px_netns net;
 *     if (!px_netns_setup(&net, 3))          // not root, no CAP_NET_ADMIN, no `ip`
 *         { print_message("skipped: %s\n", net.why); skip(); }
 *     px_netns_enter_hub(&net);               // this process (and what it starts) in the hub
 *     ... start the server on 0.0.0.0; agent i in a child that calls
 *         px_netns_join(&net, i) between fork and exec, with --address net.addr[i] ...
 *     px_netns_link(&net, 1, false);          // cut node 1 off (its interface down)
 *     px_netns_teardown(&net);                // also at exit and on a fatal signal
 *
 * Names are "pxns<PID>-hub" and "pxns<PID>-<i>"; setup first removes those
 * of runs whose process is gone (a killed test), with the processes still
 * inside them.  Needs root (or CAP_SYS_ADMIN and CAP_NET_ADMIN) and the
 * `ip` command of iproute2; `tc` only for px_netns_shape.
 */
#ifndef PX_NETNS_H
#define PX_NETNS_H

#include <stdbool.h>
#include <sys/types.h>

#define PX_NETNS_MAX 8

typedef struct px_netns {
    int n;                       /* node namespaces */
    char hub[32];                /* the hub namespace's name */
    char node[PX_NETNS_MAX][32]; /* node i's namespace */
    char hub_addr[16];           /* the hub's address on the bridge */
    char addr[PX_NETNS_MAX][16]; /* node i's address (its interface eth0) */
    char why[512];               /* why setup or the last call failed */
    int hub_fd;                  /* open namespaces, for setns(2) */
    int node_fd[PX_NETNS_MAX];
    int home_fd; /* the namespace this process started in */
    bool in_hub; /* px_netns_enter_hub was called */
    bool up;     /* set up and not yet torn down */
} px_netns;

/* Creates the hub and n node namespaces (1 to PX_NETNS_MAX) and their
 * links, after removing stale ones of killed runs.  false with x->why
 * (the reason, and what would allow it) when this machine does not permit
 * it; the test should then skip.  Registers the teardown to run at exit
 * and on SIGTERM, SIGINT, SIGABRT, SIGSEGV and SIGALRM (chained to the
 * handlers installed before: install those first). */
bool px_netns_setup(px_netns *x, int n);

/* Moves the calling thread, and so what it starts afterwards, into the
 * hub namespace (call before creating threads).  false with x->why. */
bool px_netns_enter_hub(px_netns *x);

/* Moves the calling thread into node i's namespace (i = -1: the hub).
 * Only open(2)-free system calls: safe between fork and exec.  Returns 0,
 * or -1 with errno. */
int px_netns_join(const px_netns *x, int i);

/* Brings node i's interface up or down (from inside its namespace, so the
 * node loses every address but its loopback's).  false with x->why. */
bool px_netns_link(px_netns *x, int i, bool up);

/* Shapes node i's interface with `tc qdisc replace ... netem ARGS` (for
 * example "delay 20ms loss 5%"), or removes the shaping when args is NULL.
 * false with x->why where tc or netem is missing (callers skip). */
bool px_netns_shape(px_netns *x, int i, const char *args);

/* The process ids inside node i's namespace (at most max). */
int px_netns_pids(const px_netns *x, int i, pid_t *pids, int max);

/* Kills what runs inside the namespaces (not this process), removes them
 * and returns this process to the namespace it started in.  Idempotent. */
void px_netns_teardown(px_netns *x);

/* Removes namespaces of this harness whose creating process is gone;
 * returns how many. */
int px_netns_sweep_stale(void);

#endif
