/* classify.c — placeholder, being written. */
