/*
 * status_page.h - the status page (status_page.html), embedded at build time: CMake turns the
 * file into a byte array (cmake/embed_file.cmake), so the daemon needs no file at run time and
 * the page cannot go missing or drift from the binary.
 */
#ifndef KVP_STATUS_PAGE_H
#define KVP_STATUS_PAGE_H

#include <stddef.h>

extern const unsigned char kvp_status_page[]; /* the page's bytes, NUL-terminated */
extern const size_t kvp_status_page_len;      /* without the NUL */

#endif /* KVP_STATUS_PAGE_H */
