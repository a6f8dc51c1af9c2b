/* framer.c — placeholder, being written. */
