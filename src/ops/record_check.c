/*
 * record_check.c - the full check of a tuning record (record_check.h):
 * the database's checks, then the operation that owns the record.
 */
#include "record_check.h"

#include <string.h>

int stof__record_check(const stof_db_record *r, char *why, size_t n)
{
    if (!stof__db_record_check(r, why, n))
        return 0;
    if (!strcmp(r->op, "attention")) {
        stof_candidate c;
        return stof__attention_record_candidate(r, &c, why, n);
    }
    if (!strcmp(r->op, "builder")) /* the GPU format builder's cubin */
        return strcmp(r->kernel, "mask_build") == 0 &&
                       strcmp(r->config, "{}") == 0
                   ? 1
                   : stof__why(why, n, "malformed format-builder record");
    return stof__layer_record_check(r, why, n);
}
