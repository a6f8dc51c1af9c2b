/* accesslog.c — placeholder, being written. */
