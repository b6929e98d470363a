/*
 * status.c - status strings and versions. Everything here is static text,
 * safe from any thread.
 */
#include "internal.h"

const char *stof_status_str(stof_status st)
{
    switch (st) {
#define STOF__STATUS_STR(name, value, text)                                    \
    case STOF_##name:                                                          \
        return text;
        STOF_STATUS_MAP(STOF__STATUS_STR)
#undef STOF__STATUS_STR
    default:
        return "unknown status";
    }
}

const char *stof_status_name(stof_status st)
{
    switch (st) {
#define STOF__STATUS_NAME(name, value, text)                                   \
    case STOF_##name:                                                          \
        return #name;
        STOF_STATUS_MAP(STOF__STATUS_NAME)
#undef STOF__STATUS_NAME
    default:
        return "UNKNOWN";
    }
}

unsigned stof_version(void)
{
    return STOF_VERSION_NUMBER;
}

#define STOF__STR2(x) #x
#define STOF__STR(x) STOF__STR2(x)

const char *stof_version_string(void)
{
    return STOF__STR(STOF_VERSION_MAJOR) "." STOF__STR(
        STOF_VERSION_MINOR) "." STOF__STR(STOF_VERSION_PATCH);
}
