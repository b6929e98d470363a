/*
 * tune_mask.c - stof-tune show-mask: a mask spec at a size, what the
 * kernels see of it (density, tiles full / partial / empty at a tile
 * size), and with --png its picture (stof_mask_png), written through a
 * temporary file and renamed, so a failed run leaves no partial file.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tune_cli.h"
#include "tune_text.h"

/* "N" or "NQxNK" (each 1 .. 1<<20). */
static int parse_size(const char *s, int *sq, int *sk)
{
    char *end;
    errno = 0;
    long a = strtol(s, &end, 10), b = a;
    if (end == s || errno)
        return 0;
    if (*end == 'x') {
        const char *t = end + 1;
        b = strtol(t, &end, 10);
        if (end == t || errno)
            return 0;
    }
    if (*end || a < 1 || b < 1 || a > (1L << 20) || b > (1L << 20))
        return 0;
    *sq = (int)a;
    *sk = (int)b;
    return 1;
}

static int tile_ok(int t)
{
    return t >= 16 && t <= 256 && (t & (t - 1)) == 0;
}

/* "BMxBN" tiles (each a power of two from 16 to 256, as the formats take). */
static int parse_tile(const char *s, int *bm, int *bn)
{
    int a = 0, b = 0;
    char c = 0;
    if (sscanf(s, "%dx%d%c", &a, &b, &c) != 2 || !tile_ok(a) || !tile_ok(b))
        return 0;
    *bm = a;
    *bn = b;
    return 1;
}

/* Whether path may be replaced by a picture: absent, or a regular file
 * (not a link) that is writable and empty or a PNG already. Anything else
 * is refused, not replaced (a device, a pipe, a link, someone's notes). */
static int png_destination_ok(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT)
            return 1;
        err("show-mask: %s: %s", path, strerror(errno));
        return 0;
    }
    if (S_ISDIR(sb.st_mode)) {
        err("show-mask: %s is a directory: give the picture's file name", path);
        return 0;
    }
    if (!S_ISREG(sb.st_mode)) {
        err("show-mask: %s exists and is not a regular file: not replaced",
            path);
        return 0;
    }
    if (access(path, W_OK) != 0) {
        err("show-mask: %s is not writable (mode %04o): not replaced", path,
            (unsigned)(sb.st_mode & 07777));
        return 0;
    }
    unsigned char head[8];
    FILE *f = fopen(path, "rb");
    const size_t n = f ? fread(head, 1, sizeof(head), f) : 0;
    if (f)
        fclose(f);
    if (sb.st_size != 0 &&
        (n != sizeof(head) || memcmp(head, "\x89PNG\r\n\x1a\n", 8) != 0)) {
        err("show-mask: %s exists and is not a PNG picture: not replaced; "
            "remove it or choose another name",
            path);
        return 0;
    }
    return 1;
}

/* The picture into path: written to path.tmp-PID, then renamed. */
static int write_png(stof_context *ctx, const stof_mask *m, int bm, int bn,
                     int px, const char *path)
{
    if (!png_destination_ok(path))
        return EXIT_FAIL;
    size_t need = 0;
    stof_status st = stof_mask_png(ctx, m, bm, bn, px, NULL, 0, &need);
    if (st != STOF_ERR_BUFFER_TOO_SMALL)
        return fail_with(ctx, st);
    unsigned char *buf = malloc(need);
    if (!buf) {
        err("out of memory");
        return EXIT_FAIL;
    }
    st = stof_mask_png(ctx, m, bm, bn, px, buf, need, &need);
    if (st != STOF_OK) {
        free(buf);
        return fail_with(ctx, st);
    }
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp-%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(buf, 1, need, f) == need;
    if (f && fclose(f) != 0)
        ok = 0;
    free(buf);
    if (!ok || rename(tmp, path) != 0) {
        err("show-mask: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return EXIT_FAIL;
    }
    return EXIT_OK;
}

int cmd_show_mask(stof_context *ctx, const opts *o)
{
    const char *spec = o->pos[0];
    int sq = 0, sk = 0, bm = 128, bn = 128;
    if (!parse_size(o->pos[1], &sq, &sk)) {
        err("show-mask: '%s' is not a size (N or NQxNK, 1 to 1048576)",
            o->pos[1]);
        return EXIT_USAGE;
    }
    if (o->tile && !parse_tile(o->tile, &bm, &bn)) {
        err("show-mask: --tile '%s' is not BMxBN (each a power of "
            "two from 16 to 256)", o->tile);
        return EXIT_USAGE;
    }
    if (o->pixels && (o->pixels < 16 || o->pixels > 8192)) {
        err("show-mask: --pixels %d: must be 16 to 8192", o->pixels);
        return EXIT_USAGE;
    }
    stof_mask *m = NULL;
    stof_status st = stof_mask_from_spec(ctx, spec, sq, sk, &m);
    if (st != STOF_OK) {
        err("show-mask: %s", stof_errmsg(ctx));
        return st == STOF_ERR_INVALID_ARGUMENT ? EXIT_USAGE : exit_for(st);
    }
    stof_format *f = NULL;
    st = stof_format_build(ctx, m, bm, bn, &f);
    if (st != STOF_OK) {
        stof_mask_free(&m);
        return fail_with(ctx, st);
    }
    char hex[33];
    stof_mask_digest(m, NULL, hex);
    int rc = EXIT_OK;
    if (o->png)
        rc = write_png(ctx, m, bm, bn, o->pixels, o->png);
    if (rc == EXIT_OK && o->json) {
        rc = print_json(json_pack(
            "{s:o, s:i, s:i, s:I, s:o, s:s, s:{s:i, s:i, s:I, s:I, s:I},"
            " s:o}",
            "spec", tt_jstr(spec), "seq_q", sq, "seq_k", sk, "allowed",
            (json_int_t)stof_mask_count(m), "density",
            tt_jnum(stof_mask_density(m), 6), "digest", hex, "tiles",
            "block_m", bm, "block_n", bn, "full", (json_int_t)f->n_full,
            "partial", (json_int_t)f->n_partial, "empty",
            (json_int_t)f->n_empty, "png",
            o->png ? tt_jstr(o->png) : json_null()));
    } else if (rc == EXIT_OK) {
        printf("%s at %dx%d: density %.6f (%llu allowed), digest %s\n",
               tt_term(spec), sq, sk, stof_mask_density(m),
               (unsigned long long)stof_mask_count(m), hex);
        printf("tiles %dx%d: %lld full, %lld partial, %lld empty\n", bm, bn,
               (long long)f->n_full, (long long)f->n_partial,
               (long long)f->n_empty);
        if (o->png)
            printf("picture: %s (full tiles blue, partial orange, empty "
                   "white)\n",
                   tt_term(o->png));
        tt_release();
    }
    stof_format_free(&f);
    stof_mask_free(&m);
    return rc;
}
