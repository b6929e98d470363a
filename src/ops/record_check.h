/*
 * record_check.h - what each operation accepts in a tuning record: the
 * kernel names and configuration parameters of its kernels, on top of the
 * database's own checks (stof__db_record_check). stof-tune runs
 * stof__record_check on every record it imports, merges or exports; the
 * operations run their part again when a record is loaded.
 */
#ifndef STOF_RECORD_CHECK_H
#define STOF_RECORD_CHECK_H

#include "db.h"
#include "cost_model.h"

/* The whole check: stof__db_record_check, then the operation's own. 1 when
 * valid, else 0 with the reason in why. */
int stof__record_check(const stof_db_record *r, char *why, size_t n);

/* An attention record's candidate (kernel kind and parameters), checked to
 * be a legal configuration of its kernel for the record's head_dim
 * (attention.c). 1, or 0 with the reason. */
int stof__attention_record_candidate(const stof_db_record *r,
                                     stof_candidate *c /* OUT */, char *why,
                                     size_t n);

/* A layer, GEMM or norm record's configuration (layer.c). */
int stof__layer_record_check(const stof_db_record *r, char *why, size_t n);

#endif
