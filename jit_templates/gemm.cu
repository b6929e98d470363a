/*
 * gemm.cu - placeholder, being written.
 */
