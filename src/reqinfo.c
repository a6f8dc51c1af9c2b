/* reqinfo.c — placeholder, being written. */
