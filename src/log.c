/* log.c — placeholder, being written. */
