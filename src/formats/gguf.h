/* GGUF files (versions 2 and 3): a validating reader over a memory mapping and a
 * writer.
 *
 * Reader. lm_gguf_open maps the file and checks everything before returning: every
 * count, string length, array, tensor shape, type, offset and size is bounds-checked
 * against the file and against the limits below, so a handle that opened is safe to
 * walk without further checks. Failures return LM_ERR_FORMAT (malformed or truncated),
 * LM_ERR_UNSUPPORTED (version 1, big-endian files, unknown tensor type), LM_ERR_LIMIT
 * (a count or size above the limits below), LM_ERR_NO_MEMORY or LM_ERR_IO, with a
 * sentence in lm_last_error() naming the file, the byte offset / key / tensor and
 * what was wrong. *out is NULL on failure.
 *
 * Ownership: every pointer a reader call returns (keys, strings, arrays, tensors,
 * tensor data) is borrowed from the handle and valid until lm_gguf_close. A handle is
 * immutable after open, so concurrent reads from several threads are safe.
 *
 * Decisions on what the spec leaves open:
 *   - tensor dimensions: n_dims in 0..4; each ne in 0..INT64_MAX (0 = an empty tensor
 *     with nbytes 0); the element count must fit in int64; ne[0] a multiple of the
 *     type's block size; unused ne are 1.
 *   - tensor offsets are multiples of the alignment; data ranges lie inside the data
 *     section and do not overlap; tensor names and keys are unique and contain no NUL.
 *   - bool values must be 0 or 1.
 *   - general.alignment may be stored as any integer type; it must be a non-zero power
 *     of two that fits in 32 bits.
 *   - arrays may nest up to LM_GGUF_MAX_DEPTH levels (array of array of ...), with at
 *     most LM_GGUF_MAX_NESTED array elements in all (each costs a node in memory;
 *     flat numeric and string arrays cost little and have no limit but the file).
 */
#ifndef LM_FORMATS_GGUF_H
#define LM_FORMATS_GGUF_H

#include "lumen.h"
#include "tensor/tensor.h"

#define LM_GGUF_MAX_TENSORS   (1 << 20)      /* tensors per file                      */
#define LM_GGUF_MAX_KV        (1 << 20)      /* key/value pairs per file              */
#define LM_GGUF_MAX_NAME      65535          /* bytes of a key or a tensor name       */
#define LM_GGUF_MAX_DEPTH     8              /* nesting of arrays                     */
#define LM_GGUF_MAX_NESTED    (1 << 20)      /* elements of arrays of arrays, in all  */
#define LM_GGUF_DEFAULT_ALIGNMENT 32

typedef struct lm_gguf lm_gguf;

typedef enum lm_gguf_type {
    LM_GGUF_U8 = 0,
    LM_GGUF_I8 = 1,
    LM_GGUF_U16 = 2,
    LM_GGUF_I16 = 3,
    LM_GGUF_U32 = 4,
    LM_GGUF_I32 = 5,
    LM_GGUF_F32 = 6,
    LM_GGUF_BOOL = 7,
    LM_GGUF_STRING = 8,
    LM_GGUF_ARRAY = 9,
    LM_GGUF_U64 = 10,
    LM_GGUF_I64 = 11,
    LM_GGUF_F64 = 12,
} lm_gguf_type;

/* "u32", "string", "array", ...; "unknown" for other values. */
const char *lm_gguf_type_name(lm_gguf_type type);

/* Bytes of one element of a fixed-size type (1 for BOOL); 0 for STRING, ARRAY and
 * unknown values. */
size_t lm_gguf_type_size(lm_gguf_type type);

/* ---- reader -------------------------------------------------------------------- */

/* Maps and validates `path`. The mapping lives until lm_gguf_close. */
lm_status lm_gguf_open(const char *path, lm_gguf **out);

/* Validates a caller-owned buffer; the buffer is borrowed and must outlive the
 * handle (tensor data and strings point into it). `data` may be NULL when size is 0. */
lm_status lm_gguf_open_memory(const void *data, size_t size, lm_gguf **out);

void lm_gguf_close(lm_gguf *g); /* NULL is a no-op */

uint32_t lm_gguf_version(const lm_gguf *g);
size_t lm_gguf_alignment(const lm_gguf *g);

/* ---- metadata ---- */

int64_t lm_gguf_n_kv(const lm_gguf *g);
/* NUL-terminated key of pair i (0 <= i < n_kv), NULL if i is out of range. */
const char *lm_gguf_kv_key(const lm_gguf *g, int64_t i);
/* Type of pair i; for an out-of-range i, (lm_gguf_type)-1. */
lm_gguf_type lm_gguf_kv_type(const lm_gguf *g, int64_t i);
/* Index of `key`, -1 if absent. */
int64_t lm_gguf_find_key(const lm_gguf *g, const char *key);

/* The encoded bytes of pair i's value as stored in the file (after its type field),
 * e.g. for copying metadata into a writer with lm_gguf_writer_set_raw. */
lm_status lm_gguf_kv_raw(const lm_gguf *g, int64_t i, lm_gguf_type *type, const void **bytes,
                         size_t *size);

/* Scalar getters by key: LM_ERR_NOT_FOUND if absent; LM_ERR_FORMAT if the stored
 * type cannot represent the request. Integers convert between widths and signedness
 * when the value fits; F32 and F64 convert to each other; integers convert to
 * floats; bool only reads BOOL; nothing converts from or to strings or arrays. */
lm_status lm_gguf_get_u32(const lm_gguf *g, const char *key, uint32_t *out);
lm_status lm_gguf_get_i32(const lm_gguf *g, const char *key, int32_t *out);
lm_status lm_gguf_get_u64(const lm_gguf *g, const char *key, uint64_t *out);
lm_status lm_gguf_get_i64(const lm_gguf *g, const char *key, int64_t *out);
lm_status lm_gguf_get_f32(const lm_gguf *g, const char *key, float *out);
lm_status lm_gguf_get_f64(const lm_gguf *g, const char *key, double *out);
lm_status lm_gguf_get_bool(const lm_gguf *g, const char *key, bool *out);

/* A STRING value: *str points at a NUL-terminated copy owned by the handle and *len
 * is its length in bytes (authoritative: the string may contain NUL bytes). */
lm_status lm_gguf_get_str(const lm_gguf *g, const char *key, const char **str, size_t *len);

/* An ARRAY value: element type and count. For fixed-size element types *data points
 * at the packed little-endian elements inside the file (possibly unaligned: copy
 * with memcpy); for STRING and ARRAY elements *data is NULL — use
 * lm_gguf_get_arr_str / lm_gguf_get_arr_arr. Any out pointer may be NULL. */
lm_status lm_gguf_get_arr(const lm_gguf *g, const char *key, lm_gguf_type *elem_type,
                          uint64_t *n, const void **data);

/* Element i of an array of strings, borrowed from the file and NOT NUL-terminated.
 * LM_ERR_NOT_FOUND if the key is absent or i >= n, LM_ERR_FORMAT if the value is not
 * an array of strings. */
lm_status lm_gguf_get_arr_str(const lm_gguf *g, const char *key, uint64_t i,
                              const char **str, size_t *len);

/* Element i of an array of arrays, described like lm_gguf_get_arr. Deeper levels
 * and generic walking go through the value API below. */
lm_status lm_gguf_get_arr_arr(const lm_gguf *g, const char *key, uint64_t i,
                              lm_gguf_type *elem_type, uint64_t *n, const void **data);

/* ---- generic values (every value is reachable, however deeply nested) ---- */

typedef struct lm_gguf_value lm_gguf_value;

/* Value of pair i, NULL if out of range. Borrowed from the handle. */
const lm_gguf_value *lm_gguf_kv_value(const lm_gguf *g, int64_t i);
lm_gguf_type lm_gguf_value_type(const lm_gguf_value *v);
/* Same conversions as the getters by key. */
lm_status lm_gguf_value_u64(const lm_gguf_value *v, uint64_t *out);
lm_status lm_gguf_value_i64(const lm_gguf_value *v, int64_t *out);
lm_status lm_gguf_value_f64(const lm_gguf_value *v, double *out);
lm_status lm_gguf_value_bool(const lm_gguf_value *v, bool *out);
lm_status lm_gguf_value_str(const lm_gguf_value *v, const char **str, size_t *len);
lm_status lm_gguf_value_arr(const lm_gguf_value *v, lm_gguf_type *elem_type, uint64_t *n,
                            const void **data);
lm_status lm_gguf_value_arr_str(const lm_gguf_value *v, uint64_t i, const char **str,
                                size_t *len);
/* Element i of an array of arrays; NULL if v is not one or i is out of range. */
const lm_gguf_value *lm_gguf_value_arr_item(const lm_gguf_value *v, uint64_t i);

/* ---- tensors ---- */

int64_t lm_gguf_n_tensors(const lm_gguf *g);
/* Tensor i in file order, NULL if out of range. name is NUL-terminated; data points
 * into the file (aligned to lm_gguf_alignment relative to the file start). */
const lm_tensor *lm_gguf_tensor(const lm_gguf *g, int64_t i);
const lm_tensor *lm_gguf_find_tensor(const lm_gguf *g, const char *name); /* NULL if absent */
/* Byte offset of the data section in the file. */
size_t lm_gguf_data_offset(const lm_gguf *g);

/* ---- writer --------------------------------------------------------------------- */

/* Collects metadata and tensors, then writes a version-3 file. Keys keep the order
 * of their first set; setting a key again replaces its value in place. Keys, strings
 * and metadata arrays are copied at the call. Tensor data is BORROWED: it must stay
 * valid until lm_gguf_writer_write returns (converters write huge tensors straight
 * from their sources without a second copy). Setters fail with LM_ERR_INVALID_ARG for
 * NULL/empty/over-long keys or names and LM_ERR_NO_MEMORY on allocation failure. */
typedef struct lm_gguf_writer lm_gguf_writer;

lm_gguf_writer *lm_gguf_writer_create(void); /* NULL on OOM */
void lm_gguf_writer_free(lm_gguf_writer *w); /* NULL is a no-op */

lm_status lm_gguf_writer_set_u8(lm_gguf_writer *w, const char *key, uint8_t value);
lm_status lm_gguf_writer_set_i8(lm_gguf_writer *w, const char *key, int8_t value);
lm_status lm_gguf_writer_set_u16(lm_gguf_writer *w, const char *key, uint16_t value);
lm_status lm_gguf_writer_set_i16(lm_gguf_writer *w, const char *key, int16_t value);
lm_status lm_gguf_writer_set_u32(lm_gguf_writer *w, const char *key, uint32_t value);
lm_status lm_gguf_writer_set_i32(lm_gguf_writer *w, const char *key, int32_t value);
lm_status lm_gguf_writer_set_u64(lm_gguf_writer *w, const char *key, uint64_t value);
lm_status lm_gguf_writer_set_i64(lm_gguf_writer *w, const char *key, int64_t value);
lm_status lm_gguf_writer_set_f32(lm_gguf_writer *w, const char *key, float value);
lm_status lm_gguf_writer_set_f64(lm_gguf_writer *w, const char *key, double value);
lm_status lm_gguf_writer_set_bool(lm_gguf_writer *w, const char *key, bool value);
lm_status lm_gguf_writer_set_str(lm_gguf_writer *w, const char *key, const char *value);
/* A string with an explicit length (may contain NUL bytes). */
lm_status lm_gguf_writer_set_strn(lm_gguf_writer *w, const char *key, const char *value,
                                  size_t len);
/* A numeric (fixed-size element) array: `data` holds n packed elements in host
 * (little-endian) order. BOOL elements must be 0 or 1. */
lm_status lm_gguf_writer_set_arr(lm_gguf_writer *w, const char *key, lm_gguf_type elem_type,
                                 const void *data, uint64_t n);
lm_status lm_gguf_writer_set_arr_str(lm_gguf_writer *w, const char *key,
                                     const char *const *strs, uint64_t n);
/* A value given in its encoded form (the bytes after the type field, as
 * lm_gguf_kv_raw returns them); validated like a file. This is how nested arrays
 * are written. */
lm_status lm_gguf_writer_set_raw(lm_gguf_writer *w, const char *key, lm_gguf_type type,
                                 const void *bytes, size_t size);

/* Adds a tensor; ne[0] is innermost (GGUF order), n_dims in 0..4. Checks the type,
 * shape and block-size divisibility. LM_ERR_INVALID_ARG on a duplicate name. */
lm_status lm_gguf_writer_add_tensor(lm_gguf_writer *w, const char *name, lm_dtype type,
                                    int n_dims, const int64_t *ne, const void *data);

/* Writes `path` atomically: `path`.tmp, fsync, rename. Alignment is 32, or the value
 * of general.alignment if it was set (as u32; must be a power of two). LM_ERR_IO
 * naming the path on any write failure (the temporary file is removed). The writer
 * stays usable afterwards. */
lm_status lm_gguf_writer_write(lm_gguf_writer *w, const char *path);

#endif
