/* proxy.c — placeholder, being written. */
