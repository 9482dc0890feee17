/* The emu backend's stretching measured on the wall clock: each op takes
 * its class's slowdown times what the cpu takes.  Ratios of timings blur
 * on a loaded machine, so this runs in `make check-slow`; the emu's other
 * behaviour is checked in tests/unit/test_rt_emu.c, from which this
 * builds. */
#define PX_EMU_TIMING 1
#include "../unit/test_rt_emu.c"
