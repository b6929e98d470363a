/*
 * tune_text.h - text that stof-tune prints, made safe. Strings from
 * workload files, database fields, file names and error messages reach a
 * terminal only escaped (tt_term); JSON documents are built as jansson
 * values (tt_jstr, tt_jnum) and written by tt_json_write, so they are
 * always valid JSON. Nothing is ever truncated.
 */
#ifndef STOF_TUNE_TEXT_H
#define STOF_TUNE_TEXT_H

#include <stdio.h>

#include <jansson.h>

/* s for a terminal: control characters (C0, DEL, C1), line and bidi
 * controls, and invalid UTF-8 shown as escapes (\x1b, \u202e), so text
 * from a file cannot move the cursor, change colours or reorder a line.
 * Valid printable UTF-8 is kept. */
const char *tt_term(const char *s);

/* The results of tt_term live until this call (call it after each printed
 * item); a failed allocation gives "?" rather than NULL. */
void tt_release(void);

/* A new JSON string holding s (NULL gives ""), with every byte that is not
 * part of valid UTF-8 replaced by U+FFFD: jansson refuses invalid UTF-8,
 * and a database field or file name may hold anything. NULL only when out
 * of memory. */
json_t *tt_jstr(const char *s);

/* A new JSON number holding v rounded to `digits` (1 to 15) significant
 * digits (the precision the field has always been printed with), or JSON
 * null when v is not finite (JSON has no NaN or infinity). NULL only when
 * out of memory. */
json_t *tt_jnum(double v, int digits);

/* Write doc to f as one compact line of ASCII ("key":value, no spaces),
 * then a newline, and release doc. Non-ASCII characters, control
 * characters and DEL are written as \u escapes with lowercase hex digits.
 * Returns 0, or -1 when doc is NULL (a document that could not be built)
 * or out of memory; nothing is written then. */
int tt_json_write(FILE *f, json_t *doc);

#endif
