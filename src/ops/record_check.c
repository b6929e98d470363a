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
    return stof__layer_record_check(r, why, n);
}
