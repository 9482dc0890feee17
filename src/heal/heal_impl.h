/*
 * Private declarations shared by the heal module's core files.
 */
#ifndef PX_HEAL_IMPL_H
#define PX_HEAL_IMPL_H

#include "base/common.h"

#include "plexus/heal.h"

/* Median of n values (copied and sorted; values untouched).  NAN for n 0. */
double px__heal_median(const double *v, size_t n);
/* A JSON number for a finite x, null otherwise.  New reference. */
json_t *px__heal_num(double x);
/* Sets key to a JSON number (or null for non-finite x).  PX_ENOMEM. */
px_status px__heal_set_num(json_t *o, const char *key, double x);
/* snprintf into a fixed buffer, cut to fit: for readable texts (labels,
 * evidence, reasons) where a cut is acceptable. */
void px__heal_textf(char *buf, size_t cap, const char *fmt, ...) PX_PRINTF(3, 4);
/* Formats seconds readably ("5.2 ms", "80 us", "1.5 s") into buf. */
void px__heal_fmt_s(double s, char *buf, size_t cap);
/* Whether a plan gives what validation sizes its load from: a predicted
 * time per token and to the first token (/predictions/tpot_s/p50,
 * /predictions/ttft_s/p50).  validate.c. */
bool px__heal_plan_sizes_load(const json_t *plan);

#endif
