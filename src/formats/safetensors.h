/* safetensors files: a validating reader over a memory mapping, a writer, and model
 * folders whose weights are one model.safetensors or shards listed by
 * model.safetensors.index.json.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON header
 *   {"name": {"dtype": "F16", "shape": [outer, ..., inner], "data_offsets": [b, e]},
 *    "__metadata__": {"key": "string value"}}
 * then the data section; offsets [b, e) are relative to its start (8 + N).
 *
 * Reader checks: N <= LM_ST_MAX_HEADER and within the file; the header is a JSON
 * object; every entry has a known dtype (F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16
 * U8 BOOL; others -> LM_ERR_UNSUPPORTED), a shape of at most 4 non-negative integer
 * dimensions (more -> LM_ERR_UNSUPPORTED), data_offsets of two integers with
 * begin <= end <= data size and end - begin == elements * element size (overflow
 * checked); tensors' byte ranges do not overlap; names are unique and non-empty;
 * __metadata__ values are strings. Failures return LM_ERR_FORMAT / LM_ERR_UNSUPPORTED /
 * LM_ERR_LIMIT / LM_ERR_NO_MEMORY / LM_ERR_IO with a sentence naming the file and the
 * tensor or field. *out is NULL on failure.
 *
 * Tensors: ne is the header's shape reversed, so ne[0] is the innermost dimension;
 * a rank-0 shape ([]) is one element with n_dims 0; a shape with a 0 is an empty
 * tensor (nbytes 0). Tensor order is the order of the file's data offsets. data
 * points into the mapping and may be unaligned (the format guarantees no alignment).
 *
 * Ownership: every pointer returned (tensors, names, metadata strings) is borrowed
 * from the handle and valid until its close. Handles are immutable after open. */
#ifndef LM_FORMATS_SAFETENSORS_H
#define LM_FORMATS_SAFETENSORS_H

#include "lumen.h"
#include "tensor/tensor.h"

#define LM_ST_MAX_HEADER (100u * 1024u * 1024u) /* bytes of JSON header */

typedef struct lm_safetensors lm_safetensors;

/* Maps and validates `path`; the mapping lives until close. */
lm_status lm_safetensors_open(const char *path, lm_safetensors **out);
/* Validates a caller-owned buffer, borrowed: it must outlive the handle. */
lm_status lm_safetensors_open_memory(const void *data, size_t size, lm_safetensors **out);
void lm_safetensors_close(lm_safetensors *st); /* NULL is a no-op */

int64_t lm_safetensors_n_tensors(const lm_safetensors *st);
/* Tensor i, NULL if out of range; name NUL-terminated; ne reversed from the shape. */
const lm_tensor *lm_safetensors_tensor(const lm_safetensors *st, int64_t i);
const lm_tensor *lm_safetensors_find_tensor(const lm_safetensors *st, const char *name); /* NULL if absent */

/* A __metadata__ string value (NUL-terminated), NULL if absent. */
const char *lm_safetensors_metadata(const lm_safetensors *st, const char *key);
/* Metadata pairs by index (0 <= i < n); NULL if out of range. */
int64_t lm_safetensors_n_metadata(const lm_safetensors *st);
const char *lm_safetensors_metadata_key(const lm_safetensors *st, int64_t i);
const char *lm_safetensors_metadata_value(const lm_safetensors *st, int64_t i);

/* Writer. Shapes are given outermost-first as in the file (like numpy). Names,
 * metadata and shapes are copied at the call; tensor data is BORROWED until
 * lm_safetensors_writer_write returns. Tensors are written in the order added and
 * back to back (the reference implementation rejects holes in the data section); the
 * header is padded with spaces so the data section starts at a multiple of 8. */
typedef struct lm_safetensors_writer lm_safetensors_writer;

lm_safetensors_writer *lm_safetensors_writer_create(void); /* NULL on OOM */
void lm_safetensors_writer_free(lm_safetensors_writer *w);  /* NULL is a no-op */
/* Sets (or replaces) a __metadata__ string pair. */
lm_status lm_safetensors_writer_set_metadata(lm_safetensors_writer *w, const char *key, const char *value);
/* LM_ERR_INVALID_ARG for a dtype safetensors cannot hold (quantized types), a rank
 * above 4, a negative dimension, or a duplicate or empty name. */
lm_status lm_safetensors_writer_add(lm_safetensors_writer *w, const char *name, lm_dtype type, int n_dims,
                                    const int64_t *shape, const void *data);
/* Writes `path`.tmp, fsyncs, renames onto `path`. LM_ERR_IO naming the path. */
lm_status lm_safetensors_writer_write(lm_safetensors_writer *w, const char *path);

/* A model folder's weights: `dir`/model.safetensors.index.json with its shards
 * (preferred when present), else `dir`/model.safetensors. The index's weight_map
 * maps each tensor name to a shard file name in the same folder; shard names with a
 * path separator, "..", or a leading '.' are rejected; every listed tensor must be
 * found in its shard. The folder's tensors are exactly the weight_map entries (in
 * the index's order), or all tensors of model.safetensors. LM_ERR_NOT_FOUND if the
 * folder has neither file. */
typedef struct lm_st_folder lm_st_folder;

lm_status lm_st_folder_open(const char *dir, lm_st_folder **out);
void lm_st_folder_close(lm_st_folder *f); /* NULL is a no-op */
int64_t lm_st_folder_n_tensors(const lm_st_folder *f);
/* Borrowed from the folder's shards; valid until lm_st_folder_close. */
const lm_tensor *lm_st_folder_tensor(const lm_st_folder *f, int64_t i);
const lm_tensor *lm_st_folder_find_tensor(const lm_st_folder *f, const char *name); /* NULL if absent */
/* Shards actually opened (1 for a single file), and a shard's metadata lookup. */
int64_t lm_st_folder_n_shards(const lm_st_folder *f);
const lm_safetensors *lm_st_folder_shard(const lm_st_folder *f, int64_t i);

#endif
