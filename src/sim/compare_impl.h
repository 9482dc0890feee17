/*
 * Private declarations of the policy comparison (compare*.c): the
 * statistics shared by the runner, the report and the plot.
 */
#ifndef PX_SIM_COMPARE_IMPL_H
#define PX_SIM_COMPARE_IMPL_H

#include "base/common.h"
#include "plexus/sim.h"

/* The compared figure m of one simulated run. */
double px__sim_cmp_value(const px_sim_metrics *run, px_sim_cmp_metric m);
/* Mean and 95% Student-t interval of the finite values among v[0],
 * v[stride], ... (n values); NAN mean when none is finite. */
void px__sim_cmp_ci(const double *v, size_t n, size_t stride, px_sim_ci *out);
/* The unit text of m ("s", "1/s", "J", "$", ""). */
const char *px__sim_cmp_metric_unit(px_sim_cmp_metric m);

#endif
