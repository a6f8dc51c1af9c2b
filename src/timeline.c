/* timeline.c — placeholder, being written. */
