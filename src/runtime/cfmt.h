/*
 * cfmt.h - printf in the C locale, whatever the process's (setlocale) or
 * the thread's (uselocale): the database keys and records' content hashes
 * hold numbers as text, and a decimal comma must not change them.
 */
#ifndef STOF_CFMT_H
#define STOF_CFMT_H

#include <stdarg.h>
#include <stddef.h>

int stof__c_snprintf(char *buf, size_t n, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
int stof__c_vsnprintf(char *buf, size_t n, const char *fmt, va_list ap);

#endif
