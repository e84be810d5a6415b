/* An interning hash index of names (GGUF keys, tensor names): the formats layer needs
 * O(1) lookups by name and a duplicate check on untrusted files, and the names must
 * outlive the parser's input (they become NUL-terminated lm_tensor.name strings). */
#ifndef LM_FORMATS_NAME_INDEX_H
#define LM_FORMATS_NAME_INDEX_H

#include <stddef.h>
#include <stdint.h>

typedef struct lm_name_chunk lm_name_chunk;

typedef struct lm_name_index {
    struct lm_name_slot *slots; /* open addressing, power-of-two capacity */
    size_t cap, count;
    lm_name_chunk *chunks;      /* storage of the interned copies         */
} lm_name_index;

/* Result of lm_name_index_add. */
enum { LM_NAME_ADDED = 0, LM_NAME_DUPLICATE = 1, LM_NAME_NO_MEMORY = -1 };

/* Zero-initialize an index with `= {0}`; no other init is needed. */
void lm_name_index_free(lm_name_index *ix);

/* Copies name[0..len) (plus a NUL) into the index and maps it to `value`. On
 * LM_NAME_ADDED `*interned` (if non-NULL) receives the copy, valid until free. On
 * LM_NAME_DUPLICATE it receives the existing copy and the index is unchanged. */
int lm_name_index_add(lm_name_index *ix, const char *name, size_t len, int64_t value,
                      const char **interned);

/* The value of `name`, or -1 if absent. */
int64_t lm_name_index_find(const lm_name_index *ix, const char *name, size_t len);

#endif
