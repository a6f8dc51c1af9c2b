/*
 * dashboard.h — the admin dashboard page (GET /), compiled into the binary.
 *
 * The page is written as src/admin/dashboard.html, one self-contained file (inline
 * CSS, inline JS, SVG charts drawn by that JS; nothing fetched but the admin
 * API itself). At build time src/admin/dashboard_embed.cmake turns it into a C
 * array in the build directory (dashboard_html.c), so editing the HTML needs
 * no C change and the binary needs no file at run time.
 */
#pragma once

#include <stddef.h>

/* The page's bytes, NUL-terminated for convenience (the NUL is not counted). */
extern const unsigned char dashboard_html[];
extern const size_t dashboard_html_len;
