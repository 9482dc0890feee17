/* Statistics shared by the cost model's calibration and the simulator's
 * confidence intervals: Student's t distribution. */
#include "base/common.h"

/* Continued fraction of the regularized incomplete beta function (the
 * modified Lentz method). */
static double beta_cf(double a, double b, double x)
{
    const double tiny = 1e-300;
    double c = 1.0, d = 1.0 - (a + b) * x / (a + 1.0);
    if (fabs(d) < tiny)
        d = tiny;
    d = 1.0 / d;
    double h = d;
    for (int m = 1; m <= 300; m++) {
        double m2 = 2.0 * m;
        double aa = m * (b - m) * x / ((a + m2 - 1.0) * (a + m2));
        d = 1.0 + aa * d;
        d = fabs(d) < tiny ? tiny : d;
        c = 1.0 + aa / c;
        c = fabs(c) < tiny ? tiny : c;
        d = 1.0 / d;
        h *= d * c;
        aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0));
        d = 1.0 + aa * d;
        d = fabs(d) < tiny ? tiny : d;
        c = 1.0 + aa / c;
        c = fabs(c) < tiny ? tiny : c;
        d = 1.0 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1.0) < 1e-14)
            break;
    }
    return h;
}

static double inc_beta(double a, double b, double x)
{
    if (x <= 0)
        return 0;
    if (x >= 1)
        return 1;
    double lb = lgamma(a + b) - lgamma(a) - lgamma(b) + a * log(x) + b * log(1.0 - x);
    if (x < (a + 1.0) / (a + b + 2.0))
        return exp(lb) * beta_cf(a, b, x) / a;
    return 1.0 - exp(lb) * beta_cf(b, a, 1.0 - x) / b;
}

/* P(T <= t) for Student's t with df degrees of freedom. */
static double t_cdf(double t, double df)
{
    double x = df / (df + t * t);
    double tail = 0.5 * inc_beta(df / 2.0, 0.5, x);
    return t >= 0 ? 1.0 - tail : tail;
}

double px_stat_t_quantile(double p, double df)
{
    if (!(df > 0))
        return INFINITY;
    double lo = 0, hi = 1e6;
    if (p <= 0.5)
        return 0;
    for (int i = 0; i < 200; i++) {
        double mid = 0.5 * (lo + hi);
        if (t_cdf(mid, df) < p)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}
