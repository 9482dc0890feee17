/* Private declarations shared by the cost model's files. */
#ifndef PX_COST_IMPL_H
#define PX_COST_IMPL_H

#include "plexus/cost.h"

/* Relative uncertainty of a quantity as a half-width, or fallback when it
 * states none. */
double px__cost_qty_rel(const px_qty *q, double fallback);
/* Bytes per value of a dtype; PX_DTYPE_COUNT_ or an invalid value gives
 * the fallback. */
double px__cost_bpe(px_dtype dt, double fallback);

#endif
