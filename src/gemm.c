/* gemm.c - placeholder, being written. */
#include "gemm.h"
