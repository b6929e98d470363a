/* blaslt.c - placeholder, being written. */
#include "blaslt.h"
