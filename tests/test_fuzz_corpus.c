/*
 * test_fuzz_corpus.c - replay the fuzzer's seed corpus (fuzz/corpus) through
 * the fuzz target in every build, so the inputs that found bugs stay fixed
 * without clang or libFuzzer. The target abort()s on a broken invariant.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../fuzz/fuzz_mask.c"
#include "testutil.h"

Test(fuzz_corpus, replay_seed_corpus)
{
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", tu_src_path("fuzz/corpus"));
    DIR *dp = opendir(dir);
    cr_assert_not_null(dp, "cannot open %s", dir);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char path[8192];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        FILE *fp = fopen(path, "rb");
        cr_assert_not_null(fp, "cannot open %s", path);
        size_t size = (size_t)sb.st_size;
        uint8_t *buf = malloc(size ? size : 1);
        cr_assert_not_null(buf);
        cr_assert_eq(fread(buf, 1, size, fp), size, "short read of %s", path);
        fclose(fp);
        cr_log_info("replaying %s (%zu bytes)", de->d_name, size);
        cr_assert_eq(LLVMFuzzerTestOneInput(buf, size), 0, "%s", path);
        free(buf);
        n++;
    }
    closedir(dp);
    cr_assert_geq(n, 12, "only %d corpus files in %s", n, dir);
}
