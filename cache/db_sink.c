/*
 * db_sink.c - how the database reports (db.h, stof_db_sink): formatting a
 * failure or a log line and handing it to the caller's sink.
 */
#include "db.h"

#include <stdarg.h>
#include <stdio.h>

stof_status stof__dbs_fail(const stof_db_sink *sink, stof_status st,
                           const char *fmt, ...)
{
    if (!sink || !sink->fail)
        return st;
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return sink->fail(sink->user, st, msg);
}

void stof__dbs_log(const stof_db_sink *sink, stof_log_level level,
                   const char *fmt, ...)
{
    if (!sink || !sink->log)
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sink->log(sink->user, level, msg);
}

stof_status stof__dbs_ok(const stof_db_sink *sink)
{
    if (sink && sink->ok)
        sink->ok(sink->user);
    return STOF_OK;
}
