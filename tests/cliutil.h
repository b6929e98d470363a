/*
 * cliutil.h - helpers of the stof-tune suites (test_cli*.c): each test
 * gets a fresh temporary directory (cli_setup / cli_teardown as its
 * suite's init and fini), runs $STOF_TUNE with STOF_USER_DB in it, and
 * builds fixture databases without a GPU.
 */
#ifndef STOF_CLIUTIL_H
#define STOF_CLIUTIL_H

#include <stdint.h>

#include "stof.h"

extern char tmpdir[256];
extern char out_buf[1 << 16], err_buf[1 << 16];

void cli_setup(void);
void cli_teardown(void);

/* tmpdir/name (one of 8 rotating buffers). */
const char *P(const char *name);

/* Run stof-tune with the arguments (a shell fragment); returns its exit
 * status; stdout and stderr land in out_buf and err_buf. */
int run(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

int count_lines(const char *s);
int exists(const char *path);
/* Does tmpdir hold a leftover temporary file? */
int has_tmp_files(void);

/* A context without a device or user database. */
stof_context *ctx_new(void);

/* A fixture record: valid (stof__record_check) unless edited. */
typedef struct fx {
    int key;           /* the key is this number in 32 hex digits */
    const char *gpu;
    int driver;
    double ms;
    int verified;
    const char *host;
    int64_t created;
    unsigned char cubin_byte;
    const char *version; /* NULL: this build */
} fx;

struct stof_db_record;
void fx_record(const fx *f, struct stof_db_record *r);

/* A database at path holding the records (stored with replace). */
void make_db(const char *path, const fx *recs, int n);
/* The same for records built by the caller (their cubins set). */
void store_records(const char *path, const struct stof_db_record *recs,
                   int n);

#endif
