/* Read-only memory mapping of a whole file (weights are never copied on load). */
#ifndef LM_CORE_MAPPED_FILE_H
#define LM_CORE_MAPPED_FILE_H

#include "lumen.h"

typedef struct lm_mapped_file {
    const uint8_t *data; /* NULL for an empty file */
    size_t size;
} lm_mapped_file;

/* Maps `path` read-only. On error returns LM_ERR_IO with the path and reason. */
lm_status lm_mapped_file_open(const char *path, lm_mapped_file *out);
void lm_mapped_file_close(lm_mapped_file *file);

#endif
