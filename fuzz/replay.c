/*
 * replay.c - main() for the fuzz drivers when libFuzzer is not available (gcc builds).
 *
 * Usage: fuzz_<driver>_replay PATH...  Each PATH is an input file or a directory of input files
 * (not recursive). Every input goes through the driver's LLVMFuzzerTestOneInput() once, so the
 * committed corpus, including every input that once crashed a driver, is a regression test. A
 * run that finds no input at all fails: a mistyped corpus path must not pass silently.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

/* Reads a whole file; returns 0 or -errno. */
static int read_file(const char *path, uint8_t **data, size_t *size)
{
    FILE *f = fopen(path, "rbe");
    if (!f)
        return -errno;
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap)
            break;
        uint8_t *bigger = realloc(buf, cap * 2);
        if (!bigger) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    int err = ferror(f) ? -EIO : 0;
    fclose(f);
    if (!buf)
        return -ENOMEM;
    if (err) {
        free(buf);
        return err;
    }
    *data = buf;
    *size = len;
    return 0;
}

static int run_file(const char *path, unsigned *count)
{
    uint8_t *data = NULL;
    size_t size = 0;
    int rc = read_file(path, &data, &size);
    if (rc) {
        fprintf(stderr, "cannot read %s: %s\n", path, strerror(-rc));
        return rc;
    }
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    (*count)++;
    return 0;
}

static int run_path(const char *path, unsigned *count)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "cannot stat %s: %s\n", path, strerror(errno));
        return -errno;
    }
    if (!S_ISDIR(st.st_mode))
        return run_file(path, count);

    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort);
    if (n < 0) {
        fprintf(stderr, "cannot list %s: %s\n", path, strerror(errno));
        return -errno;
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char file[4096];
        if (rc == 0 && names[i]->d_name[0] != '.') {
            snprintf(file, sizeof(file), "%s/%s", path, names[i]->d_name);
            if (stat(file, &st) == 0 && S_ISREG(st.st_mode))
                rc = run_file(file, count);
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    unsigned count = 0;
    for (int i = 1; i < argc; i++)
        if (run_path(argv[i], &count))
            return 1;
    if (count == 0) {
        fprintf(stderr, "%s: no input found\n", argv[0]);
        return 1;
    }
    printf("%s: %u inputs replayed\n", argv[0], count);
    return 0;
}
