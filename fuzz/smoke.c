/* A fuzz target's smoke run: its entry point once over every file of the
 * folders given (its seed corpus), without libFuzzer, so that ctest runs
 * it in every build.  A seed that crashes the target fails the run, as
 * does a folder without seeds, or a target whose px_fuzz_smoke_check (when
 * it has one) says the seeds no longer reach what it is meant to fuzz. */
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int px_fuzz_smoke_check(void) __attribute__((weak));

#define MAX_SEED (1 << 20)

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return -1;
    }
    uint8_t *buf = malloc(MAX_SEED);
    size_t n = buf ? fread(buf, 1, MAX_SEED, f) : 0;
    bool whole = buf && feof(f) && !ferror(f);
    fclose(f);
    if (!whole) {
        fprintf(stderr, "%s: cannot read it whole (seeds hold at most %d bytes)\n", path, MAX_SEED);
        free(buf);
        return -1;
    }
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    size_t seeds = 0;
    for (int a = 1; a < argc; a++) {
        DIR *d = opendir(argv[a]);
        if (!d) {
            fprintf(stderr, "%s: cannot open the seed folder\n", argv[a]);
            return 1;
        }
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            char path[4096];
            struct stat st;
            snprintf(path, sizeof path, "%s/%s", argv[a], e->d_name);
            if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
                continue;
            if (run_file(path) != 0) {
                closedir(d);
                return 1;
            }
            seeds++;
        }
        closedir(d);
    }
    if (!seeds) {
        fprintf(stderr, "no seeds in the folders given: name the target's fuzz/corpus folder\n");
        return 1;
    }
    fprintf(stderr, "%zu seeds\n", seeds);
    return px_fuzz_smoke_check ? px_fuzz_smoke_check() : 0;
}
