/*
 * tune_text.h - text that stof-tune prints, made safe: strings from
 * workload files, database fields, file names and error messages reach a
 * terminal or a JSON document only escaped. Nothing is ever truncated.
 */
#ifndef STOF_TUNE_TEXT_H
#define STOF_TUNE_TEXT_H

/* A JSON string literal of s (quotes included, NULL gives ""): '"', '\\'
 * and control characters escaped, and invalid UTF-8 replaced by U+FFFD,
 * so the document is always valid JSON. */
const char *tt_json(const char *s);

/* s for a terminal: control characters (C0, DEL, C1), line and bidi
 * controls, and invalid UTF-8 shown as escapes (\x1b, \u202e), so text
 * from a file cannot move the cursor, change colours or reorder a line.
 * Valid printable UTF-8 is kept. */
const char *tt_term(const char *s);

/* The results of tt_json and tt_term live until this call (call it after
 * each printed item); a failed allocation gives "?" (tt_term) or ""
 * (tt_json) rather than NULL. */
void tt_release(void);

#endif
