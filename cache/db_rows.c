/*
 * db_rows.c - the rows of the layered database (db.h): reading and
 * storing records (each checked when read), the local trust table, and
 * the misses of cache-only runs. Every write is one IMMEDIATE transaction.
 */
#include "db_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

/* Copy a text column into a char array, truncating. */
static void col_text(char *dst, size_t n, sqlite3_stmt *s, int col)
{
    const unsigned char *t = sqlite3_column_text(s, col);
    size_t len = t ? (size_t)sqlite3_column_bytes(s, col) : 0;
    if (len >= n)
        len = n - 1;
    if (len)
        memcpy(dst, t, len);
    dst[len] = '\0';
}

const char *stof__db_columns(void)
{
    return DB_COLUMNS;
}

int stof__db_shape_sql(const char *t, char *buf, size_t n)
{
    size_t len = 0;
    int ok = 1;
    buf[0] = '\0';
#define ADD_(...)                                                              \
    do {                                                                       \
        int k = snprintf(buf + len, len < n ? n - len : 0, __VA_ARGS__);       \
        if (k < 0 || len + (size_t)k >= n)                                     \
            ok = 0;                                                            \
        else                                                                   \
            len += (size_t)k;                                                  \
    } while (0)
#define SHAPE_T_(f)                                                            \
    ADD_("(typeof(%s.%s) = 'text' AND length(CAST(%s.%s AS BLOB)) < %zu) AND ", \
         t, #f, t, #f, sizeof(((stof_db_record *)0)->f));
#define SHAPE_I_(f) ADD_("typeof(%s.%s) = 'integer' AND ", t, #f);
#define SHAPE_D_(f) ADD_("typeof(%s.%s) IN ('real', 'integer') AND ", t, #f);
    DB_FIELDS(SHAPE_T_, SHAPE_I_, SHAPE_I_, SHAPE_D_)
    ADD_("typeof(%s.cubin) IN ('blob', 'null')", t);
#undef SHAPE_T_
#undef SHAPE_I_
#undef SHAPE_D_
#undef ADD_
    return ok;
}

int stof__db_read_row(sqlite3_stmt *s, int first, stof_db_record *r)
{
    int col = first;
    memset(r, 0, sizeof(*r));
#define GET_T_(f) col_text(r->f, sizeof(r->f), s, col++);
#define GET_I_(f) r->f = sqlite3_column_int(s, col++);
#define GET_L_(f) r->f = sqlite3_column_int64(s, col++);
#define GET_D_(f) r->f = sqlite3_column_double(s, col++);
    DB_FIELDS(GET_T_, GET_I_, GET_L_, GET_D_)
#undef GET_T_
#undef GET_I_
#undef GET_L_
#undef GET_D_
    /* A NULL pointer with a nonzero size is SQLite running out of memory
     * (an empty or NULL cubin gives NULL with size 0). */
    const void *blob = sqlite3_column_blob(s, col);
    int bytes = sqlite3_column_bytes(s, col);
    col++;
    if (!blob && bytes > 0)
        return SQLITE_NOMEM;
    size_t size = blob ? (size_t)bytes : 0;
    if (size) {
        r->cubin = malloc(size);
        if (!r->cubin)
            return SQLITE_NOMEM;
        memcpy(r->cubin, blob, size);
        r->cubin_size = size;
    }
    r->hits = sqlite3_column_int64(s, col++);
    return SQLITE_OK;
}

/* Pending hits are written when the database stores a record (a tuning:
 * writing already) and when it closes, never on a lookup's path: there the
 * commit cost a warm plan 2-20 ms now and then (the write-ahead log's
 * restart or checkpoint after a tuning). A process killed before either
 * loses its counts; they are statistics. */

void stof__db_hits_flush(stof_db *db)
{
    db_pending_hits *p = &db->pend;
    if (!p->len)
        return;
    db_layer *L = &db->layers[0];
    if (!L->conn || !L->writable) {
        p->len = 0;
        return;
    }
    sqlite3_stmt *s;
    /* Statistics only: never inside another transaction of this connection
     * and never waiting for a busy database (the hits stay in memory for
     * the next time). */
    if (!sqlite3_get_autocommit(L->conn) ||
        sqlite3_busy_timeout(L->conn, 0) != SQLITE_OK)
        return;
    int ok = stof__db_exec(L->conn, "BEGIN IMMEDIATE") == SQLITE_OK;
    for (int i = 0; ok && i < p->len; i++) {
        ok = stof__db_layer_stmt(L, ST_HIT, &s) == SQLITE_OK &&
             sqlite3_bind_text(s, 1, p->key[i], -1, SQLITE_STATIC) ==
                 SQLITE_OK &&
             sqlite3_bind_int64(s, 2, p->n[i]) == SQLITE_OK &&
             sqlite3_step(s) == SQLITE_DONE;
        stof__db_done_stmt(s);
    }
    if (ok)
        ok = stof__db_exec(L->conn, "COMMIT") == SQLITE_OK;
    if (ok)
        p->len = 0;
    else
        stof__db_rollback(L->conn);
    (void)sqlite3_busy_timeout(L->conn, DB_BUSY_TIMEOUT_MS);
}

/* One more hit of key in memory; its pending count (0 when memory ran
 * out: the hit is then lost, it is a statistic). */
static int64_t count_hit(stof_db *db, const char *key)
{
    db_pending_hits *p = &db->pend;
    int i = 0;
    while (i < p->len && strcmp(p->key[i], key) != 0)
        i++;
    if (i == p->len) {
        if (p->len == p->cap) {
            const int cap = p->cap ? 2 * p->cap : 16;
            char(*k)[33] = realloc(p->key, (size_t)cap * sizeof(*k));
            if (k)
                p->key = k;
            int64_t *n = realloc(p->n, (size_t)cap * sizeof(*n));
            if (n)
                p->n = n;
            if (!k || !n)
                return 0;
            p->cap = cap;
        }
        snprintf(p->key[i], sizeof(p->key[i]), "%s", key);
        p->n[i] = 0;
        p->len++;
    }
    return ++p->n[i];
}

/* --- the memo (db_int.h) ------------------------------------------------ */

/* At most this many records and bytes of cubins are kept. */
#define MEMO_MAX STOF_DB_MEMO_MAX
#define MEMO_MAX_BYTES ((size_t)64 << 20)

void stof__db_memo_drop(stof_db *db, const char *key)
{
    db_memo *m = &db->memo;
    for (int i = 0; i < m->n;) {
        if (key && strcmp(m->e[i].rec.key, key) != 0) {
            i++;
            continue;
        }
        m->bytes -= m->e[i].rec.cubin_size;
        stof__db_record_clear(&m->e[i].rec);
        m->e[i] = m->e[--m->n];
    }
    if (!key) {
        free(m->e);
        memset(m, 0, sizeof(*m));
    }
}

static int memo_find(const db_memo *m, int layer, const char *key)
{
    for (int i = 0; i < m->n; i++)
        if (m->e[i].layer == layer && !strcmp(m->e[i].rec.key, key))
            return i;
    return -1;
}

/* A deep copy of r into *out (without the cubin when `lazy`); 0 when
 * memory ran out. */
static int record_copy(stof_db_record *out, const stof_db_record *r, int lazy)
{
    *out = *r;
    out->cubin = NULL;
    if (r->cubin && r->cubin_size && !lazy) {
        out->cubin = malloc(r->cubin_size);
        if (!out->cubin) {
            memset(out, 0, sizeof(*out));
            return 0;
        }
        memcpy(out->cubin, r->cubin, r->cubin_size);
    }
    return 1;
}

/* Keep a copy of r, just read from `layer` and checked (best effort:
 * nothing when memory is short or the cubin is too large). */
static void memo_put(stof_db *db, int layer, const stof_db_record *r)
{
    db_memo *m = &db->memo;
    if (r->cubin_size > MEMO_MAX_BYTES / 4)
        return;
    stof__db_memo_drop(db, r->key);
    if (m->n == m->cap && m->cap < MEMO_MAX) {
        const int cap = m->cap ? 2 * m->cap : 8;
        db_memo_entry *e = realloc(m->e, (size_t)cap * sizeof(*e));
        if (!e)
            return;
        m->e = e;
        m->cap = cap;
    }
    /* Full (entries or bytes): replace others in turn. */
    while (m->n && (m->n == m->cap ||
                    m->bytes + r->cubin_size > MEMO_MAX_BYTES)) {
        const int i = (int)(m->next++ % (unsigned)m->n);
        m->bytes -= m->e[i].rec.cubin_size;
        stof__db_record_clear(&m->e[i].rec);
        m->e[i] = m->e[--m->n];
    }
    if (!record_copy(&m->e[m->n].rec, r, 0))
        return;
    m->e[m->n].rec.cubin_xxh3 =
        r->cubin && r->cubin_size ? XXH3_64bits(r->cubin, r->cubin_size) : 0;
    m->e[m->n].layer = layer;
    m->bytes += r->cubin_size;
    m->n++;
}

void stof__db_memo_keep(stof_db *db, int layer, const stof_db_record *r)
{
    if (db && r && layer >= 0 && layer < db->n_layers)
        memo_put(db, layer, r);
}

/* The memo's record of key from layer L (index i), when L still stores
 * that key under the same content hash: copied to *out with the row's
 * hits. 1 served; 0 not (the entry is dropped when the row changed or
 * is gone; out is then clear). */
static int memo_serve(stof_db *db, int i, const char *key,
                      stof_db_record *out, int lazy)
{
    const int j = memo_find(&db->memo, i, key);
    if (j < 0)
        return 0;
    sqlite3_stmt *s;
    int rc = stof__db_layer_stmt(&db->layers[i], ST_HASH, &s);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    const db_memo_entry *e = &db->memo.e[j];
    const unsigned char *h =
        rc == SQLITE_ROW ? sqlite3_column_text(s, 0) : NULL;
    const int same = h && !strcmp((const char *)h, e->rec.content_hash);
    const int64_t hits = same ? sqlite3_column_int64(s, 1) : 0;
    stof__db_done_stmt(s);
    if (!same) {
        stof__db_memo_drop(db, key);
        return 0;
    }
    /* (small cubins, cuBLASLt's algorithms, come along: a copy costs less
     * than the caller's second lookup) */
    if (!record_copy(out, &e->rec,
                     lazy && e->rec.cubin_xxh3 &&
                         e->rec.cubin_size > STOF_DB_LAZY_MIN_BYTES))
        return 0;
    out->hits = hits;
    return 1;
}

/* lookup's modes */
enum { LOOKUP_WHOLE, LOOKUP_LAZY, LOOKUP_AGAIN };

static stof_status lookup(stof_db *db, const char *key, stof_db_record *out,
                          int mode)
{
    if (out)
        memset(out, 0, sizeof(*out));
    if (!db || !out || !key || !*key)
        return stof__dbs_fail(db ? (&db->sink) : NULL, STOF_ERR_INVALID_ARGUMENT,
                          "stof__db_lookup: %s is NULL or empty",
                          !db ? "db" : !out ? "out" : "key");
    for (int i = 0; i < db->n_layers; i++) {
        db_layer *L = &db->layers[i];
        if (!stof__db_layer_fresh(db, i))
            continue;
        sqlite3_stmt *s = NULL;
        int rc = SQLITE_ROW;
        if (!memo_serve(db, i, key, out, mode == LOOKUP_LAZY)) {
            rc = stof__db_layer_stmt(L, ST_LOOKUP, &s);
            if (rc == SQLITE_OK)
                rc = sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
            if (rc == SQLITE_OK)
                rc = sqlite3_step(s);
            if (rc == SQLITE_ROW) {
                rc = stof__db_read_row(s, 0, out);
                stof__db_done_stmt(s);
                s = NULL;
                if (rc != SQLITE_OK) {
                    stof__db_record_clear(out);
                    return stof__dbs_fail((&db->sink), STOF_ERR_OUT_OF_MEMORY,
                                          "tuning database %s: out of memory "
                                          "reading record %s",
                                          L->path, key);
                }
                char why[256];
                if (!stof__db_record_check(out, why, sizeof(why))) {
                    /* Damaged or crafted: never loaded, whatever it says. */
                    stof__dbs_log((&db->sink), STOF_LOG_WARN,
                                  "tuning database %s (%s): record %s is "
                                  "invalid (%s): ignored",
                                  L->path, i == 0 ? "user" : "system", key,
                                  why);
                    stof__db_record_clear(out);
                    continue;
                }
                memo_put(db, i, out);
                rc = SQLITE_ROW;
            }
        }
        if (rc == SQLITE_ROW) {
            snprintf(out->source, sizeof(out->source), "%s",
                     i == 0 ? "user" : "system");
            out->layer = i;
            /* The row's hits and those still in memory, this one too. */
            if (i == 0 && L->writable && mode != LOOKUP_AGAIN)
                out->hits += count_hit(db, key);
            return STOF_OK;
        }
        stof__db_done_stmt(s);
        if (rc != SQLITE_DONE && !L->warned) {
            L->warned = 1;
            stof__dbs_log((&db->sink), STOF_LOG_WARN,
                      "tuning database %s (%s): lookup failed: %s (SQLite "
                      "error %d); treating it as a miss",
                      L->path, i == 0 ? "user" : "system",
                      sqlite3_errmsg(L->conn), rc);
        }
    }
    return STOF_ERR_NOT_FOUND;
}

stof_status stof__db_lookup(stof_db *db, const char *key, stof_db_record *out)
{
    return lookup(db, key, out, LOOKUP_WHOLE);
}

stof_status stof__db_lookup_lazy(stof_db *db, const char *key,
                                 stof_db_record *out)
{
    return lookup(db, key, out, LOOKUP_LAZY);
}

stof_status stof__db_lookup_again(stof_db *db, const char *key,
                                  stof_db_record *out)
{
    return lookup(db, key, out, LOOKUP_AGAIN);
}

/* The writable user layer, or a failure recorded on sink. */
static stof_status user_layer(stof_db *db, db_layer **out)
{
    db_layer *L = &db->layers[0];
    *out = NULL;
    if (!L->conn || !L->writable)
        return stof__dbs_fail((&db->sink), STOF_ERR_DATABASE,
                          "no writable user tuning database: %s%s%s",
                          L->path ? L->path : "", L->path ? ": " : "",
                          L->why[0] ? L->why : "not open");
    *out = L;
    return STOF_OK;
}

/* Run the bound write statements s and then s2 (may be NULL) of L in one
 * IMMEDIATE transaction: the write lock is taken (waiting up to the busy
 * timeout) before anything is read, so concurrent writers queue instead of
 * failing. */
static stof_status run_write(stof_db *db, db_layer *L, sqlite3_stmt *s,
                             sqlite3_stmt *s2, const char *what);

/* The writes a plan makes on its way (a miss in cache-only mode, the trust
 * of a verified record): the same, waiting at most PLAN_WRITE_WAIT_MS for
 * another connection's write lock (an import, a tuner's commit) instead of
 * the busy timeout's 10 s; the caller keeps what it could not write. */
#define PLAN_WRITE_WAIT_MS 100
static stof_status run_write_on_plan(stof_db *db, db_layer *L, sqlite3_stmt *s,
                                     const char *what)
{
    (void)sqlite3_busy_timeout(L->conn, PLAN_WRITE_WAIT_MS);
    stof_status st = run_write(db, L, s, NULL, what);
    (void)sqlite3_busy_timeout(L->conn, DB_BUSY_TIMEOUT_MS);
    return st;
}

static stof_status run_write(stof_db *db, db_layer *L, sqlite3_stmt *s,
                             sqlite3_stmt *s2, const char *what)
{
    /* Inside a unit's transaction (stof__db_store_unit): its statements
     * only; the unit commits or rolls back. */
    const int outer = !sqlite3_get_autocommit(L->conn);
    int rc = outer ? SQLITE_OK : stof__db_exec(L->conn, "BEGIN IMMEDIATE");
    if (rc != SQLITE_OK) {
        stof_status st = DB_FAIL(db, L, rc, what);
        stof__db_done_stmt(s);
        stof__db_done_stmt(s2);
        return st;
    }
    rc = sqlite3_step(s);
    if (rc == SQLITE_DONE && s2)
        rc = sqlite3_step(s2);
    if (rc != SQLITE_DONE) {
        stof_status st = DB_FAIL(db, L, rc, what);
        stof__db_done_stmt(s);
        stof__db_done_stmt(s2);
        if (!outer)
            stof__db_rollback(L->conn);
        return st;
    }
    stof__db_done_stmt(s);
    stof__db_done_stmt(s2);
    if (outer)
        return STOF_OK;
    rc = stof__db_exec(L->conn, "COMMIT");
    if (rc != SQLITE_OK) {
        stof_status st = DB_FAIL(db, L, rc, what);
        stof__db_rollback(L->conn);
        return st;
    }
    return STOF_OK;
}

static int bind_array_text(sqlite3_stmt *s, int col, const char *t, size_t n)
{
    return sqlite3_bind_text(s, col, t, (int)strnlen(t, n), SQLITE_STATIC);
}

/* Bind a ST_TRUST statement for record r. */
static int bind_trust(sqlite3_stmt *t, const stof_db_record *r)
{
    int rc = bind_array_text(t, 1, r->key, sizeof(r->key));
    if (rc == SQLITE_OK)
        rc = bind_array_text(t, 2, r->content_hash, sizeof(r->content_hash));
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_int64(t, 3, (sqlite3_int64)time(NULL));
    return rc;
}

static void trust_mem_add(db_trust_mem *m, const stof_db_record *r);

stof_status stof__db_store(stof_db *db, const stof_db_record *r, int replace,
                           int trusted_here)
{
    if (!db)
        return STOF_ERR_INVALID_ARGUMENT;
    const stof_db_sink *sink = (&db->sink);
    DBS_CHECK_ARG(sink, r, "stof__db_store: record is NULL");
    DBS_CHECK_ARG(sink, r->key[0], "stof__db_store: record has no key");
    DBS_CHECK_ARG(sink,
                   isfinite(r->time_ms) && isfinite(r->runner_up_ms) &&
                       isfinite(r->model_ms),
                   "stof__db_store: record %s: times must be finite", r->key);
    DBS_CHECK_ARG(sink, r->cubin || r->cubin_size == 0,
                   "stof__db_store: record %s: cubin is NULL with size %zu",
                   r->key, r->cubin_size);
    db_layer *L;
    stof_status st = user_layer(db, &L);
    if (st != STOF_OK)
        return st;

    stof_db_record c = *r; /* the filled-in copy that is bound */
    c.cubin = NULL;
    c.verified = r->verified != 0;
    if (!c.created_at)
        c.created_at = (int64_t)time(NULL);
    if (!c.host[0] && gethostname(c.host, sizeof(c.host)) != 0)
        snprintf(c.host, sizeof(c.host), "unknown");
    c.host[sizeof(c.host) - 1] = '\0';
    c.cubin = r->cubin;
    stof__db_record_hash(&c, c.content_hash);
    c.cubin = NULL;

    sqlite3_stmt *s;
    int rc = stof__db_layer_stmt(L, ST_STORE, &s);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, L, rc, "preparing the record store");
    int col = 1;
#define BIND_T_(f)                                                             \
    if (rc == SQLITE_OK)                                                       \
        rc = bind_array_text(s, col++, c.f, sizeof(c.f));
#define BIND_I_(f)                                                             \
    if (rc == SQLITE_OK)                                                       \
        rc = sqlite3_bind_int(s, col++, c.f);
#define BIND_L_(f)                                                             \
    if (rc == SQLITE_OK)                                                       \
        rc = sqlite3_bind_int64(s, col++, c.f);
#define BIND_D_(f)                                                             \
    if (rc == SQLITE_OK)                                                       \
        rc = sqlite3_bind_double(s, col++, c.f);
    DB_FIELDS(BIND_T_, BIND_I_, BIND_L_, BIND_D_)
#undef BIND_T_
#undef BIND_I_
#undef BIND_L_
#undef BIND_D_
    if (rc == SQLITE_OK)
        rc = r->cubin_size ? sqlite3_bind_blob64(s, col, r->cubin,
                                                 (sqlite3_uint64)r->cubin_size,
                                                 SQLITE_STATIC)
                           : sqlite3_bind_null(s, col);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_int(s, sqlite3_bind_parameter_index(s, ":replace"),
                              replace != 0);
    if (rc != SQLITE_OK) {
        stof__db_done_stmt(s);
        return DB_FAIL(db, L, rc, "binding the record");
    }
    sqlite3_stmt *t = NULL;
    if (trusted_here) {
        rc = stof__db_layer_stmt(L, ST_TRUST, &t);
        if (rc == SQLITE_OK)
            rc = bind_trust(t, &c);
        if (rc != SQLITE_OK) {
            stof__db_done_stmt(s);
            stof__db_done_stmt(t);
            return DB_FAIL(db, L, rc, "binding the trust entry");
        }
    }
    st = run_write(db, L, s, t, "storing a record");
    if (st == STOF_OK) {
        /* The first plan after a tuning finds it in memory (when the row
         * kept another record under the conflict rule, its hash differs
         * and the lookup reads the row). */
        c.cubin = r->cubin;
        if (stof__db_record_check(&c, NULL, 0))
            memo_put(db, 0, &c);
        c.cubin = NULL;
        if (trusted_here)
            trust_mem_add(&db->trust, &c);
        /* The hits counted so far go out with the tuning's writes. */
        stof__db_hits_flush(db);
    }
    return st;
}

stof_status stof__db_store_unit(stof_db *db, const stof_db_record *recs, int n,
                                int lead, int replace, int trusted_here)
{
    if (!db)
        return STOF_ERR_INVALID_ARGUMENT;
    DBS_CHECK_ARG((&db->sink), recs && n >= 1 && lead >= 0 && lead < n,
                  "stof__db_store_unit: %d records, lead %d", n, lead);
    db_layer *L;
    stof_status st = user_layer(db, &L);
    if (st != STOF_OK)
        return st;
    int rc = stof__db_exec(L->conn, "BEGIN IMMEDIATE");
    if (rc != SQLITE_OK)
        return DB_FAIL(db, L, rc, "starting a unit of records");
    /* The lead record decides for the unit, by stof__db_store's rule. */
    const stof_db_record *r = &recs[lead];
    int store = 1;
    if (!replace) {
        stof_db_record old;
        if (stof__db_lookup_again(db, r->key, &old) == STOF_OK) {
            if (old.layer == 0)
                store = r->verified &&
                        (!old.verified || r->time_ms < old.time_ms);
            stof__db_record_clear(&old);
        }
    }
    for (int i = 0; store && st == STOF_OK && i < n; i++)
        st = stof__db_store(db, &recs[i], 1, trusted_here);
    if (st == STOF_OK) {
        rc = stof__db_exec(L->conn, "COMMIT");
        if (rc != SQLITE_OK)
            st = DB_FAIL(db, L, rc, "committing a unit of records");
    }
    if (st != STOF_OK)
        stof__db_rollback(L->conn);
    else if (store)
        stof__db_hits_flush(db); /* (skipped inside the unit) */
    return st;
}

/* The in-memory trust list: index of (key, hash) or -1. */
static int trust_mem_find(const db_trust_mem *t, const stof_db_record *r)
{
    for (int i = 0; i < t->n; i++)
        if (!strncmp(t->v[i], r->key, 33) &&
            !strncmp(t->v[i] + 33, r->content_hash, 33))
            return i;
    return -1;
}

/* Remember in memory that (key, hash) of r is trusted (once; best
 * effort). */
static void trust_mem_add(db_trust_mem *m, const stof_db_record *r)
{
    if (trust_mem_find(m, r) >= 0)
        return;
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        void *v = realloc(m->v, (size_t)cap * sizeof(*m->v));
        if (!v)
            return; /* asked again next time: safe */
        m->v = v;
        m->cap = cap;
    }
    snprintf(m->v[m->n], 33, "%s", r->key);
    snprintf(m->v[m->n] + 33, 33, "%s", r->content_hash);
    m->n++;
}

int stof__db_trusted(stof_db *db, const stof_db_record *r)
{
    if (!db || !r || !r->key[0] || !r->content_hash[0])
        return 0;
    if (trust_mem_find(&db->trust, r) >= 0)
        return 1;
    db_layer *L = &db->layers[0];
    if (!L->conn)
        return 0;
    sqlite3_stmt *s;
    int rc = stof__db_layer_stmt(L, ST_TRUSTED, &s);
    if (rc == SQLITE_OK)
        rc = bind_array_text(s, 1, r->key, sizeof(r->key));
    if (rc == SQLITE_OK)
        rc = bind_array_text(s, 2, r->content_hash, sizeof(r->content_hash));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    stof__db_done_stmt(s);
    /* Trust is never withdrawn (a changed record has another hash): the
     * answer is kept for the next plans of this process. */
    if (rc == SQLITE_ROW)
        trust_mem_add(&db->trust, r);
    return rc == SQLITE_ROW;
}

void stof__db_trust(stof_db *db, const stof_db_record *r)
{
    if (!db || !r || !r->key[0] || !r->content_hash[0] ||
        stof__db_trusted(db, r))
        return;
    db_layer *L = &db->layers[0];
    if (L->conn && L->writable) {
        sqlite3_stmt *t;
        int rc = stof__db_layer_stmt(L, ST_TRUST, &t);
        if (rc == SQLITE_OK)
            rc = bind_trust(t, r);
        if (rc == SQLITE_OK &&
            run_write_on_plan(db, L, t, "recording a verified record") ==
                STOF_OK) {
            trust_mem_add(&db->trust, r);
            return;
        }
        if (rc != SQLITE_OK)
            stof__db_done_stmt(t);
        stof__dbs_log((&db->sink), STOF_LOG_WARN,
                  "tuning database %s: could not record that record %s was "
                  "verified here (%s); it is trusted for this process only",
                  L->path, r->key, db->last_err);
    }
    trust_mem_add(&db->trust, r);
}

void stof__db_forget(stof_db *db, const char *key, const char *content_hash)
{
    if (!db || !key || !content_hash)
        return;
    db_layer *L = &db->layers[0];
    if (!L->conn || !L->writable)
        return;
    sqlite3_stmt *s;
    int rc = stof__db_layer_stmt(L, ST_FORGET, &s);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(s, 2, content_hash, -1, SQLITE_STATIC);
    if (rc != SQLITE_OK) {
        stof__db_done_stmt(s);
        return;
    }
    if (run_write(db, L, s, NULL, "deleting a record") != STOF_OK)
        stof__dbs_log((&db->sink), STOF_LOG_WARN,
                  "tuning database %s: could not delete record %s: %s",
                  L->path, key, db->last_err);
}

stof_status stof__db_record_miss(stof_db *db, const char *key,
                                 const char *problem_json,
                                 const void *mask_bits, size_t mask_bytes)
{
    if (!db)
        return STOF_ERR_INVALID_ARGUMENT;
    DBS_CHECK_ARG((&db->sink), key && *key, "stof__db_record_miss: no key");
    DBS_CHECK_ARG((&db->sink), mask_bits || mask_bytes == 0,
                   "stof__db_record_miss: mask_bits is NULL with size %zu",
                   mask_bytes);
    db_layer *L;
    stof_status st = user_layer(db, &L);
    if (st != STOF_OK)
        return st;
    sqlite3_stmt *s;
    int rc = stof__db_layer_stmt(L, ST_MISS, &s);
    if (rc != SQLITE_OK)
        return DB_FAIL(db, L, rc, "preparing the miss record");
    rc = sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(s, 2, problem_json ? problem_json : "{}", -1,
                               SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = mask_bytes ? sqlite3_bind_blob64(s, 3, mask_bits,
                                              (sqlite3_uint64)mask_bytes,
                                              SQLITE_STATIC)
                        : sqlite3_bind_null(s, 3);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_int64(s, 4, (sqlite3_int64)time(NULL));
    if (rc != SQLITE_OK) {
        stof__db_done_stmt(s);
        return DB_FAIL(db, L, rc, "binding the miss");
    }
    return run_write_on_plan(db, L, s, "recording a miss");
}

/* Where an iteration stands: the key of the last row read as SQLite holds
 * it (its type and every byte: a damaged or crafted file may hold a BLOB
 * key, or text with a NUL inside, which a C string would cut so that
 * "key > last" found the same row again, for ever), and as text for the
 * caller. */
typedef struct iter_key {
    sqlite3_value *v; /* NULL before the first row */
    char *text;
} iter_key;

static void iter_key_free(iter_key *k)
{
    sqlite3_value_free(k->v);
    free(k->text);
    k->v = NULL;
    k->text = NULL;
}

/* Bind the next row's lower bound (exclusive) to parameter 1 of s. */
static int bind_after(sqlite3_stmt *s, const iter_key *k)
{
    return k->v ? sqlite3_bind_value(s, 1, k->v)
                : sqlite3_bind_text(s, 1, "", -1, SQLITE_STATIC);
}

/* Advance an iteration to the key of the row now in s (column 0). */
static int save_key(sqlite3_stmt *s, iter_key *k)
{
    sqlite3_value *v = sqlite3_value_dup(sqlite3_column_value(s, 0));
    const unsigned char *t = sqlite3_column_text(s, 0);
    char *dup = strdup(t ? (const char *)t : "");
    if (!v || !dup) {
        sqlite3_value_free(v);
        free(dup);
        return SQLITE_NOMEM;
    }
    iter_key_free(k);
    k->v = v;
    k->text = dup;
    return SQLITE_OK;
}

/* Both iterations read one row per statement, by key order, and reset the
 * statement before calling back: no read transaction is open during the
 * callback, so it may store, record or delete through the same db. */
stof_status stof__db_foreach(stof_db *db, int layer, stof_db_record_fn fn,
                             void *user)
{
    if (!db)
        return STOF_ERR_INVALID_ARGUMENT;
    DBS_CHECK_ARG((&db->sink), fn, "stof__db_foreach: fn is NULL");
    DBS_CHECK_ARG((&db->sink), layer >= 0 && layer < db->n_layers,
                   "stof__db_foreach: layer %d is out of range (0..%d)",
                   layer, db->n_layers - 1);
    db_layer *L = &db->layers[layer];
    if (!L->conn)
        return stof__dbs_fail((&db->sink), STOF_ERR_DATABASE,
                          "tuning database layer %d%s%s is not open: %s",
                          layer, L->path ? " " : "", L->path ? L->path : "",
                          L->why[0] ? L->why : "unusable");
    iter_key last = {0};
    stof_status st = STOF_OK;
    for (;;) {
        sqlite3_stmt *s;
        int rc = stof__db_layer_stmt(L, ST_NEXT_RECORD, &s);
        if (rc == SQLITE_OK)
            rc = bind_after(s, &last);
        if (rc == SQLITE_OK)
            rc = sqlite3_step(s);
        if (rc == SQLITE_DONE) {
            stof__db_done_stmt(s);
            break;
        }
        stof_db_record r;
        memset(&r, 0, sizeof(r));
        if (rc == SQLITE_ROW)
            rc = save_key(s, &last);
        if (rc == SQLITE_OK)
            rc = stof__db_read_row(s, 0, &r);
        if (rc != SQLITE_OK) {
            st = rc == SQLITE_NOMEM
                     ? stof__dbs_fail((&db->sink), STOF_ERR_OUT_OF_MEMORY,
                                  "tuning database %s: out of memory",
                                  L->path)
                     : DB_FAIL(db, L, rc, "reading records");
            stof__db_done_stmt(s);
            stof__db_record_clear(&r);
            break;
        }
        stof__db_done_stmt(s);
        snprintf(r.source, sizeof(r.source), "%s",
                 layer == 0 ? "user" : "system");
        r.layer = layer;
        int stop = fn(user, &r);
        stof__db_record_clear(&r);
        if (stop)
            break;
    }
    iter_key_free(&last);
    return st;
}

stof_status stof__db_foreach_miss(stof_db *db, stof_db_miss_fn fn, void *user)
{
    if (!db)
        return STOF_ERR_INVALID_ARGUMENT;
    DBS_CHECK_ARG((&db->sink), fn, "stof__db_foreach_miss: fn is NULL");
    db_layer *L = &db->layers[0];
    if (!L->conn)
        return stof__dbs_fail((&db->sink), STOF_ERR_DATABASE,
                          "no user tuning database: %s%s%s",
                          L->path ? L->path : "", L->path ? ": " : "",
                          L->why[0] ? L->why : "not open");
    iter_key last = {0};
    stof_status st = STOF_OK;
    for (;;) {
        sqlite3_stmt *s;
        int rc = stof__db_layer_stmt(L, ST_NEXT_MISS, &s);
        if (rc == SQLITE_OK)
            rc = bind_after(s, &last);
        if (rc == SQLITE_OK)
            rc = sqlite3_step(s);
        if (rc == SQLITE_DONE) {
            stof__db_done_stmt(s);
            break;
        }
        char *problem = NULL;
        void *bits = NULL;
        size_t nbits = 0;
        int64_t count = 0;
        if (rc == SQLITE_ROW)
            rc = save_key(s, &last);
        if (rc == SQLITE_OK) {
            const unsigned char *p = sqlite3_column_text(s, 1);
            problem = strdup(p ? (const char *)p : "");
            const void *b = sqlite3_column_blob(s, 2);
            nbits = b ? (size_t)sqlite3_column_bytes(s, 2) : 0;
            bits = nbits ? malloc(nbits) : NULL;
            if (!problem || (nbits && !bits))
                rc = SQLITE_NOMEM;
            else if (nbits)
                memcpy(bits, b, nbits);
            count = sqlite3_column_int64(s, 3);
        }
        if (rc != SQLITE_OK) {
            st = rc == SQLITE_NOMEM
                     ? stof__dbs_fail((&db->sink), STOF_ERR_OUT_OF_MEMORY,
                                  "tuning database %s: out of memory",
                                  L->path)
                     : DB_FAIL(db, L, rc, "reading misses");
            stof__db_done_stmt(s);
            free(problem);
            free(bits);
            break;
        }
        stof__db_done_stmt(s);
        int stop = fn(user, last.text, problem, bits, nbits, count);
        free(problem);
        free(bits);
        if (stop)
            break;
    }
    iter_key_free(&last);
    return st;
}

stof_status stof__db_delete_miss(stof_db *db, const char *key)
{
    if (!db)
        return STOF_ERR_INVALID_ARGUMENT;
    DBS_CHECK_ARG((&db->sink), key && *key, "stof__db_delete_miss: no key");
    db_layer *L;
    stof_status st = user_layer(db, &L);
    if (st != STOF_OK)
        return st;
    sqlite3_stmt *s;
    int rc = stof__db_layer_stmt(L, ST_DELETE_MISS, &s);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    if (rc != SQLITE_OK) {
        stof__db_done_stmt(s);
        return DB_FAIL(db, L, rc, "deleting a miss");
    }
    return run_write(db, L, s, NULL, "deleting a miss");
}
