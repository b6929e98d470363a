/*
 * layer_ops.cu - placeholder, being written.
 */
