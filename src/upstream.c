/* upstream.c — placeholder, being written. */
